"""The handle table: open file versions (:class:`~fastfs.fsio.entry.FileEntry`), the handles that
name them, and versions.

One :class:`~fastfs.fsio.entry.FileEntry` stands for one version of one source file (its
:class:`~fastfs.fsio.source.FileKey`) while it has handles; every handle of that version (opens,
open-less readers, warm jobs) maps to it. The table is the one place that:

* allocates handles (:meth:`HandleTable.attach`, never 0: 0 is an open-less read), counting each on
  the entry of its version and naming it in the table in one locked step, and remembers each
  path's last version (``versions``: a new version of a path frees the old one's blocks at once);
* makes the handles hold the version's source file while there are any (the entry's
  :class:`~fastfs.fsio.source.SourceRef`: :meth:`~fastfs.fsio.source.SourceRef.hold` at each attach,
  :meth:`~fastfs.fsio.source.SourceRef.drop` at the last release); reads take their own references
  from the ref itself, never through this table;
* keeps an entry whose reads are stuck after its last handle closed (:meth:`unstuck` forgets it);
* keeps the entries of versions whose last handle closed, when nothing was read or planned through
  them (passthrough opens, files the kernel's page cache served), for the next open of the version
  (``_idle``, at most :data:`MAX_IDLE`, least recently released dropped first): a hot open + close
  of a file builds no entry, its policy and its source reference each time;
* tracks the implicit handles of open-less readers (``fuse.no_open``), least recently used dropped.

Concurrency: ``lock`` guards ``_handles``, ``_entries``, ``_idle``, ``versions``, ``_implicit``,
``_next_fh`` and each entry's ``handles``; it is taken before an entry's source ref lock (:meth:`attach`,
:meth:`release`), never after it. :meth:`get` reads ``_handles`` without it: one dict lookup is
atomic under the GIL, and an entry found stays a valid object after a concurrent release (its reads
then fail or finish normally). The lock is never held across I/O (a source open or close happens
outside it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from fastfs.fsio.entry import FileEntry
from fastfs.fsio.source import FileKey, SourceFile

__all__ = ["MAX_IDLE", "MAX_IMPLICIT", "MAX_VERSIONS", "Attached", "FileEntry", "HandleTable", "Released"]

# Paths whose last file key is remembered (a new version frees the old one's blocks at once).
MAX_VERSIONS = 100_000
# Open-less readers (fuse.no_open) tracked; least recently used closed first.
MAX_IMPLICIT = 256
# Entries of versions with no handle kept for their next open, at most (about 3 KiB each, measured
# with tracemalloc: 12 MiB in all): the files one job opens again and again, or a second pass over a
# few thousand small files, fit.
MAX_IDLE = 4096


class Released(NamedTuple):
    """What the release of one handle leaves the caller to do outside the table's lock."""

    entry: FileEntry
    last_handle: bool
    src: SourceFile | None  # the handles' source reference to put back (last handle), or None
    disk_fd: int  # the disk-tier descriptor to close (last handle), or -1
    superseded: bool = False  # the last handle of a version its path has a newer one of: free its blocks


class Attached(NamedTuple):
    """What :meth:`HandleTable.attach` did, for the caller to finish outside the table's lock."""

    entry: FileEntry
    fh: int  # the new handle
    previous: FileKey | None  # the path's version before this one, to free the blocks of now (when it
    # differs and has no handles: one with handles is marked superseded and freed at its last release)
    src: SourceFile | None  # a source file the entry did not need, for the caller to put back, or None
    stale: list[int]  # implicit handles replaced or pushed out by this one (to release)


class HandleTable:
    """Handles -> file entries, entries by version, each path's last version, implicit handles."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._handles: dict[int, FileEntry] = {}  # fh -> entry (lock; get() reads it without, see module)
        self._entries: dict[FileKey, FileEntry] = {}  # version -> entry, while it has handles or stuck reads
        self._idle: OrderedDict[FileKey, FileEntry] = OrderedDict()  # version -> entry kept for its next
        # open (idle: no handle; see idle()), least recently released first (lock)
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
        (made by *make* if none exists), whose handles then hold *src* as their source file if they
        hold none yet (:meth:`~fastfs.fsio.source.SourceRef.hold`). The handle is
        counted on the entry and named in the table in one locked step, so no reader of the table
        (:meth:`check_invariants` included) ever sees one without the other. With *implicit_at* the
        handle is *path*'s implicit handle of an open-less reader, opened at that time."""
        with self.lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._idle.pop(key, None) or make()
                self._entries[key] = entry
            src = entry.source.hold(src)
            entry.handles += 1
            fh = self._add_locked(entry)
            previous = self.versions.get(path)
            if previous is not None and previous != key:
                held = self._entries.get(previous)
                if held is not None and held.handles:  # its handles still read it: free it at their end
                    held.superseded = True
                    previous = None
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
            superseded = last_handle and entry.superseded
            if last_handle:
                if self._entries.get(entry.key) is entry and not entry.stuck_reads.count:
                    del self._entries[entry.key]  # (kept while reads are stuck: the next open knows)
                    if idle(entry) and not superseded:
                        self._idle[entry.key] = entry
                        if len(self._idle) > MAX_IDLE:
                            self._idle.popitem(last=False)
                src = entry.source.drop()
                disk_fd, entry.disk_fd = entry.disk_fd, -1
        return Released(entry, last_handle, src, disk_fd, superseded)

    def unstuck(self, entry: FileEntry) -> None:
        """The last stuck read of *entry* returned: forget the entry if it was kept only for that."""
        with self.lock:
            if entry.handles == 0 and not entry.stuck_reads.count and self._entries.get(entry.key) is entry:
                del self._entries[entry.key]

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
        """Forget every handle; returns the entries (their source references and descriptors to give back)."""
        with self.lock:
            entries = list(self._entries.values())
            self._entries.clear()
            self._idle.clear()
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
                stuck = entry.stuck_reads
                if entry.handles < 0 or stuck.count < 0 or stuck.inline_stuck > stuck.inline:
                    raise AssertionError(f"entry of {entry.path} has negative or inconsistent counts")
            for key, entry in self._idle.items():
                if entry.key != key or entry.handles or key in self._entries or not idle(entry):
                    raise AssertionError(f"idle entry of {entry.path} is open, filed twice or was used")
            for path, (entry, _at, fh) in self._implicit.items():
                if self._handles.get(fh) is not entry:
                    raise AssertionError(f"implicit handle {fh} of {path} is not in the handle table")
            if len(self._implicit) > MAX_IMPLICIT or len(self.versions) > MAX_VERSIONS or len(self._idle) > MAX_IDLE:
                raise AssertionError("implicit handles or remembered versions over their bound")


def idle(entry: FileEntry) -> bool:
    """Whether *entry*, whose last handle just closed, may wait for its version's next open as it is:
    nothing was read through it (no stream, no source stream, no bytes left to count), nothing was
    planned for it (no format probe), no read of it is stuck, and it did not grow (its size is its
    key's). Any of those is state of one load, which the next open of the version must not inherit."""
    reads = entry.reads
    return (
        not entry.format.probed
        and not reads.policy.streams
        and entry.stream is None
        and not reads.delivered
        and not reads.direct
        and not reads.mmap_seen
        and not entry.stuck_reads.count
        and entry.size == entry.key.size
    )
