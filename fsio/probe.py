"""The format probe and head windows: what a file's format says a loader will read, fetched ahead.

:class:`FormatProbe` runs once per file version (first open, files of :data:`FORMAT_MIN_SIZE` or
more) on a pool worker: it reads the file's head (from a cached block, the disk tier or the source),
asks :func:`fastfs.fsio.formats.plan_for` for the loader's ranges, and installs a
:class:`~fastfs.fsio.policy.RangePlan` on the entry, which from then on decides alone what is fetched
ahead inside its ranges (the read path asks it). The plan releases one block at open
(:data:`FORMAT_INITIAL_LEAD`), then bytes ahead of each run of reads the reader has proven dense. A
program or shared library (ELF) gets no plan: the windows of its stream policy are capped at one
block instead (:data:`~fastfs.fsio.policy.CODE_WINDOW`).
With learning on, when the last handle of a planned file closes, the share of the plan its readers
read is remembered (:meth:`FormatProbe.learn_load`); the next load of the same version, after a
remount too, has its plan released whole at open if that load read (nearly, :data:`WHOLE_SHARE`)
all of it.

Head windows. A plan's heads (the local header of every record of a torch zip, which ``torch.load``
reads one by one, each a source round trip) are fetched at open, in parallel, as small page windows
(:data:`HEAD_WINDOW`) kept in the cache under their own key kind, :class:`~fastfs.fsio.source.HeadKey`
of the file key (window number as index), so they never collide with the file's blocks and the disk
tier never stores them. :meth:`FormatProbe.head_block` finds the window holding a read, which the
read path then serves from it.

The sequential shape (:mod:`fastfs.fsio.shape`: one source stream per file, read in order). A plan
whose blocks fit :data:`PLAN_BUDGET_SHARE` of the cache budget is released whole at open and fetched
in file order (:func:`~fastfs.fsio.policy.file_order`): the stream reads the file once, front to
back, and a loader that reads the tensors in another order (transformers' lazy loads, model order
against a file sorted by name) finds them in RAM instead of restarting the source's download at
every tensor. A larger plan is released as the loader proves it reads on, as in the parallel shape
(its fills still queue in offset order on the stream). No head windows: each would be a read at a
distant offset on the stream (a restart); a plan fetched whole holds the heads in its blocks, and
otherwise the loader's own reads of them go to the file's descriptor, as a direct reader's would.
The probe's own reads inside the first block come from block 0, filled first on the stream (once
the shape is settled: while it only waits for the jump probe of an unknown FUSE client, the head is
one read of :data:`~fastfs.fsio.formats.HEAD_BYTES`, so a file read at random there does not pay
for a whole block: most such clients read any offset on any handle), and a
reader's read outside blocks while the probe runs waits for its plan (``format.planned``, at most
:data:`~fastfs.fsio.fills.PLAN_WAIT` seconds) and is then served from the plan's block: a loader
that parses the header as fast as the probe does and reaches for a tensor before the plan is queued
would otherwise read the file's own descriptor there, one more download on such a client.

State: what the probe learns about a version is the entry's :class:`~fastfs.fsio.entry.FormatState`
(``entry.format``), which this module alone writes; the probe reads through the entry's own
:class:`~fastfs.fsio.source.SourceRef`.

Concurrency: the probe runs on one pool worker per version (``format.probed`` under the entry's
lock makes it once); it sets ``format.plan`` and ``format.heads`` under the entry's lock;
``format.heads`` is replaced whole and read without the lock (one load of an immutable tuple). The
probe holds no lock across its reads. ``readahead`` and ``learn`` are single attribute loads.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from typing import TYPE_CHECKING

from fastfs.config.schema import ReadaheadConfig
from fastfs.fsio import formats
from fastfs.fsio import stats as m
from fastfs.fsio.cache import READY, Block, BlockCache, round_up
from fastfs.fsio.disk.tier import DiskTier
from fastfs.fsio.entry import FileEntry, HeadWindow
from fastfs.fsio.fills import Fills
from fastfs.fsio.policy import CODE_WINDOW, RangePlan, file_order
from fastfs.fsio.pool import PreadPool
from fastfs.fsio.shape import PROBE_DUE, PROBE_RECHECK, SETTLE_WAIT
from fastfs.fsio.source import DIRECT_ALIGN, HeadKey
from fastfs.fsio.trace import DecisionLog

if TYPE_CHECKING:
    from fastfs.fsio.learn import AccessLog

# Files at least this large get a format probe on first open (smaller ones are read whole anyway).
FORMAT_MIN_SIZE = 1024 * 1024
# Bytes of a format plan released at open, before any read: one block (the first tensor's start),
# so a loader that then reads little does not pay for more; reads release the rest.
FORMAT_INITIAL_LEAD = 4 * 1024 * 1024
# Bytes fetched from the page of each head of a format plan (a zip local header): the kernel reads
# a header as the two pages from the page it starts in (8 KiB requests), so this holds that read.
HEAD_WINDOW = 8 * 1024
# Head windows are fetched only while they total at most 1/HEAD_SHARE of the planned bytes, so a
# full load pays at most ~6 % extra for them (files of many tiny records are read in blocks anyway).
HEAD_SHARE = 16
# Cap of one file's head windows (2,048 records with 8 KiB windows).
MAX_HEAD_BYTES = 16 * 1024 * 1024
# Share of a format plan the previous load of the file read from which the next load of the same
# version gets its plan released whole at open (a loader that read nine tenths reads it all).
WHOLE_SHARE = 0.9
# How far ahead of the furthest read a format plan keeps its ranges in flight at most.
FORMAT_LEAD = 256 * 1024 * 1024
# Share of the cache budget a format plan's blocks may take to be fetched whole, in file order, at
# open in the sequential shape (the loader's out-of-order reads must find them all still in RAM;
# the rest of the budget stays for other files).
PLAN_BUDGET_SHARE = 0.5
# Sorts after every window of the same start (bisect key for "the last window starting <= offset").
_AFTER_ANY = float("inf")

__all__ = ["FormatProbe", "HeadWindow"]


class FormatProbe:
    """Format probes, range plans and head windows of the open file versions (see the module docstring)."""

    def __init__(
        self,
        cache: BlockCache,
        pool: PreadPool,
        stats: m.Stats,
        disk: DiskTier | None,
        fills: Fills,
        block_size: int,
        readahead: ReadaheadConfig,
        trace: DecisionLog,
        learn: AccessLog | None = None,
    ) -> None:
        self.cache = cache
        self.pool = pool
        self.stats = stats
        self.disk = disk
        self.fills = fills
        self.block_size = block_size
        self.readahead = readahead  # replaced whole by reconfigure
        self.trace = trace
        self.learn = learn  # fastfs.fsio.learn.AccessLog or None

    def reconfigure(self, readahead: ReadaheadConfig) -> None:
        self.readahead = readahead

    # -- probe ------------------------------------------------------------------------------------
    def maybe_probe(self, entry: FileEntry) -> None:
        """Queue the format probe of *entry* unless it had one (or is too small, or formats are off);
        the source's jump probe too, when its shape still waits for one."""
        if self.fills.shaper.probe_state in (PROBE_DUE, PROBE_RECHECK):
            self.fills.probe_shape(entry, at_open=True)
        state = entry.format
        if not self.readahead.formats or state.probed or entry.size < FORMAT_MIN_SIZE:
            return
        with entry.lock:
            probe = not state.probed
            state.probed = True
            state.planning = probe
            if probe and self.fills.shaper.sequential:  # readers outside blocks wait for the plan
                state.planned = threading.Event()
        if probe and not self.pool.submit_prefetch(lambda: self._probe_format(entry)):
            self._planned(entry)
            self.stats.add(m.BACKPRESSURE)

    def _probe_format(self, entry: FileEntry) -> None:
        """Read the head, parse it, queue the loader's ranges (runs on a pool worker)."""
        try:
            self._plan_format(entry)
        finally:
            self._planned(entry)

    @staticmethod
    def _planned(entry: FileEntry) -> None:
        """The format probe of *entry* ended (a plan queued, or none): readers waiting for it go on."""
        state = entry.format
        state.planning = False
        if state.planned is not None:
            state.planned.set()

    def _read_at(self, entry: FileEntry, offset: int, length: int) -> bytes:
        """[offset, offset+length) of *entry* for the format parser: from a ready cache block, the disk
        tier or the source (the probe's only reads)."""
        cached = self._cached_range(entry, offset, length)
        if cached is not None:  # warmed or scanned already: no source read for the probe
            return cached
        if self.fills.shaper.stream and offset + length <= self.block_size:
            buf = bytearray(max(0, min(length, entry.size - offset)))
            n = self.fills.from_stream_block(entry, offset, memoryview(buf))
            if n is not None:
                return bytes(buf[:n])
        if self.disk is not None and self.disk.holds(entry.dkey, offset, length):
            buf = bytearray(max(0, min(length, entry.size - offset)))
            n = self.disk.read(entry.dkey, offset, memoryview(buf))
            if n is not None:
                return bytes(buf[:n])
        src = entry.source.get()
        try:
            buf = bytearray(max(0, min(length, entry.size - offset)))
            n = self.fills.timed_pread(src, offset, memoryview(buf), entry.path)
            self.stats.add(m.BYTES_FETCHED_PREFETCH, n)
            return bytes(buf[:n])
        finally:
            entry.source.put(src)

    def _plan_format(self, entry: FileEntry) -> None:
        if entry.handles == 0:  # (read without the table's lock: closed meanwhile, a probe is not worth it)
            return

        def read_at(offset: int, length: int) -> bytes:
            return self._read_at(entry, offset, length)

        try:
            # only the head: a file read at random must not pay for a whole block
            head = read_at(0, formats.HEAD_BYTES)
            plan = formats.plan_for(head, entry.size, read_at)
        except OSError:
            return
        if plan is None or not plan.ranges:
            if formats.is_program(head):
                with entry.lock:
                    entry.reads.policy.cap_windows(CODE_WINDOW)
                self.stats.add(m.PROGRAMS)
                self.trace("%s: a program or shared library (ELF): its runs are prefetched one block ahead", entry.path)
                return
            self.trace("%s: no known format in its first bytes: prefetch follows sequential reads only", entry.path)
            return
        self.stats.add(m.FORMAT_PLANS)
        shaper = self.fills.shaper
        if shaper.provisional:  # the source's jump probe runs (started at this open): a plan decided
            # now would be read whole on one stream, as if the source were one; wait for its answer
            shaper.wait_settled(SETTLE_WAIT)
        sequential = shaper.sequential
        if not sequential:
            self._fetch_heads(entry, plan)
        max_lead = max(FORMAT_LEAD, 2 * self.readahead.max_window)
        learn = self.learn
        share = learn.file_share(entry.path, entry.size, entry.key.mtime_ns) if learn is not None else None
        whole = share is not None and share >= WHOLE_SHARE
        in_file_order = sequential and self._fits_budget(plan)
        if in_file_order:  # one stream: read it front to back once, the loader's order then comes from RAM
            lead = plan.total
            how = "fetched whole at open, in file order (one source stream per file)"
        elif whole:  # the last load of this version read it all: no need to wait for proof
            self.stats.add(m.LEARNED_WHOLE)
            lead = max_lead
            how = "released whole, as the last load read it all"
        else:  # the release at open ends on a block boundary (a few bytes past it would fetch a whole block)
            first = plan.ranges[0][0]
            lead = (first + FORMAT_INITIAL_LEAD) // self.block_size * self.block_size - first
            lead = lead if lead > 0 else FORMAT_INITIAL_LEAD
            how = "released as the loader proves it reads on"
        self.trace(
            "%s: %s format plan of %d ranges (%d bytes, %d record headers): %s",
            entry.path,
            plan.format,
            len(plan.ranges),
            plan.total,
            len(plan.heads),
            how,
        )
        with entry.lock:
            range_plan = entry.format.plan = RangePlan(tuple(plan.ranges), lead, max_lead, whole=whole)
            ranges = range_plan.advance()
            if self.cache.checking:  # debug switch (cache.check_invariants)
                range_plan.check_invariants()
        if in_file_order:
            ranges = file_order(ranges)
        self.fills.prefetch(entry, ranges)

    def _fits_budget(self, plan: formats.Plan) -> bool:
        """The blocks covering *plan* take at most :data:`PLAN_BUDGET_SHARE` of the cache budget."""
        bs = self.block_size
        blocks = 0
        last = -1  # the highest block counted (ranges in file order: each block counted once)
        for start, stop in file_order([(a, a + n) for a, n in plan.ranges if n > 0]):
            first = max(start // bs, last + 1)
            last = (stop - 1) // bs
            blocks += max(0, last - first + 1)
        return blocks * bs <= PLAN_BUDGET_SHARE * self.cache.budget

    def loader_maps(self, entry: FileEntry) -> bool | None:
        """Whether the version's loader maps the file (:func:`fastfs.fsio.formats.loader_maps`), from its
        name when it says (:func:`~fastfs.fsio.formats.maps_by_name`: no read), else its first
        :data:`~fastfs.fsio.formats.DETECT_BYTES`: from a ready cache block when RAM holds them,
        else one read of a fresh handle of the version, closed at once (:meth:`SourceRef.fresh`), its
        pages dropped from the client's page cache: on a client that serves a handle as one ranged
        download, the download that read starts ends with it (measured over rclone, 256 MiB: read on
        the handles' own file, kept open, the server read 1.18x the file for a passthrough np.load
        instead of direct reads' 1.06x), and the loader's own first read starts its handle's download
        at 0, in order, as a direct reader's does. Remembered on the
        entry; None when the head cannot be read (the caller serves the open: fastfs's read path then
        times out a hung source)."""
        state = entry.format
        if state.maps is not None:
            return state.maps
        hint = formats.maps_by_name(entry.path)
        if hint is not None:
            state.maps = hint
            return hint
        head = self._cached_range(entry, 0, formats.DETECT_BYTES)
        if head is None:
            try:
                src = entry.source.fresh()
            except OSError:
                return None
            try:
                buf = bytearray(min(formats.DETECT_BYTES, entry.size))
                cold = src.cached_share() == 0.0  # the client held none of the file (None: not known)
                n = self.fills.timed_pread(src, 0, memoryview(buf), entry.path)
                # and the client forgets what this read brought in, its read-ahead with it: left in its
                # page cache, those pages made the loader's first read on the handle it reads through
                # begin past them, with the kernel's next two read-ahead windows in flight at once, and
                # the client started its download at whichever came first (now and then the later
                # one: the earlier one then restarted it, window after window; 4 restarts and 13.5 MB
                # moved for an 8 MiB file on the emulated stream client, in 5 test runs of 108)
                if cold:
                    with contextlib.suppress(OSError):  # (a hint: the route does not depend on it)
                        src.forget_pages()
            except OSError:
                return None
            finally:
                src.close()
            head = bytes(buf[:n])
        state.maps = formats.loader_maps(head)
        return state.maps

    def _cached_range(self, entry: FileEntry, offset: int, length: int) -> bytes | None:
        """[offset, offset+length) clipped at EOF from one ready cache block, or None."""
        end = min(entry.size, offset + length)
        index = offset // self.block_size
        if end <= offset or (end - 1) // self.block_size != index:
            return None
        block = self.cache.get(entry.key, index)
        if block is None:
            return None
        try:
            if block.state != READY or block.start + block.length < end:
                return None
            return bytes(block.view[offset - block.start : end - block.start])
        finally:
            self.cache.unpin(block)

    def learn_load(self, entry: FileEntry) -> None:
        """The last handle of a planned file closed: remember how much of its plan the load read."""
        plan = entry.format.plan
        if self.learn is None or plan is None or plan.read == 0 or plan.total == 0:
            return  # nothing read through fastfs (the kernel's cache served it): nothing learned
        self.learn.record_file(entry.path, entry.size, entry.key.mtime_ns, plan.read / plan.total)

    # -- head windows -----------------------------------------------------------------------------
    def _fetch_heads(self, entry: FileEntry, plan: formats.Plan) -> None:
        """Queue the page windows of a plan's heads (before its ranges: the loader reads them first)."""
        windows: list[list[int]] = []
        for offset, length in sorted(plan.heads):
            start = offset // DIRECT_ALIGN * DIRECT_ALIGN
            stop = min(entry.size, max(start + HEAD_WINDOW, round_up(offset + length)))
            if windows and start <= windows[-1][1]:
                windows[-1][1] = max(windows[-1][1], stop)
            else:
                windows.append([start, stop])
        total = sum(b - a for a, b in windows)
        if not windows or total > min(MAX_HEAD_BYTES, plan.total // HEAD_SHARE):
            return
        heads = []
        head_key = HeadKey(entry.key)
        for index, (start, stop) in enumerate(windows):
            block, created = self.cache.reserve(head_key, index, stop - start, prefetched=True, start=start)
            if block is None:
                self.stats.add(m.BACKPRESSURE)
                break
            if created and not self.fills.start_fill(entry, block, start, stop - start, demand=False):
                self.cache.unpin(block)
                break
            self.cache.unpin(block)
            heads.append(HeadWindow(start, stop, index))
        with entry.lock:
            entry.format.heads = tuple(heads)

    def head_block(self, entry: FileEntry, offset: int, end: int) -> Block | None:
        """The (pinned) block of the head window holding all of [offset, end), or None."""
        heads = entry.format.heads
        k = bisect.bisect_right(heads, (offset, _AFTER_ANY)) - 1  # the last window starting <= offset
        if k < 0:
            return None
        window = heads[k]
        if end > window.stop:
            return None
        return self.cache.get(HeadKey(entry.key), window.index)
