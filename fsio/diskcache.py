"""The local disk cache tier: source-file ranges kept on a local disk, across restarts.

:class:`DiskStore` keeps bytes the engine read from the source in a directory on a local
filesystem (``cache.disk_dir``), so a later epoch, a file larger than the RAM budget, or a reload
after a remount is served from local disk instead of the source. It is self-contained: the engine
hands it filled cache blocks (:meth:`DiskStore.put`), asks it before going to the source
(:meth:`DiskStore.read_into`), and asks for a descriptor of a complete file to open by FUSE
passthrough (:meth:`DiskStore.complete_fd`).

Layout on disk (see :mod:`fastfs.fsio.diskdir` and :mod:`fastfs.fsio.diskindex`)::

    DIR/FASTFS-DISKCACHE          marker: "fastfs disk cache ... format 1" (written first)
    DIR/journal                   append-only index log (header, then CRC-framed records)
    DIR/journal.new               a compaction in progress (removed at open: never authoritative)
    DIR/data/XX/NNNNNNNNNNNNNNNN  one sparse data file per source-file version, entry id in hex

An entry is one source-file version, keyed by the identity the engine uses (``stat_key``: device,
inode, size, mtime_ns, ctime_ns; any tuple of ints works): a changed source file has another key,
so it is never served from the old entry (which ages out by LRU). Its data file has the source's
size and holds cached bytes at their source offsets (holes elsewhere), so a complete data file is
byte for byte the source file. The file is divided into 64 KiB chunks; the index records which
chunks are held (a partly cached large file keeps exactly the ranges it holds) and each one's
CRC-32, computed from the bytes the engine read from the source, before they are written.

Crash safety (what guards what):

* A chunk is recorded as held (in RAM, then in the journal) only after its ``pwritev`` returned.
  The journal record is CRC-framed; replay stops at the first torn or damaged record, so a crash
  mid-append loses at most the records after it. Losing records is always safe: the journal then
  under-states what the data files hold.
* No byte is served unless checked. :meth:`read_into` reads whole chunks and compares each one's
  CRC-32 with the recorded one; a mismatch, a short read, a missing data file or one whose size is
  not the source's means the entry is dropped (data file unlinked) and None is returned. So data
  lost or torn by a crash (a record made durable before its data), truncated, or altered behind the
  store's back is detected (a random alteration passes a CRC-32 with probability 2^-32), never served.
* :meth:`complete_fd` hands out a descriptor only for an entry that is complete *and* was verified
  in this process: its data file fsynced (written back; a write-back error fails it) and read back
  whole with every chunk matching its CRC, recording the file's identity (inode, size, mtime_ns,
  ctime_ns). Every later call compares that identity with a fresh ``fstat``: any write, truncate or
  replacement of the file changes it, and the entry is dropped. The store never writes to a
  complete entry. Verification runs on a writer thread; the first call for an unverified entry
  queues it and returns None (serve through :meth:`read_into` meanwhile), a later call gets the fd.
  After a restart every entry is unverified again, so a crash never leaves a file trusted unread.
  :meth:`read_into` of such a verified entry skips the CRCs when the same ``fstat`` identity check
  passes (the trust ``complete_fd`` gives FUSE passthrough anyway); otherwise it checks them. With
  ``verify_min``, an entry at least that large is queued for verification as soon as its last
  chunk is written (its pages are still in the page cache, so the read-back is cheap), so the next
  open in the same process can pass through at once.
* Entry ids are never reused (``NEXT`` records reserve them in blocks ahead of use), so a data file
  name always means one entry; data files no live entry names are removed by a sweep at start.
* A compaction writes ``journal.new``, fsyncs it, renames it over ``journal`` and fsyncs the
  directory: either the old or the new journal is found after a crash.
* The directory is checked at open (:func:`fastfs.fsio.diskdir.open_root`): owned by the daemon's
  user, not group/world-writable, created 0700; a non-empty directory without the marker is foreign
  and refused (nothing deleted); a marker of another format, or a marker or journal header that
  cannot be parsed, means ours but unusable: only the names the store creates are removed, then it
  starts empty. ``flock`` on the directory keeps a second process from using it at the same time.

Writes are off the read path: :meth:`put` only queues (a memoryview of a pinned cache block plus
its ``release`` callback) and returns; when the queue (:data:`WRITE_QUEUE_BYTES`) is full the write
is declined and counted (backpressure), the caller keeps its pin. Writer threads (one per key
shard, :data:`WRITERS`) compute the CRCs, ``pwritev`` the view itself (no copy), call ``release``,
then journal the chunks. Readers never take a lock that is held across I/O: ``_lock`` guards only
RAM state; ``_jlock`` serialises journal appends and compaction and is taken only by writer
threads and :meth:`close`.

Budget: ``cache.disk_budget`` (bytes, or a share of the space available to the tier: its
filesystem's free space plus what the tier holds) bounds data files + journal + fan-out
directories; ``cache.disk_free_floor`` (bytes, or a share of the filesystem's size) of free space
is never used. Free space comes from ``statvfs`` (injectable), re-read at least every
:data:`SPACE_CHECK_INTERVAL` seconds, after every :data:`SPACE_CHECK_BYTES` written, and whenever
the estimate says a write would go below the floor; between checks the estimate subtracts what was
written and what is in flight. When a write would break the budget or the floor, least recently
used entries are evicted (whole entries); when that cannot make room the write is declined. Writer
thread 0 re-checks periodically even when idle, so the floor is held while another program fills
the disk (the tier shrinks, down to nothing). Metadata is bounded: at most ``max_entries`` entries
(:data:`MAX_ENTRIES`, about 0.7 KiB of RAM each), 5 bytes of RAM per held 64 KiB chunk, and a journal
compacted to its live size when it doubles.

LRU order is kept in RAM (reads and writes refresh it); the journal keeps it as of the last
compaction (done at every clean :meth:`close`) plus later writes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import threading
import time
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from fastfs.fsio import diskdir, diskindex
from fastfs.fsio.diskdir import DiskCacheError
from fastfs.fsio.diskindex import CHUNK, Entry, charge, chunk_len, nchunks

log = logging.getLogger("fastfs.diskcache")

MIB = 1024 * 1024
# Writer threads: one computes CRCs (GIL released) while the other is in pwritev; on 2 cores more buys nothing.
WRITERS = 2
# Bytes of pinned cache blocks the write queue holds at most: one 64 MiB prefetch window, small next to 4 GiB.
WRITE_QUEUE_BYTES = 64 * MIB
# Entries (cached file versions) kept at most: ~0.7 KiB of RAM each (measured), so 1 M is ~0.7 GiB at worst.
MAX_ENTRIES = 1_000_000
# Seconds between statvfs checks (also while idle: another program may be filling the disk).
SPACE_CHECK_INTERVAL = 1.0
# Bytes written between statvfs checks under load (the estimate between checks subtracts them).
SPACE_CHECK_BYTES = 64 * MIB
# Seconds between journal fsyncs when it changed (a crash loses at most this much index, never data).
JOURNAL_SYNC_INTERVAL = 5.0
# Read size of a whole-file verification (a multiple of CHUNK).
VERIFY_READ = 4 * MIB
# Disk space charged per directory of ours and for the marker (one filesystem block each).
DIR_CHARGE = 4096
# Ids reserved per NEXT record: ids handed out never exceed the last journalled reservation.
ID_BLOCK = 4096

# Counters (monotonic) and gauges of :meth:`DiskStore.stats`.
HITS = "disk_hits"  # read_into calls served from disk
HIT_BYTES = "disk_hit_bytes"  # bytes served by them
MISSES = "disk_misses"  # read_into calls for ranges not held
WRITES = "disk_writes"  # puts written and recorded
BYTES_WRITTEN = "disk_bytes_written"
WRITES_DROPPED = "disk_writes_dropped"  # puts declined: write queue full (backpressure)
WRITES_NO_ROOM = "disk_writes_no_room"  # puts not written: budget or free-space floor, nothing left to evict
WRITES_SKIPPED = "disk_writes_skipped"  # puts not taken: already held, unaligned, or closing
WRITE_ERRORS = "disk_write_errors"  # puts that failed with an OS error (ENOSPC, EIO...)
EVICTIONS = "disk_evictions"  # entries evicted (LRU, budget, floor, entry cap)
EVICTED_BYTES = "disk_evicted_bytes"
CORRUPT = "disk_corrupt_dropped"  # entries dropped because a check failed (CRC, size, missing, altered)
VERIFIED = "disk_verified_files"  # complete entries read back and verified for complete_fd
COMPLETE_FDS = "disk_complete_fds"  # descriptors handed out by complete_fd
CLEARED = "disk_cleared"  # 1 when the directory was ours but unusable and was cleared at open
COUNTERS = (
    HITS,
    HIT_BYTES,
    MISSES,
    WRITES,
    BYTES_WRITTEN,
    WRITES_DROPPED,
    WRITES_NO_ROOM,
    WRITES_SKIPPED,
    WRITE_ERRORS,
    EVICTIONS,
    EVICTED_BYTES,
    CORRUPT,
    VERIFIED,
    COMPLETE_FDS,
    CLEARED,
)
USE = "disk_cache_bytes"  # data files + journal + directories, as charged
BUDGET = "disk_cache_budget"  # effective budget now
FREE = "disk_free_bytes"  # the filesystem's available bytes at the last check
FLOOR = "disk_free_floor"  # free bytes never used
FILES = "disk_cache_files"  # entries
QUEUED = "disk_queue_bytes"  # bytes waiting in the write queue
GAUGES = (USE, BUDGET, FREE, FLOOR, FILES, QUEUED)

_PUT, _VERIFY = 0, 1
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def _ident(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _pread_full(fd: int, view: memoryview, offset: int) -> int:
    total = 0
    while total < len(view):
        n = os.preadv(fd, [view[total:]], offset + total)
        if n <= 0:
            break
        total += n
    return total


class _Writer:
    """One writer thread and its queue (jobs for the keys hashed to it). ``jobs`` and ``busy`` are
    guarded by the store's ``_lock`` (``cv`` is a condition on it)."""

    __slots__ = ("index", "jobs", "cv", "thread", "busy")

    def __init__(self, index: int, lock: threading.Lock) -> None:
        self.index = index
        self.jobs: deque[tuple] = deque()
        self.cv = threading.Condition(lock)
        self.thread: threading.Thread | None = None
        self.busy = False


class DiskStore:
    """A budgeted, crash-safe disk store of source-file ranges (see the module docstring).

    Thread-safe. ``_lock`` guards the index (``_index`` in LRU order, oldest first, and every
    :class:`Entry` field), the space accounting (``_used``, ``_jbytes``, ``_dir_bytes``, ``_budget``,
    ``_floor``, ``_avail``, ``_written_since``, ``_pending``, ``_space_due``), ``_queued``, ``_inqueue``, the
    writers' queues, ``_drops``, ``_next_id``/``_id_limit`` and the counters ``_c``; it is never held
    across I/O. ``_jlock`` guards ``_jfd`` and the journal file (appends, compaction, fsync) and is
    taken before ``_lock`` when both are needed. ``_sub_fds`` slots are installed under ``_lock``.
    """

    def __init__(
        self,
        directory: str,
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
        if (budget_bytes > 0) == (0 < budget_share <= 1):
            raise ValueError("give exactly one of budget_bytes > 0 or 0 < budget_share <= 1")
        if floor_bytes < 0 or not 0 <= floor_share < 1 or (floor_bytes and floor_share):
            raise ValueError("floor: bytes >= 0 or a share in [0, 1), not both")
        self._budget_bytes = budget_bytes
        self._budget_share = budget_share
        self._floor_bytes = floor_bytes
        self._floor_share = floor_share
        self.max_entries = max(1, max_entries)
        self.queue_bytes = queue_bytes
        self.verify_min = verify_min  # entries at least this large (> 0) are verified as soon as complete
        self._statvfs = statvfs
        self._clock = clock
        self._lock = threading.Lock()
        self._jlock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._c = dict.fromkeys(COUNTERS, 0)
        self._index: OrderedDict[tuple, Entry] = OrderedDict()
        self._drops: list[Entry] = []
        self._queued = 0
        self._inqueue: dict[tuple, set[int]] = {}  # key -> offsets of its puts queued and not done yet
        self._used = 0  # data bytes charged: held chunks + reservations of writes in flight
        self._inflight = 0  # of which reservations of writes in flight
        self._jbytes = 0  # journal length
        self._jsnap = 0  # journal length right after the last compaction
        self._jdirty = False  # appended since the last fsync
        self._jsync_due = 0.0
        self._changed = False  # LRU order or index changed since the last compaction
        self._dir_bytes = 0
        self._budget = budget_bytes
        self._floor = floor_bytes
        self._avail = 0
        self._written_since = 0
        self._pending = 0  # bytes of writes that passed the space check and are not yet written
        self._space_due = 0.0
        self._closing = False
        self._closed = False
        self._sub_fds = [-1] * 256
        self._data_fd = -1
        self._jfd = -1
        self._sweep_ids: set[int] | None = None
        self._sweep_limit = 0
        self._stale: list[int] = []
        self._root, self.path = diskdir.open_root(directory)
        try:
            try:
                fcntl.flock(self._root, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DiskCacheError(f"{self.path}: in use by another fastfs process") from None
            self._open_layout()
            self._refresh_space()
            with self._lock:  # a journal may describe more than fits now (a crash, a lowered budget)
                self._to_limits_locked(self._drops)
        except OSError as e:
            self._close_fds()
            raise DiskCacheError(f"{self.path}: cannot use the disk cache directory: {e.strerror or e}") from None
        except BaseException:
            self._close_fds()
            raise
        self._writers = [_Writer(i, self._lock) for i in range(max(1, writers))]
        for w in self._writers:
            w.thread = threading.Thread(target=self._run, args=(w,), name=f"fastfs-disk-{w.index}", daemon=True)
            w.thread.start()

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

    # == opening ===================================================================================
    def _open_layout(self) -> None:
        root = self._root
        marker = diskdir.read_marker(root)
        fresh = marker is None
        if marker is None:
            names = diskdir.foreign_names(root)
            if names:
                shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
                raise DiskCacheError(
                    f"{self.path}: not empty and not a fastfs disk cache (no {diskdir.MARKER}; holds {shown});"
                    " use an empty or new directory"
                )
            diskdir.write_marker(root)
        elif marker != diskdir.FORMAT:
            self._clear(f"format {marker} is not {diskdir.FORMAT}" if marker > 0 else "unreadable marker")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(diskdir.JOURNAL_NEW, dir_fd=root)  # an unfinished compaction: never authoritative
        try:
            jfd = os.open(diskdir.JOURNAL, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        except FileNotFoundError:
            jfd = -1
        except OSError as e:
            raise DiskCacheError(f"{self.path}: cannot open {diskdir.JOURNAL}: {e.strerror}") from None
        if jfd >= 0:
            st = os.fstat(jfd)
            data = b""
            if stat.S_ISREG(st.st_mode):
                data = os.pread(jfd, st.st_size, 0)
            if not diskindex.check_header(data):
                os.close(jfd)
                jfd = -1
                self._clear("journal header missing or of another format")
            else:
                rep = diskindex.replay(data)
                if rep.good_end < len(data):
                    os.ftruncate(jfd, rep.good_end)  # a torn or damaged tail: drop it
                self._jfd = jfd
                self._jbytes = rep.good_end
                self._jsnap = rep.good_end
                for entry in rep.entries.values():
                    self._index[entry.key] = entry
                    self._used += entry.used
                self._next_id = self._id_limit = rep.next_id
                self._stale = rep.stale
                self._sweep_ids = {e.id for e in rep.entries.values()}
                self._sweep_limit = rep.next_id
        if jfd < 0:
            if not fresh and self._c[CLEARED] == 0:
                self._clear("journal missing")  # data files nothing describes: start empty
            self._new_journal()
        self._data_fd = diskdir.open_subdir(root, diskdir.DATA, create=True)
        subs = [n for n in os.listdir(self._data_fd) if len(n) == 2]
        self._dir_bytes = DIR_CHARGE * (3 + len(subs))  # the root, the marker, data/ and its fan-out directories

    def _clear(self, why: str) -> None:
        removed = diskdir.clear_ours(self._root)
        log.warning("disk cache %s: %s: cleared %d files it had created", self.path, why, removed)
        diskdir.write_marker(self._root)
        self._c[CLEARED] = 1

    def _new_journal(self) -> None:
        data = diskindex.header() + diskindex.rec_next(ID_BLOCK + 1)
        fd = os.open(
            diskdir.JOURNAL, os.O_RDWR | os.O_APPEND | diskdir.FILE_CREATE, diskdir.FILE_MODE, dir_fd=self._root
        )
        os.write(fd, data)
        os.fsync(fd)
        os.fsync(self._root)
        self._jfd = fd
        self._jbytes = self._jsnap = len(data)
        self._next_id = 1
        self._id_limit = ID_BLOCK + 1
        self._sweep_ids = set()
        self._sweep_limit = 1

    # == the engine's interface ====================================================================
    def put(self, key: tuple, size: int, offset: int, view: memoryview, release: Callable[[], None]) -> bool:
        """Queue ``view`` (the source file's bytes at ``offset``; file version ``key`` of ``size``
        bytes) to be written. Never blocks on I/O.

        True: the store took the pin and calls ``release()`` exactly once, from a writer thread,
        when it no longer reads ``view``. False (queue full: counted as dropped; already held,
        unaligned, already queued, or closing: skipped): ``release`` is not called, the caller keeps
        its pin. ``offset`` must be a multiple of 64 KiB and the view whole 64 KiB chunks or end at ``size``
        (engine blocks and whole small files always are).
        """
        n = len(view)
        end = offset + n
        aligned = n > 0 and offset >= 0 and offset % CHUNK == 0 and (n % CHUNK == 0 or end == size) and end <= size
        with self._lock:
            if not aligned or self._closing or not diskindex.valid_key(key):
                self._c[WRITES_SKIPPED] += 1
                return False
            entry = self._index.get(key)
            if entry is not None and (entry.size != size or entry.holds(offset // CHUNK, (end - 1) // CHUNK)):
                self._c[WRITES_SKIPPED] += 1
                return False
            offsets = self._inqueue.get(key)
            if offsets is not None and offset in offsets:
                self._c[WRITES_SKIPPED] += 1
                return False
            if self._queued + n > self.queue_bytes:
                self._c[WRITES_DROPPED] += 1
                return False
            self._queued += n
            self._inqueue.setdefault(key, set()).add(offset)
            w = self._writers[hash(key) % len(self._writers)]
            w.jobs.append((_PUT, key, size, offset, view, release))
            w.cv.notify()
        return True

    def holds(self, key: tuple, offset: int, length: int) -> bool:
        """Whether ``[offset, offset + length)`` (clipped at the file's end) is held (no I/O, no check)."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None or not entry.created or offset < 0:
                return False
            end = min(offset + length, entry.size)
            return offset >= end or entry.holds(offset // CHUNK, (end - 1) // CHUNK)

    def queued(self, key: tuple, offset: int) -> bool:
        """Whether a put of ``key`` at ``offset`` is queued or being written now (no I/O)."""
        with self._lock:
            return offset in self._inqueue.get(key, ())

    def pending(self, key: tuple) -> bool:
        """Whether any put of ``key`` is queued or being written now (no I/O)."""
        with self._lock:
            return key in self._inqueue

    def has_room(self, nbytes: int) -> bool:
        """Whether the write queue has room for ``nbytes`` now (advisory: a put may still be declined)."""
        return self._queued + nbytes <= self.queue_bytes

    def held_bytes(self, key: tuple) -> int:
        """Bytes of file version ``key`` the store holds (no I/O, no check)."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None or not entry.created or not entry.nheld:
                return 0
            held = entry.nheld * CHUNK
            last = len(entry.held) - 1
            if entry.held[last]:
                held -= CHUNK - chunk_len(entry.size, last)
            return held

    def advise(self, key: tuple) -> bool:
        """Ask the kernel to read the data file of ``key`` into the page cache ahead (``POSIX_FADV_WILLNEED``,
        no wait, no check: :meth:`read_into` checks when it is read); False when nothing is held."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None or not entry.created:
                return False
        try:
            fd = os.open(diskdir.data_name(entry.id), _READ, dir_fd=self._subdir(entry.id, create=False))
        except OSError:
            return False
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            return False
        finally:
            os.close(fd)
        return True

    def read_into(self, key: tuple, offset: int, view: memoryview) -> int | None:
        """Fill ``view`` with the file's bytes from ``offset`` if held; returns the bytes filled
        (``len(view)``, less at the file's end), or None: not held, or held but failed its check (then
        dropped; ``view``'s contents are undefined). Reads whole chunks and checks each one's CRC (not
        for a file verified whole and unchanged since); an aligned request (engine blocks, whole small
        files) is read straight into ``view``, others through a scratch buffer."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None or not entry.created or offset < 0:
                self._c[MISSES] += 1
                return None
            size = entry.size
            end = min(offset + len(view), size)
            if offset >= end:
                return 0
            first, last = offset // CHUNK, (end - 1) // CHUNK
            if not entry.holds(first, last):
                self._c[MISSES] += 1
                return None
            crcs = entry.crcs[first : last + 1]
            verified = entry.verified
            self._index.move_to_end(key)
            self._changed = True
        lo, hi = first * CHUNK, min((last + 1) * CHUNK, size)
        direct = offset == lo and end == hi
        target = view[: end - offset] if direct else memoryview(bytearray(hi - lo))
        try:
            fd = os.open(diskdir.data_name(entry.id), _READ, dir_fd=self._subdir(entry.id, create=False))
        except OSError:
            self._corrupt(entry)
            return None
        trusted = False
        try:
            st = os.fstat(fd)
            ok = stat.S_ISREG(st.st_mode) and st.st_size == size and _pread_full(fd, target, lo) == len(target)
            trusted = ok and verified is not None and _ident(st) == verified
        except OSError:
            ok = False
        finally:
            os.close(fd)
        if ok and not trusted:  # a file verified whole in this process and unchanged since needs no CRC
            for i, crc in enumerate(crcs):
                if zlib.crc32(target[i * CHUNK : (i + 1) * CHUNK]) != crc:
                    ok = False
                    break
        if not ok:
            self._corrupt(entry)
            return None
        if not direct:
            view[: end - offset] = target[offset - lo : end - lo]
        with self._lock:
            self._c[HITS] += 1
            self._c[HIT_BYTES] += end - offset
        return end - offset

    def complete_fd(self, key: tuple) -> int | None:
        """A new read-only descriptor of the data file of a complete, verified entry (its bytes are
        exactly the source file's; the caller closes it), or None. The first call for a complete but
        not yet verified entry queues its verification and returns None; a later call gets the fd.
        The descriptor stays valid (and its disk space used) until closed, even if the entry is evicted."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None or not entry.created or not entry.complete:
                return None
            if entry.verified is None:
                self._queue_verify_locked(entry)
                return None
            ident = entry.verified
            self._index.move_to_end(key)
            self._changed = True
        try:
            fd = os.open(diskdir.data_name(entry.id), _READ, dir_fd=self._subdir(entry.id, create=False))
        except OSError:
            self._corrupt(entry)
            return None
        try:
            same = _ident(os.fstat(fd)) == ident
        except OSError:
            same = False
        if not same:
            os.close(fd)
            self._corrupt(entry)
            return None
        with self._lock:
            self._c[COMPLETE_FDS] += 1
        return fd

    def discard(self, key: tuple) -> bool:
        """Drop the entry of ``key`` if any (e.g. the engine saw the source change); True if dropped."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                return False
            self._remove_locked(entry)
            self._queue_drop_locked(entry)
        return True

    def stats(self) -> dict[str, int]:
        """Counters (:data:`COUNTERS`, monotonic) and gauges (:data:`GAUGES`) as one flat dict."""
        with self._lock:
            out = dict(self._c)
            out.update(
                {
                    USE: self._used + self._jbytes + self._dir_bytes,
                    BUDGET: self._budget,
                    FREE: self._avail,
                    FLOOR: self._floor,
                    FILES: len(self._index),
                    QUEUED: self._queued,
                }
            )
        return out

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write, verification and drop is done; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._drops or any(w.jobs or w.busy for w in self._writers):
                if self._closed:
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left if left is not None else 1.0)
        return True

    def maintain(self) -> None:
        """Re-read free space, evict to the budget, the free-space floor and the entry cap, compact and
        sync the journal when due. Writer thread 0 calls it every SPACE_CHECK_INTERVAL; tests call it."""
        self._refresh_space()
        victims: list[Entry] = []
        with self._lock:
            self._to_limits_locked(victims)
        if victims:
            self._discard(victims)
            self._refresh_space()
        self._journal_upkeep()

    def close(self, drain: bool = True) -> None:
        """Stop the writers (after finishing queued writes when ``drain``, else releasing them unwritten),
        compact and sync the journal, close every descriptor. Idempotent."""
        with self._lock:
            if self._closed or self._closing:
                return
            self._closing = True
            if not drain:
                for w in self._writers:
                    for job in w.jobs:
                        if job[0] == _PUT:
                            self._queued -= len(job[4])
                            self._unqueue_locked(job[1], job[3])
                            self._release(job[5])
                    w.jobs.clear()
            for w in self._writers:
                w.cv.notify_all()
        for w in self._writers:
            if w.thread is not None:
                w.thread.join()
        with self._lock:
            drops, self._drops = self._drops, []
        self._discard(drops)
        try:
            self._compact(force=self._changed)
            with self._jlock:
                os.fsync(self._jfd)
        except OSError as e:
            log.warning("disk cache %s: journal not saved at close: %s", self.path, e.strerror)
        with self._lock:
            self._closed = True
            self._idle.notify_all()
        self._close_fds()

    def _close_fds(self) -> None:
        for fd in [*self._sub_fds, self._data_fd, self._jfd, self._root]:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._sub_fds = [-1] * 256
        self._data_fd = self._jfd = self._root = -1

    # == writer threads ============================================================================
    def _run(self, w: _Writer) -> None:
        if w.index == 0:
            self._sweep()
        while True:
            with self._lock:
                w.busy = False
                if not w.jobs and not self._drops:
                    self._idle.notify_all()
                while not w.jobs and not self._drops and not self._closing:
                    timeout = None
                    if w.index == 0:
                        timeout = max(0.0, self._space_due - self._clock())
                        if timeout == 0:
                            break
                    w.cv.wait(timeout)
                if self._closing and not w.jobs:
                    return
                job = w.jobs.popleft() if w.jobs else None
                drops, self._drops = self._drops, []
                w.busy = True
            try:
                if drops:
                    self._discard(drops)
                if job is not None and job[0] == _PUT:
                    self._write(*job[1:])
                elif job is not None and self._closing:
                    with self._lock:
                        job[1].verifying = False  # not worth delaying the close for
                elif job is not None:
                    self._verify(job[1])
                if w.index == 0 and self._clock() >= self._space_due:
                    self.maintain()
            except Exception:  # a bug must not kill the writer (writes would stall forever)
                log.exception("disk cache %s: writer failed", self.path)

    def _write(self, key: tuple, size: int, offset: int, view: memoryview, release: Callable[[], None]) -> None:
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
            crcs = diskindex.crcs_of(view)
            with self._lock:
                entry = self._index.get(key)
                if entry is not None and (entry.size != size or entry.holds(first, first + count - 1)):
                    self._c[WRITES_SKIPPED] += 1
                    return
                if not self._evict_locked(victims, need, keep=entry, new=entry is None):
                    self._c[WRITES_NO_ROOM] += 1
                    entry = None
                else:
                    if entry is None:
                        entry = Entry(self._take_id_locked(), key, size)
                        self._index[key] = entry
                    self._index.move_to_end(key)
                    self._used += need
                    self._inflight += need
                    reserved = need
            if victims:
                self._discard(victims)
            if entry is None:
                return
            if self._id_limit_due():
                self._reserve_ids()
            spaced = self._space_for(need, entry)
            if not spaced:
                with self._lock:
                    self._c[WRITES_NO_ROOM] += 1
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
                    self._unlink_data(entry.id)
                raise
            os.close(fd)
            self._release(release)
            released = True
            record = diskindex.rec_chunks(entry.id, first, crcs)
            if creating:  # the file exists and holds this write: one append describes both
                record = diskindex.rec_entry(entry.id, size, key) + record
            try:
                self._append(record)
            except OSError:
                if creating:
                    self._unlink_data(entry.id)
                raise
            if creating and not self._created(entry):
                return
            with self._lock:
                self._pending -= spaced
                self._written_since += spaced
                spaced = 0
                self._used -= reserved
                self._inflight -= reserved
                reserved = 0
                if entry.live:
                    self._used += entry.mark(first, crcs)
                    self._c[WRITES] += 1
                    self._c[BYTES_WRITTEN] += n
                    self._changed = True
                    if 0 < self.verify_min <= size and entry.complete and entry.verified is None:
                        self._queue_verify_locked(entry)  # its pages are still in the page cache: cheap now
            done = True
        except OSError as e:
            with self._lock:
                self._c[WRITE_ERRORS] += 1
                if e.errno == errno.ENOSPC:
                    self._space_due = 0.0  # re-read free space now
        finally:
            with self._lock:
                self._used -= reserved
                self._inflight -= reserved
                self._pending -= spaced
                self._queued -= n
                self._unqueue_locked(key, offset)
                if not done and entry is not None and not entry.created:
                    self._remove_locked(entry)  # never got a data file: leave no empty entry behind
            if not released:
                self._release(release)

    def _unqueue_locked(self, key: tuple, offset: int) -> None:
        offsets = self._inqueue.get(key)
        if offsets is not None:
            offsets.discard(offset)
            if not offsets:
                del self._inqueue[key]

    def _release(self, release: Callable[[], None]) -> None:
        try:
            release()
        except Exception:
            log.exception("disk cache %s: release callback failed", self.path)

    def _open_for_write(self, entry: Entry, truncate: bool) -> int:
        """The entry's data file opened for writing, created (``truncate``: extended to the source's size)
        if the entry has none yet; -1 when it vanished (the entry is dropped)."""
        sub = self._subdir(entry.id, create=True)
        name = diskdir.data_name(entry.id)
        if entry.created:
            try:
                fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sub)
            except FileNotFoundError:
                self._corrupt(entry)  # no-op when an eviction removed it meanwhile
                return -1
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
                os.close(fd)
                self._corrupt(entry)
                return -1
            return fd
        try:
            fd = os.open(name, os.O_WRONLY | diskdir.FILE_CREATE, diskdir.FILE_MODE, dir_fd=sub)
        except FileExistsError:  # an orphan of a crashed run whose records were lost
            os.unlink(name, dir_fd=sub)
            fd = os.open(name, os.O_WRONLY | diskdir.FILE_CREATE, diskdir.FILE_MODE, dir_fd=sub)
        if truncate:
            try:
                os.ftruncate(fd, entry.size)
            except BaseException:
                os.close(fd)
                os.unlink(name, dir_fd=sub)
                raise
        return fd

    def _created(self, entry: Entry) -> bool:
        """The new data file and its ENTRY record exist: from now on an eviction unlinks it. When the
        entry was evicted while being created (the evictor left the file to us), remove it; False then."""
        with self._lock:
            live = entry.live
            if live:
                entry.created = True
        if not live:
            self._unlink_data(entry.id)
            try:
                self._append(diskindex.rec_drop(entry.id))
            except OSError:
                pass
        return live

    def _verify(self, entry: Entry) -> None:
        """Read a complete entry back whole; mark it verified (for complete_fd) or drop it."""
        ok = False
        ident = None
        try:
            fd = os.open(diskdir.data_name(entry.id), _READ, dir_fd=self._subdir(entry.id, create=False))
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                os.fsync(fd)  # written back (a write-back error fails here), so the bytes checked are durable
                st = os.fstat(fd)
                with self._lock:
                    crcs = array("I", entry.crcs)
                    size = entry.size
                ok = stat.S_ISREG(st.st_mode) and st.st_size == size
                buf = memoryview(bytearray(min(VERIFY_READ, nchunks(size) * CHUNK)))
                pos = 0
                while ok and pos < size:
                    part = buf[: min(len(buf), size - pos)]
                    if _pread_full(fd, part, pos) != len(part):
                        ok = False
                        break
                    base = pos // CHUNK
                    for i in range(nchunks(len(part))):
                        if zlib.crc32(part[i * CHUNK : (i + 1) * CHUNK]) != crcs[base + i]:
                            ok = False
                            break
                    pos += len(part)
                if ok:
                    ident = _ident(st)
                    if _ident(os.fstat(fd)) != ident:
                        ok = False  # changed while being read: not trusted; a later complete_fd retries
                        ident = None
                        with self._lock:
                            entry.verifying = False
                        return
            except OSError:
                ok = False
            finally:
                os.close(fd)
        with self._lock:
            entry.verifying = False
            if ok and entry.live:
                entry.verified = ident
                self._c[VERIFIED] += 1
        if not ok:
            self._corrupt(entry)

    # == space =====================================================================================
    def _refresh_space(self) -> None:
        st = self._statvfs(self._root)
        avail = st.f_bavail * st.f_frsize
        total = st.f_blocks * st.f_frsize
        with self._lock:
            self._avail = avail
            self._written_since = 0
            self._space_due = self._clock() + SPACE_CHECK_INTERVAL
            self._floor = self._floor_bytes if self._floor_bytes else int(self._floor_share * total)
            if self._budget_share:
                mine = self._used - self._inflight + self._jbytes + self._dir_bytes  # on disk now
                self._budget = int(self._budget_share * (avail + mine))

    def _space_for(self, need: int, entry: Entry) -> int:
        """Reserve ``need`` bytes against the free-space floor (evicting LRU entries if that helps);
        returns the bytes reserved (0: no room)."""
        need += diskindex.PAGE  # inode and extent blocks the write may add
        with self._lock:
            due = self._clock() >= self._space_due or self._written_since >= SPACE_CHECK_BYTES
            short = self._avail - self._written_since - self._pending - need < self._floor
        if due or short:
            self._refresh_space()
        for attempt in range(2):
            victims: list[Entry] = []
            with self._lock:
                deficit = self._floor - (self._avail - self._written_since - self._pending - need)
                if deficit <= 0:
                    self._pending += need
                    return need
                if attempt == 1 or self._used - self._inflight - entry.used < deficit:
                    return 0  # evicting every other entry would not be enough: evict nothing
                while deficit > 0:
                    victim = self._victim_locked(entry)
                    if victim is None:
                        break
                    deficit -= victim.used
                    self._evict_one_locked(victim, victims)
            if not victims:
                return 0
            self._discard(victims)
            self._refresh_space()
        return 0

    def _to_limits_locked(self, victims: list[Entry]) -> None:
        """Evict LRU entries (lock held) until the index fits the entry cap, the budget and the floor."""
        self._evict_locked(victims, need=0, keep=None)
        deficit = self._floor - (self._avail - self._written_since - self._pending)
        while deficit > 0:
            victim = self._victim_locked(None)
            if victim is None:
                break
            deficit -= victim.used
            self._evict_one_locked(victim, victims)

    def _evict_locked(self, victims: list[Entry], need: int, keep: Entry | None, new: bool = False) -> bool:
        """Evict LRU entries (lock held) until ``need`` more bytes fit the budget and, with ``new``, one
        more entry fits the cap; False when that is impossible."""
        while len(self._index) + (1 if new else 0) > self.max_entries:
            victim = self._victim_locked(keep)
            if victim is None:
                return False
            self._evict_one_locked(victim, victims)
        fixed = self._jbytes + self._dir_bytes + self._inflight + (keep.used if keep is not None else 0)
        if fixed + need > self._budget:
            return False  # even evicting every other entry would not make room: evict nothing
        while self._used + self._jbytes + self._dir_bytes + need > self._budget:
            victim = self._victim_locked(keep)
            if victim is None:
                return False
            self._evict_one_locked(victim, victims)
        return True

    def _victim_locked(self, keep: Entry | None) -> Entry | None:
        for entry in self._index.values():
            if entry is not keep:
                return entry
        return None

    def _evict_one_locked(self, victim: Entry, victims: list[Entry]) -> None:
        self._c[EVICTIONS] += 1
        self._c[EVICTED_BYTES] += victim.used
        self._remove_locked(victim)
        if victim.created:
            victims.append(victim)

    def _remove_locked(self, entry: Entry) -> None:
        if entry.live:
            entry.live = False
            self._used -= entry.used
            if self._index.get(entry.key) is entry:
                del self._index[entry.key]
            self._changed = True

    def _queue_verify_locked(self, entry: Entry) -> None:
        if not entry.verifying and not self._closing:
            entry.verifying = True
            w = self._writers[hash(entry.key) % len(self._writers)]
            w.jobs.append((_VERIFY, entry))
            w.cv.notify()

    def _queue_drop_locked(self, entry: Entry) -> None:
        if entry.created:
            self._drops.append(entry)
            self._writers[0].cv.notify()

    def _corrupt(self, entry: Entry) -> None:
        """A check failed: drop the entry now (RAM), its data file on a writer thread."""
        with self._lock:
            if not entry.live:
                return
            self._c[CORRUPT] += 1
            self._remove_locked(entry)
            self._queue_drop_locked(entry)

    def _discard(self, victims: list[Entry]) -> None:
        """Unlink the data files of entries already removed from the index, and journal the drops."""
        records = []
        for entry in victims:
            self._unlink_data(entry.id)
            records.append(diskindex.rec_drop(entry.id))
        if records:
            try:
                self._append(b"".join(records))
            except OSError:  # the drops are lost from the journal: a restart finds the files gone and drops them
                with self._lock:
                    self._c[WRITE_ERRORS] += 1

    def _unlink_data(self, entry_id: int) -> None:
        try:
            os.unlink(diskdir.data_name(entry_id), dir_fd=self._subdir(entry_id, create=False))
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("disk cache %s: cannot remove a data file: %s", self.path, e.strerror)

    def _subdir(self, entry_id: int, create: bool) -> int:
        slot = entry_id & 0xFF
        fd = self._sub_fds[slot]
        if fd >= 0:
            return fd
        name = diskdir.fanout_name(entry_id)
        try:
            fd = diskdir.open_subdir(self._data_fd, name, create=False)
        except FileNotFoundError:
            if not create:
                raise
            fd = diskdir.open_subdir(self._data_fd, name, create=True)
            with self._lock:
                self._dir_bytes += DIR_CHARGE
        with self._lock:
            if self._sub_fds[slot] < 0:
                self._sub_fds[slot] = fd
                return fd
            other = self._sub_fds[slot]
        os.close(fd)
        return other

    # == ids and the journal =======================================================================
    def _take_id_locked(self) -> int:
        entry_id = self._next_id
        self._next_id += 1
        return entry_id

    def _id_limit_due(self) -> bool:
        return self._next_id >= self._id_limit

    def _reserve_ids(self) -> None:
        """Journal a NEXT record reserving the next block of ids before any of them names a file."""
        with self._jlock:
            if self._next_id < self._id_limit:
                return
            limit = self._next_id + ID_BLOCK
            self._append_locked(diskindex.rec_next(limit))
            self._id_limit = limit

    def _append(self, data: bytes) -> None:
        with self._jlock:
            self._append_locked(data)

    def _append_locked(self, data: bytes) -> None:
        try:
            written = os.write(self._jfd, data)
        except OSError:
            written = -1
        if written != len(data):
            os.ftruncate(self._jfd, self._jbytes)  # never leave a torn record in the middle
            raise OSError(errno.ENOSPC, "journal append failed", diskdir.JOURNAL)
        with self._lock:
            self._jbytes += written
        self._jdirty = True

    def _journal_upkeep(self) -> None:
        with self._lock:
            grown = self._jbytes > max(diskindex.COMPACT_MIN, diskindex.COMPACT_FACTOR * self._jsnap)
        if grown:
            self._compact(force=True)
        if self._jdirty and self._clock() >= self._jsync_due:
            with self._jlock:
                self._jdirty = False
                os.fsync(self._jfd)
            self._jsync_due = self._clock() + JOURNAL_SYNC_INTERVAL

    def _compact(self, force: bool) -> None:
        """Rewrite the journal as a snapshot of the live index in LRU order (atomic rename)."""
        if not force:
            return
        with self._jlock:
            with self._lock:
                rows = [
                    (e.id, e.key, e.size, bytes(e.held), e.crcs.tobytes()) for e in self._index.values() if e.created
                ]
                limit = max(self._id_limit, self._next_id)
                self._changed = False
            data = diskindex.snapshot(rows, limit)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(diskdir.JOURNAL_NEW, dir_fd=self._root)
            fd = os.open(
                diskdir.JOURNAL_NEW, os.O_RDWR | os.O_APPEND | diskdir.FILE_CREATE, diskdir.FILE_MODE, dir_fd=self._root
            )
            try:
                view = memoryview(data)
                done = 0
                while done < len(data):
                    done += os.write(fd, view[done:])
                os.fsync(fd)
                os.rename(diskdir.JOURNAL_NEW, diskdir.JOURNAL, src_dir_fd=self._root, dst_dir_fd=self._root)
                os.fsync(self._root)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(diskdir.JOURNAL_NEW, dir_fd=self._root)
                raise
            os.close(self._jfd)
            self._jfd = fd
            self._jdirty = False
            with self._lock:
                self._jbytes = self._jsnap = len(data)
                self._id_limit = limit

    # == start-up sweep ============================================================================
    def _sweep(self) -> None:
        """Remove data files no entry names (stale entries, files of a crashed run's lost records)."""
        live, limit = self._sweep_ids, self._sweep_limit
        self._sweep_ids = None
        for entry_id in self._stale:
            self._unlink_data(entry_id)
        self._stale = []
        if not live and limit <= 1:
            return
        try:
            subs = [n for n in os.listdir(self._data_fd) if len(n) == 2]
        except OSError:
            return
        for sub in subs:
            try:
                fd = diskdir.open_subdir(self._data_fd, sub, create=False)
            except OSError:
                continue
            try:
                for name in os.listdir(fd):
                    entry_id = diskdir.parse_data_name(name)
                    if entry_id is None or entry_id >= limit or entry_id in live:
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=fd)
            except OSError:
                pass
            finally:
                os.close(fd)
