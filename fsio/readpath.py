"""The read path: one read of an open file version, as named steps.

:meth:`ReadPath.read_into` walks these steps, in this order:

1. **clip** the request at the end of the file (nothing left: an empty reply);
2. **head window** (:meth:`ReadPath._from_head`): a read that falls inside a head window of a format
   plan (a torch zip's local headers, fetched at open by :mod:`fastfs.fsio.probe`) is served from
   it, and that is all;
3. **classify** (:meth:`ReadPath._classify`): the read is fed to the version's
   :class:`~fastfs.fsio.policy.StreamPolicy`, and, inside a format plan's ranges, to its
   :class:`~fastfs.fsio.policy.RangePlan`, which alone decides what is fetched ahead there; the
   :class:`Decision` says whether the read continues a tight sequential stream and which ranges to
   fetch ahead (while the format probe runs, a read from offset 0 does not make the stream policy's
   bet on a whole-file read). Stream events are counted and traced here;
4. **reserve demand** blocks (:meth:`ReadPath._reserve_demand`): for a tight sequential stream, and
   for a large read inside a format plan's ranges on a source read in parallel (the plan fetches
   those blocks anyway: read exactly now, they would be fetched twice), the missing blocks of the
   read are reserved and queued at demand priority;
5. **prefetch** (:meth:`ReadPath._prefetch`) the decision's ranges ahead, declined when the budget or
   the queue is full (backpressure), and tell the stream policy how far it got;
6. **serve** (:meth:`ReadPath._serve`) block by block: bytes a cache block holds are copied from it,
   waiting for its fill (or, with *parts*, sent from the block itself without a copy); bytes no
   block holds, or whose fill failed, are read exactly from the disk tier or the source
   (:meth:`fastfs.fsio.fills.Fills.read_exact`: random reads are never amplified);
7. **count** the request and the file's bytes (batched per file, :data:`FILE_STATS_BATCH`).

Direct reads. A read of this path that joins no stream and is served exactly from the source
(step 6) is all the path does for a random reader: the policy is fed, the source read, the read
counted. :meth:`ReadPath.direct_offer` says when the kernel layer may do that itself for a handle
(its request loop preads into its own buffer, ``daemon/kernel/_loop.c``): the version's last read
was served whole from the source, it has no head window, no format plan or probe under way, no
disk tier key, no stuck read, no sequential stream, and exact reads run on the reader's own thread
anyway (no read timeout, or the kernel layer's watchdog bounds them). The offer carries the
windows where a read would join one of the file's streams (:meth:`StreamPolicy.direct_windows`):
the kernel layer sends such reads, and any it cannot serve, back here, first handing over what it
served (:meth:`ReadPath.direct_served`: counted as this path counts them, and its last reads fed
to the policy in order, so the policy decides as if it had seen every read; with several threads
reading one handle, a read may reach the kernel layer before the windows show a stream another
thread's read just began there: it is served, and handed back with the next read that continues
it). A direct read the kernel layer's watchdog answered while its pread ran on counts as a stuck
read of the file until the pread returns (:meth:`ReadPath.direct_stuck`,
:meth:`ReadPath.direct_unstuck`), as an exact read of this path does
(:meth:`fastfs.fsio.fills.Fills.abandoned_read`).

Block fills, exact reads, timeouts and the retry-wait rule live in :mod:`fastfs.fsio.fills`.

State: what the read path keeps about a version is the entry's :class:`~fastfs.fsio.entry.ReadState`
(``entry.reads``: the stream policy and the byte counters), which this module alone writes; it
reads the probe's :class:`~fastfs.fsio.entry.FormatState` (``entry.format``: plan, heads).

Concurrency: :class:`ReadPath` has no mutable state of its own besides the settings
(``readahead``, replaced whole by :meth:`ReadPath.reconfigure`, one attribute load per read). The
entry's lock guards its policy and plan (held only while they decide, never across I/O) and its
byte counters. Blocks are pinned while read from and unpinned on every path out.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from fastfs.config.schema import ReadaheadConfig
from fastfs.fsio import stats as m
from fastfs.fsio.cache import FAILED, READY, Block, BlockCache
from fastfs.fsio.entry import FileEntry
from fastfs.fsio.fills import EXACT_ALIGNED_MIN, Fills
from fastfs.fsio.policy import MAX_SLACK, REORDER_REQUESTS, SLACK_MIN_REQUEST, ReadPlan
from fastfs.fsio.probe import FormatProbe
from fastfs.fsio.trace import DecisionLog

# Bytes delivered from one file version before its per-file counts join the shared top-files table.
FILE_STATS_BATCH = 4 * 1024 * 1024
# Reads inside a format plan's ranges at least this large take whole blocks at demand priority, in
# or out of the plan's order: a loader's page faults ahead of the plan (seen: safetensors 0.8's
# load_file touches the mapped file every 16 MiB before it copies the tensors in order), read
# exactly, were fetched again by the plan's fills of their blocks (1.13x the file over sshfs, 1.15x
# on the emulator). Smaller reads stay exact: a look at one small tensor must not cost a block.
PLANNED_BLOCK_READ_MIN = 256 * 1024
# Reads the kernel layer may answer itself are smaller than this: larger page-aligned ones are split
# over parallel source streams by the fills (fills.EXACT_ALIGNED_MIN), which one pread would undo.
DIRECT_READ_MAX = EXACT_ALIGNED_MIN


def direct_limits() -> tuple[int, int, int, int, tuple[float, ...]]:
    """What the kernel layer's direct reads must know of this path: (the read size they stay below,
    then the stream policy's slack: requests of reorder, at least a page each, at most a cap; the
    stats' latency bounds)."""
    return DIRECT_READ_MAX, REORDER_REQUESTS, SLACK_MIN_REQUEST, MAX_SLACK, m.LATENCY_BUCKETS


class ReplyParts:
    """The pieces of one read's reply when RAM blocks are sent without a copy (see read_into)."""

    __slots__ = ("views", "blocks")

    def __init__(self) -> None:
        self.views: list[memoryview] = []
        self.blocks: list[Block] = []


class Decision(NamedTuple):
    """What the policies decided for one read (step 3). (The per-read results are immutable
    NamedTuples rather than frozen dataclasses: two of those per read cost ~2 us, measured.)"""

    plan: ReadPlan  # the stream policy's plan
    planned: bool  # the read lies inside a format plan's ranges (the plan decides what is fetched)
    blocks: bool  # whole blocks at demand priority (a tight sequential stream, a large planned read)
    ranges: list[tuple[int, int]]  # byte ranges to fetch ahead


class DirectOffer(NamedTuple):
    """Reads of a handle the kernel layer may answer itself (see the module docstring)."""

    fd: int  # the version's source descriptor (the kernel layer keeps a duplicate)
    size: int  # the version's size: reads reaching past it come here
    windows: tuple[tuple[int, int], ...]  # (low, high) offsets where a read would join a stream


class DirectTally(NamedTuple):
    """What the kernel layer served of a handle since it last handed its reads over."""

    reads: int
    nbytes: int
    seconds: float  # the preads' time, summed
    latency: tuple[int, ...]  # reads by stats.LATENCY_BUCKETS (one more: beyond the last)
    sizes: dict[int, int]  # reads by (size - 1).bit_length()
    ring: tuple[tuple[int, int], ...]  # its last reads, (offset, length), oldest first (for the policy)


class Served(NamedTuple):
    """How a read was served (steps 2 and 6)."""

    n: int  # bytes delivered
    cached: int  # of which counted as served from the RAM cache
    direct: int  # of which read from the source outside blocks


class ReadPath:
    """Reads of open file versions (see the module docstring for the steps)."""

    def __init__(
        self,
        cache: BlockCache,
        stats: m.Stats,
        fills: Fills,
        probe: FormatProbe,
        block_size: int,
        readahead: ReadaheadConfig,
        trace: DecisionLog,
    ) -> None:
        self.cache = cache
        self.stats = stats
        self.fills = fills
        self.probe = probe
        self.block_size = block_size
        self.readahead = readahead  # replaced whole by reconfigure
        self.trace = trace
        # handles whose direct reads were answered by the kernel layer's watchdog while their pread ran
        # on: fh -> (its entry, such reads counted stuck less those returned; negative: returned before
        # they were counted, the kernel layer tells both from two threads); guarded by _stuck_lock
        self._stuck_direct: dict[int, tuple[FileEntry | None, int]] = {}
        self._stuck_lock = threading.Lock()

    def reconfigure(self, readahead: ReadaheadConfig) -> None:
        self.readahead = readahead

    def read_into(self, entry: FileEntry, offset: int, dest: memoryview, parts: ReplyParts | None) -> int:
        """Fill ``dest`` with *entry*'s bytes at ``offset``; returns the count (short only at EOF)."""
        end = min(offset + len(dest), entry.size)
        if end <= offset:
            self.stats.request(0, 0)
            return 0
        served = self._from_head(entry, offset, end, dest, parts) if entry.format.heads else None
        if served is None:
            decision = self._classify(entry, offset, end) if self.readahead.enabled else None
            demand = self._reserve_demand(entry, offset, end) if decision is not None and decision.blocks else []
            if decision is not None and decision.ranges:
                self._prefetch(entry, decision)
            try:
                served = self._serve(entry, offset, end, dest, demand, parts)
            finally:
                for block in demand:
                    if block is not None:
                        self.cache.unpin(block)
        self.stats.request(served.n, served.cached)
        self.account_file(entry, served.n, served.direct)
        # a read of the whole file leaves the kernel every page: none of it comes back for the loop to
        # answer, whose duplicate of the descriptor would only cost a close at the source (a FLUSH of
        # its own: s3fs answers it with a HEAD, one more request a small file than a direct reader's)
        entry.reads.exact = served.direct == served.n and (offset > 0 or served.n < entry.size)
        return served.n

    # -- direct reads (see the module docstring) --------------------------------------------------
    def direct_offer(self, entry: FileEntry) -> DirectOffer | None:
        """The handover of *entry*'s random reads to the kernel layer, or None when this path must see them."""
        state = entry.format
        if not entry.reads.exact or state.heads or state.planning or state.plan is not None or entry.dkey:
            return None
        fills = self.fills
        if (fills.shaper.sequential and state.probed) or (self.readahead.read_timeout and not fills.inline_reads):
            return None
        file = entry.source.file  # (the handles hold it: it stays open while the handle is)
        if file is None or file.fd < 0:
            return None
        with entry.lock:
            if entry.stuck_reads.count:
                return None
            windows = entry.reads.policy.direct_windows() if self.readahead.enabled else ()
        return None if windows is None else DirectOffer(file.fd, entry.size, windows)

    def direct_stuck(self, entry: FileEntry | None, fh: int, count: int) -> None:
        """*count* direct reads of handle *fh* still ran at the source when the kernel layer's watchdog
        answered one of the handle's reads: stuck reads of the file (*entry*; None: released, nothing to
        count) until each returns (:meth:`direct_unstuck`; one that returned already is not counted)."""
        if entry is None:
            return
        with self._stuck_lock:
            out = self._stuck_direct.pop(fh, (None, 0))[1]
            if out + count:
                self._stuck_direct[fh] = (entry, out + count)
        for _ in range(max(0, out + count) - max(0, out)):  # (those not returned already)
            self.fills.abandoned_elsewhere(entry)

    def direct_unstuck(self, fh: int) -> None:
        """One of handle *fh*'s stuck direct reads returned (perhaps before :meth:`direct_stuck` counted it)."""
        with self._stuck_lock:
            entry, out = self._stuck_direct.get(fh, (None, 0))
            if out == 1:
                del self._stuck_direct[fh]
            else:
                self._stuck_direct[fh] = (entry, out - 1)
        if out > 0 and entry is not None:  # (a read counted stuck)
            self.fills.inline_done(entry)

    def direct_served(self, entry: FileEntry, tally: DirectTally) -> None:
        """Count the reads the kernel layer served of *entry* and feed its last ones to the policy."""
        if tally.reads:
            self.stats.direct(tally.reads, tally.nbytes, tally.seconds, tally.latency, tally.sizes)
            self.account_file(entry, tally.nbytes, tally.nbytes)
            # each read served there joined no stream (the windows and the reads before it say so): a
            # new random stream each, as this path counts them
            self.stats.add(m.RANDOM_STREAMS, tally.reads)
        if tally.ring and self.readahead.enabled:
            with entry.lock:
                policy = entry.reads.policy
                for offset, length in tally.ring:
                    policy.on_read(offset, length)

    # -- step 2: head windows ---------------------------------------------------------------------
    def _from_head(
        self, entry: FileEntry, offset: int, end: int, dest: memoryview, parts: ReplyParts | None
    ) -> Served | None:
        """Serve [offset, end) from a head window holding all of it; None when none does (or its fill failed)."""
        block = self.probe.head_block(entry, offset, end)
        if block is None:
            return None
        try:
            n, _ = self._copy_block(entry, block, offset, end, dest, self.readahead.read_timeout or None)
        finally:
            self.cache.unpin(block)
        if n != end - offset:
            return None
        if parts is not None:
            parts.views.append(dest[:n])
        return Served(n, n, 0)

    # -- step 3: classify -------------------------------------------------------------------------
    def _classify(self, entry: FileEntry, offset: int, end: int) -> Decision:
        """Feed the read to the policies (under the entry's lock); count and trace stream events."""
        state = entry.format
        with entry.lock:
            plan = entry.reads.policy.on_read(offset, end - offset)
            range_plan = state.plan
            planned = range_plan is not None and range_plan.contains(offset)
            # inside a format plan the plan alone decides what to fetch ahead: it knows where
            # the loader's ranges end, the stream policy would read on past them
            confirmed = True
            if planned and range_plan is not None:
                ranges = range_plan.advance(offset, end)
                confirmed = range_plan.confirmed
                if self.cache.checking:  # debug switch (cache.check_invariants): the plan's own check
                    range_plan.check_invariants()
            elif state.planning and plan.prefetch and offset == 0:
                # the bet on a read from offset 0 waits for the format plan being made now
                ranges = []
            else:
                ranges = list(plan.prefetch)
        # whole blocks at demand priority for a tight sequential stream (inside a plan: one whose
        # run the plan confirmed), and for a large read anywhere inside the plan's ranges: the plan
        # fetches those blocks anyway (not on a stream client: a block out of order makes the file's
        # stream jump; there the read goes exactly to the file's own descriptor); other reads are
        # served exactly while the prefetch brings the blocks in order
        blocks = (plan.sequential and confirmed) or (
            planned and end - offset >= PLANNED_BLOCK_READ_MIN and not self.fills.shaper.sequential
        )
        if planned and not plan.sequential and not entry.reads.mmap_seen:
            # out-of-order reads inside a planned range: page faults of an mmap load
            entry.reads.mmap_seen = True
            self.stats.add(m.MMAP_STREAMS)
        if plan.started:
            self.stats.add(m.SEQ_STREAMS)
        if plan.reset:
            self.stats.add(m.SEQ_RESETS)
        if plan.new_random:
            self.stats.add(m.RANDOM_STREAMS)
        if (plan.started or plan.reset or plan.new_random) and self.trace.enabled:
            self._trace_stream(entry, offset, plan, planned)
        return Decision(plan, planned, blocks, ranges)

    def _trace_stream(self, entry: FileEntry, offset: int, plan: ReadPlan, planned: bool) -> None:
        """Debug line of a stream decision (random reads: once per file version, they repeat)."""
        where = "; inside the format plan, which decides what is fetched" if planned else ""
        if plan.started:
            self.trace("%s: sequential reads at offset %d: prefetching ahead%s", entry.path, offset, where)
        elif plan.reset:
            self.trace("%s: a sequential stream was dropped for a new read at offset %d", entry.path, offset)
        else:
            self.trace.once(
                (entry.key, "random"),
                "%s: read at offset %d continues no stream: served exactly, no prefetch until reads are sequential%s",
                entry.path,
                offset,
                where,
            )

    # -- steps 4 and 5: demand blocks and prefetch ------------------------------------------------
    def _reserve_demand(self, entry: FileEntry, offset: int, end: int) -> list[Block | None]:
        """Reserve and queue (demand priority) the missing blocks of [offset, end); pinned, in order."""
        bs = self.block_size
        out: list[Block | None] = []
        for index in range(offset // bs, (end - 1) // bs + 1):
            block = self.cache.get(entry.key, index)
            if block is None:
                block = self.fills.fetch_block(entry, index, demand=True, keep_pin=True)
            out.append(block)
        return out

    def _prefetch(self, entry: FileEntry, decision: Decision) -> None:
        """Queue the decision's ranges ahead; a stream policy's own plan hears how far it got."""
        upto, complete = self.fills.prefetch(entry, decision.ranges)
        if decision.plan.prefetch and not decision.planned:
            with entry.lock:
                entry.reads.policy.scheduled(decision.plan.stream, upto, complete)

    # -- step 6: serve ----------------------------------------------------------------------------
    def _serve(
        self,
        entry: FileEntry,
        offset: int,
        end: int,
        dest: memoryview,
        demand: list[Block | None],
        parts: ReplyParts | None,
    ) -> Served:
        """Fill ``dest`` (or *parts*) with [offset, end) block by block."""
        bs = self.block_size
        pos = offset
        cached = direct = 0
        first = offset // bs
        timeout = self.readahead.read_timeout or None
        while pos < end:
            index = pos // bs
            stop = min(end, (index + 1) * bs)
            block = demand[index - first] if demand else None
            pinned_here = False
            if block is None:
                block = self.cache.get(entry.key, index)
                pinned_here = block is not None
            n = -1  # -1: this part comes from the source directly (no block, or its fill failed)
            if block is not None:
                try:
                    n, from_cache = self._copy_block(entry, block, pos, stop, dest[pos - offset :], timeout, parts)
                finally:
                    if pinned_here:
                        self.cache.unpin(block)
                cached += from_cache
            if n < 0:
                n = self.fills.read_exact(entry, pos, dest[pos - offset : stop - offset])
                direct += n
                if parts is not None and n:
                    parts.views.append(dest[pos - offset : pos - offset + n])
            pos += n
            if pos < stop:  # end of file reached early
                break
        return Served(pos - offset, cached, direct)

    def _copy_block(
        self,
        entry: FileEntry,
        block: Block,
        pos: int,
        stop: int,
        dest: memoryview,
        timeout: float | None,
        parts: ReplyParts | None = None,
    ) -> tuple[int, int]:
        """Copy [pos, stop) of the file from ``block`` to ``dest``, waiting for its fill.

        Returns (bytes copied, of which counted as served from the cache); (-1, 0) when the fill
        failed (errors are never cached: the caller reads the source directly).
        """
        ready = block.state == READY
        if block.state == FAILED:
            return -1, 0
        if not ready:
            self.fills.wait_fill(entry, block, timeout)
        if block.state == FAILED:
            return -1, 0
        block_start = block.start
        n = max(0, min(stop, block_start + block.length) - pos)
        if n == 0:
            return 0, 0
        if parts is None:
            dest[:n] = block.view[pos - block_start : pos - block_start + n]
        else:  # sent from the block itself, which stays pinned until the reply is written
            self.cache.pin(block)
            parts.blocks.append(block)
            parts.views.append(block.view[pos - block_start : pos - block_start + n])
        if not block.used and self.cache.use(block) and block.prefetched:
            self.stats.add(m.BYTES_PREFETCH_USED, block.length)
        if pos + n >= block_start + block.length:
            self.cache.consumed(block)
        return n, n if block.prefetched or ready else 0

    def release_parts(self, parts: ReplyParts) -> None:
        """The reply built from *parts* was sent: release its views and unpin its blocks."""
        for view in parts.views:
            view.release()
        parts.views.clear()
        for block in parts.blocks:
            self.cache.unpin(block)
        parts.blocks.clear()

    # -- handing a small file to the kernel at open (fastfs.fsio.handover) -----------------------
    def ram_head(self, entry: FileEntry) -> int:
        """Bytes of *entry*'s version RAM holds ready from offset 0 in its first block (a peek: no pin,
        no LRU touch; the file is whole in RAM when this covers its size)."""
        block = self.cache.peek(entry.key, 0)
        if block is None or block.state != READY or block.start != 0:
            return 0
        return block.length

    def handover_parts(self, entry: FileEntry, length: int) -> ReplyParts | None:
        """A view of [0, *length*) of *entry*'s first block, pinned in the parts (give them back with
        :meth:`release_parts`), or None when the block no longer holds it (evicted meanwhile)."""
        block = self.cache.get(entry.key, 0)
        if block is None:
            return None
        if block.state != READY or block.start != 0 or block.length < length:
            self.cache.unpin(block)
            return None
        parts = ReplyParts()
        parts.blocks.append(block)
        parts.views.append(block.view[:length])
        return parts

    def handed_over(self, entry: FileEntry, parts: ReplyParts) -> int:
        """The kernel took the bytes of *parts* into its page cache: counted as an open handed over and
        as bytes delivered to the application from the cache (they will be read from the kernel's
        copy), a prefetched block's bytes as used; the block becomes a drop-behind candidate."""
        n = sum(len(v) for v in parts.views)
        stats = self.stats
        self._count_handed(entry, n, 0)
        stats.add(m.BYTES_SERVED_CACHE, n)
        for block in parts.blocks:
            if not block.used and self.cache.use(block) and block.prefetched:
                stats.add(m.BYTES_PREFETCH_USED, block.length)
            self.cache.consumed(block)
        return n

    def read_at_open(self, entry: FileEntry, length: int) -> memoryview | None:
        """The first *length* bytes of *entry*'s version read now from the source file its handles hold
        (an inline handover, :mod:`fastfs.fsio.handover`; timed into the source's read speed), or None:
        no source file held (an open answered from metadata), an error, or not exactly *length* bytes
        (the file changed since its stat; the READs then find out)."""
        file = entry.source.file
        if file is None or file.fd < 0:
            return None
        view = memoryview(bytearray(length))
        try:
            n = self.fills.timed_pread(file, 0, view, entry.path)
        except OSError:
            return None
        if n != length:
            return None
        self.stats.add(m.BYTES_FETCHED_DEMAND, n)
        return view

    def handed_from_source(self, entry: FileEntry, n: int) -> None:
        """The kernel took *n* bytes :meth:`read_at_open` read: counted as an open handed over and as
        bytes delivered to the application, read from the source (none from RAM)."""
        self._count_handed(entry, n, n)

    def _count_handed(self, entry: FileEntry, n: int, from_source: int) -> None:
        """One open handed over, *n* bytes delivered (*from_source* of them read from the source)."""
        stats = self.stats
        stats.add(m.OPENS_HANDED)
        stats.add(m.BYTES_HANDED, n)
        stats.add(m.BYTES_REQUESTED, n)
        self.account_file(entry, n, from_source)

    # -- step 7: per-file counts ------------------------------------------------------------------
    def account_file(self, entry: FileEntry, delivered: int, direct: int, flush: bool = False) -> None:
        """Per-file bytes for the top-files table, summed per entry (its own lock) and handed to the
        shared table in batches, so a read does not take a mount-wide lock."""
        state = entry.reads
        with entry.lock:
            state.delivered += delivered
            state.direct += direct
            if not flush and state.delivered < FILE_STATS_BATCH:
                return
            delivered, direct = state.delivered, state.direct
            state.delivered = state.direct = 0
        if delivered or direct:
            self.stats.file_bytes(entry.path, fetched=direct, delivered=delivered)
