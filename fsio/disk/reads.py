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
  verified in this process (:meth:`Reader.verify`, on a writer thread): its data file fsynced
  (written back; a write-back error fails it) and read back whole with every chunk matching its CRC,
  recording the file's identity (inode, size, mtime_ns, ctime_ns). Every later call compares that
  identity with a fresh ``fstat``: any write, truncate or replacement of the file changes it, and
  the entry is dropped. The store never writes to a complete entry. The first call for an
  unverified entry queues its verification (``queue_verify_locked``) and returns None (serve
  through :meth:`Reader.read_into` meanwhile); a later call gets the fd. After a restart every
  entry is unverified again, so a crash never leaves a file trusted unread.
* :meth:`Reader.read_into` of such a verified entry skips the CRCs when the same ``fstat``
  identity check passes (the trust ``complete_fd`` gives FUSE passthrough anyway); otherwise it
  checks them.

Locks: the reader has no state of its own; it reads the index under the catalog lock, copies what
it needs (id, CRCs, verified identity), and does all I/O after releasing it. Readers never take the
journal lock.
"""

from __future__ import annotations

import os
import stat
import zlib
from array import array
from collections.abc import Callable

from fastfs.fsio.disk.catalog import COMPLETE_FDS, HIT_BYTES, HITS, MISSES, VERIFIED, Catalog
from fastfs.fsio.disk.files import DataFiles
from fastfs.fsio.disk.index import CHUNK, Entry, Key, chunk_len, nchunks

MIB = 1024 * 1024
# Read size of a whole-file verification (a multiple of CHUNK).
VERIFY_READ = 4 * MIB


def ident(st: os.stat_result) -> tuple[int, int, int, int]:
    """A data file's identity: any write, truncate or replacement changes it."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


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
        try:
            st = os.fstat(fd)
            ok = stat.S_ISREG(st.st_mode) and st.st_size == size and pread_full(fd, target, lo) == len(target)
            trusted = ok and verified is not None and ident(st) == verified
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
        with catalog.lock:
            catalog.counters[HITS] += 1
            catalog.counters[HIT_BYTES] += end - offset
        return end - offset

    def complete_fd(self, key: Key) -> int | None:
        """A new read-only descriptor of the data file of a complete, verified entry (its bytes are
        exactly the source file's; the caller closes it), or None. The first call for a complete but
        not yet verified entry queues its verification and returns None; a later call gets the fd.
        The descriptor stays valid (and its disk space used) until closed, even if the entry is evicted."""
        catalog = self._catalog
        with catalog.lock:
            entry = catalog.created_locked(key)
            if entry is None or not entry.complete:
                return None
            if entry.verified is None:
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
                os.fsync(fd)  # written back (a write-back error fails here), so the bytes checked are durable
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
