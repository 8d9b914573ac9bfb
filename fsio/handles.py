"""The handle table: open file versions (:class:`FileEntry`), the handles that name them, and versions.

One :class:`FileEntry` stands for one version of one source file (its :class:`~fastfs.fsio.source.FileKey`)
while it has handles; every handle of that version (opens, open-less readers, warm jobs) maps to it.
The table is the one place that:

* allocates handles (:meth:`HandleTable.attach`, never 0: 0 is an open-less read), counting each on
  the entry of its version and naming it in the table in one locked step, and remembers each
  path's last version (``versions``: a new version of a path frees the old one's blocks at once);
* counts source-file references (:meth:`get_source` / :meth:`put_source`): block fills and exact
  reads hold one while their preads run, so a release never closes a descriptor under a read;
* keeps an entry whose reads are stuck after its last handle closed (:meth:`unstuck` forgets it);
* tracks the implicit handles of open-less readers (``fuse.no_open``), least recently used dropped.

Concurrency: ``lock`` guards ``_handles``, ``_entries``, ``versions``, ``_implicit``, ``_next_fh``,
each entry's ``handles``, ``src`` and ``disk_fd``, and source-file reference counts. :meth:`get`
reads ``_handles`` without it: one dict lookup is atomic under the GIL, and an entry found stays a
valid object after a concurrent release (its reads then fail or finish normally). The lock is never
held across I/O (a source open or close happens outside it). Each entry's own ``lock`` guards its
policy, range plan and read counters (see the field comments).
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from fastfs.fsio.policy import RangePlan, StreamPolicy
from fastfs.fsio.pool import FileGroup
from fastfs.fsio.source import FileKey, Source, SourceFile

if TYPE_CHECKING:  # (probe.py imports this module)
    from fastfs.fsio.probe import HeadWindow

# Paths whose last file key is remembered (a new version frees the old one's blocks at once).
MAX_VERSIONS = 100_000
# Open-less readers (fuse.no_open) tracked; least recently used closed first.
MAX_IMPLICIT = 256


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


@dataclass
class FileEntry:
    """State of one open file version shared by its handles."""

    path: str
    key: FileKey
    size: int
    src: SourceFile | None  # its source file, once opened (the table's lock)
    st: os.stat_result
    policy: StreamPolicy  # guarded by lock
    lock: threading.Lock = field(default_factory=threading.Lock)
    handles: int = 0  # handles naming this entry (the table's lock)
    range_plan: RangePlan | None = None  # the format plan (guarded by lock; set once by the probe)
    probed: bool = False  # a format probe was started (guarded by lock)
    planning: bool = False  # a format probe is queued or running (the plan will decide what to fetch);
    # set under lock, cleared by the probe without it (a bool store; readers only steer prefetch by it)
    mmap_seen: bool = False  # out-of-order reads inside the plan were counted (a bool set once, no lock)
    heads: tuple[HeadWindow, ...] = ()  # the fetched head windows (by start): replaced
    # whole under lock, read without it (one attribute load of an immutable tuple)
    inline: int = 0  # source reads running on readers' own threads (guarded by lock)
    inline_stuck: int = 0  # of those, counted in stuck: the kernel layer gave up on their readers (lock)
    stuck: int = 0  # source reads (direct or block fills) still running after a reader timed out on
    # them (written under lock; read without it as a hint, re-checked under it: see fills.Fills.fail_fast)
    probe_at: float = 0.0  # monotonic time the last read was let through to a stuck file (guarded by lock)
    unstuck: threading.Event = field(default_factory=lambda: _set(threading.Event()))  # set while
    # stuck == 0 (changed under lock)
    group: FileGroup = field(default_factory=FileGroup)  # this version's jobs in the pool (the pool's lock)
    delivered: int = 0  # bytes delivered, not yet added to the top-files table (guarded by lock)
    direct: int = 0  # bytes read from the source for them outside blocks, likewise
    dkey: tuple = ()  # key of this version in the disk tier (() without one); set once
    disk_fd: int = -1  # descriptor of its complete disk-tier file handed to the kernel as the backing
    # file of passthrough opens (the table's lock; closed with the last handle)


@dataclass(frozen=True)
class Released:
    """What the release of one handle leaves the caller to do outside the table's lock."""

    entry: FileEntry
    last_handle: bool
    src: SourceFile | None  # the source reference to put back (last handle), or None
    disk_fd: int  # the disk-tier descriptor to close (last handle), or -1


class Attached(NamedTuple):
    """What :meth:`HandleTable.attach` did, for the caller to finish outside the table's lock."""

    entry: FileEntry
    fh: int  # the new handle
    previous: FileKey | None  # the path's version before this one (its blocks are freed when it differs)
    src: SourceFile | None  # a source reference left over for the caller to put back, or None
    stale: list[int]  # implicit handles replaced or pushed out by this one (to release)


class HandleTable:
    """Handles -> file entries, entries by version, each path's last version, implicit handles."""

    def __init__(self, source: Source) -> None:
        self.source = source  # reopened by get_source when an open was answered from metadata
        self.lock = threading.Lock()
        self._handles: dict[int, FileEntry] = {}  # fh -> entry (lock; get() reads it without, see module)
        self._entries: dict[FileKey, FileEntry] = {}  # version -> entry, while it has handles or stuck reads
        self.versions: OrderedDict[str, FileKey] = OrderedDict()  # path -> file key of its last open (lock;
        # the scanner's `in` test reads it without: one atomic lookup, a hint only)
        self._implicit: OrderedDict[str, tuple[FileEntry, float, int]] = OrderedDict()  # path -> (entry,
        # opened at, fh) of open-less readers (lock)
        self._next_fh = 1  # the next handle (lock)
        # get(fh): the entry of handle fh or None, read without the lock (see the module docstring);
        # the dict's own method, as a read pays for every call layer
        self.get: Callable[[int], FileEntry | None] = self._handles.get

    # -- handles ----------------------------------------------------------------------------------

    def _add_locked(self, entry: FileEntry) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = entry
        return fh

    def attach(
        self,
        path: str,
        key: FileKey,
        src: SourceFile | None,
        make: Callable[[], FileEntry],
        implicit_at: float | None = None,
    ) -> Attached:
        """The one handle allocator: a new handle (never 0) on the entry of version *key* of *path*
        (made by *make* if none exists), handing it *src* if it has no source file yet. The handle is
        counted on the entry and named in the table in one locked step, so no reader of the table
        (:meth:`check_invariants` included) ever sees one without the other. With *implicit_at* the
        handle is *path*'s implicit handle of an open-less reader, opened at that time."""
        with self.lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = make()
                self._entries[key] = entry
                src = None  # the new entry holds it
            if entry.src is None and src is not None:
                entry.src, src = src, None
            entry.handles += 1
            fh = self._add_locked(entry)
            previous = self.versions.get(path)
            self.versions[path] = key
            self.versions.move_to_end(path)
            if len(self.versions) > MAX_VERSIONS:
                self.versions.popitem(last=False)
            stale: list[int] = []
            if implicit_at is not None:
                old = self._implicit.pop(path, None)
                self._implicit[path] = (entry, implicit_at, fh)
                if old is not None:
                    stale.append(old[2])
                while len(self._implicit) > MAX_IMPLICIT:
                    stale.append(self._implicit.popitem(last=False)[1][2])
        return Attached(entry, fh, previous, src, stale)

    def release(self, fh: int) -> Released | None:
        """Drop handle *fh*; None when it was not open."""
        with self.lock:
            entry = self._handles.pop(fh, None)
            if entry is None:
                return None
            entry.handles -= 1
            src = None
            disk_fd = -1
            last_handle = entry.handles == 0
            if last_handle:
                if self._entries.get(entry.key) is entry and not entry.stuck:
                    del self._entries[entry.key]  # (kept while reads are stuck: the next open knows)
                src, entry.src = entry.src, None
                disk_fd, entry.disk_fd = entry.disk_fd, -1
        return Released(entry, last_handle, src, disk_fd)

    def unstuck(self, entry: FileEntry) -> None:
        """The last stuck read of *entry* returned: forget the entry if it was kept only for that."""
        with self.lock:
            if entry.handles == 0 and not entry.stuck and self._entries.get(entry.key) is entry:
                del self._entries[entry.key]

    def set_disk_fd(self, entry: FileEntry, fd: int) -> int:
        """Make *fd* the entry's disk-tier backing descriptor unless it has one; returns the descriptor
        the caller must close (*fd* when the entry had one already, else -1)."""
        with self.lock:
            if entry.disk_fd < 0:
                entry.disk_fd, fd = fd, -1
        return fd

    def backing_fd(self, entry: FileEntry, on_disk: bool, passthrough: bool) -> tuple[bool, int]:
        """(goes to the disk tier, descriptor the kernel reads) of a passthrough open of *entry*."""
        with self.lock:
            on_disk = on_disk or (passthrough and entry.disk_fd >= 0)
            if on_disk:
                return True, entry.disk_fd
            if passthrough and entry.src is not None:
                return False, entry.src.fd
            return False, -1

    # -- source references ------------------------------------------------------------------------
    def put_source(self, src: SourceFile) -> None:
        with self.lock:
            src.refs -= 1
            last = src.refs == 0
        if last:
            src.close()

    def get_source(self, entry: FileEntry) -> SourceFile:
        """The entry's source file with a reference taken (opened now if the open was served from metadata)."""
        with self.lock:
            src = entry.src
            if src is not None:
                src.refs += 1
                return src
        fresh = self.source.open_file(entry.path)
        if fresh.key != entry.key:
            fresh.close()
            raise OSError(errno.ESTALE, "source file changed since it was opened", entry.path)
        with self.lock:
            if entry.src is None and entry.handles > 0:
                entry.src = fresh
                fresh.refs += 1
                return fresh
            if entry.src is not None:
                entry.src.refs += 1
                other = entry.src
            else:
                return fresh  # entry closed meanwhile: caller's reference is the only one
        fresh.close()
        return other

    # -- open-less readers (fuse.no_open) ---------------------------------------------------------
    def implicit(self, path: str, now: float, trust: float, expect: FileKey | None) -> FileEntry | None:
        """The implicit entry of *path* while it is younger than *trust* seconds and of version *expect*."""
        with self.lock:
            item = self._implicit.get(path)
            if item is not None and now - item[1] <= trust and (expect is None or item[0].key == expect):
                self._implicit.move_to_end(path)
                return item[0]
        return None

    # -- reports ----------------------------------------------------------------------------------
    def entries(self) -> list[FileEntry]:
        with self.lock:
            return list(self._entries.values())

    def counts(self) -> tuple[int, list[FileEntry]]:
        """(handles opened by readers, not open-less ones; the entries)."""
        with self.lock:
            return len(self._handles) - len(self._implicit), list(self._entries.values())

    def close(self) -> list[FileEntry]:
        """Forget every handle; returns the entries (their source files and descriptors to close)."""
        with self.lock:
            entries = list(self._entries.values())
            self._entries.clear()
            self._handles.clear()
            self._implicit.clear()
        return entries

    def check_invariants(self) -> None:
        """Raise AssertionError when the table is inconsistent (tests and the debug switch run this).

        An entry without handles may stay listed for a moment after its stuck reads returned (until
        :meth:`unstuck`), so that is not checked; the per-entry counts are read without the entry's
        lock (exact when no read runs)."""
        with self.lock:
            counts: dict[int, int] = {}
            for fh, entry in self._handles.items():
                if not 0 < fh < self._next_fh:
                    raise AssertionError(f"handle {fh} outside 1..{self._next_fh - 1}")
                counts[id(entry)] = counts.get(id(entry), 0) + 1
                if self._entries.get(entry.key) is not entry:
                    raise AssertionError(f"handle {fh} names an entry not in the version table: {entry.path}")
            for key, entry in self._entries.items():
                if entry.key != key:
                    raise AssertionError(f"entry of {entry.path} filed under another version")
                if entry.handles != counts.get(id(entry), 0):
                    raise AssertionError(
                        f"entry of {entry.path} counts {entry.handles} handles, {counts.get(id(entry), 0)} name it"
                    )
                if entry.handles < 0 or entry.stuck < 0 or entry.inline_stuck > entry.inline:
                    raise AssertionError(f"entry of {entry.path} has negative or inconsistent counts")
            for path, (entry, _at, fh) in self._implicit.items():
                if self._handles.get(fh) is not entry:
                    raise AssertionError(f"implicit handle {fh} of {path} is not in the handle table")
            if len(self._implicit) > MAX_IMPLICIT or len(self.versions) > MAX_VERSIONS:
                raise AssertionError("implicit handles or remembered versions over their bound")
