"""The disk store's write queue and writer threads.

Writes are off the read path: :meth:`Writers.put` only queues (a memoryview of a pinned cache block
plus its ``release`` callback) and returns; when the queue (:data:`WRITE_QUEUE_BYTES`, or the
store's ``queue_bytes``) is full the write is declined and counted (backpressure), the caller keeps
its pin. Writer threads (one per key shard, :data:`WRITERS`, so all writes of one file version are
done in order by one thread) run three kinds of job:

* **Puts** (:meth:`Writers.write`): compute the CRCs of the view's chunks (GIL released), make room
  (the budget and the entry cap: :meth:`~.space.Space.make_room_locked`, charging the write as in
  flight; the free-space floor: :meth:`~.space.Space.reserve`), create the data file when the entry
  has none, ``pwritev`` the view itself (no copy), call ``release``, then journal the chunks (with
  the ``ENTRY`` record for a new data file). A chunk is recorded as held (in the journal, then in
  RAM) only after its ``pwritev`` returned; the put that makes an entry complete counts it
  (``disk_files_completed``): the journal then describes it whole, so a restart serves it even after
  a kill -9 (bytes written say nothing of that: a file's head can be written long before its tail).
  With ``verify_min``, an entry at least that large is queued for verification as soon as its last
  chunk is written (its pages are still in the page cache, so the read-back is cheap), so the next
  open in the same process can pass through at once.
* **Verifications** (``verify``: :meth:`~.reads.Reader.verify`), queued by ``complete_fd`` or by a
  put that completed a large entry.
* **Drops** (``drops``, done by whichever writer wakes first): the data files of entries taken out
  of the index (corrupt, discarded) are unlinked and their ``DROP`` records journalled.

Writer thread 0 also sweeps the data directory first thing (:meth:`~.files.DataFiles.sweep`) and
calls ``maintain`` every :data:`~.space.SPACE_CHECK_INTERVAL` even when idle (the floor is held while
another program fills the disk; the journal is compacted and fsynced when due).

Locks: every field (``queued``, ``inqueue``, ``drops``, ``closing``, ``closed`` and each thread's
``jobs`` and ``busy``) is guarded by the catalog lock; each thread's ``cv`` and ``idle`` are
conditions on it. Jobs run with no lock held; a job takes the journal lock (appends) and the catalog
lock (state) in that order.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fastfs.fsio.disk import index
from fastfs.fsio.disk.catalog import (
    BYTES_WRITTEN,
    COMPLETED,
    WRITE_ERRORS,
    WRITES,
    WRITES_DROPPED,
    WRITES_NO_ROOM,
    WRITES_SKIPPED,
    Catalog,
)
from fastfs.fsio.disk.files import DataFiles
from fastfs.fsio.disk.index import CHUNK, Entry, Key, charge, chunk_len, nchunks
from fastfs.fsio.disk.journal import Journal
from fastfs.fsio.disk.space import Space

log = logging.getLogger("fastfs.diskcache")

MIB = 1024 * 1024
# Writer threads: one computes CRCs (GIL released) while the other is in pwritev; on 2 cores more buys nothing.
WRITERS = 2
# Bytes of pinned cache blocks the write queue holds at most: one 64 MiB prefetch window, small next to 4 GiB.
WRITE_QUEUE_BYTES = 64 * MIB

_PUT, _VERIFY = 0, 1


class _Thread:
    """One writer thread and its queue (jobs for the keys hashed to it). ``jobs`` and ``busy`` are
    guarded by the catalog lock (``cv`` is a condition on it)."""

    __slots__ = ("index", "jobs", "cv", "thread", "busy")

    def __init__(self, number: int, lock: threading.Lock) -> None:
        self.index = number
        self.jobs: deque[tuple[Any, ...]] = deque()
        self.cv = threading.Condition(lock)
        self.thread: threading.Thread | None = None
        self.busy = False


class Writers:
    """The write queue and writer threads of one store (see the module docstring).

    ``corrupt(entry)`` drops an entry found damaged; ``drop_files(entries)`` unlinks the data files of
    entries already out of the index and journals their drops; ``verify(entry)`` reads a complete
    entry back; ``maintain()`` is the store's periodic upkeep."""

    def __init__(
        self,
        catalog: Catalog,
        space: Space,
        journal: Journal,
        files: DataFiles,
        *,
        path: str,
        threads: int,
        queue_bytes: int,
        verify_min: int,
        corrupt: Callable[[Entry], None],
        drop_files: Callable[[list[Entry]], None],
        verify: Callable[[Entry], None],
        maintain: Callable[[], None],
    ) -> None:
        self._catalog = catalog
        self._space = space
        self._journal = journal
        self._files = files
        self._path = path
        self._corrupt = corrupt
        self._drop_files = drop_files
        self._verify = verify
        self._maintain = maintain
        self._lock = catalog.lock
        self.queue_bytes = queue_bytes
        self.verify_min = verify_min  # entries at least this large (> 0) are verified as soon as complete
        # All below: catalog lock.
        self.idle = threading.Condition(self._lock)  # notified when a thread runs out of work, and at close
        self.queued = 0  # bytes of puts queued and not done yet
        self.inqueue: dict[Key, set[int]] = {}  # key -> offsets of its puts queued and not done yet
        self.drops: list[Entry] = []  # entries out of the index whose data files are still to be unlinked
        self.closing = False
        self.closed = False
        self._threads = [_Thread(i, self._lock) for i in range(max(1, threads))]

    def start(self) -> None:
        for t in self._threads:
            t.thread = threading.Thread(target=self._run, args=(t,), name=f"fastfs-disk-{t.index}", daemon=True)
            t.thread.start()

    # -- the queue ----------------------------------------------------------------------------------
    def put(self, key: Key, size: int, offset: int, view: memoryview, release: Callable[[], None]) -> bool:
        """Queue a write (see :meth:`fastfs.fsio.disk.store.DiskStore.put`); never blocks on I/O."""
        n = len(view)
        end = offset + n
        aligned = n > 0 and offset >= 0 and offset % CHUNK == 0 and (n % CHUNK == 0 or end == size) and end <= size
        counters = self._catalog.counters
        with self._lock:
            if not aligned or self.closing or not index.valid_key(key):
                counters[WRITES_SKIPPED] += 1
                return False
            entry = self._catalog.entries.get(key)
            if entry is not None and (entry.size != size or entry.holds(offset // CHUNK, (end - 1) // CHUNK)):
                counters[WRITES_SKIPPED] += 1
                return False
            offsets = self.inqueue.get(key)
            if offsets is not None and offset in offsets:
                counters[WRITES_SKIPPED] += 1
                return False
            if self.queued + n > self.queue_bytes:
                counters[WRITES_DROPPED] += 1
                return False
            self.queued += n
            self.inqueue.setdefault(key, set()).add(offset)
            t = self._threads[hash(key) % len(self._threads)]
            t.jobs.append((_PUT, key, size, offset, view, release))
            t.cv.notify()
        return True

    def queued_at(self, key: Key, offset: int) -> bool:
        """Whether a put of ``key`` at ``offset`` is queued or being written now (no I/O)."""
        with self._lock:
            return offset in self.inqueue.get(key, ())

    def pending(self, key: Key) -> bool:
        """Whether any put of ``key`` is queued or being written now (no I/O)."""
        with self._lock:
            return key in self.inqueue

    def has_room(self, nbytes: int) -> bool:
        """Whether the write queue has room for ``nbytes`` now (advisory: a put may still be declined)."""
        return self.queued + nbytes <= self.queue_bytes

    def queue_verify_locked(self, entry: Entry) -> None:
        """Queue a verification of ``entry`` (catalog lock held) unless one is queued or the store closes."""
        if not entry.verifying and not self.closing:
            entry.verifying = True
            t = self._threads[hash(entry.key) % len(self._threads)]
            t.jobs.append((_VERIFY, entry))
            t.cv.notify()

    def queue_drop_locked(self, entry: Entry) -> None:
        """Have a writer unlink the data file of ``entry`` (already out of the index; catalog lock held)."""
        if entry.created:
            self.drops.append(entry)
            self._threads[0].cv.notify()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write, verification and drop is done; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self.drops or any(t.jobs or t.busy for t in self._threads):
                if self.closed:
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.idle.wait(left if left is not None else 1.0)
        return True

    def stop(self, drain: bool) -> list[Entry] | None:
        """Stop the threads (after their queued writes when ``drain``, else releasing those unwritten);
        returns the drops still to do (the caller does them); None when already stopped or stopping."""
        with self._lock:
            if self.closed or self.closing:
                return None
            self.closing = True
            if not drain:
                for t in self._threads:
                    for job in t.jobs:
                        if job[0] == _PUT:
                            self.queued -= len(job[4])
                            self._unqueue_locked(job[1], job[3])
                            self._release(job[5])
                    t.jobs.clear()
            for t in self._threads:
                t.cv.notify_all()
        for t in self._threads:
            if t.thread is not None:
                t.thread.join()
        with self._lock:
            drops, self.drops = self.drops, []
        return drops

    def stopped(self) -> None:
        """The store is closed: wake every :meth:`flush`."""
        with self._lock:
            self.closed = True
            self.idle.notify_all()

    # -- the threads --------------------------------------------------------------------------------
    def _run(self, t: _Thread) -> None:
        if t.index == 0:
            self._files.sweep()
        while True:
            with self._lock:
                t.busy = False
                if not t.jobs and not self.drops:
                    self.idle.notify_all()
                while not t.jobs and not self.drops and not self.closing:
                    timeout = None
                    if t.index == 0:
                        timeout = self._space.seconds_to_check_locked()
                        if timeout == 0:
                            break
                    t.cv.wait(timeout)
                if self.closing and not t.jobs:
                    return
                job = t.jobs.popleft() if t.jobs else None
                drops, self.drops = self.drops, []
                t.busy = True
            try:
                if drops:
                    self._drop_files(drops)
                if job is not None and job[0] == _PUT:
                    self.write(*job[1:])
                elif job is not None and self.closing:
                    with self._lock:
                        job[1].verifying = False  # not worth delaying the close for
                elif job is not None:
                    self._verify(job[1])
                if t.index == 0:
                    with self._lock:
                        due = self._space.seconds_to_check_locked() == 0
                    if due:
                        self._maintain()
            except Exception:  # a bug must not kill the writer (writes would stall forever)
                log.exception("disk cache %s: writer failed", self._path)

    def write(self, key: Key, size: int, offset: int, view: memoryview, release: Callable[[], None]) -> None:
        """Write one queued put (on its writer thread; see the module docstring)."""
        catalog, space, counters = self._catalog, self._space, self._catalog.counters
        n = len(view)
        first = offset // CHUNK
        count = nchunks(n)
        need = sum(charge(chunk_len(size, i)) for i in range(first, first + count))
        reserved = 0
        spaced = 0
        released = False
        done = False
        entry: Entry | None = None
        victims: list[Entry] = []
        try:
            crcs = index.crcs_of(view)
            with self._lock:
                entry = catalog.entries.get(key)
                if entry is not None and (entry.size != size or entry.holds(first, first + count - 1)):
                    counters[WRITES_SKIPPED] += 1
                    return
                if not space.make_room_locked(victims, need, keep=entry, new=entry is None):
                    counters[WRITES_NO_ROOM] += 1
                    entry = None
                else:
                    if entry is None:
                        entry = Entry(self._journal.take_id_locked(), key, size)
                        catalog.add_locked(entry)
                    catalog.touch_locked(key)
                    catalog.reserve_locked(need)
                    reserved = need
            if victims:
                self._drop_files(victims)
            if entry is None:
                return
            self._journal.reserve_ids()
            spaced = space.reserve(need, entry, self._drop_files)
            if not spaced:
                with self._lock:
                    counters[WRITES_NO_ROOM] += 1
                return
            creating = not entry.created
            fd = self._open_for_write(entry, truncate=creating and offset + n < size)
            if fd < 0:
                return
            try:
                pos = 0
                while pos < n:
                    pos += os.pwritev(fd, [view[pos:]], offset + pos)
            except BaseException:
                os.close(fd)
                if creating:
                    self._files.unlink(entry.id)
                raise
            os.close(fd)
            self._release(release)
            released = True
            record = index.rec_chunks(entry.id, first, crcs)
            if creating:  # the file exists and holds this write: one append describes both
                record = index.rec_entry(entry.id, size, key) + record
            try:
                self._journal.append(record)
            except OSError:
                if creating:
                    self._files.unlink(entry.id)
                raise
            if creating and not self._created(entry):
                return
            with self._lock:
                space.written_locked(spaced)
                spaced = 0
                catalog.unreserve_locked(reserved)
                reserved = 0
                if entry.live:
                    was_complete = entry.complete
                    catalog.mark_locked(entry, first, crcs)
                    counters[WRITES] += 1
                    counters[BYTES_WRITTEN] += n
                    if entry.complete and not was_complete:
                        counters[COMPLETED] += 1  # journalled whole: a restart (even after kill -9) serves it
                    if 0 < self.verify_min <= size and entry.complete and entry.verified is None:
                        self.queue_verify_locked(entry)  # its pages are still in the page cache: cheap now
            done = True
        except OSError as e:
            with self._lock:
                counters[WRITE_ERRORS] += 1
                if e.errno == errno.ENOSPC:
                    space.check_now_locked()  # re-read free space now
        finally:
            with self._lock:
                catalog.unreserve_locked(reserved)
                space.unreserve_locked(spaced)
                self.queued -= n
                self._unqueue_locked(key, offset)
                if not done and entry is not None and not entry.created:
                    catalog.remove_locked(entry)  # never got a data file: leave no empty entry behind
            if not released:
                self._release(release)

    def _open_for_write(self, entry: Entry, truncate: bool) -> int:
        """The entry's data file opened for writing, created (``truncate``: extended to the source's size)
        if the entry has none yet; -1 when it vanished (the entry is dropped)."""
        if not entry.created:
            return self._files.create(entry.id, entry.size if truncate else 0)
        try:
            fd = self._files.open_write(entry.id)
        except FileNotFoundError:
            self._corrupt(entry)  # no-op when an eviction removed it meanwhile
            return -1
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
            os.close(fd)
            self._corrupt(entry)
            return -1
        return fd

    def _created(self, entry: Entry) -> bool:
        """The new data file and its ENTRY record exist: from now on an eviction unlinks it. When the
        entry was evicted while being created (the evictor left the file to us), remove it; False then."""
        with self._lock:
            live = entry.live
            if live:
                entry.created = True
        if not live:
            self._files.unlink(entry.id)
            try:
                self._journal.append(index.rec_drop(entry.id))
            except OSError:
                pass
        return live

    def _unqueue_locked(self, key: Key, offset: int) -> None:
        offsets = self.inqueue.get(key)
        if offsets is not None:
            offsets.discard(offset)
            if not offsets:
                del self.inqueue[key]

    def _release(self, release: Callable[[], None]) -> None:
        try:
            release()
        except Exception:
            log.exception("disk cache %s: release callback failed", self._path)
