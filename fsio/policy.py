"""Pure read-ahead policy: events in, plans out.

Nothing here does I/O, reads a clock or starts a thread, so every decision is testable with
tables and property tests. The engine feeds each read request of an open file version into its
:class:`StreamPolicy` and each open into the mount's :class:`ScanPolicy`, then carries out the
returned plan (subject to the cache budget) and reports back with :meth:`StreamPolicy.scheduled`.

Streams. One file may be read by several streams at once (two processes, or one handle
interleaving regions). A read continues a stream when it starts within ``slack`` of the stream's
expected next offset; ``slack`` tolerates the kernel's own reordering of concurrent read-ahead
requests (several FUSE threads deliver 1 MiB requests out of order). Only reads within one request
of the expected offset count as evidence of a sequential pattern; looser joins just keep the
stream alive. A stream is sequential after
:data:`SEQ_MIN_HITS` continuing reads covering at least :data:`SEQ_MIN_BYTES`, or at once when it
starts at offset 0 (the common "load the
whole file" case; the kernel makes the same bet). Its prefetch window starts at
``initial_window`` and doubles, up to ``max_window``, each time the previous plan was scheduled
whole; a plan cut short by backpressure keeps the window. A read that continues no stream starts a
new one, replacing the least recently used; losing a sequential stream that way is a reset.
Streams that are not sequential never prefetch: their reads are served exactly as asked.

Plans along ranges (:class:`RangePlan`) serve format-aware prefetch: the ranges a loader will
read, in order, released ``lead`` bytes ahead of the furthest read, which also covers
mmap-shaped loads whose page faults arrive out of order within those ranges. The lead starts
small (a lazy loader that maps a file and touches one tensor must not pull the whole file) and
doubles with every read inside the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Continuing reads before a stream counts as sequential (two could be coincidence, three is a pattern).
SEQ_MIN_HITS = 3
# Bytes a stream must cover before it counts as sequential: one large random pread reaches us as
# several contiguous requests (the kernel splits it and reads ahead up to 1 MiB), so a stream has to
# outgrow what a single application read can span.
SEQ_MIN_BYTES = 4 * 1024 * 1024
# Out-of-order tolerance in units of the stream's request size (kernel read-ahead from 10 FUSE threads).
REORDER_REQUESTS = 16
# Cap on the tolerance so a slack computed from huge requests does not swallow real seeks.
MAX_SLACK = 16 * 1024 * 1024
# Streams tracked per file version (several processes or regions read one file at once).
MAX_STREAMS = 8
# Bytes of a format plan released around a read that jumps past the released region (one
# kernel read-around of an mmap page fault).
JUMP_LEAD = 1024 * 1024
# A read within this distance ahead of a stream's prefetched end triggers the next plan
# (asynchronous read-ahead, like the kernel's PG_readahead mark), as a fraction of the window.
TRIGGER_FRACTION = 0.5


@dataclass
class Stream:
    """One sequential candidate inside a file."""

    ident: int
    next_offset: int
    request_size: int
    covered: int = 0
    hits: int = 0
    sequential: bool = False
    window: int = 0
    prefetched_to: int = 0
    last_use: int = 0


@dataclass(frozen=True)
class ReadPlan:
    """What to do for one read: which stream it joined and which byte ranges to prefetch."""

    stream: int
    sequential: bool
    prefetch: tuple[tuple[int, int], ...] = ()
    started: bool = False
    """This read made the stream sequential (count a new sequential stream)."""
    reset: bool = False
    """A sequential stream was dropped to make room (count a reset)."""
    new_random: bool = False
    """A stream was created that is not (yet) sequential."""


@dataclass
class StreamPolicy:
    """Sequential detection and prefetch windows of one file version (not thread-safe: the engine
    calls it under the file's lock)."""

    file_size: int
    initial_window: int
    max_window: int
    streams: list[Stream] = field(default_factory=list)
    _clock: int = 0
    _next_id: int = 1

    def on_read(self, offset: int, size: int) -> ReadPlan:
        """Feed one read of ``size`` bytes at ``offset``; returns the plan."""
        self._clock += 1
        end = min(offset + size, self.file_size)
        stream = self._match(offset)
        started = reset = new_random = False
        tight = True
        if stream is None:
            stream, reset = self._new_stream(offset, size)
            if offset == 0:
                stream.sequential = True
                stream.hits = SEQ_MIN_HITS
                started = True
            else:
                new_random = True
        else:
            # a tight continuation is evidence and may plan more; a looser join only keeps a
            # reordered stream alive (strided reads, one page per tensor, never pull the file)
            tight = abs(offset - stream.next_offset) <= max(stream.request_size, size)
            if tight:
                stream.hits += 1
                stream.covered += end - offset
            stream.request_size = max(stream.request_size, size)
            if not stream.sequential and stream.hits >= SEQ_MIN_HITS and stream.covered >= SEQ_MIN_BYTES:
                stream.sequential = True
                started = True
        stream.last_use = self._clock
        stream.next_offset = max(stream.next_offset, end)
        prefetch: tuple[tuple[int, int], ...] = ()
        if stream.sequential and tight:
            if stream.window == 0:
                stream.window = self.initial_window
            stream.prefetched_to = max(stream.prefetched_to, offset)
            ahead = stream.prefetched_to - end
            if ahead < stream.window * TRIGGER_FRACTION and stream.prefetched_to < self.file_size:
                start = max(stream.prefetched_to, offset)
                stop = min(self.file_size, end + stream.window)
                if stop > start:
                    prefetch = ((start, stop),)
        return ReadPlan(stream.ident, stream.sequential and tight, prefetch, started, reset, new_random)

    def scheduled(self, stream_id: int, upto: int, complete: bool) -> None:
        """The engine scheduled the plan up to ``upto``; ``complete`` when nothing was declined."""
        for s in self.streams:
            if s.ident == stream_id:
                s.prefetched_to = max(s.prefetched_to, upto)
                if complete:
                    s.window = min(self.max_window, max(s.window * 2, self.initial_window))
                return

    def set_windows(self, initial_window: int, max_window: int) -> None:
        """Apply new limits (reload); current windows are clipped."""
        self.initial_window, self.max_window = initial_window, max_window
        for s in self.streams:
            s.window = min(s.window, max_window)

    def _match(self, offset: int) -> Stream | None:
        best = None
        for s in self.streams:
            slack = min(MAX_SLACK, REORDER_REQUESTS * max(s.request_size, 4096))
            if s.next_offset - slack <= offset <= s.next_offset + slack and (
                best is None or abs(offset - s.next_offset) < abs(offset - best.next_offset)
            ):
                best = s
        return best

    def _new_stream(self, offset: int, size: int) -> tuple[Stream, bool]:
        reset = False
        if len(self.streams) >= MAX_STREAMS:
            victim = min(self.streams, key=lambda s: s.last_use)
            reset = victim.sequential
            self.streams.remove(victim)
        stream = Stream(self._next_id, offset, size, covered=min(size, self.file_size - offset), hits=1)
        self._next_id += 1
        self.streams.append(stream)
        return stream, reset


@dataclass
class RangePlan:
    """Ranges a loader will read, in order, released ``lead`` bytes ahead of the furthest read.

    Positions are counted in *plan order* (bytes of the ranges, one after the other). A read inside
    the released region is a prefetch hit: the watermark moves to ``furthest read + lead``, and the
    lead doubles (up to ``max_lead``) each time the reader has read half of it (bytes read, not
    the distance it skipped). A read past the
    watermark is a jump (an mmap user touching a tensor far ahead, or a lazy loader reading one
    header per tensor): only :data:`JUMP_LEAD` bytes around it are released and the skipped gap is
    left to the stream policy, so a loader that touches little does not pull the whole file.

    Not thread-safe; the engine calls it under the file's lock.
    """

    ranges: tuple[tuple[int, int], ...]
    """(offset, length) in the order the loader reads them."""
    lead: int
    """Bytes released ahead of the reader now; doubles each time the reader consumed half of it."""
    max_lead: int = 0
    """Cap of ``lead`` (0: ``lead`` never grows)."""
    _released: int = 0  # plan position up to which bytes were released
    _cursor: int = 0  # furthest plan position read
    _consumed: int = 0  # bytes read inside released ranges since the lead last doubled

    @property
    def total(self) -> int:
        return sum(length for _, length in self.ranges)

    def _position(self, offset: int) -> tuple[int, int] | None:
        """(plan position of offset, plan position where its range ends) or None outside the plan."""
        pos = 0
        for start, length in self.ranges:
            if start <= offset < start + length:
                return pos + offset - start, pos + length
            pos += length
        return None

    def advance(self, offset: int = -1, end: int = 0) -> list[tuple[int, int]]:
        """A read of [offset, end) happened (offset -1: the initial call); returns newly due (start, stop)."""
        if offset < 0:
            return self._release(self._released, self.lead)
        where = self._position(offset)
        if where is None:
            return []
        position, range_end = where
        stop = min(range_end, position + max(0, end - offset))
        if position > self._released:  # a jump: release a little around it, leave the gap
            self._cursor = max(self._cursor, stop)
            return self._release(position, JUMP_LEAD)
        self._cursor = max(self._cursor, stop)
        self._consumed += stop - position
        if self._consumed >= self.lead // 2:  # the reader read half a lead's worth: grow
            self.lead = max(self.lead, min(self.max_lead, self.lead * 2))
            self._consumed = 0
        return self._release(self._released, self._cursor + self.lead - self._released)

    def _release(self, start: int, length: int) -> list[tuple[int, int]]:
        """Release plan positions [start, start + length) not released yet; returns file ranges."""
        lo_target, hi_target = max(start, 0), start + length
        if start < self._released:
            lo_target = self._released
        out: list[tuple[int, int]] = []
        pos = 0
        for file_start, n in self.ranges:
            lo, hi = max(pos, lo_target), min(pos + n, hi_target)
            if hi > lo:
                out.append((file_start + lo - pos, file_start + hi - pos))
            pos += n
            if pos >= hi_target:
                break
        self._released = max(self._released, min(hi_target, pos))
        return out

    def contains(self, offset: int) -> bool:
        return any(start <= offset < start + length for start, length in self.ranges)


@dataclass
class ScanPolicy:
    """Detects a many-small-file scan of one directory from the order of opens.

    ``on_open`` records an open and says whether it starts a scan (``trigger`` distinct files
    opened). ``plan`` orders the names to prefetch: for a sorted scan the names after the last one
    opened first, then the rest; for a shuffled scan (a sampler's order) every name not read yet.
    ``epoch_over`` tells when a re-open of an already read name means a new pass has begun.
    Not thread-safe; the engine calls it under the directory's lock.
    """

    trigger: int
    opened: set[str] = field(default_factory=set)
    order: list[str] = field(default_factory=list)
    active: bool = False

    def on_open(self, name: str) -> bool:
        """Record an open; True when this open starts a scan."""
        if name in self.opened:
            return False
        self.opened.add(name)
        if len(self.order) < MAX_ORDER:
            self.order.append(name)
        if self.active or len(self.opened) < self.trigger:
            return False
        self.active = True
        return True

    def is_sorted(self) -> bool:
        return self.order == sorted(self.order)

    def plan(self, listing: list[str]) -> list[str]:
        names = sorted(n for n in listing if n not in self.opened)
        if self.order and self.is_sorted():
            last = self.order[-1]
            return [n for n in names if n > last] + [n for n in names if n <= last]
        return names

    def epoch_over(self, name: str, known: int) -> bool:
        """A re-open of ``name`` after most of the ``known`` files were read: a new pass began."""
        return name in self.opened and known > 0 and len(self.opened) >= EPOCH_FRACTION * known


# Opens remembered per directory for the sorted/shuffled decision (bounds memory on huge directories).
MAX_ORDER = 4096
# Share of a directory read before a re-open counts as the start of the next epoch.
EPOCH_FRACTION = 0.5
