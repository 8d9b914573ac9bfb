"""The disk store's journal file and its entry ids.

The journal (``DIR/journal``) is the index on disk: an append-only log of CRC-framed records (the
format is :mod:`fastfs.fsio.disk.index`'s). :class:`Journal` owns the file:

* **Open** (:meth:`Journal.open`): a journal whose header is not ours is unusable (the store then
  clears the directory); otherwise it is replayed up to the first torn or damaged record and cut
  there (``ftruncate``), so a crash mid-append loses at most the records after it. Losing records is
  always safe: the journal then under-states what the data files hold. ``journal.new`` (a compaction
  a crash interrupted) is removed first: it is never authoritative.
* **Appends** (:meth:`Journal.append`): one ``write`` per record batch on an ``O_APPEND``
  descriptor; a short or failed write is cut back (never a torn record in the middle) and raised as
  ``ENOSPC``. ``ENTRY`` is appended after its data file exists, ``CHUNKS`` after their ``pwritev``
  returned, ``DROP`` after the unlink.
* **Durability** (:meth:`Journal.upkeep`): fsync at most every :data:`JOURNAL_SYNC_INTERVAL`
  seconds when it changed (a crash loses at most that much index, never data); compaction when
  the journal grew past :data:`~fastfs.fsio.disk.index.COMPACT_FACTOR` times its last snapshot.
* **Compaction** (:meth:`Journal.compact`): the live index is written in LRU order to
  ``journal.new``, fsynced, renamed over ``journal``, the directory fsynced: after a crash either the
  old or the new journal is found. Done at every clean close when the index changed, so LRU order
  survives a clean restart.
* **Ids** (:meth:`Journal.take_id_locked`, :meth:`Journal.reserve_ids`): entry ids are never reused;
  ``NEXT`` records reserve them in blocks (:data:`ID_BLOCK`) ahead of use, so an id handed out never
  exceeds the last journalled reservation by the time it names a file, and a data file name always
  means one entry.

Locks: ``lock`` (held across the journal's I/O) guards ``fd``, ``dirty`` and the file itself, and is
taken before the catalog lock; ``nbytes``, ``snap``, ``next_id`` and ``id_limit`` are guarded by the
catalog lock (the space accounting reads ``nbytes``; ids are taken with the index). ``sync_due`` is
used only by writer thread 0 (through ``maintain``) and by ``close`` after the writers stopped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Callable

from fastfs.fsio.disk import directory, index
from fastfs.fsio.disk.catalog import Catalog
from fastfs.fsio.disk.index import Replay

# Seconds between journal fsyncs when it changed (a crash loses at most this much index, never data).
JOURNAL_SYNC_INTERVAL = 5.0
# Ids reserved per NEXT record: ids handed out never exceed the last journalled reservation.
ID_BLOCK = 4096


class Journal:
    """The journal of one store's directory (see the module docstring)."""

    def __init__(self, catalog: Catalog, root_fd: int, path: str, clock: Callable[[], float]) -> None:
        self.lock = threading.Lock()
        self._path = path
        self._catalog = catalog
        self._root = root_fd
        self._clock = clock
        self.fd = -1  # (lock)
        self.dirty = False  # appended since the last fsync (lock)
        self.sync_due = 0.0
        self.nbytes = 0  # journal length (catalog lock)
        self.snap = 0  # journal length right after the last compaction (catalog lock)
        self.next_id = 1  # next entry id to hand out (catalog lock)
        self.id_limit = 1  # ids below this are reserved by a journalled NEXT record (catalog lock)

    # -- opening (before any other thread) ---------------------------------------------------------
    def open(self) -> tuple[Replay | None, str]:
        """Open and replay the directory's journal, cutting a torn or damaged tail: (replay, "").
        (None, why) when there is none or its header is not ours (then nothing is open)."""
        root = self._root
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory.JOURNAL_NEW, dir_fd=root)  # an unfinished compaction: never authoritative
        try:
            fd = os.open(directory.JOURNAL, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        except FileNotFoundError:
            return None, "journal missing"
        except OSError as e:
            raise directory.DiskCacheError(f"{self._path}: cannot open {directory.JOURNAL}: {e.strerror}") from None
        st = os.fstat(fd)
        data = b""
        if stat.S_ISREG(st.st_mode):
            data = os.pread(fd, st.st_size, 0)
        if not index.check_header(data):
            os.close(fd)
            return None, "journal header missing or of another format"
        rep = index.replay(data)
        if rep.good_end < len(data):
            os.ftruncate(fd, rep.good_end)  # a torn or damaged tail: drop it
        self.fd = fd
        self.nbytes = self.snap = rep.good_end
        self.next_id = self.id_limit = rep.next_id
        return rep, ""

    def create(self) -> None:
        """Start a new, empty journal (header and a first id reservation), durably."""
        data = index.header() + index.rec_next(ID_BLOCK + 1)
        fd = os.open(
            directory.JOURNAL,
            os.O_RDWR | os.O_APPEND | directory.FILE_CREATE,
            directory.FILE_MODE,
            dir_fd=self._root,
        )
        os.write(fd, data)
        os.fsync(fd)
        os.fsync(self._root)
        self.fd = fd
        self.nbytes = self.snap = len(data)
        self.next_id = 1
        self.id_limit = ID_BLOCK + 1

    # -- ids --------------------------------------------------------------------------------------
    def take_id_locked(self) -> int:
        """A new entry id (catalog lock held); call :meth:`reserve_ids` before it names a file."""
        entry_id = self.next_id
        self.next_id += 1
        return entry_id

    def reserve_ids(self) -> None:
        """Journal a NEXT record reserving the next block of ids when the ids taken reached the last one."""
        if self.next_id < self.id_limit:
            return
        with self.lock:
            if self.next_id < self.id_limit:
                return
            limit = self.next_id + ID_BLOCK
            self._append_locked(index.rec_next(limit))
            self.id_limit = limit

    # -- appends, fsync, compaction ---------------------------------------------------------------
    def append(self, data: bytes) -> None:
        """Append whole records; raises OSError (nothing appended) when they could not be written."""
        with self.lock:
            self._append_locked(data)

    def _append_locked(self, data: bytes) -> None:
        try:
            written = os.write(self.fd, data)
        except OSError:
            written = -1
        if written != len(data):
            os.ftruncate(self.fd, self.nbytes)  # never leave a torn record in the middle
            raise OSError(errno.ENOSPC, "journal append failed", directory.JOURNAL)
        with self._catalog.lock:
            self.nbytes += written
        self.dirty = True

    def upkeep(self) -> None:
        """Compact when the journal doubled since its last snapshot; fsync when changed and due."""
        with self._catalog.lock:
            grown = self.nbytes > max(index.COMPACT_MIN, index.COMPACT_FACTOR * self.snap)
        if grown:
            self.compact()
        if self.dirty and self._clock() >= self.sync_due:
            with self.lock:
                self.dirty = False
                os.fsync(self.fd)
            self.sync_due = self._clock() + JOURNAL_SYNC_INTERVAL

    def sync(self) -> None:
        with self.lock:
            os.fsync(self.fd)

    def compact(self) -> None:
        """Rewrite the journal as a snapshot of the live index in LRU order (atomic rename)."""
        root = self._root
        with self.lock:
            with self._catalog.lock:
                rows = self._catalog.snapshot_locked()
                limit = max(self.id_limit, self.next_id)
            data = index.snapshot(rows, limit)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(directory.JOURNAL_NEW, dir_fd=root)
            fd = os.open(
                directory.JOURNAL_NEW,
                os.O_RDWR | os.O_APPEND | directory.FILE_CREATE,
                directory.FILE_MODE,
                dir_fd=root,
            )
            try:
                view = memoryview(data)
                done = 0
                while done < len(data):
                    done += os.write(fd, view[done:])
                os.fsync(fd)
                os.rename(directory.JOURNAL_NEW, directory.JOURNAL, src_dir_fd=root, dst_dir_fd=root)
                os.fsync(root)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(directory.JOURNAL_NEW, dir_fd=root)
                raise
            os.close(self.fd)
            self.fd = fd
            self.dirty = False
            with self._catalog.lock:
                self.nbytes = self.snap = len(data)
                self.id_limit = limit

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
        self.fd = -1
