"""The disk store: a budgeted, crash-safe store of source-file ranges on a local disk (the facade).

:class:`DiskStore` keeps bytes the engine read from the source in a directory on a local
filesystem (``cache.disk_dir``), so a later epoch, a file larger than the RAM budget, or a reload
after a remount is served from local disk instead of the source. It is self-contained: the engine
(through :mod:`fastfs.fsio.disk.tier`) hands it filled cache blocks (:meth:`DiskStore.put`), asks
it before going to the source (:meth:`DiskStore.read_into`), and asks for a descriptor of a
complete file to open by FUSE passthrough (:meth:`DiskStore.complete_fd`).

Layout on disk (:mod:`.directory`, :mod:`.files`, :mod:`.index`)::

    DIR/FASTFS-DISKCACHE          marker: "fastfs disk cache ... format 1" (written first)
    DIR/journal                   append-only index log (header, then CRC-framed records)
    DIR/journal.new               a compaction in progress (removed at open: never authoritative)
    DIR/data/XX/NNNNNNNNNNNNNNNN  one sparse data file per source-file version, entry id in hex

An entry is one source-file version, keyed by the identity the engine uses (any tuple of ints): a
changed source file has another key, so it is never served from the old entry (which ages out by
LRU). The file is divided into 64 KiB chunks; the index records which chunks are held (a partly
cached large file keeps exactly the ranges it holds) and each one's CRC-32, computed from the bytes
the engine read from the source, before they are written.

The store is these parts, each in its module with its design and its fields' locks:

* :class:`~.catalog.Catalog`: the RAM index in LRU order, the counters, the one RAM lock;
* :class:`~.writer.Writers`: the write queue and writer threads (puts, verifications, drops);
* :class:`~.reads.Reader`: reads checked against the CRCs, whole-file verification, trusted fds;
* :class:`~.space.Space`: the budget, the free-space floor and LRU eviction;
* :class:`~.journal.Journal`: the journal file (appends, fsync, compaction) and entry ids;
* :class:`~.files.DataFiles`: the data files, their fan-out directories and the start-up sweep.

This module opens the directory and wires them: opening checks the directory
(:func:`~.directory.open_root`: owned by the daemon's user, not group/world-writable, created
0700), takes ``flock`` on it (a second process cannot use it at the same time), refuses a non-empty
directory without the marker (foreign: nothing deleted), clears one of ours that cannot be used (a
marker of another format, or a marker or journal header that cannot be parsed: only the names the
store creates are removed, then it starts empty), replays the journal, and evicts down to the limits
(a journal may describe more than fits now). Dropping an entry is two steps everywhere: out of the
index under the lock (:meth:`DiskStore._corrupt`, :meth:`DiskStore.discard`, eviction), then its
data file unlinked and a ``DROP`` journalled without it (:meth:`DiskStore._drop_files`, on a writer
thread or in ``maintain``/``close``).

Crash safety, in one place (each part's docstring says how): a chunk is recorded as held only after
its write returned; the journal loses at most a torn tail, and losing records only under-states what
is held; no byte is served unchecked (CRC per chunk, or a verified and unchanged whole file); ids are
never reused and unnamed data files are swept at start; a compaction is an atomic rename. LRU order
is kept in RAM (reads and writes refresh it); the journal keeps it as of the last compaction (done
at every clean :meth:`DiskStore.close`) plus later writes.

Locks: ``Journal.lock`` before ``Catalog.lock``; only the journal lock is ever held across I/O, and
only writer threads, ``maintain`` and ``close`` take it (see :mod:`fastfs.fsio.disk`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from fastfs.fsio.disk import directory, index, space
from fastfs.fsio.disk.catalog import (
    BUDGET,
    BYTES_WRITTEN,
    CLEARED,
    COMPLETE_FDS,
    COMPLETED,
    CORRUPT,
    COUNTERS,
    EVICTED_BYTES,
    EVICTIONS,
    FILES,
    FLOOR,
    FREE,
    GAUGES,
    HIT_BYTES,
    HITS,
    MAX_ENTRIES,
    MISSES,
    QUEUED,
    USE,
    VERIFIED,
    WRITE_ERRORS,
    WRITES,
    WRITES_DROPPED,
    WRITES_NO_ROOM,
    WRITES_SKIPPED,
    Catalog,
)
from fastfs.fsio.disk.directory import DiskCacheError
from fastfs.fsio.disk.files import DataFiles
from fastfs.fsio.disk.index import Entry, Key
from fastfs.fsio.disk.journal import Journal
from fastfs.fsio.disk.reads import Reader
from fastfs.fsio.disk.space import Space
from fastfs.fsio.disk.writer import WRITE_QUEUE_BYTES, WRITERS, Writers

# The stats names and limits users of the store need, from the modules that define them.
__all__ = [
    "BUDGET",
    "BYTES_WRITTEN",
    "CLEARED",
    "COMPLETED",
    "COMPLETE_FDS",
    "CORRUPT",
    "COUNTERS",
    "EVICTED_BYTES",
    "EVICTIONS",
    "FILES",
    "FLOOR",
    "FREE",
    "GAUGES",
    "HITS",
    "HIT_BYTES",
    "MAX_ENTRIES",
    "MISSES",
    "QUEUED",
    "USE",
    "VERIFIED",
    "WRITERS",
    "WRITES",
    "WRITES_DROPPED",
    "WRITES_NO_ROOM",
    "WRITES_SKIPPED",
    "WRITE_ERRORS",
    "WRITE_QUEUE_BYTES",
    "DiskCacheError",
    "DiskStore",
]

log = logging.getLogger("fastfs.diskcache")


class DiskStore:
    """A budgeted, crash-safe disk store of source-file ranges (see the module docstring). Thread-safe;
    its parts (``catalog``, ``writers``, ``reader``, ``space``, ``journal``, ``files``) document their
    fields and locks."""

    def __init__(
        self,
        path: str,
        *,
        budget_bytes: int = 0,
        budget_share: float = 0.0,
        floor_bytes: int = 0,
        floor_share: float = 0.0,
        max_entries: int = MAX_ENTRIES,
        queue_bytes: int = WRITE_QUEUE_BYTES,
        writers: int = WRITERS,
        verify_min: int = 0,
        statvfs: Callable[[int], Any] = os.statvfs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        space.check_limits(budget_bytes, budget_share, floor_bytes, floor_share)
        self.catalog = Catalog(max_entries)
        self._root, self.path = directory.open_root(path)
        self.journal = Journal(self.catalog, self._root, self.path, clock)
        self.space = Space(
            self.catalog,
            self.journal,
            self._root,
            budget_bytes=budget_bytes,
            budget_share=budget_share,
            floor_bytes=floor_bytes,
            floor_share=floor_share,
            statvfs=statvfs,
            clock=clock,
        )
        self.files = DataFiles(self.catalog.lock, self.path, self.space.charge_dir)
        self.reader = Reader(self.catalog, self.files, self._corrupt, self._queue_verify_locked)
        self.writers = Writers(
            self.catalog,
            self.space,
            self.journal,
            self.files,
            path=self.path,
            threads=writers,
            queue_bytes=queue_bytes,
            verify_min=verify_min,
            corrupt=self._corrupt,
            drop_files=self._drop_files,
            verify=self.reader.verify,
            maintain=self.maintain,
        )
        try:
            try:
                fcntl.flock(self._root, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DiskCacheError(f"{self.path}: in use by another fastfs process") from None
            self._open_layout()
            self.space.refresh()
            with self.catalog.lock:  # a journal may describe more than fits now (a crash, a lowered budget)
                self.space.to_limits_locked(self.writers.drops)
        except OSError as e:
            self._close_fds()
            raise DiskCacheError(f"{self.path}: cannot use the disk cache directory: {e.strerror or e}") from None
        except BaseException:
            self._close_fds()
            raise
        self.writers.start()

    @classmethod
    def from_config(cls, cache: Any, **kwargs: Any) -> DiskStore | None:
        """A store for a :class:`~fastfs.config.schema.CacheConfig` (None when ``disk_dir`` is empty)."""
        if not cache.disk_dir:
            return None
        from fastfs.config.schema import parse_amount

        budget = parse_amount(cache.disk_budget, "cache.disk_budget")
        floor = parse_amount(cache.disk_free_floor, "cache.disk_free_floor")
        return cls(
            cache.disk_dir,
            budget_bytes=budget.bytes,
            budget_share=budget.share,
            floor_bytes=floor.bytes,
            floor_share=floor.share,
            **kwargs,
        )

    # -- settings the engine and tests adjust -------------------------------------------------------
    @property
    def queue_bytes(self) -> int:
        """Bytes of pinned views the write queue holds at most."""
        return self.writers.queue_bytes

    @queue_bytes.setter
    def queue_bytes(self, value: int) -> None:
        self.writers.queue_bytes = value

    @property
    def verify_min(self) -> int:
        """Entries at least this large (> 0) are verified as soon as they are complete."""
        return self.writers.verify_min

    @property
    def max_entries(self) -> int:
        return self.catalog.max_entries

    # == opening ===================================================================================
    def _open_layout(self) -> None:
        root = self._root
        marker = directory.read_marker(root)
        fresh = marker is None
        if marker is None:
            names = directory.foreign_names(root)
            if names:
                shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
                raise DiskCacheError(
                    f"{self.path}: not empty and not a fastfs disk cache (no {directory.MARKER}; holds {shown});"
                    " use an empty or new directory"
                )
            directory.write_marker(root)
        elif marker != directory.FORMAT:
            self._clear(f"format {marker} is not {directory.FORMAT}" if marker > 0 else "unreadable marker")
        rep, why = self.journal.open()
        if rep is not None:
            self.catalog.load(rep.entries.values())
            self.files.plan_sweep({e.id for e in rep.entries.values()}, rep.next_id, rep.stale)
        else:
            if not fresh and self.catalog.counters[CLEARED] == 0:
                self._clear(why)  # data files nothing describes: start empty
            self.journal.create()
            self.files.plan_sweep(set(), 1, [])
        self.space.count_dirs(self.files.open(root))

    def _clear(self, why: str) -> None:
        removed = directory.clear_ours(self._root)
        log.warning("disk cache %s: %s: cleared %d files it had created", self.path, why, removed)
        directory.write_marker(self._root)
        self.catalog.counters[CLEARED] = 1

    # == the engine's interface ====================================================================
    def put(self, key: Key, size: int, offset: int, view: memoryview, release: Callable[[], None]) -> bool:
        """Queue ``view`` (the source file's bytes at ``offset``; file version ``key`` of ``size``
        bytes) to be written. Never blocks on I/O.

        True: the store took the pin and calls ``release()`` exactly once, from a writer thread,
        when it no longer reads ``view``. False (queue full: counted as dropped; already held,
        unaligned, already queued, or closing: skipped): ``release`` is not called, the caller keeps
        its pin. ``offset`` must be a multiple of 64 KiB and the view whole 64 KiB chunks or end at ``size``
        (engine blocks and whole small files always are).
        """
        return self.writers.put(key, size, offset, view, release)

    def holds(self, key: Key, offset: int, length: int) -> bool:
        """Whether ``[offset, offset + length)`` (clipped at the file's end) is held (no I/O, no check)."""
        return self.reader.holds(key, offset, length)

    def queued(self, key: Key, offset: int) -> bool:
        """Whether a put of ``key`` at ``offset`` is queued or being written now (no I/O)."""
        return self.writers.queued_at(key, offset)

    def pending(self, key: Key) -> bool:
        """Whether any put of ``key`` is queued or being written now (no I/O)."""
        return self.writers.pending(key)

    def has_room(self, nbytes: int) -> bool:
        """Whether the write queue has room for ``nbytes`` now (advisory: a put may still be declined)."""
        return self.writers.has_room(nbytes)

    def held_bytes(self, key: Key) -> int:
        """Bytes of file version ``key`` the store holds (no I/O, no check)."""
        return self.reader.held_bytes(key)

    def advise(self, key: Key) -> bool:
        """Ask the kernel to read the data file of ``key`` into the page cache ahead (``POSIX_FADV_WILLNEED``,
        no wait, no check: :meth:`read_into` checks when it is read); False when nothing is held."""
        return self.reader.advise(key)

    def read_into(self, key: Key, offset: int, view: memoryview) -> int | None:
        """Fill ``view`` with the file's bytes from ``offset`` if held; returns the bytes filled
        (``len(view)``, less at the file's end), or None: not held, or held but failed its check (then
        dropped; ``view``'s contents are undefined). Reads whole chunks and checks each one's CRC (not
        for a file verified whole and unchanged since); see :mod:`.reads`."""
        return self.reader.read_into(key, offset, view)

    def complete_fd(self, key: Key) -> int | None:
        """A new read-only descriptor of the data file of a complete, verified entry (its bytes are
        exactly the source file's; the caller closes it), or None. The first call for a complete but
        not yet verified entry queues its verification and returns None; a later call gets the fd.
        The descriptor stays valid (and its disk space used) until closed, even if the entry is evicted."""
        return self.reader.complete_fd(key)

    def discard(self, key: Key) -> bool:
        """Drop the entry of ``key`` if any (e.g. the engine saw the source change); True if dropped."""
        with self.catalog.lock:
            entry = self.catalog.entries.get(key)
            if entry is None:
                return False
            self.catalog.remove_locked(entry)
            self.writers.queue_drop_locked(entry)
        return True

    def stats(self) -> dict[str, int]:
        """Counters (:data:`COUNTERS`, monotonic) and gauges (:data:`GAUGES`) as one flat dict."""
        with self.catalog.lock:
            out = dict(self.catalog.counters)
            out.update(
                {
                    USE: self.space.charged_locked(),
                    BUDGET: self.space.budget,
                    FREE: self.space.avail,
                    FLOOR: self.space.floor,
                    FILES: len(self.catalog.entries),
                    QUEUED: self.writers.queued,
                }
            )
        return out

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write, verification and drop is done; False on timeout."""
        return self.writers.flush(timeout)

    def maintain(self) -> None:
        """Re-read free space, evict to the budget, the free-space floor and the entry cap, compact and
        sync the journal when due. Writer thread 0 calls it every SPACE_CHECK_INTERVAL; tests call it."""
        self.space.refresh()
        victims: list[Entry] = []
        with self.catalog.lock:
            self.space.to_limits_locked(victims)
        if victims:
            self._drop_files(victims)
            self.space.refresh()
        self.journal.upkeep()

    def close(self, drain: bool = True) -> None:
        """Stop the writers (after finishing queued writes when ``drain``, else releasing them unwritten),
        compact and sync the journal, close every descriptor. Idempotent."""
        drops = self.writers.stop(drain)
        if drops is None:
            return
        self._drop_files(drops)
        try:
            if self.catalog.changed:
                self.journal.compact()
            self.journal.sync()
        except OSError as e:
            log.warning("disk cache %s: journal not saved at close: %s", self.path, e.strerror)
        self.writers.stopped()
        self._close_fds()

    # == dropping entries ==========================================================================
    def _queue_verify_locked(self, entry: Entry) -> None:
        self.writers.queue_verify_locked(entry)

    def _corrupt(self, entry: Entry) -> None:
        """A check failed: drop the entry now (RAM), its data file on a writer thread."""
        with self.catalog.lock:
            if not entry.live:
                return
            self.catalog.counters[CORRUPT] += 1
            self.catalog.remove_locked(entry)
            self.writers.queue_drop_locked(entry)

    def _drop_files(self, victims: list[Entry]) -> None:
        """Unlink the data files of entries already removed from the index, and journal the drops."""
        records = []
        for entry in victims:
            self.files.unlink(entry.id)
            records.append(index.rec_drop(entry.id))
        if records:
            try:
                self.journal.append(b"".join(records))
            except OSError:  # the drops are lost from the journal: a restart finds the files gone and drops them
                with self.catalog.lock:
                    self.catalog.counters[WRITE_ERRORS] += 1

    def _close_fds(self) -> None:
        self.files.close()
        self.journal.close()
        if self._root >= 0:
            with contextlib.suppress(OSError):
                os.close(self._root)
        self._root = -1
