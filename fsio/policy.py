"""Pure read-ahead policy: events in, plans out.

Nothing here does I/O, reads a clock or starts a thread, so every decision is testable with
tables and property tests. The engine feeds each read request of an open file version into its
:class:`StreamPolicy`, each open into the mount's :class:`ScanPolicy` (and each scan fetch's time into
its :class:`ScanWindow`: how many fetches a shuffled reader's scan keeps in flight), then carries out the
returned plan (subject to the cache budget) and reports back with :meth:`StreamPolicy.scheduled`.

Streams. One file may be read by several streams at once (two processes, or one handle
interleaving regions). A read continues a stream when it starts within ``slack`` of the stream's
expected next offset; ``slack`` tolerates the kernel's own reordering of concurrent read-ahead
requests (several FUSE threads deliver 1 MiB requests out of order). Only reads within one request
of the expected offset count as evidence of a sequential pattern; looser joins just keep the
stream alive. A stream is sequential after
:data:`SEQ_MIN_HITS` continuing reads covering at least :data:`SEQ_MIN_BYTES`, or at once when it
starts at offset 0 with a read of at least :data:`ZERO_BET_MIN` (the common "load the whole file"
case; the kernel makes the same bet), or after :data:`SEQ_MIN_HITS` reads in a row when it starts at 0 with a
smaller read (a database reading its header page and then at random makes no bet). Its prefetch window starts at
``initial_window`` and doubles, up to ``max_window``, each time the previous plan was scheduled
whole; a plan cut short by backpressure keeps the window. A read that continues no stream starts a
new one, replacing the least recently used; losing a sequential stream that way is a reset.
Streams that are not sequential never prefetch: their reads are served exactly as asked. A version
found to be a program or shared library (ELF, :func:`fastfs.fsio.formats.is_program`) has its windows
capped at :data:`CODE_WINDOW` for good (:meth:`StreamPolicy.cap_windows`, a reload too): the loader maps
it and touches it in short runs, so a window bet at the end of each run would mostly go unread.

Plans along ranges (:class:`RangePlan`) serve format-aware prefetch: the ranges a loader will
read, in order. Beyond a small release at open, bytes are released only ahead of a *run* the
reader has proven by reading it densely (reordered requests and mmap page faults from several
threads join runs too), and within the tensor being read until the run crosses into the next: a
lazy loader that maps a file and touches a page of every tensor must not pull the whole file.
A plan made for a file whose previous load read it whole (``whole``, learned) releases its first
``lead`` bytes at open and does not stop runs at tensor ends. Plans count the bytes read inside
them (``read``), which is what the engine remembers for the next load.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import NamedTuple

# Continuing reads before a stream counts as sequential (two could be coincidence, three is a pattern).
SEQ_MIN_HITS = 3
# Bytes a stream must cover before it counts as sequential: one large random pread reaches us as
# several contiguous requests (the kernel splits it and reads ahead up to 1 MiB), so a stream has to
# outgrow what a single application read can span.
SEQ_MIN_BYTES = 4 * 1024 * 1024
# A first read from offset 0 at least this large makes the whole-file bet at once; after a smaller one
# (a database's or an index's header page, also a loader's first small read) the stream is proven
# by SEQ_MIN_HITS reads in a row, whatever their size: a database goes on at random instead.
ZERO_BET_MIN = 64 * 1024
# Out-of-order tolerance in units of the stream's request size (kernel read-ahead from 10 FUSE threads).
REORDER_REQUESTS = 16
# Cap on the tolerance so a slack computed from huge requests does not swallow real seeks.
MAX_SLACK = 16 * 1024 * 1024
# The request size a slack counts at least (a page: the kernel's reads are whole pages).
SLACK_MIN_REQUEST = 4096
# Streams tracked per file version (several processes or regions read one file at once).
MAX_STREAMS = 8
# Bytes a run of reads inside a format plan must cover before the plan releases anything ahead
# of it: more than one mmap read-around (2 MiB around a faulting page at read_ahead_kb 1024), so a
# lazy loader touching the first page of every tensor is served exactly what it reads.
RUN_CONFIRM = 4 * 1024 * 1024
# A read this close to a run joins it (the kernel reorders concurrent requests by a few MiB).
RUN_SLACK = 4 * 1024 * 1024
# A confirmed run gets this many times what it read released ahead (a fast ramp: a run is only
# confirmed once the reader has read densely, and within one tensor the release stops at its end).
RUN_LEAD_FACTOR = 4
# Smallest release ahead of a confirmed run: two 4 MiB blocks per source stream in flight.
RUN_MIN_LEAD = 32 * 1024 * 1024
# A run counts as walking on into the following ranges (tensors) once it has read this far past
# the end of the range it began in: more than the kernel's own read-ahead of an mmap reader past the
# end of the tensor it is touching.
RUN_CROSS = 8 * 1024 * 1024
# Runs tracked per plan (threads of one mmap load touching different tensors).
MAX_RUNS = 4
# Prefetch window of a program or shared library (ELF): one cache block. The dynamic loader maps it
# and touches it in short runs (headers, symbol and relocation tables, the pages it relocates, code
# as it runs); the next block of a run is still fetched while the loader works on this one, but no
# bet of initial_window..max_window is left unread at each run's end. import torch over issue 14's
# emulator: 6.2 s and 228 MB read at the source with 1 MiB windows, 6.2 s and 311 MB with 8-64 MiB
# (directly: 10.0 s, 102 MB); import numpy gave up 3-5 % of its 1.1x for a third less read.
CODE_WINDOW = 1024 * 1024
# Ranges (tensors) read whole by dense runs, not one after another in plan order, after which a plan
# releases everything (a loader asking for every tensor by name in the model's order, as transformers
# does with safetensors: the file is read whole, only out of order). In file order the stream/run
# logic already follows the reader.
WHOLE_AFTER_RANGES = 3
# Ranges remembered as read whole (bounds a plan's memory for checkpoints of many tensors).
MAX_COMPLETE_TRACKED = 64
# A read within this distance ahead of a stream's prefetched end triggers the next plan
# (asynchronous read-ahead, like the kernel's PG_readahead mark), as a fraction of the window.
TRIGGER_FRACTION = 0.5


@dataclass(slots=True)
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
    from_zero: bool = False  # began with a small read at offset 0: SEQ_MIN_HITS reads prove it, whatever their bytes


def stream_slack(request_size: int) -> int:
    """How far from a stream's next offset a read still joins it (:meth:`StreamPolicy._match` inlines it)."""
    return min(MAX_SLACK, REORDER_REQUESTS * max(request_size, SLACK_MIN_REQUEST))


class ReadPlan(NamedTuple):
    """What to do for one read: which stream it joined and which byte ranges to prefetch (a tuple:
    one is made per read)."""

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
    cap: int = 0
    """Largest window of this version whatever the limits given (0: none; :meth:`cap_windows`)."""
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
            if offset == 0 and size >= ZERO_BET_MIN:
                stream.sequential = True
                stream.hits = SEQ_MIN_HITS
                started = True
            else:
                stream.from_zero = offset == 0
                new_random = True
        else:
            # a tight continuation is evidence and may plan more; a looser join only keeps a
            # reordered stream alive (strided reads, one page per tensor, never pull the file)
            tight = abs(offset - stream.next_offset) <= max(stream.request_size, size)
            if tight:
                stream.hits += 1
                stream.covered += end - offset
            stream.request_size = max(stream.request_size, size)
            # from offset 0, the hits alone prove it (a random reader does not continue its first read
            # twice); elsewhere one large pread split by the kernel must not look sequential
            proven = stream.hits >= SEQ_MIN_HITS and (stream.covered >= SEQ_MIN_BYTES or stream.from_zero)
            if not stream.sequential and proven:
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
        """Apply new limits (reload), within the version's cap; current windows are clipped."""
        if self.cap:
            initial_window, max_window = min(initial_window, self.cap), min(max_window, self.cap)
        self.initial_window, self.max_window = initial_window, max_window
        for s in self.streams:
            s.window = min(s.window, max_window)

    def cap_windows(self, cap: int) -> None:
        """Keep every window of this version at most *cap* bytes from now on (later limits too)."""
        self.cap = cap
        self.set_windows(self.initial_window, self.max_window)

    def direct_windows(self) -> tuple[tuple[int, int], ...] | None:
        """Where a read would join one of the streams ((low, high) offsets, inclusive), for a reader of
        the reads that join none (the kernel layer's direct reads, see :mod:`fastfs.fsio.readpath`);
        None while a stream is sequential (its reads prefetch: every read must come here)."""
        windows = []
        for s in self.streams:
            if s.sequential:
                return None
            slack = stream_slack(s.request_size)
            windows.append((max(0, s.next_offset - slack), s.next_offset + slack))
        return tuple(windows)

    def _match(self, offset: int) -> Stream | None:
        """The tracked stream nearest *offset* whose slack (REORDER_REQUESTS requests of its size, at
        least a page each, at most MAX_SLACK) holds it. (Every read scans up to MAX_STREAMS streams:
        plain comparisons, no min/max/abs calls.)"""
        best = None
        best_d = 0
        for s in self.streams:
            rs = s.request_size
            slack = REORDER_REQUESTS * (rs if rs > SLACK_MIN_REQUEST else SLACK_MIN_REQUEST)
            if slack > MAX_SLACK:
                slack = MAX_SLACK
            d = offset - s.next_offset
            if d < 0:
                d = -d
            if d <= slack and (best is None or d < best_d):
                best, best_d = s, d
        return best

    def _new_stream(self, offset: int, size: int) -> tuple[Stream, bool]:
        reset = False
        if len(self.streams) >= MAX_STREAMS:
            victim = self.streams[0]
            for s in self.streams:  # the least recently used (a loop: every random read of a file comes here)
                if s.last_use < victim.last_use:
                    victim = s
            reset = victim.sequential
            self.streams.remove(victim)
        stream = Stream(self._next_id, offset, size, covered=min(size, self.file_size - offset), hits=1)
        self._next_id += 1
        self.streams.append(stream)
        return stream, reset


@dataclass
class _Run:
    """A contiguous region of a :class:`RangePlan` the reader is walking (plan positions)."""

    start: int
    end: int
    read: int
    first_range: int  # index of the range the run began in
    crossed: bool = False  # the run went on into a following range


class RangePlan:
    """Ranges a loader will read, in order, released ahead of the reader as it proves it reads them.

    Positions are counted in *plan order* (bytes of the ranges, one after the other). The first
    call releases ``lead`` bytes from the start (the loader's first reads come right after its
    header). After that nothing is released for a read until the region around it has been read
    densely: reads join a *run* (a contiguous region, within :data:`RUN_SLACK` of it, so the
    kernel's reordered requests and an mmap's read-around join too); once a run has read
    :data:`RUN_CONFIRM` bytes, the plan releases ``RUN_LEAD_FACTOR`` x what the run read (at least
    :data:`RUN_MIN_LEAD`, at most ``max_lead``) past the run's end. Until the run has crossed into a
    following range (read :data:`RUN_CROSS` bytes past the end of the one it began in), the release
    stops at the end of its own range: a reader that touches one tensor is shown to want that
    tensor, not the next. A lazy loader that maps a file and touches
    a page or two of every tensor never confirms a run, so it is served exactly what it reads.

    Several runs are tracked at once (:data:`MAX_RUNS`: threads of one mmap load touching different
    tensors). Released regions are remembered, so no byte is released twice. With ``whole`` (the
    previous load of this file read all of it) the release at open is usually the whole plan, and
    runs are not held at the end of their range. A plan becomes ``whole`` on the way too, once
    dense runs have read :data:`WHOLE_AFTER_RANGES` ranges whole out of plan order (a loader asking
    for every tensor by name in another order than the file's).

    Not thread-safe; the engine calls it under the file's lock.
    """

    def __init__(self, ranges: tuple[tuple[int, int], ...], lead: int, max_lead: int = 0, whole: bool = False) -> None:
        self.ranges = tuple((start, length) for start, length in ranges if length > 0)
        """(offset, length) in the order the loader reads them."""
        self.lead = lead
        """Bytes released by the first call (before any read)."""
        self.whole = whole
        """The reader is expected to read the whole plan (learned from the previous load)."""
        self.read = 0
        """Bytes of reads that fell inside the plan (re-reads count again)."""
        self.max_lead = max(max_lead, RUN_MIN_LEAD)
        """Cap of the bytes released ahead of one run."""
        self._plan_starts: list[int] = []  # plan position of each range
        pos = 0
        for _, length in self.ranges:
            self._plan_starts.append(pos)
            pos += length
        self.total = pos
        # ranges sorted by file offset, for bisect: (file start, range index)
        self._by_offset = sorted((start, i) for i, (start, _) in enumerate(self.ranges))
        self._offsets = [start for start, _ in self._by_offset]
        self._released: list[tuple[int, int]] = []  # merged, sorted released plan intervals
        self._runs: list[_Run] = []  # most recently used last
        self.confirmed = False
        """The last read's run is confirmed (the reader is walking the plan densely there)."""
        self._complete: set[int] = set()  # ranges a confirmed run covered whole

    def _locate(self, offset: int) -> int | None:
        """Index of the range holding file ``offset``, or None (plans hold disjoint ranges; in a
        malformed one that overlaps, only the range starting last at or before ``offset`` counts)."""
        k = bisect.bisect_right(self._offsets, offset) - 1
        if k < 0:
            return None
        start, i = self._by_offset[k]
        return i if offset < start + self.ranges[i][1] else None

    def contains(self, offset: int) -> bool:
        return self._locate(offset) is not None

    def advance(self, offset: int = -1, end: int = 0) -> list[tuple[int, int]]:
        """A read of [offset, end) happened (offset -1: the initial call); returns newly due (start, stop)."""
        if offset < 0:
            return self._release(0, self.lead)
        index = self._locate(offset)
        if index is None:
            return []
        start, length = self.ranges[index]
        position = self._plan_starts[index] + offset - start
        stop = self._plan_starts[index] + min(length, max(offset + 1, end) - start)
        self.read += stop - position
        run = self._join(position, stop, index)
        self.confirmed = run.read >= RUN_CONFIRM
        if not self.confirmed:
            return []
        promoted: list[tuple[int, int]] = []
        if not self.whole and self._completes(run, index):
            # dense reads have taken whole tensors in an order other than the file's (a loader that
            # asks for every tensor by name): the whole plan is wanted, only out of order
            self.whole = True
            promoted = self._release(0, self.max_lead)
        ahead = min(self.max_lead, max(RUN_MIN_LEAD, RUN_LEAD_FACTOR * run.read))
        limit = run.end + ahead
        if not run.crossed and not self.whole:
            limit = min(limit, self._plan_starts[run.first_range] + self.ranges[run.first_range][1])
        return promoted + self._release(run.end, limit)

    def _completes(self, run: _Run, index: int) -> bool:
        """Count range *index* as read whole once a confirmed run covers it; True when that makes
        :data:`WHOLE_AFTER_RANGES` ranges, not all one after another in plan order."""
        plan_start = self._plan_starts[index]
        if index in self._complete or run.start > plan_start or run.end < plan_start + self.ranges[index][1]:
            return False
        if len(self._complete) < MAX_COMPLETE_TRACKED:
            self._complete.add(index)
        if len(self._complete) < WHOLE_AFTER_RANGES:
            return False
        ordered = sorted(self._complete)
        return ordered != list(range(ordered[0], ordered[0] + len(ordered)))

    def _join(self, position: int, stop: int, index: int) -> _Run:
        for run in reversed(self._runs):
            if run.start - RUN_SLACK <= position <= run.end + RUN_SLACK:
                run.start = min(run.start, position)
                run.end = max(run.end, stop)
                run.read += stop - position
                if not run.crossed:
                    first_end = self._plan_starts[run.first_range] + self.ranges[run.first_range][1]
                    run.crossed = run.end >= first_end + RUN_CROSS
                self._runs.remove(run)
                self._runs.append(run)
                return run
        if len(self._runs) >= MAX_RUNS:
            self._runs.pop(0)
        run = _Run(position, stop, stop - position, index)
        self._runs.append(run)
        return run

    def _release(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """Release plan positions [lo, hi) not released yet; returns their file ranges in plan order."""
        hi = min(hi, self.total)
        if hi <= lo:
            return []
        fresh: list[tuple[int, int]] = []
        cursor = lo
        for a, b in self._released:
            if b <= cursor:
                continue
            if a >= hi:
                break
            if a > cursor:
                fresh.append((cursor, a))
            cursor = max(cursor, b)
        if cursor < hi:
            fresh.append((cursor, hi))
        if not fresh:
            return []
        self._released = _merge_intervals([*self._released, (lo, hi)])
        out: list[tuple[int, int]] = []
        for a, b in fresh:
            i = bisect.bisect_right(self._plan_starts, a) - 1
            while a < b and i < len(self.ranges):
                file_start, length = self.ranges[i]
                plan_start = self._plan_starts[i]
                piece_end = min(b, plan_start + length)
                if piece_end > a:
                    lo, hi = file_start + a - plan_start, file_start + piece_end - plan_start
                    if out and out[-1][1] == lo:  # back-to-back tensors: one file range
                        out[-1] = (out[-1][0], hi)
                    else:
                        out.append((lo, hi))
                a = piece_end
                i += 1
        return out

    @property
    def released_bytes(self) -> int:
        return sum(b - a for a, b in self._released)

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant: ranges non-empty and their plan
        positions cumulative, the released intervals sorted, disjoint, non-touching and inside the
        plan, runs inside the plan and at most :data:`MAX_RUNS`, completed ranges real ones."""
        pos = 0
        for i, ((start, length), plan_start) in enumerate(zip(self.ranges, self._plan_starts, strict=True)):
            assert length > 0 and start >= 0, f"range plan: range {i} is ({start}, {length})"
            assert plan_start == pos, f"range plan: range {i} at plan position {plan_start}, expected {pos}"
            pos += length
        assert self.total == pos, f"range plan: total {self.total} != {pos} bytes of ranges"
        assert self._offsets == sorted(start for start, _ in self.ranges), "range plan: offset index out of date"
        last = -1
        for a, b in self._released:
            assert 0 <= a < b <= self.total, f"range plan: released [{a}, {b}) outside [0, {self.total})"
            assert a > last, f"range plan: released intervals not sorted and merged at [{a}, {b})"
            last = b
        assert self.read >= 0, f"range plan: read {self.read}"
        assert len(self._runs) <= MAX_RUNS, f"range plan: {len(self._runs)} runs tracked, at most {MAX_RUNS}"
        for run in self._runs:
            assert 0 <= run.start <= run.end <= self.total, f"range plan: run [{run.start}, {run.end}) outside the plan"
            assert 0 <= run.first_range < len(self.ranges), f"range plan: run begins in range {run.first_range}"
        assert len(self._complete) <= MAX_COMPLETE_TRACKED, "range plan: too many completed ranges tracked"
        assert all(0 <= i < len(self.ranges) for i in self._complete), "range plan: completed range out of bounds"


def file_order(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """File ranges ``(start, stop)`` (a plan's release, in the loader's order) sorted by offset, the
    overlapping and touching ones joined: the order one stream reads them in (the sequential shape)."""
    return _merge_intervals(ranges)


def _merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted [start, stop) intervals with overlapping and touching ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


@dataclass
class ScanPolicy:
    """Detects a many-small-file scan of one directory from the order of opens, and bounds what a
    scan in name order fetches ahead.

    ``on_open`` records an open and says whether it starts a scan (``trigger`` distinct files
    opened). ``plan`` orders the names to prefetch: for a sorted scan the names after the last one
    opened first, then the rest; for a shuffled scan (a sampler's order) every name not read yet.
    ``epoch_over`` tells when a re-open of an already read name means a new pass has begun.
    While a learned set is replayed (``learn``) only opens outside it start a scan: a job that read
    a tenth of the directory last time gets that tenth fetched, not the rest as well.

    A reader in name order shows what it will read: the names it passed. Once the scan's listing is
    placed (``place``), ``may_fetch`` lets a scan fetch only the :data:`SORTED_LEAD_FILES` names
    after the reader's last open, and none while the reader opened fewer than
    :data:`SORTED_MIN_USE` of the names it passed: a reader of the first 100 files of 10,000 is not
    given the whole directory. A reader whose last :data:`STRIDE_CONFIRM` steps through the listing
    were the same number of names (a rank reading every k-th file, as ``DistributedSampler`` without
    shuffling hands out) is strided (``stride``): the next :data:`SORTED_LEAD_FILES` names on its
    stride may be fetched and ``skips`` tells the scan to drop the names between them, which the
    reader passes over. A shuffled reader shows nothing until its pass ends, so a shuffled scan (or a
    replay of a learned set: ``replaying``) is not bounded here.
    Not thread-safe; the engine calls it under the directory's lock.
    """

    trigger: int
    opened: set[str] = field(default_factory=set)
    order: list[str] = field(default_factory=list)
    active: bool = False
    in_order: bool = True  # every open so far came after the one before it in name order
    replaying: bool = False  # the scan replays a learned set: fetched whatever the order
    learned: frozenset[str] = frozenset()  # the learned set replayed (``learn``): its opens start no scan
    outside: int = 0  # distinct names opened outside ``learned``: what starts a scan
    index: dict[str, int] | None = None  # name -> position in the sorted listing (``place``)
    first: int = -1  # lowest position opened (-1: none placed yet)
    last: int = -1  # the reader's position: that of the last open (in order)
    placed: int = 0  # opened names that have a position
    step: int = 0  # the last step of the reader in name order (positions between two opens; 0: none)
    steps: int = 0  # how many steps in a row were ``step`` long

    def on_open(self, name: str) -> bool:
        """Record an open; True when this open starts a scan."""
        if name in self.opened:
            return False
        if self.order and name < self.order[-1]:
            self.in_order = False
        self.opened.add(name)
        if len(self.order) < MAX_ORDER:
            self.order.append(name)
        elif self.in_order:
            self.order[-1] = name  # (past MAX_ORDER only the last name is needed: the reader's place)
        self._place_open(name)
        if name not in self.learned:
            self.outside += 1
        if self.active or self.outside < self.trigger:
            return False
        self.active = True
        return True

    def learn(self, names: frozenset[str]) -> None:
        """A learned set of *names* is replayed: opens of its names start no scan (it is fetched
        already); ``trigger`` names outside it do (the reader reads beyond what it read last time)."""
        self.replaying = True
        self.learned = names
        self.outside = len(self.opened - names)

    def is_sorted(self) -> bool:
        return self.in_order

    def plan(self, listing: list[str]) -> list[str]:
        names = sorted(n for n in listing if n not in self.opened)
        if self.order and self.is_sorted():
            last = self.order[-1]
            return [n for n in names if n > last] + [n for n in names if n <= last]
        return names

    def place(self, listing: list[str]) -> None:
        """Index the directory's whole *listing* by name order (once per scan): the positions
        ``may_fetch`` bounds a sorted scan by."""
        self.index = {n: i for i, n in enumerate(sorted(listing))}
        self.first = self.last = -1
        self.placed = self.step = self.steps = 0
        for name in self.order:  # in the order opened: the reader's steps
            self._place_open(name)
        if len(self.opened) > len(self.order):  # (past MAX_ORDER: counted, their steps unknown)
            kept = set(self.order)
            for name in self.opened - kept:
                self._place_open(name, steps=False)

    def _place_open(self, name: str, steps: bool = True) -> None:
        if self.index is None:
            return
        i = self.index.get(name)
        if i is None:
            return  # (a name newer than the listing)
        if steps:
            if self.last >= 0 and i > self.last:
                step = i - self.last
                self.steps = self.steps + 1 if step == self.step else 1
                self.step = step
            elif self.last >= 0:
                self.step = self.steps = 0  # (a step back: no stride)
        self.placed += 1
        self.first = i if self.first < 0 else min(self.first, i)
        self.last = max(self.last, i)

    def stride(self) -> int:
        """The reader's stride through the listing: the length of its last :data:`STRIDE_CONFIRM` steps
        when they were all the same and longer than one name (a rank's every k-th file), else 0."""
        return self.step if self.step > 1 and self.steps >= STRIDE_CONFIRM else 0

    def lead(self) -> int:
        """Names past the reader's position a sorted scan may fetch: :data:`SORTED_LEAD_FILES` while
        the reader opened at least :data:`SORTED_MIN_USE` of the names it passed, else 0."""
        passed = self.last - self.first + 1 if self.first >= 0 else 0
        if passed > 0 and self.placed < SORTED_MIN_USE * passed and not self.stride():
            return 0
        return SORTED_LEAD_FILES

    def bounded(self) -> bool:
        """True when ``may_fetch`` bounds this scan: a placed listing and a reader in name order at a
        known position (a scan ahead of a walk has no reader yet: it fetches the directory, the
        reader may enter it from either end)."""
        return self.index is not None and self.in_order and not self.replaying and self.first >= 0

    def may_fetch(self, name: str) -> bool:
        """May the scan fetch *name* now? Always, unless :meth:`bounded`; then only a name within
        :meth:`lead` names after the reader's position, or, for a strided reader, one of the next
        :meth:`lead` names on its stride (a name the listing lacks: yes)."""
        i = self._bounded_position(name)
        if i is None:
            return True
        stride = self.stride()
        if stride:
            return self.last < i <= self.last + self.lead() * stride and (i - self.last) % stride == 0
        return self.last < i <= self.last + self.lead()

    def _bounded_position(self, name: str) -> int | None:
        """*name*'s position in the placed listing when :meth:`bounded` bounds this scan, else None
        (not bounded, or a name the listing lacks)."""
        if not self.bounded():
            return None
        assert self.index is not None
        return self.index.get(name)

    def skips(self, name: str) -> bool:
        """True when a scan of a strided reader will not fetch *name* while the reader goes on as it
        does: the name is behind the reader, or off its stride (the scan drops it from its queue;
        the names on the stride are fetched as the reader comes near them). Any other bounded scan
        keeps such a name queued: a reader that leaves name order later (a shuffle after a few
        opens in order) gets it fetched then."""
        i = self._bounded_position(name)
        stride = self.stride()
        return i is not None and stride > 0 and (i <= self.last or (i - self.last) % stride != 0)

    def windowed(self) -> bool:
        """True when this scan's fetches in flight follow a :class:`ScanWindow`: its reader opened
        names out of name order (shuffled, several workers, or any order the names do not tell) and
        no learned set is replayed. Such a reader may read any part of the directory, so the scan
        may fetch much that is never read, and on a source that queues requests the reader's own
        would wait behind it. A reader in name order (whose scan fetches its next names), a scan
        ahead of a walk (no reader yet) and a replay (the set read last time) are not windowed."""
        return bool(self.opened) and not self.in_order and not self.replaying

    def epoch_over(self, name: str, known: int) -> bool:
        """A re-open of ``name`` after most of the ``known`` files were read: a new pass began."""
        return name in self.opened and known > 0 and len(self.opened) >= EPOCH_FRACTION * known


@dataclass(frozen=True)
class Siblings:
    """The subdirectories of one parent, in the listing's order and in name order, indexed once per
    listing (a walk asks at each directory it enters: no sort or search per question)."""

    orders: tuple[tuple[str, ...], ...]
    indexes: tuple[dict[str, int], ...]

    @classmethod
    def of(cls, names: list[str]) -> Siblings:
        orders = (tuple(names), tuple(sorted(names)))
        return cls(orders, tuple({n: i for i, n in enumerate(o)} for o in orders))

    def walk_ahead(self, previous: str, arrived: str, depth: int) -> list[str]:
        """The siblings to scan ahead of a walk (at most *depth*): the reader arrived in *arrived* right
        after *previous*. When *previous* comes just before *arrived* in the listing's order or in name
        order, the walk goes that way and the *depth* siblings after *arrived* in it are returned;
        otherwise (a jump, a revisit, a name not listed) none.

        >>> Siblings.of(["a", "c", "b", "d"]).walk_ahead("a", "b", 1)
        ['c']
        >>> Siblings.of(["a", "b", "c", "d"]).walk_ahead("a", "c", 1)
        []
        """
        if depth <= 0 or previous == arrived:
            return []
        for order, index in zip(self.orders, self.indexes, strict=True):
            i = index.get(arrived)
            if i is not None and i > 0 and order[i - 1] == previous:
                return list(order[i + 1 : i + 1 + depth])
        return []


# Opens remembered per directory for the sorted/shuffled decision (bounds memory on huge directories).
MAX_ORDER = 4096
# Share of a directory read before a re-open counts as the start of the next epoch.
EPOCH_FRACTION = 0.5
# Names a scan in name order fetches past the reader's last open: 8 rounds of the scanner's 32
# fetches in flight, so a reader of the whole directory waits on the source, never on this bound,
# while a reader that stops leaves at most this many files fetched and never read.
SORTED_LEAD_FILES = 256
# Share of the names it passed a reader in name order must have opened for its scan to fetch ahead:
# a scan then fetches at most 1.25x the files read (a reader skipping names with no stride is left to
# read its own, as it would directly; a strided one is told by its steps, STRIDE_CONFIRM).
SORTED_MIN_USE = 0.8
# Steps of the same length in a row (positions in name order between a reader's opens) that make it
# strided: four equal steps are no accident of a reader skipping names (a shuffled or irregular reader
# shows steps that differ), and a rank of a strided shard shows them after five opens.
STRIDE_CONFIRM = 4

# Fetches in flight a windowed scan starts with (ScanWindow): one, so its first round measures a fetch
# with none of the scan's ahead of it (the base every later round is compared with).
SCAN_WINDOW_START = 1
# Mean fetches in flight of a round that measures the base (ScanWindow.base): a round at window 1.
SCAN_WINDOW_BASE_FLIGHT = 1.5
# Which of that round's times, quickest first, is the base: the second quickest of at least 8. Not the
# median: where the reader's own requests share the source's one queue, half of a lone fetch's times
# include waiting for the reader's (a base twice the source's time hides the scan's queue: the window
# grew to 6 over a source answering one fetch at a time and never stopped). Not the quickest: one
# lucky time would make every later round look queued (times spread by a third on a busy host).
SCAN_WINDOW_BASE_RANK = 1
# Fetches a window adjusts on at least (the mean of a round of noisy times decides).
SCAN_WINDOW_ROUND = 8
# The source's queue a window keeps, in fetches (Vegas): grown at SCAN_WINDOW_QUEUE_LOW or below, shrunk
# above SCAN_WINDOW_QUEUE_HIGH. A fetch that waits behind one more is one more round trip the
# shuffled reader's own request may wait too.
SCAN_WINDOW_QUEUE_LOW = 1.25
SCAN_WINDOW_QUEUE_HIGH = 2.0
# ... or, for a wide window, these shares of it (a base a tenth off, from noisy times, reads as a
# tenth of the window queued: a window of 32 would otherwise shrink on noise alone).
SCAN_WINDOW_QUEUE_LOW_SHARE = 0.125
SCAN_WINDOW_QUEUE_HIGH_SHARE = 0.25
# Fetches a source overlaps, at most, for a windowed scan to stop (window 0). One that answers them one
# at a time (rclone's mount of small files, a CPU-bound object server) shows 1 to 1.5 (a fetch behind k
# others takes k + 1 times a lone one; the reader's own requests in the same queue slow the lone one
# too); one that overlaps 3 shows 2.25 or more, so 1.75 parts them (one that overlaps 2 may be
# stopped while its reader keeps it busy). There a shuffled reader's scan gains nothing (the source's
# one queue does the same work either way) and its fetches of names never read are the reader's wait
# (a shuffled tenth over rclone: 0.12x direct with 32 in flight).
SCAN_WINDOW_SERIAL = 1.75
# The stop test's rounds: at least this many in flight (with 1 or 2 a source overlapping 2 cannot be
# told from one overlapping 1 through noisy times) ...
SCAN_WINDOW_SERIAL_TEST = 3
# ... by a window never larger than this (noise lets one of 3 on a source answering one at a time grow
# to 4 for a round; a source that let it grow past overlaps 3 or more, and a later slow round is the
# host's noise or the source's load, which shrinks the window but stops no scan).
SCAN_WINDOW_SERIAL_PEAK = 4
# Rounds in a row that must show the source answering one at a time before the scan stops (one round
# of 8 fetches can be slow on a busy host).
SCAN_WINDOW_SERIAL_ROUNDS = 2


@dataclass
class ScanWindow:
    """How many fetches a windowed scan (:meth:`ScanPolicy.windowed`) keeps in flight: as many as
    the source overlaps, and not many more (TCP Vegas's rule on fetch times).

    Every fetch reports how long it took and how many of the scan's fetches were in flight when it ended
    (``done``); a round is at least :data:`SCAN_WINDOW_ROUND` fetches and one window. The window starts
    at 1, and ``base`` is the lowest second quickest time of a round at window 1
    (:data:`SCAN_WINDOW_BASE_RANK`): the source's time for one fetch with nothing waiting ahead of it. Each later round
    estimates the fetches queued at the source as ``in flight x (1 - base / mean time)`` (the mean: by
    Little's law it grows with the queue however unfairly the source serves it): none while
    the source overlaps them all (their times stay at the base), the whole window less one on a source
    that answers one at a time (the times grow with the window). At most :data:`SCAN_WINDOW_QUEUE_LOW`
    queued: the window grows by half (the source has room; it doubles until the first round that did not
    grow it, as TCP's slow start: a source overlapping 30 fetches gets them after five rounds); more
    than :data:`SCAN_WINDOW_QUEUE_HIGH`: it shrinks by a quarter, to 1 at least (a wide window keeps a
    share of itself queued instead, :data:`SCAN_WINDOW_QUEUE_HIGH_SHARE`: noise). So a source that
    overlaps 10 fetches gets 10 to 15 in flight, and the reader's own request waits behind one or two of
    the scan's, wherever the scan may be fetching names it never reads.

    The same round tells the fetches the source overlaps: ``in flight x base / mean time``.
    :data:`SCAN_WINDOW_SERIAL_ROUNDS` rounds in a row of :data:`SCAN_WINDOW_SERIAL_TEST` in flight, by a
    window never larger than :data:`SCAN_WINDOW_SERIAL_PEAK`, that show fewer than
    :data:`SCAN_WINDOW_SERIAL` stop the scan (window 0, ``stopped``): a source that answers one fetch at
    a time does the reader's work and the scan's in one queue, so the scan cannot get ahead of the
    reader and only adds its names the reader never opens. The scan's next epoch measures again. Pure:
    the scanner measures the times.
    """

    most: int  # the window's upper bound (the scanner's SCAN_PARALLEL)
    size: int = SCAN_WINDOW_START
    base: float = float("inf")  # seconds: the lowest second quickest time of a round at window 1 (inf: none)
    times: list[float] = field(default_factory=list)  # this round's fetch times
    inflight: int = 0  # this round's sum of fetches in flight as each ended
    peak: int = 0  # the largest window so far
    starting: bool = True  # no round has held or shrunk the window yet (it doubles: slow start)
    serial: int = 0  # stop-test rounds in a row that showed a source answering one fetch at a time

    def __post_init__(self) -> None:
        self.size = max(1, min(self.size, self.most))
        self.peak = self.size

    @property
    def stopped(self) -> bool:
        return self.size == 0

    def done(self, seconds: float, inflight: int) -> int:
        """A fetch took *seconds*, ending with *inflight* fetches of the scan in flight (itself
        included); returns the window (changed at the end of a round; 0: stopped)."""
        if self.stopped:
            return 0
        self.times.append(seconds)
        self.inflight += inflight
        if len(self.times) < max(self.size, SCAN_WINDOW_ROUND):
            return self.size
        times = sorted(self.times)
        mean = sum(times) / len(times)
        flight = self.inflight / len(times)
        self.times.clear()
        self.inflight = 0
        if flight <= SCAN_WINDOW_BASE_FLIGHT:
            self.base = min(self.base, times[SCAN_WINDOW_BASE_RANK])
        if self.base == float("inf"):
            return self.size  # (no round at window 1 yet: a scan windowed while more were in flight)
        # (the round's mean: by Little's law it grows with the queue however the source orders it; a
        # source that serves some fetches at once and starves others keeps a median at the base)
        overlapped = flight * min(1.0, self.base / mean) if mean > 0 else flight
        queued = flight - overlapped
        testing = flight >= SCAN_WINDOW_SERIAL_TEST and self.peak <= SCAN_WINDOW_SERIAL_PEAK
        if testing:  # (a round at a smaller window neither counts nor breaks the run)
            self.serial = self.serial + 1 if overlapped < SCAN_WINDOW_SERIAL else 0
        if self.serial >= SCAN_WINDOW_SERIAL_ROUNDS:
            self.size = 0
        elif queued <= max(SCAN_WINDOW_QUEUE_LOW, flight * SCAN_WINDOW_QUEUE_LOW_SHARE):
            self.size = min(self.most, self.size * 2 if self.starting else self.size + max(1, self.size // 2))
        elif queued > max(SCAN_WINDOW_QUEUE_HIGH, flight * SCAN_WINDOW_QUEUE_HIGH_SHARE):
            self.size = max(1, self.size - max(1, self.size // 4))
            self.starting = False
        else:
            self.starting = False
        self.peak = max(self.peak, self.size)
        return self.size


# -- open routes ---------------------------------------------------------------------------------
ROUTE_SERVED = "served"
ROUTE_PASSTHROUGH = "passthrough"


def choose_route(mode: str, kernel_can: bool, source_local: bool) -> str:
    """How an open file is read: ``served`` (through the engine: RAM cache, prefetch, stats) or
    ``passthrough`` (the kernel reads the source file itself, at the source's own speed).

    *mode* is ``fuse.passthrough``: ``off`` always serves; ``on`` passes through whenever the kernel
    connection can (*kernel_can*); ``auto`` passes through only local sources (*source_local*: block
    device filesystems and tmpfs, where fastfs's parallel prefetch has nothing to hide and every
    FUSE request is pure cost), never network or FUSE sources, which are latency-bound.
    """
    if not kernel_can or mode == "off":
        return ROUTE_SERVED
    if mode == "on" or source_local:
        return ROUTE_PASSTHROUGH
    return ROUTE_SERVED


def stream_route_applies(
    mode: str, kernel_can: bool, natural: str, stream: bool, size: int, small_max: int, disk_tier: bool = False
) -> bool:
    """Whether the route of an open depends on how the file's loader reads it (then
    :func:`stream_file_route` decides, from the file's first bytes): on a source read as one stream
    per file (*stream*: the sequential shape, a client that serves a handle as one ranged download),
    for a file above *small_max* (the small-file scan's size: smaller files stay served, where the scan
    keeps several in flight and hides the source's latency), with ``fuse.passthrough`` ``auto``
    (*mode*), a kernel that can pass through (*kernel_can*), a source otherwise served (*natural*)
    and no disk tier (*disk_tier*: a mount that has one asked for local copies of what it reads, which
    only served reads make; its later opens pass through to the complete copy)."""
    return kernel_can and mode == "auto" and natural == ROUTE_SERVED and stream and size > small_max and not disk_tier


def stream_file_route(loader_maps: bool | None, jumps_waste: bool = True, reused: bool = False) -> str:
    """The route of a large file on a source read as one stream per file (see
    :func:`stream_route_applies`), from whether its format's loader maps it (*loader_maps*; None: not
    known, its first bytes unread or unreadable) and whether a jump on one of the source's handles
    wastes a download (*jumps_waste*: :attr:`fastfs.fsio.shape.Shaper.jumps_waste`).

    A loader that reads in order (``np.load``, ``torch.load``, ``pickle.load``) gets nothing from the
    served route there: the client already streams the handle ahead of it, and serving adds a copy
    and a round trip per request (measured over loopback s3fs and rclone, 256 MiB np.load, medians of
    9: passed through 1.01x and 1.04x of direct reads, served 0.71-0.92x before): such files pass
    through. A loader that maps the file (safetensors) faults pages in out of order: where a jump
    restarts a download (rclone: the server read 90-219x the file, 12x slower than served, where
    fastfs reads the file once in order and answers the faults from RAM) it is served, as is a file
    whose head could not be read (fastfs's read path times out a hung source); where a jump costs one
    ranged request and nothing more (s3fs) it passes through too.

    A version opened again (*reused*: passed through or read before on this mount, no handle holding
    it passed through now) is served whatever its loader: a reload through the client costs its whole
    download again (np.load of 256 MiB over rclone: 0.67-0.80 s every time directly or passed
    through), while served, the load fills the RAM cache once and every later one reads RAM
    (0.09-0.10 s)."""
    if reused:
        return ROUTE_SERVED
    if loader_maps is False or not jumps_waste:
        return ROUTE_PASSTHROUGH
    return ROUTE_SERVED


# -- directory listings with attributes ----------------------------------------------------------
def listing_attributes(setting: bool, source_local: bool) -> bool:
    """Whether listings carry attributes (READDIRPLUS negotiated with the kernel), from
    ``fuse.readdirplus`` (*setting*) and whether the source is local (*source_local*).

    Attributes cost one source stat per entry, made before the listing is answered; the kernel keeps
    them only for the first buffer of a listing (``READDIRPLUS_AUTO`` goes back to plain READDIR
    after it unless lookups come in between), so on a source whose stats are round trips (network,
    FUSE clients, lookups answered one at a time) a listing with attributes costs the source what a
    lookup of every entry would, and the reader's LOOKUPs arrive anyway: plain listings there (a
    listing costs what the source's own listing does; issue 21: ``os.listdir`` of 10,000 files took
    10.9 s with attributes, 0.01 s directly). On a local source a stat is a cached inode read and a
    tree walk's lookups are saved where the kernel keeps the attributes: as the setting says."""
    return setting and source_local
