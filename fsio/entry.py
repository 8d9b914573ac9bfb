"""One open file version (:class:`FileEntry`): its identity and the state each part keeps on it.

A :class:`FileEntry` stands for one version of one source file (its
:class:`~fastfs.fsio.source.FileKey`) while it has handles (see :mod:`fastfs.fsio.handles`). It keeps
the version's identity and hands each part that keeps state about the version a component of its
own, which only that part writes:

================  ====================  =========================================================
component         owner (the writer)    what
================  ====================  =========================================================
``source``        fills, probe, table   :class:`~fastfs.fsio.source.SourceRef`: the reference-counted
                                        source file (the handle table holds it for the handles)
``stuck_reads``   :mod:`.fills`         :class:`StuckReads`: source reads a reader gave up on
``stream``        :mod:`.fills`         :class:`SourceStream`: the in-order block fills of the
                                        sequential shape (None until the first one)
``format``        :mod:`.probe`         :class:`FormatState`: the format probe, range plan, heads
``reads``         :mod:`.readpath`      :class:`ReadState`: stream policy, byte counters
``group``         :mod:`.pool`          :class:`~fastfs.fsio.pool.FileGroup`: the version's jobs
``handles``       :mod:`.handles`       handles naming the entry
``disk_fd``       :mod:`.opening`       the disk-tier file the kernel reads on passthrough opens
================  ====================  =========================================================

This module is a leaf (it imports only the types of its fields), so the parts that use an entry
import it and not each other: fills, probe, the read path and the handle table have no import
circle.

Concurrency: identity (``path``, ``key``) is set once; ``size``, ``st`` and ``dkey`` too, except
when the version grows (:mod:`fastfs.fsio.refresh`: the file was only appended to, its handles now
read the longer file, and it leaves the disk tier): then they are replaced under the entry's lock
and read without it, one attribute load each (``key`` stays: the key of the version's RAM blocks,
whose bytes an append does not change). The entry's
``lock`` guards the fields of ``stuck_reads``, ``format`` and ``reads`` as each component says
(held only while a policy decides or a count changes, never across I/O), and ``stream`` and its
fields; ``handles`` is guarded by
the handle table's lock, ``source`` by its own, ``group`` by the pool's, ``disk_fd`` as said there.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from fastfs.fsio.policy import RangePlan, StreamPolicy
from fastfs.fsio.pool import FileGroup
from fastfs.fsio.source import FileKey, SourceFile, SourceRef

if TYPE_CHECKING:
    from fastfs.fsio.disk.index import Key as DiskKey


class HeadWindow(NamedTuple):
    """One fetched head window: file bytes [start, stop) in cache block (HeadKey(file key), index)."""

    start: int
    stop: int
    index: int  # type: ignore[assignment]  # the field shadows tuple.index, which no caller uses


class StuckReads:
    """Source reads of the version still running after a reader gave up waiting for them (owned by
    :mod:`fastfs.fsio.fills`, which alone writes it). While ``count`` > 0 new reads of the file fail
    fast, except one per probe period (``probe_at``).

    Concurrency: every field is written under the entry's lock; ``count`` is also read without it as
    a hint and re-checked under it (see :meth:`fastfs.fsio.fills.Fills.fail_fast`); ``clear`` is an
    event set once ``count`` is back at 0, waited on without the lock. It is made only when reads of
    the version get stuck (:meth:`stuck`, before ``count`` leaves 0: a reader that sees ``count`` > 0
    finds it), so an open of a healthy file creates none (an entry is made per open of a version not
    open yet: an Event, with its Condition and lock, cost a measurable share of a hot open)."""

    __slots__ = ("count", "inline", "inline_stuck", "probe_at", "clear")

    def __init__(self) -> None:
        self.count = 0  # source reads (direct or block fills) still running after a reader timed out on them
        self.inline = 0  # source reads running on readers' own threads
        self.inline_stuck = 0  # of those, counted in count: the kernel layer gave up on their readers
        self.probe_at = 0.0  # monotonic time the last read was let through to a stuck file
        self.clear: threading.Event | None = None  # set once count is back at 0 (None: never stuck)

    def stuck(self, now: float) -> None:
        """The first read of a stuck episode (``count`` 0, the entry's lock held; the caller counts it
        next): the probe period starts now, and readers wait on a new, unset ``clear``."""
        self.probe_at = now
        self.clear = threading.Event()

    def unstuck(self) -> None:
        """``count`` is back at 0 (the entry's lock held): wake the readers waiting on ``clear``."""
        if self.clear is not None:
            self.clear.set()


class SourceStream:
    """The version's one source stream in the sequential shape (owned by :mod:`fastfs.fsio.fills`,
    which alone writes it): block fills waiting for the stream, ordered by offset, and the one pool
    job (``runner``) that reads them one after the other; ``pos`` is where the stream stands (the end
    of the last read issued, None before the first).

    Concurrency: every field is guarded by the entry's lock (held only to queue or take a fill)."""

    __slots__ = ("queue", "pos", "runner", "serial")

    def __init__(self) -> None:
        self.queue: list[tuple[int, int, Any]] = []  # (file offset, serial, fill), sorted
        self.pos: int | None = None
        self.runner: Any = None  # the pool job reading the queue, while it is queued or running
        self.serial = 0  # ties of one offset in queue order (a fill is never compared)


class FormatState:
    """What the format probe learned about the version (owned by :mod:`fastfs.fsio.probe`).

    Concurrency: ``probed`` and ``plan`` are written under the entry's lock (``plan`` set once);
    ``planning`` is set under it and cleared by the probe without it (a bool store; readers only steer
    prefetch by it); ``planned`` (the sequential shape only) is made with ``planning`` and set when it
    is cleared, for readers that wait for the plan; ``heads`` is replaced whole under the lock and
    read without it (one attribute load of an immutable tuple); ``maps`` and ``passed`` are one store
    each without a lock (two opens racing to read the head find the same answer; ``passed`` only
    turns True)."""

    __slots__ = ("probed", "planning", "planned", "plan", "heads", "maps", "passed")

    def __init__(self) -> None:
        self.probed = False  # a format probe was started
        self.planning = False  # a format probe is queued or running (its plan will decide what to fetch)
        self.planned: threading.Event | None = None  # set once that probe ended (the sequential shape)
        self.plan: RangePlan | None = None  # the format's range plan
        self.heads: tuple[HeadWindow, ...] = ()  # the fetched head windows, by start
        self.maps: bool | None = None  # the loader maps the file (FormatProbe.loader_maps; None: not read)
        self.passed = False  # an open of the version was passed through by the stream route (Opener)


class ReadState:
    """The read path's state of the version (owned by :mod:`fastfs.fsio.readpath`): the stream
    policy its reads feed and the bytes not yet added to the shared top-files table.

    Concurrency: ``policy``, ``delivered`` and ``direct`` are guarded by the entry's lock (the engine's
    reconfigure and snapshot take it too); ``mmap_seen`` is a bool set once without it; ``exact`` a
    bool each read sets without it (a hint: the last writer wins)."""

    __slots__ = ("policy", "delivered", "direct", "mmap_seen", "exact")

    def __init__(self, policy: StreamPolicy) -> None:
        self.policy = policy
        self.delivered = 0  # bytes delivered, not yet added to the top-files table
        self.direct = 0  # bytes read from the source for them outside blocks, likewise
        self.mmap_seen = False  # out-of-order reads inside the format plan were counted
        # the last read was served whole from the source and was not the whole file (a hint: readpath.direct_offer)
        self.exact = False


class FileEntry:
    """One open file version shared by its handles (see the module docstring for its components)."""

    __slots__ = (
        "path",
        "key",
        "size",
        "st",
        "dkey",
        "lock",
        "source",
        "stuck_reads",
        "stream",
        "format",
        "reads",
        "group",
        "handles",
        "opened_at",
        "disk_fd",
        "superseded",
        "failed_blocks",
    )

    def __init__(
        self,
        path: str,
        key: FileKey,
        size: int,
        st: os.stat_result,
        source: SourceRef,
        policy: StreamPolicy,
        dkey: DiskKey,
    ) -> None:
        self.path = path
        self.key = key
        self.size = size
        self.st = st
        self.dkey = dkey  # key of this version in the disk tier (() without one)
        self.lock = threading.Lock()
        self.source = source
        self.stuck_reads = StuckReads()
        self.stream: SourceStream | None = None  # created by the first fill of the sequential shape
        self.format = FormatState()
        self.reads = ReadState(policy)
        self.group = FileGroup()
        self.handles = 0  # handles naming this entry (the handle table's lock)
        self.opened_at = float("-inf")  # monotonic time of its latest open (the opener's float store, read
        # as a hint): the open was its close-to-open check, the refresher's first growth check is a period later
        self.superseded = False  # its path was opened in a newer version while this one had handles: its
        # blocks are freed at its last release, not before (set under the handle table's lock)
        # block indexes whose fill from the source failed (fills.py): never filled again for this
        # version, reads there go to the source exactly. Filled again for every read, over rclone a file
        # replaced by a smaller one under a stale size cost each page the client's retries (about 0.3 s,
        # the kernel asking page by page after the first failure): one read waited 41-53 s. (A set only
        # added to, under the GIL: read without a lock, a hint.)
        self.failed_blocks: set[int] = set()
        self.disk_fd = -1  # descriptor of the complete disk-tier file handed to the kernel as the backing
        # file of passthrough opens: set once per holding by the opener (Opener.disk_backing, under the
        # entry's lock, while the opening handle keeps the entry), taken by the handle table at the
        # last release (under its lock; no open of the entry can run then)

    # -- read-only views for reports and tests (each part uses its own component) -------------------
    @property
    def src(self) -> SourceFile | None:
        """The source file the handles hold (None while the open was answered from metadata)."""
        return self.source.file

    @property
    def stuck(self) -> int:
        """Source reads a reader gave up on that are still running (:class:`StuckReads`)."""
        return self.stuck_reads.count

    @property
    def range_plan(self) -> RangePlan | None:
        """The format's range plan (:class:`FormatState`), once the probe made one."""
        return self.format.plan

    @property
    def heads(self) -> tuple[HeadWindow, ...]:
        """The fetched head windows (:class:`FormatState`)."""
        return self.format.heads
