"""The disk store's reads: every byte checked before it is served, and whole-file verification.

No byte is served unless checked:

* :meth:`Reader.read_into` reads whole 64 KiB chunks and compares each one's CRC-32 with the one
  recorded when the engine's bytes were written; a mismatch, a short read, a missing data file or
  one whose size is not the source's means the entry is dropped (``corrupt``: out of the index now,
  its data file unlinked by a writer thread) and None is returned. So data lost or torn by a crash
  (a record made durable before its data), truncated, or altered behind the store's back is detected
  (a random alteration passes a CRC-32 with probability 2^-32), never served. An aligned request
  (engine blocks, whole small files) is read straight into the caller's view, others through a
  scratch buffer.
* :meth:`Reader.complete_fd` hands out a descriptor only for an entry that is complete *and* was
  verified in this process (:meth:`Reader.verify`, on a writer thread): its data file written back
  (:func:`written_back`; a write-back error fails it) and read back whole with every chunk matching its CRC,
  recording the file's identity (inode, size, mtime_ns, ctime_ns). Every later call compares that
  identity with a fresh ``fstat``: any write, truncate or replacement of the file changes it, and
  the entry is dropped. The store never writes to a complete entry. The first call for an
  unverified entry of :data:`VERIFY_AT_OPEN_MIN` or more queues its verification
  (``queue_verify_locked``) and returns None (serve through :meth:`Reader.read_into` meanwhile); a
  later call gets the fd. Smaller entries are verified when the write that completes them is done
  (the writers' ``verify_min``), or by a :meth:`Reader.read_into` of the whole file: every chunk
  checked as it is served, then the file written back and its identity unchanged (no second read).
  After a restart every entry is unverified again, so a crash never leaves a file trusted unread.
* :meth:`Reader.read_into` of such a verified entry skips the CRCs when the same ``fstat``
  identity check passes (the trust ``complete_fd`` gives FUSE passthrough anyway); otherwise it
  checks them.

Locks: the reader has no state of its own; it reads the index under the catalog lock, copies what
it needs (id, CRCs, verified identity), and does all I/O after releasing it. Readers never take the
journal lock.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import zlib
from array import array
from collections.abc import Callable

from fastfs.fsio.disk.catalog import COMPLETE_FDS, HIT_BYTES, HITS, MISSES, VERIFIED, Catalog
from fastfs.fsio.disk.files import DataFiles
from fastfs.fsio.disk.index import CHUNK, Entry, Ident, Key, chunk_len, nchunks

MIB = 1024 * 1024
# Read size of a whole-file verification (a multiple of CHUNK).
VERIFY_READ = 4 * MIB


def ident(st: os.stat_result) -> Ident:
    """A data file's identity: any write, truncate or replacement changes it."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


# Unverified entries at least this large are verified (read back on a writer thread) when an open asks
# for their descriptor; smaller ones when written (the store's verify_min) or by a checked read of the
# whole file: after a restart a read-back of each small file at its first open doubled the epoch's disk
# reads (a shuffled epoch over 1,872 files of 112 KiB from the tier: 2.01 s, against 1.68-1.73 s without).
VERIFY_AT_OPEN_MIN = 1024 * 1024
# sync_file_range flags: wait for write-back under way, start it for every dirty page, wait for it.
_SYNC_RANGE = 1 | 2 | 4


def _libc_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # pragma: no cover - not glibc/musl on Linux
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _libc_sync_file_range()


def written_back(fd: int) -> None:
    """Wait until every page of the file *fd* is written to its device; raise OSError when a write-back
    failed (since *fd* was opened). ``sync_file_range`` (no journal commit, no device cache flush): a
    verification is trusted by this process only and earned again after any restart, so what it must
    know is that the disk holds the bytes the kernel will read, not that they survive a power loss.
    Falls back to ``fsync`` where the call is missing."""
    fn = _sync_file_range
    if fn is not None:
        if fn(fd, 0, 0, _SYNC_RANGE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE):
            raise OSError(err, os.strerror(err))
    os.fsync(fd)


def pread_full(fd: int, view: memoryview, offset: int) -> int:
    """Read into all of ``view`` from ``offset`` unless the file ends first; returns the bytes read."""
    total = 0
    while total < len(view):
        n = os.preadv(fd, [view[total:]], offset + total)
        if n <= 0:
            break
        total += n
    return total


class Reader:
    """Checked reads of one store (see the module docstring). ``corrupt(entry)`` drops an entry that
    failed a check; ``queue_verify_locked(entry)`` (catalog lock held) queues a verification."""

    def __init__(
        self,
        catalog: Catalog,
        files: DataFiles,
        corrupt: Callable[[Entry], None],
        queue_verify_locked: Callable[[Entry], None],
    ) -> None:
        self._catalog = catalog
        self._files = files
        self._corrupt = corrupt
        self._queue_verify_locked = queue_verify_locked

    def holds(self, key: Key, offset: int, length: int) -> bool:
        """Whether ``[offset, offset + length)`` (clipped at the file's end) is held (no I/O, no check)."""
        with self._catalog.lock:
            entry = self._catalog.created_locked(key)
            if entry is None or offset < 0:
                return False
            end = min(offset + length, entry.size)
            return offset >= end or entry.holds(offset // CHUNK, (end - 1) // CHUNK)

    def held_bytes(self, key: Key) -> int:
        """Bytes of file version ``key`` the store holds (no I/O, no check)."""
        with self._catalog.lock:
            entry = self._catalog.created_locked(key)
            if entry is None or not entry.nheld:
                return 0
            held = entry.nheld * CHUNK
            last = len(entry.held) - 1
            if entry.held[last]:
                held -= CHUNK - chunk_len(entry.size, last)
            return held

    def advise(self, key: Key) -> bool:
        """Ask the kernel to read the data file of ``key`` into the page cache ahead (``POSIX_FADV_WILLNEED``,
        no wait, no check: :meth:`read_into` checks when it is read); False when nothing is held."""
        with self._catalog.lock:
            entry = self._catalog.created_locked(key)
            if entry is None:
                return False
        try:
            fd = self._files.open_read(entry.id)
        except OSError:
            return False
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            return False
        finally:
            os.close(fd)
        return True

    def read_into(self, key: Key, offset: int, view: memoryview) -> int | None:
        """Fill ``view`` with the file's bytes from ``offset`` if held; returns the bytes filled
        (``len(view)``, less at the file's end), or None: not held, or held but failed its check (then
        dropped; ``view``'s contents are undefined)."""
        catalog = self._catalog
        with catalog.lock:
            entry = catalog.created_locked(key)
            if entry is None or offset < 0:
                catalog.counters[MISSES] += 1
                return None
            size = entry.size
            end = min(offset + len(view), size)
            if offset >= end:
                return 0
            first, last = offset // CHUNK, (end - 1) // CHUNK
            if not entry.holds(first, last):
                catalog.counters[MISSES] += 1
                return None
            crcs = entry.crcs[first : last + 1]
            verified = entry.verified
            # the whole of a complete, unverified entry: checked here, it is verified once written back
            seal = verified is None and not entry.verifying and first == 0 and end == size
            catalog.touch_locked(key)
        lo, hi = first * CHUNK, min((last + 1) * CHUNK, size)
        direct = offset == lo and end == hi
        target = view[: end - offset] if direct else memoryview(bytearray(hi - lo))
        try:
            fd = self._files.open_read(entry.id)
        except OSError:
            self._corrupt(entry)
            return None
        trusted = False
        sealed: Ident | None = None
        try:
            st = os.fstat(fd)
            ok = stat.S_ISREG(st.st_mode) and st.st_size == size and pread_full(fd, target, lo) == len(target)
            trusted = ok and verified is not None and ident(st) == verified
            if ok and not trusted:  # a file verified whole in this process and unchanged since needs no CRC
                for i, crc in enumerate(crcs):
                    if zlib.crc32(target[i * CHUNK : (i + 1) * CHUNK]) != crc:
                        ok = False
                        break
            if ok and seal:
                # every chunk of it matched: once written back unchanged, it is verified (the write-back
                # of a file a daemon before this one wrote is long done: the call returns at once)
                written_back(fd)
                sealed = ident(st)
                ok = ident(os.fstat(fd)) == sealed
        except OSError:
            ok = False
        finally:
            os.close(fd)
        if not ok:
            self._corrupt(entry)
            return None
        if not direct:
            view[: end - offset] = target[offset - lo : end - lo]
        with catalog.lock:
            catalog.counters[HITS] += 1
            catalog.counters[HIT_BYTES] += end - offset
            if sealed is not None and entry.live and entry.verified is None:
                entry.verified = sealed
                catalog.counters[VERIFIED] += 1
        return end - offset

    def complete_fd(self, key: Key) -> int | None:
        """A new read-only descriptor of the data file of a complete, verified entry (its bytes are
        exactly the source file's; the caller closes it), or None. The first call for a complete but
        not yet verified entry (of :data:`VERIFY_AT_OPEN_MIN` or more) queues its verification and returns
        None; a later call gets the fd.
        The descriptor stays valid (and its disk space used) until closed, even if the entry is evicted."""
        catalog = self._catalog
        with catalog.lock:
            entry = catalog.created_locked(key)
            if entry is None or not entry.complete:
                return None
            if entry.verified is None:
                if entry.size >= VERIFY_AT_OPEN_MIN:
                    self._queue_verify_locked(entry)
                return None
            verified = entry.verified
            catalog.touch_locked(key)
        try:
            fd = self._files.open_read(entry.id)
        except OSError:
            self._corrupt(entry)
            return None
        try:
            same = ident(os.fstat(fd)) == verified
        except OSError:
            same = False
        if not same:
            os.close(fd)
            self._corrupt(entry)
            return None
        with catalog.lock:
            catalog.counters[COMPLETE_FDS] += 1
        return fd

    def verify(self, entry: Entry) -> None:
        """Read a complete entry back whole (on a writer thread); mark it verified or drop it."""
        catalog = self._catalog
        ok = False
        identity = None
        try:
            fd = self._files.open_read(entry.id)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                written_back(fd)  # (a write-back error fails here): the bytes checked are the disk's
                st = os.fstat(fd)
                with catalog.lock:
                    crcs = array("I", entry.crcs)
                    size = entry.size
                ok = stat.S_ISREG(st.st_mode) and st.st_size == size
                buf = memoryview(bytearray(min(VERIFY_READ, nchunks(size) * CHUNK)))
                pos = 0
                while ok and pos < size:
                    part = buf[: min(len(buf), size - pos)]
                    if pread_full(fd, part, pos) != len(part):
                        ok = False
                        break
                    base = pos // CHUNK
                    for i in range(nchunks(len(part))):
                        if zlib.crc32(part[i * CHUNK : (i + 1) * CHUNK]) != crcs[base + i]:
                            ok = False
                            break
                    pos += len(part)
                if ok:
                    identity = ident(st)
                    if ident(os.fstat(fd)) != identity:
                        # changed while being read: not trusted; a later complete_fd retries
                        with catalog.lock:
                            entry.verifying = False
                        return
            except OSError:
                ok = False
            finally:
                os.close(fd)
        with catalog.lock:
            entry.verifying = False
            if ok and entry.live:
                entry.verified = identity
                catalog.counters[VERIFIED] += 1
        if not ok:
            self._corrupt(entry)
