"""The disk cache tier as the engine uses it: keys, fills from disk, writes of fetched bytes, opens.

:class:`~fastfs.fsio.disk.store.DiskStore` keeps source-file ranges on a local disk; this module is
the glue between it and the engine (:mod:`fastfs.fsio.engine`), so the engine's own changes stay
a few calls in its fill, scan, open, warm and stats paths:

* **Writes** (:meth:`DiskTier.keeps`, :meth:`DiskTier.store_block`): when a block fill from the
  source completes (demand, prefetch, a format plan, a warm) or a small-file scan fetched a file
  whole, the engine pins the block once more before it becomes READY and hands it to the store,
  which only queues it; a writer thread writes the block's own buffer (no copy) and then unpins it.
  A reader never waits for a disk write; a full write queue drops the write (counted). Head
  windows (cache key kind ``HeadKey``, at arbitrary offsets) and short fills (a source that shrank) are
  not written.
  A small file read whole outside blocks (an exact read) is handed over as a copy
  (:meth:`DiskTier.store_copy`), since the reader's buffer goes back to the kernel.
* **Reads** (:class:`~fastfs.fsio.fills.DiskFill`): a block fill whose range the store holds (:meth:`DiskStore.holds`,
  no I/O) is queued on the pool at the fill's priority as one job reading from disk into the block
  (each 64 KiB chunk CRC-checked; see the store); when the store no longer holds it or a check
  fails (the entry is then dropped), the same job falls back to the source fill, so a reader never
  gets a byte of an entry that failed its check. Exact reads outside blocks (random reads, small
  files read at once) read the tier in the reader's thread before they go to the source. A scan's
  fetch of a small file the tier holds whole keeps only its metadata and asks the data file into the
  page cache (:meth:`DiskStore.advise`), so a scan runs ahead in metadata without taking RAM.
* **Opens** (:meth:`DiskTier.complete_fd`): a file (of any size) the store holds complete and has
  verified in this process
  is handed to the kernel as the passthrough backing file even when the source itself is served
  (network and FUSE sources), so a later epoch reads at local-disk speed without a READ reaching the
  daemon. The kernel still checks every access against the node's attributes, which are the source
  version's (the data file is 0600 and owned by the daemon; only its bytes are used). The open of a
  file a scan fetched lately is answered from the scan's metadata also when only the tier still
  holds its data (as when RAM does).

Keys. The engine's RAM key is ``stat_key`` (device, inode, size, mtime_ns, ctime_ns). Device numbers
of NFS and FUSE sources change across remounts of the source, and FUSE sources without ``use_ino``
(libfuse's high-level default, sshfs, many object-store clients) number inodes per mount, so that key
would make a remounted source miss everything. The disk key is instead ``(KEY_FORMAT, tree, path,
ino, size, mtime_ns, ctime_ns)``: ``tree`` and ``path`` are 64-bit hashes of the source root's real
path and the file's path below it, and ``ino`` is kept only on filesystems whose inode numbers are
persistent (:data:`STABLE_INODE_TYPES`: local filesystems, NFS, Ceph, Lustre; 0 elsewhere). A changed
file has another size, mtime or ctime (ctime cannot be set by users), so it misses; the path guards
against inode numbers reused within a tree that spans several filesystems. A renamed file misses
(safe). The price: on a filesystem without persistent inode numbers, a file replaced within one
timestamp tick by another of the same size at the same path would match; sources with coarse
timestamps have the same limit in every cache keyed by attributes.

Concurrency: the tier itself holds no mutable state beyond the store (thread-safe, see its own
docstring); :class:`~fastfs.fsio.fills.DiskFill` objects are owned by the block they fill (``block.job``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastfs.fsio.cache import Block
from fastfs.fsio.disk import directory
from fastfs.fsio.disk import store as diskstore
from fastfs.fsio.disk.index import Key
from fastfs.fsio.disk.store import DiskStore
from fastfs.fsio.source import LOCAL_FS_TYPES, FileKey, HeadKey

if TYPE_CHECKING:
    from fastfs.config.schema import Config

# Version of the key layout: a store written with another layout never matches (its entries age out).
KEY_FORMAT = 1
# statfs f_type of filesystems whose inode numbers persist across remounts (kept in the key there).
STABLE_INODE_TYPES = LOCAL_FS_TYPES | {
    0x6969,  # nfs
    0x00C36400,  # ceph
    0x0BD00BD0,  # lustre
}
# Seconds a warm filling the disk waits between tries when the write queue is full.
WARM_QUEUE_POLL = 0.01
# Files at least this large are verified as soon as the tier holds them whole (the read-back finds their
# pages in the page cache), so the next open in this process goes by passthrough: every file. A
# verification waits for its file's write-back (sync_file_range, no device flush: 120-180 us a file on
# this VM's disk, against 240-300 us for an fsync) on a writer thread, never on a reader.
EAGER_VERIFY_MIN = 1
# Share of the RAM budget the write queue may pin at most (1/2): queued blocks stay pinned in RAM until
# written (readable, not evictable), so a small budget keeps room for the readers' blocks; a quarter
# dropped 3 of 10 writes of a small-file epoch at a 20 MiB budget, a half 1 in 25.
QUEUE_RAM_SHARE = 2


def _id64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(os.fsencode(text), digest_size=8).digest(), "little")


class DiskTier:
    """The engine's view of one :class:`DiskStore` (see the module docstring)."""

    def __init__(self, store: DiskStore, source_root: str, source_fs_type: int) -> None:
        self.store = store
        self.path = store.path
        self._tree = _id64(os.path.realpath(source_root))
        self._keep_ino = source_fs_type in STABLE_INODE_TYPES

    @classmethod
    def open(
        cls, config: Config, source_root: str, source_fs_type: int, ram_budget: int, mountpoint: str = ""
    ) -> DiskTier | None:
        """The tier of ``config.cache`` (None when ``cache.disk_dir`` is empty), its write queue bounded
        to a share of ``ram_budget`` (:data:`QUEUE_RAM_SHARE`). Raises
        :class:`~fastfs.fsio.disk.directory.DiskCacheError` (one line) for a directory inside or around the
        source or the mountpoint, one owned by another user or writable by others, a foreign one, or
        one another process uses."""
        cache = config.cache
        if not cache.disk_dir:
            return None
        directory.check_placement(cache.disk_dir, source_root, mountpoint or config.mountpoint)
        queue = min(diskstore.WRITE_QUEUE_BYTES, max(cache.block_size, ram_budget // QUEUE_RAM_SHARE))
        store = DiskStore.from_config(cache, queue_bytes=queue, verify_min=EAGER_VERIFY_MIN)
        assert store is not None  # (disk_dir is set)
        return cls(store, source_root, source_fs_type)

    def writing(self) -> bool:
        """Whether writes are queued (their blocks stay pinned in RAM until written)."""
        return self.store.stats()[diskstore.QUEUED] > 0

    def key(self, path: str, file_key: FileKey) -> Key:
        """Disk key of the version ``file_key`` (the engine's stat_key) of source file ``path``."""
        _dev, ino, size, mtime_ns, ctime_ns = file_key  # (a plain 5-tuple works too)
        return (KEY_FORMAT, self._tree, _id64(path), ino if self._keep_ino else 0, size, mtime_ns, ctime_ns)

    # -- reads ------------------------------------------------------------------------------------
    def holds(self, dkey: Key, start: int, length: int) -> bool:
        return bool(dkey) and self.store.holds(dkey, start, length)

    def read(self, dkey: Key, start: int, view: memoryview) -> int | None:
        """Bytes read into ``view`` from ``start`` (checked), or None: not held, or failed its check."""
        return self.store.read_into(dkey, start, view) if dkey else None

    # -- writes -----------------------------------------------------------------------------------
    @staticmethod
    def keeps(dkey: Key, block: Block, n: int, length: int) -> bool:
        """Whether a fill of ``block`` that got ``n`` of its ``length`` bytes is written to disk: whole
        blocks of the file only (not head windows, which lie at any offset, nor short reads), and not
        blocks of a disk warm (it writes them itself with :meth:`ensure`, waiting for queue room)."""
        if getattr(block, "disk_warm", False):
            return False
        return bool(dkey) and n == length and n > 0 and not isinstance(block.key[0], HeadKey)

    def store_block(self, dkey: Key, size: int, block: Block, n: int, unpin: Callable[[Block], None]) -> bool:
        """Queue the first ``n`` bytes of ``block`` (pinned once for the store by the caller) for writing;
        the pin is given back with ``unpin(block)`` when the store is done, or at once when not taken."""
        if self.store.put(dkey, size, block.start, block.view[:n], functools.partial(unpin, block)):
            return True
        unpin(block)
        return False

    def store_copy(self, dkey: Key, size: int, view: memoryview) -> bool:
        """Queue a copy of a whole small file read outside blocks (``view`` is the file's bytes from 0)."""
        data = memoryview(bytes(view))
        return self.store.put(dkey, size, 0, data, _nothing)

    def ensure(
        self,
        dkey: Key,
        size: int,
        block: Block,
        pin: Callable[[Block], None],
        unpin: Callable[[Block], None],
        deadline: float | None,
    ) -> bool:
        """For ``fastfs warm --disk``: see that the READY ``block`` (pinned by the caller) is on disk or
        queued for it, waiting (until ``deadline``) for room in the write queue; False when it could
        not be queued (the store declined it or is closing)."""
        n = block.length
        while True:
            if self.store.holds(dkey, block.start, n) or self.store.queued(dkey, block.start):
                return True
            if self.store.has_room(n):
                pin(block)
                if self.store_block(dkey, size, block, n, unpin):
                    return True
                if self.store.holds(dkey, block.start, n) or self.store.queued(dkey, block.start):
                    return True
                if self.store.has_room(n):
                    return False  # not taken for another reason (closing, a bad range)
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(WARM_QUEUE_POLL)

    # -- opens ------------------------------------------------------------------------------------
    def complete_fd(self, dkey: Key) -> int | None:
        """A descriptor of the complete, verified data file of ``dkey`` (the caller closes it), or None
        (the first call for an unverified complete file queues its verification)."""
        return self.store.complete_fd(dkey) if dkey else None

    # -- stats and life ---------------------------------------------------------------------------
    def stats(self) -> tuple[dict[str, int], dict[str, int]]:
        """(counters, gauges) of the store, named as in :mod:`fastfs.fsio.disk.catalog`."""
        s = self.store.stats()
        return {k: s[k] for k in diskstore.COUNTERS}, {k: s[k] for k in diskstore.GAUGES}

    def close(self) -> None:
        self.store.close()


def _nothing() -> None:
    pass
