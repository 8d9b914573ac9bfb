"""Block fills and exact reads: every byte the read path takes from the source or the disk tier.

:class:`Fills` is handed what it needs (the cache, the pool, the disk tier, the stats, the block
size, the read settings and one callback, ``on_unstuck``, told when an entry's last stuck read
returned) and knows nothing of the engine or the handle table: source files come from each entry's
own :class:`~fastfs.fsio.source.SourceRef`. Its parts:

* **Block fills** (:meth:`Fills.fetch_block`, :meth:`Fills.prefetch`): reserve a cache block and
  queue its fill: from the disk tier when it holds the range (:class:`DiskFill`,
  one pool job that falls back to the source), else from the source as a :class:`Preads` of
  pieces of at least :data:`FILL_SPLIT_MIN`, one per source stream, read in parallel; the last
  piece to finish completes the block (a failed piece fails it) and hands it to the disk tier.
* **Exact reads** (:meth:`Fills.read_exact`): the bytes a read takes outside blocks, from the disk
  tier when it holds them, else from the source: small ones on the reader's own thread when a
  watchdog bounds requests (``inline_reads``) or no timeout is set, large page-aligned ones (an mmap
  read-around) split into parallel pieces through a page-aligned bounce buffer; demand results land
  in a private buffer first, so a late completion never writes into a buffer the kernel took back.
* **The sequential shape** (:mod:`fastfs.fsio.shape`: stream-oriented clients, where a read that
  does not continue a handle's last one restarts its download): a block fill from the source is one
  read of the whole block on the file's one block-read stream (O_DIRECT where the source takes it,
  else the file's own descriptor), never split. Fills wait in the entry's
  :class:`~fastfs.fsio.entry.SourceStream`, ordered by offset, and one pool job per file
  (:class:`StreamRunner`) reads them one after the other: the next is the first queued at or after
  where the stream stands, so the stream only moves forward until nothing is queued ahead (then it
  starts again from the lowest queued: what the reader forces). At most one read is in flight on
  the stream. A reader waiting for a queued fill promotes the runner (demand priority), never the
  fill past the others. Exact reads take the file's own descriptor, whole, as a direct reader's
  would. The shape in force is the mount's :class:`~fastfs.fsio.shape.Shaper`'s; the first open of
  a large file starts the jump probe when the shaper wants one (:meth:`Fills.probe_shape`: a pool
  job, off the reader's path).
* **Timeouts and stuck files** (:meth:`Fills.wait_fill`, :meth:`Fills.fail_fast`,
  :meth:`Fills.abandoned_read`): a read gives up after ``read_timeout``; the reads it gave up on
  count as stuck reads of the file until they return, and while a file has stuck reads new reads
  of it fail at once, except one per :data:`STUCK_PROBE_SECONDS` let through to notice a source
  that came back. The one retry-wait rule (:func:`retry_wait`): a read that follows a timed-out read
  of the same data waits at most :data:`RETRY_WAIT`.

A block's fill is a :class:`BlockFill` (``block.job`` while it is queued or running): its pool
jobs (so a reader waiting on a queued prefetch promotes them) and the priority they were queued at.

Concurrency: :class:`Fills` holds no mutable state of its own besides the settings, which
:meth:`Fills.reconfigure` replaces, and ``closed`` (single attribute stores, read without a lock). A
:class:`Preads`' ``results``, ``left`` and ``abandoned`` are guarded by its ``guard``; the entry's
:class:`~fastfs.fsio.entry.StuckReads`, which this module alone writes, by the entry's lock. No lock
is held across a pread or while waiting for one. An entry's ``stream`` is guarded by the entry's
lock, taken only to queue or take a fill (a runner is submitted to the pool under it: the pool's
locks are never held while calling out, so the order entry lock -> pool lock is the only one).
"""

from __future__ import annotations

import _thread
import bisect
import errno
import functools
import logging
import mmap
import time
from collections.abc import Callable

from fastfs.fsio import stats as m
from fastfs.fsio.cache import READY, Block, BlockCache, BlockFill, round_up
from fastfs.fsio.disk.index import Key as DiskKey
from fastfs.fsio.disk.tier import DiskTier
from fastfs.fsio.entry import FileEntry, SourceStream
from fastfs.fsio.handover import ReadSpeed
from fastfs.fsio.pool import PreadPool
from fastfs.fsio.shape import PARALLEL, PROBE_DUE, Shaper, SourceFacts
from fastfs.fsio.source import DIRECT_ALIGN, SourceFile

log = logging.getLogger(__name__)

# Exact demand reads at least this large (and page-aligned) go to a block-read stream through an
# aligned buffer, as one source request instead of the source's read-ahead-sized pieces.
EXACT_ALIGNED_MIN = 64 * 1024
# Exact aligned reads are split into pieces of at least this size, one per source stream.
EXACT_SPLIT_MIN = 256 * 1024
# Block fills are split into pieces of at least this size, one per source stream, read in parallel:
# a reader waiting for a block waits for its slowest piece, not for one stream to carry all of it,
# and queued blocks complete in queue order instead of all together at the end.
FILL_SPLIT_MIN = 1024 * 1024
# Seconds (at most; never more than read_timeout) a read outside blocks waits, in the sequential
# shape, for the format plan of its file being made (a probe parses a head in milliseconds once its
# first block is in): the plan's blocks then serve it instead of a read of the file's descriptor.
PLAN_WAIT = 2.0
# Largest whole file an exact read hands the disk tier as a copy (larger files are read in blocks, which
# the tier takes without a copy).
DISK_COPY_MAX = 1024 * 1024
# Seconds a read waits when an earlier read of the same data already timed out (the kernel retries
# a failed request at once; the source may also have come back meanwhile).
RETRY_WAIT = 1.0
# While reads of a file are stuck on the source (a reader timed out and they have not returned),
# new reads of it fail at once, except one per this many seconds that tries the source again.
STUCK_PROBE_SECONDS = 5.0
# Seconds a read of such a file waits for the stuck reads to return before it fails (a source that
# has just come back answers them within milliseconds).
UNSTUCK_WAIT = 0.25


def retry_wait(timeout: float | None, retry: bool) -> float | None:
    """The one retry-wait rule: how long a read waits for the source (None: no bound). A read that
    follows one that already timed out on the same data or file (*retry*) waits at most RETRY_WAIT."""
    return min(timeout, RETRY_WAIT) if timeout and retry else timeout


def spans(length: int, parts: int) -> list[tuple[int, int]]:
    """``[0, length)`` cut into at most ``parts`` contiguous pieces with page-aligned starts."""
    chunk = round_up(-(-length // max(1, parts)))
    return [(a, min(length, a + chunk)) for a in range(0, length, chunk)]


class Fills:
    """Block fills and exact reads of the open file versions of one mount (see the module docstring)."""

    def __init__(
        self,
        cache: BlockCache,
        pool: PreadPool,
        stats: m.Stats,
        disk: DiskTier | None,
        block_size: int,
        source_streams: int,
        read_timeout: float,
        on_unstuck: Callable[[FileEntry], None],
        clock: Callable[[], float] = time.monotonic,
        shaper: Shaper | None = None,
        jump_probe: Callable[[str, int], tuple[float, float]] | None = None,
    ) -> None:
        self.cache = cache
        self.pool = pool
        self.stats = stats
        self.disk = disk
        self.on_unstuck = on_unstuck  # the last stuck read of an entry returned (the handle table may forget it)
        self.block_size = block_size
        self.source_streams = source_streams  # fixed for the mount (a restart setting)
        self.read_timeout = read_timeout  # seconds (0: no bound); replaced by reconfigure
        self.clock = clock  # monotonic seconds (stuck files' probe times)
        self.inline_reads = False  # set when a watchdog bounds requests: exact small reads then run on
        # the reader's thread (see read_direct)
        self.shaper = shaper or Shaper(SourceFacts(), PARALLEL)  # the mount's access shape (fixed setting)
        self.jump_probe = jump_probe  # (path, size) -> (continue, jump) seconds on one fresh handle
        self.closed = False  # set once by close: stream runners stop and fail what is still queued
        self.speed = ReadSpeed()  # latency of the source's small reads (fsio.handover; a hint, no lock)

    def reconfigure(self, read_timeout: float) -> None:
        self.read_timeout = read_timeout

    def close(self) -> None:
        """The mount is going away: stream runners read nothing more (before the pool closes)."""
        self.closed = True

    # -- source reads -----------------------------------------------------------------------------
    def timed_pread(
        self, src: SourceFile, pos: int, view: memoryview, path: str, aligned: bool = False, single: bool = False
    ) -> int:
        """One source pread, its latency and errors counted (errors carry *path*)."""
        t0 = time.perf_counter()
        try:
            # (the sequential shape's flag only when set: tests stand in for read_into without it)
            n = src.read_into(pos, view, aligned, single) if single else src.read_into(pos, view, aligned)
        except OSError as e:
            self.stats.error(errno.errorcode.get(e.errno or errno.EIO, "EIO"))
            raise OSError(e.errno or errno.EIO, e.strerror, path) from None
        seconds = time.perf_counter() - t0
        self.stats.pread(seconds)
        self.speed.note(seconds, len(view))
        return n

    # -- block fills ------------------------------------------------------------------------------
    def fetch_block(
        self, entry: FileEntry, index: int, demand: bool, keep_pin: bool = False, warm: bool = False
    ) -> Block | None:
        """Reserve block ``index`` and queue its fill. Returns the (pinned if keep_pin) block or None.
        *warm*: asked for by a warm (counted apart from read-ahead's own guesses: not ``prefetched``)."""
        start = index * self.block_size
        length = min(self.block_size, entry.size - start)
        if length <= 0 or index in entry.failed_blocks:
            return None  # (a block whose fill failed: the reads go to the source exactly)
        block, created = self.cache.reserve(entry.key, index, length, prefetched=not demand and not warm)
        if block is None:
            if not demand:
                self.stats.add(m.BACKPRESSURE)
            return None
        if created and not self.start_fill(entry, block, start, length, demand):
            if keep_pin:
                return block  # failed: the reader goes to the source directly
            self.cache.unpin(block)
            return None
        if not keep_pin:
            self.cache.unpin(block)
        return block

    def prefetch(self, entry: FileEntry, ranges: list[tuple[int, int]]) -> tuple[int, bool]:
        """Queue prefetch of the blocks covering ``ranges``; returns (end scheduled, complete)."""
        bs = self.block_size
        upto = 0
        for start, stop in ranges:
            for index in range(start // bs, (stop - 1) // bs + 1):
                if self.cache.peek(entry.key, index) is None and self.fetch_block(entry, index, demand=False) is None:
                    return upto, False
                upto = min(stop, (index + 1) * bs)
        return upto, True

    def start_fill(self, entry: FileEntry, block: Block, start: int, length: int, demand: bool) -> bool:
        """Queue the fill of a block just reserved (the caller holds its pin): from the disk tier when it
        holds the range (one pool job, which falls back to the source), else from the source.

        False when it could not be queued (source unavailable, or prefetch declined: counted as
        backpressure); the block has been failed then.
        """
        if self.disk is not None and self.disk.holds(entry.dkey, start, length):
            fill = DiskFill(self, entry, block, start, length, demand)
            block.job = fill
            if demand:
                self.pool.submit_demand(fill)
                return True
            if self.pool.submit_prefetch(fill):
                return True
            block.job = None
            self.cache.fail(block, 0)
            self.stats.add(m.BACKPRESSURE)
            return False
        return self.start_source_fill(entry, block, start, length, demand)

    def start_source_fill(self, entry: FileEntry, block: Block, start: int, length: int, demand: bool) -> bool:
        """Queue the fill of a block from the source as parallel pieces (see :meth:`start_fill`)."""
        if entry.stuck_reads.count:  # no more reads queued behind the stuck ones of this file: a reader
            # goes to read_direct, which fails fast (or tries the source once per probe period)
            self.cache.fail(block, 0)
            if not demand:
                self.stats.add(m.BACKPRESSURE)
            return False
        try:
            src = entry.source.get()
        except OSError as e:
            self.cache.fail(block, e.errno or errno.EIO)
            return False
        want = min(block.capacity, round_up(length))
        shaper = self.shaper
        if shaper.probe_state == PROBE_DUE:
            self.probe_shape(entry)
        done = functools.partial(self._complete_fill, block, length)
        if shaper.sequential:  # the whole block, one read on the file's one stream, in offset order
            fill = Preads(self, entry, src, start, block.view, [(0, want)], True, demand, done, single=True)
            block.job = fill
            if self._queue_on_stream(entry, fill):
                return True
            block.job = None
            entry.source.put(src)
            self.cache.fail(block, 0)
            self.stats.add(m.BACKPRESSURE)
            return False
        parts = spans(want, min(self.source_streams, want // FILL_SPLIT_MIN))
        fill = Preads(self, entry, src, start, block.view, parts, True, demand, done)
        block.job = fill
        if demand:
            for job in fill.jobs:
                self.pool.submit_demand(job)
            return True
        if self.pool.submit_prefetch_all(fill.jobs):
            return True
        block.job = None
        entry.source.put(src)
        self.cache.fail(block, 0)
        self.stats.add(m.BACKPRESSURE)
        return False

    # -- the sequential shape: one stream per file, fills in offset order ---------------------------
    def _queue_on_stream(self, entry: FileEntry, fill: Preads) -> bool:
        """Queue *fill* on the entry's stream; start its runner when none is out, or promote the one
        queued when *fill* is for a waiting reader. False when the pool declined a new prefetch
        runner (the fill was taken back out: nothing else was queued then)."""
        pool = self.pool
        with entry.lock:
            stream = entry.stream
            if stream is None:
                stream = entry.stream = SourceStream()
            stream.serial += 1
            item = (fill.pos, stream.serial, fill)
            bisect.insort(stream.queue, item)
            runner = stream.runner
            if runner is None:  # the queue was empty (a runner leaves only when it is): start one
                runner = stream.runner = StreamRunner(self, entry)
                if fill.demand:
                    pool.submit_demand(runner)
                elif not pool.submit_prefetch(runner):
                    stream.runner = None
                    stream.queue.remove(item)
                    return False
            elif fill.demand:
                pool.promote(runner)  # queued as a prefetch: a reader now waits on it (False: it runs)
        return True

    def _promote(self, entry: FileEntry, fill: BlockFill) -> None:
        """A reader waits for the queued prefetch *fill*: its jobs go to the demand queue; a fill on
        the file's stream keeps its place there, its runner is promoted instead."""
        if isinstance(fill, Preads) and fill.single:
            stream = entry.stream
            runner = stream.runner if stream is not None else None  # (a hint: promote says no when it runs)
            if runner is not None:
                self.pool.promote(runner)
            return
        for job in fill.jobs:
            self.pool.promote(job)

    def probe_shape(self, entry: FileEntry, at_open: bool = False) -> None:
        """Start the jump probe on *entry*'s file when the shaper wants one and the file is large enough
        (the format probe calls this at a version's first open, *at_open*; a fill of the source before
        it; a stream verdict's recheck only at an open)."""
        probe, shaper = self.jump_probe, self.shaper
        if probe is None or not shaper.claim_probe(entry.size, at_open, entry.path):
            return
        path, size = entry.path, entry.size

        def run() -> None:
            try:
                continue_s, jump_s = probe(path, size)
            except OSError as e:
                chosen = shaper.probe_failed(f"{e.strerror or e} ({path})")
                log.debug("source shape: jump probe of %s failed (%s): %s, %s", path, e, chosen.kind, chosen.reason)
                return
            chosen = shaper.probed(continue_s, jump_s)
            log.debug("source shape after the jump probe of %s: %s (%s)", path, chosen.kind, chosen.reason)

        if not self.pool.submit_prefetch(run):
            shaper.unclaim_probe()  # the queue is full: the next large file's fill tries again

    def _from_plan_block(self, entry: FileEntry, pos: int, view: memoryview) -> int | None:
        """The sequential shape, a read outside blocks of a file whose format probe started: inside
        block 0 it comes from block 0 (:meth:`from_stream_block`); elsewhere it first waits for the
        probe's plan (:data:`PLAN_WAIT` at most) and comes from the plan's block when there is one.
        None: no block holds it (the caller reads the source)."""
        index = pos // self.block_size
        if index == 0 and pos + len(view) <= self.block_size:
            return self.from_stream_block(entry, pos, view)
        planned = entry.format.planned
        if planned is not None and entry.format.planning:
            timeout = self.read_timeout
            planned.wait(min(PLAN_WAIT, timeout) if timeout else PLAN_WAIT)
        if self.cache.peek(entry.key, index) is None or (pos + len(view) - 1) // self.block_size != index:
            return None
        return self.from_stream_block(entry, pos, view, index)

    def from_stream_block(self, entry: FileEntry, pos: int, view: memoryview, index: int = 0) -> int | None:
        """Fill *view* (inside block *index*, 0 unless told) from that block, filled on the file's
        stream if it is not in RAM yet (the sequential shape: the format probe's head, and a reader's
        first reads while the probe runs): the stream's first read is the one the reader needs first,
        and the file's own descriptor is not read at its start (on a stream-oriented client every
        handle read there is a download of its own). Returns the bytes copied; None when the block
        cannot be had (budget, a failed fill). Raises as :meth:`wait_fill` does."""
        block = self.cache.get(entry.key, index)
        if block is None:
            block = self.fetch_block(entry, index, demand=False, keep_pin=True)
            if block is None:
                return None
        try:
            if block.state != READY:
                self.wait_fill(entry, block, self.read_timeout or None)
            if block.state != READY:
                return None
            n = max(0, min(len(view), block.start + block.length - pos))
            view[:n] = block.view[pos - block.start : pos - block.start + n]
            return n
        finally:
            self.cache.unpin(block)

    def _complete_fill(self, block: Block, length: int, fill: Preads) -> None:
        """The last piece of a block's fill finished: the block is complete, or failed if a piece failed."""
        try:
            block.job = None
            try:
                n = min(fill.total(), length)
            except OSError as e:
                if e.errno != errno.ETIMEDOUT:  # (an abandoned fill is the stuck reads' business)
                    fill.entry.failed_blocks.add(block.start // self.block_size)
                self.cache.fail(block, e.errno or errno.EIO)
                return
            kind = m.BYTES_FETCHED_PREFETCH if block.prefetched else m.BYTES_FETCHED_WARM  # not prefetched: a warm's
            self.stats.add(m.BYTES_FETCHED_DEMAND if fill.demand else kind, n)
            self.stats.file_bytes(fill.path, fetched=n)
            entry = fill.entry
            self.complete_block(block, n, entry.dkey, entry.size, length)
        finally:
            fill.entry.source.put(fill.src)

    def complete_block(self, block: Block, n: int, dkey: DiskKey, size: int, length: int) -> None:
        """Mark a filled block READY (``n`` bytes) and hand it to the disk tier when the tier keeps it."""
        disk = self.disk
        keep = disk is not None and disk.keeps(dkey, block, n, length)
        if keep:
            self.cache.pin(block)  # the store's pin, taken while the block cannot be evicted yet
        self.cache.complete(block, n)
        if keep and disk is not None:
            disk.store_block(dkey, size, block, n, self.cache.unpin)

    # -- waiting for a fill -----------------------------------------------------------------------
    def wait_fill(self, entry: FileEntry, block: Block, timeout: float | None) -> None:
        """Wait for a block that is not READY to be filled (its state says how it ended): promote a
        queued prefetch, wait at most *timeout* (less when retrying, see :func:`retry_wait`). Raises
        EIO when the file's reads are stuck (fail fast) or the wait timed out (the fill then counts
        as a stuck read of the file)."""
        if self.fail_fast(entry):
            self._failed_fast(entry)
        fill = block.job
        if fill is not None and not fill.demand:
            self._promote(entry, fill)
        # an earlier reader already gave up on this fill or on another read of the file (this is
        # the read let through to try the source): wait only briefly for the source to come back
        retry = block.errno == errno.ETIMEDOUT or bool(entry.stuck_reads.count)
        if not block.done.wait(retry_wait(timeout, retry)):
            block.errno = errno.ETIMEDOUT
            if isinstance(fill, Preads):
                fill.abandon()
            self._timed_out(entry)

    def abandon_block(self, block: Block) -> None:
        """A warm gave up waiting for *block*: its fill counts as a stuck read of the file, as when a
        reader times out."""
        fill = block.job
        if block.state != READY and isinstance(fill, Preads):
            block.errno = errno.ETIMEDOUT
            fill.abandon()
            self.stats.add(m.TIMEOUTS)
            self.stats.error("ETIMEDOUT")

    def _timed_out(self, entry: FileEntry) -> None:
        self.stats.add(m.TIMEOUTS)
        self.stats.error("ETIMEDOUT")
        raise OSError(errno.EIO, "source read timed out", entry.path)

    def fail_fast(self, entry: FileEntry) -> bool:
        """True when a read of *entry* should fail at once: earlier source reads of it are stuck (a
        reader timed out on them and they have not returned), so a new one would only queue behind
        them. One read per :data:`STUCK_PROBE_SECONDS` is let through to notice a source that is back."""
        stuck = entry.stuck_reads
        if not stuck.count:
            return False
        # the stuck reads may be returning right now (a source that came back): wait a moment for them
        clear = stuck.clear  # (made before count left 0)
        if clear is None or clear.wait(UNSTUCK_WAIT):
            return False
        now = self.clock()
        with entry.lock:
            if not stuck.count:
                return False
            if now - stuck.probe_at >= STUCK_PROBE_SECONDS:
                stuck.probe_at = now
                return False
        return True

    def _failed_fast(self, entry: FileEntry) -> None:
        self.stats.add(m.FAST_FAILS)
        raise OSError(errno.EIO, "source reads of this file are stuck", entry.path)

    def abandoned_read(self, entry: FileEntry) -> None:
        """The kernel layer gave up on a read of *entry* (its watchdog answered the request while the
        read ran on): if an inline source read of the file is still out, it counts as a stuck read of
        the file until it returns, so later reads of it fail fast instead of hanging one more thread."""
        stuck = entry.stuck_reads
        with entry.lock:
            if stuck.inline <= stuck.inline_stuck:
                return  # no inline read out that is not counted already
            if not stuck.count:
                stuck.stuck(self.clock())
            stuck.count += 1
            stuck.inline_stuck += 1
        self.stats.add(m.TIMEOUTS)

    def abandoned_elsewhere(self, entry: FileEntry) -> None:
        """A source read of *entry* made outside the engine (the kernel layer's direct reads) is still
        out after its request was answered: a stuck inline read of the file until :meth:`inline_done`."""
        with entry.lock:
            entry.stuck_reads.inline += 1
        self.abandoned_read(entry)

    def inline_done(self, entry: FileEntry) -> None:
        """An inline source read of *entry* returned (a stuck one: the file may be unstuck now)."""
        stuck = entry.stuck_reads
        with entry.lock:
            stuck.inline -= 1
            unstuck = False
            if stuck.inline_stuck:
                stuck.inline_stuck -= 1
                stuck.count -= 1
                unstuck = stuck.count == 0
                if unstuck:
                    stuck.unstuck()
        if unstuck:
            self.on_unstuck(entry)

    # -- exact reads ------------------------------------------------------------------------------
    def read_exact(self, entry: FileEntry, pos: int, view: memoryview) -> int:
        """Bytes a read takes outside blocks: from the disk tier when it holds them (checked there), else
        from the source (:meth:`read_direct`; in the sequential shape, of a file whose format probe
        started: from the plan's block, see :meth:`_from_plan_block`). A small file read whole from
        the source this way is also given to the tier, as a copy (the reader's buffer goes back to
        the kernel)."""
        disk = self.disk
        if disk is not None and entry.dkey and disk.holds(entry.dkey, pos, len(view)):
            n = disk.read(entry.dkey, pos, view)
            if n is not None:
                return n
        if self.shaper.sequential and entry.format.probed:
            n = self._from_plan_block(entry, pos, view)
            if n is not None:
                return n
        if disk is None or not entry.dkey:
            return self.read_direct(entry, pos, view)
        n = self.read_direct(entry, pos, view)
        if pos == 0 and n == entry.size and 0 < n <= DISK_COPY_MAX:
            disk.store_copy(entry.dkey, entry.size, view[:n])
        return n

    def read_direct(self, entry: FileEntry, pos: int, view: memoryview) -> int:
        """Demand read of exactly ``view`` from the source (no caching), bounded by read_timeout.

        A large page-aligned read (an mmap read-around, a loader's read outside any prefetch) goes
        to the block-read streams (``O_DIRECT`` where the source has it) through a page-aligned
        bounce buffer, split into up to ``source_streams`` pieces read in parallel: a buffered read
        of a latency-bound source is cut by the source's own small read-ahead into round trips one
        after the other, and one stream's bandwidth would bound it. In the sequential shape it is
        one read of the file's own descriptor instead (the streams would restart), still on the pool
        under the read timeout.
        """
        timeout = self.read_timeout
        if timeout and self.fail_fast(entry):
            self._failed_fast(entry)
        source = entry.source
        src = source.get()
        length = len(view)
        large = length >= EXACT_ALIGNED_MIN and pos % DIRECT_ALIGN == 0
        # the sequential shape: a large read too goes to the file's own descriptor, whole, as a direct
        # reader's would (the stream is the fills'), still on the pool under the read timeout
        aligned = large and not self.shaper.sequential
        if not large and (not timeout or self.inline_reads):
            # on the reader's own thread: a hand-off to the pool costs more than the read on a fast
            # source; a hung one is bounded by the kernel layer's watchdog (abandoned_read)
            with entry.lock:
                entry.stuck_reads.inline += 1
            try:
                n = self.timed_pread(src, pos, view, entry.path)
            finally:
                source.put(src)
                self.inline_done(entry)
            self.stats.add(m.BYTES_FETCHED_DEMAND, n)
            return n
        size = round_up(length) if aligned else length
        parts = spans(size, min(self.source_streams, length // EXACT_SPLIT_MIN) if aligned else 1)
        done = _thread.allocate_lock()
        done.acquire()

        def finished(batch: Preads) -> None:
            source.put(src)
            done.release()

        bounce = mmap.mmap(-1, size) if aligned else bytearray(length)
        batch = Preads(self, entry, src, pos, memoryview(bounce), parts, aligned, True, finished)
        if not timeout and len(batch.jobs) == 1:
            batch.jobs[0]()
        else:
            for job in batch.jobs:
                self.pool.submit_demand(job)
        # while an earlier read of this file is stuck past the timeout, wait only briefly
        wait = retry_wait(timeout, bool(entry.stuck_reads.count))
        if not done.acquire(timeout=wait if wait else -1):
            if batch.abandon():
                self._timed_out(entry)
            done.acquire()  # it finished as the wait ended: the results are in
        total = min(batch.total(), length)
        view[:total] = batch.view[:total]
        self.stats.add(m.BYTES_FETCHED_DEMAND, total)
        return total


class DiskFill:
    """One block fill served from the disk tier: a pool job (``jobs`` is itself, so a reader waiting
    for a queued prefetch can promote it like a source fill). When the store does not hold the range
    any more or a check fails, it hands the block to the source fill instead (``fills``: the
    :class:`Fills` that queued it)."""

    __slots__ = ("fills", "entry", "block", "start", "length", "demand", "jobs")

    def __init__(self, fills: Fills, entry: FileEntry, block: Block, start: int, length: int, demand: bool) -> None:
        self.fills, self.entry, self.block = fills, entry, block
        self.start, self.length, self.demand = start, length, demand
        self.jobs = (self,)

    def __call__(self) -> None:
        fills, block, disk = self.fills, self.block, self.fills.disk
        assert disk is not None  # only a Fills with a tier queues a DiskFill
        try:
            n = disk.read(self.entry.dkey, self.start, block.view[: self.length])
        except OSError:
            n = None
        if n != self.length:  # not held (evicted meanwhile) or failed its check: the source decides
            fills.start_source_fill(self.entry, block, self.start, self.length, self.demand)
            return
        block.job = None
        if not self.demand:
            fills.stats.add(m.BYTES_DISK_PREFETCH, n)
        fills.cache.complete(block, n)


class Preads:
    """One source read of ``entry``'s file cut into pieces (``spans`` of ``view``, from file offset
    ``pos``) run in parallel as pool jobs (``jobs``, in the file's pool group); the last piece to
    finish calls ``done(self)``. A :class:`BlockFill` when it fills a block.

    ``results`` holds each piece's byte count or error (an ``OSError`` without its traceback, whose
    frames would keep views of ``view`` alive). ``results``, ``left`` and ``abandoned`` (a reader gave up
    waiting: the read counts in ``entry.stuck_reads`` until its last piece returns, and pieces not started yet
    are skipped) are guarded by ``guard``; the rest is set once. ``demand`` is the priority the jobs
    were queued with (a reader waiting for a queued prefetch promotes its jobs). ``single``: a block
    fill of the sequential shape, one piece read on the file's one stream by its
    :class:`StreamRunner` (its job is not a pool job of its own).
    """

    __slots__ = (
        "fills",
        "entry",
        "path",
        "src",
        "pos",
        "view",
        "spans",
        "aligned",
        "demand",
        "single",
        "done",
        "jobs",
        "results",
        "left",
        "abandoned",
        "guard",
    )

    def __init__(
        self,
        fills: Fills,
        entry: FileEntry,
        src: SourceFile,
        pos: int,
        view: memoryview,
        pieces: list[tuple[int, int]],
        aligned: bool,
        demand: bool,
        done: Callable[[Preads], None],
        single: bool = False,
    ) -> None:
        self.fills, self.entry, self.path, self.src, self.pos, self.view = fills, entry, entry.path, src, pos, view
        self.spans, self.aligned, self.demand, self.done, self.single = pieces, aligned, demand, done, single
        self.jobs = [Pread(self, i) for i in range(len(pieces))]
        self.results: list[int | OSError] = [0] * len(pieces)
        self.left = len(pieces)
        self.abandoned = False
        self.guard = _thread.allocate_lock()

    def abandon(self) -> bool:
        """A reader gave up waiting; True when pieces were still out (the file now counts a stuck read)."""
        with self.guard:
            if self.left == 0 or self.abandoned:
                return self.left > 0
            self.abandoned = True
        entry = self.entry
        stuck = entry.stuck_reads
        with entry.lock:
            if not stuck.count:  # the next read let through to try the source is one probe period away
                stuck.stuck(self.fills.clock())
            stuck.count += 1
        return True

    def total(self) -> int:
        """Bytes read contiguously from the start (a short piece is the end of the file); raises the
        first piece's error."""
        total = 0
        for (a, b), outcome in zip(self.spans, self.results, strict=True):
            if isinstance(outcome, OSError):
                raise outcome
            total += min(outcome, b - a)
            if outcome < b - a:
                break
        return total


class Pread:
    """One piece of a :class:`Preads` (a plain object: cheaper than a closure per job); ``group`` is
    its file's pool group (the pool bounds the pieces of one file running at once)."""

    __slots__ = ("batch", "index", "group")

    def __init__(self, batch: Preads, index: int) -> None:
        self.batch, self.index, self.group = batch, index, batch.entry.group

    def __call__(self) -> None:
        batch = self.batch
        a, b = batch.spans[self.index]
        if batch.abandoned:  # its reader gave up: do not add a read to a source that does not answer
            outcome: int | OSError = OSError(errno.ETIMEDOUT, "abandoned after a timeout", batch.path)
        else:
            try:
                outcome = batch.fills.timed_pread(
                    batch.src, batch.pos + a, batch.view[a:b], batch.path, batch.aligned, batch.single
                )
            except OSError as e:
                outcome = OSError(e.errno or errno.EIO, e.strerror, batch.path)
        with batch.guard:
            batch.results[self.index] = outcome
            batch.left -= 1
            last = batch.left == 0
            abandoned = batch.abandoned
        if last:
            if abandoned:  # the source answered at last: reads of this file may wait again
                entry = batch.entry
                stuck = entry.stuck_reads
                with entry.lock:
                    stuck.count -= 1
                    unstuck = stuck.count == 0
                    if unstuck:
                        stuck.unstuck()
                if unstuck:
                    batch.fills.on_unstuck(entry)
            batch.done(batch)


class StreamRunner:
    """The pool job reading one file's :class:`~fastfs.fsio.entry.SourceStream` (the sequential
    shape): it takes the next fill (the first queued at or after where the stream stands, else the
    lowest), reads it, and goes on while fills are queued; it leaves when the queue is empty (under
    the entry's lock, so a fill queued after that starts a new runner). While the file's format probe
    is making its plan from block 0, it waits for the plan (at most :data:`PLAN_WAIT`) before taking
    the next fill. ``group`` is the file's pool group, as for every job of the file."""

    __slots__ = ("fills", "entry", "group")

    def __init__(self, fills: Fills, entry: FileEntry) -> None:
        self.fills, self.entry, self.group = fills, entry, entry.group

    def __call__(self) -> None:
        fills, entry = self.fills, self.entry
        stream = entry.stream
        assert stream is not None  # made before the first runner
        while True:
            fmt = entry.format
            planned = fmt.planned
            if planned is not None and fmt.planning and _ready(fills.cache.peek(entry.key, 0)):
                # the format probe has its head and is queuing its plan: take the next fill once it is
                # in, so the stream goes on in file order (a reader's block further on, queued while the
                # probe parses, would be a jump ahead and one back)
                timeout = fills.read_timeout
                planned.wait(min(PLAN_WAIT, timeout) if timeout else PLAN_WAIT)
            with entry.lock:
                if fills.closed:
                    dropped = [fill for _, _, fill in stream.queue]
                    stream.queue.clear()
                    stream.runner = None
                    fill, jumped = None, False
                else:
                    dropped = []
                    fill, jumped = _take(stream)
                    if fill is None:
                        stream.runner = None
            for gone in dropped:  # the mount closes: their blocks fail (nobody reads them any more)
                with gone.guard:
                    gone.results[0] = OSError(errno.ECANCELED, "the mount is closing", gone.path)
                    gone.left = 0
                gone.done(gone)
            if fill is None:
                return
            fills.stats.add(m.STREAM_FILLS)
            if jumped:
                fills.stats.add(m.STREAM_JUMPS)
            fill.jobs[0]()


def _ready(block: Block | None) -> bool:
    return block is not None and block.state == READY


def _take(stream: SourceStream) -> tuple[Preads | None, bool]:
    """Take the stream's next fill (the entry's lock held): the first queued at or after ``pos``, else
    the lowest; the stream then stands at its end. Returns it (None: nothing queued) and whether it
    does not continue where the stream stood (a jump: the source restarts its download)."""
    queue = stream.queue
    if not queue:
        return None, False
    pos = stream.pos
    i = 0 if pos is None else bisect.bisect_left(queue, (pos,))
    if i == len(queue):
        i = 0
    start, _, fill = queue.pop(i)
    stream.pos = start + fill.spans[0][1]
    return fill, pos is not None and start != pos
