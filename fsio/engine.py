"""The engine: the whole read path of fastfs behind a small, FUSE-free API.

The daemon's operations adapter translates kernel requests into calls of :class:`Engine`; tests
drive it directly. The engine owns the confined :class:`~fastfs.fsio.source.Source`, the
:class:`~fastfs.fsio.cache.BlockCache`, the :class:`~fastfs.fsio.pool.PreadPool` and the
policies, and carries out what the pure policies plan.

Read path. Each read of an open file version is fed to its :class:`StreamPolicy`. A read that
continues a sequential stream is served from cache blocks: blocks it needs that are missing are
fetched at demand priority, and the plan's window ahead is reserved and queued as prefetch
(declined when the budget or the queue is full). A read of a stream that is not sequential goes to
the source for exactly the bytes asked (no amplification for random access); a large one (an mmap
read-around) is split into page-aligned pieces read in parallel on the block-read streams.
Block fills are split into pieces of at least :data:`FILL_SPLIT_MIN`, one per source stream, read
in parallel; the last piece to finish completes the block (a failed piece fails it).
Format-aware plans (:mod:`fastfs.fsio.formats`) decide alone what is fetched ahead inside their
ranges, mmap-shaped reads included: a :class:`RangePlan` releases one block at open, then bytes
ahead of each run of reads the reader has proven dense, within the touched tensor until the run
walks on into the next (a lazy loader touching a page of every tensor is served what it reads).
A plan's heads (the local header of every record of a torch zip, which ``torch.load`` reads one by
one, each a source round trip) are fetched at open, in parallel, as small page windows kept in the
cache under negative block indexes, and reads that fall inside one are served from it. When the
last handle of a planned file closes, the share of the plan its readers read is remembered (with
learning on); the next load of the same version, after a remount too, has its plan released whole
at open if that load read (nearly) all of it.
While the format probe runs, a read from offset 0 does not make the stream policy's bet on a whole
file read. Every source read runs on the pool so a read can give up after
``readahead.read_timeout`` (a hung source must not hang the application forever); results of such
demand reads land in a private bounce buffer first, so a late completion never writes into a
buffer the kernel already took back.

Opens. Close-to-open consistency, as NFS: each open revalidates the source (open + fstat) and
builds the file key (device, inode, size, mtime, ctime); an open for an inode of another version
(``expect``) fails with ESTALE. The kernel has one inode per version (the daemon's node table), so
its page cache of a version is never stale. The route of an open (served through this engine, or
passthrough to the source file) is chosen here (:func:`~fastfs.fsio.policy.choose_route`). The one
exception is a file fetched whole by a small-file scan in the last ``attr_timeout`` seconds (and
still held in RAM or by the disk tier): its open and lookups are answered from the metadata the
scan fetched, like the kernel's own attribute cache, which is what makes a directory scan fast on
high-latency storage.

Disk tier (``cache.disk_dir``, :mod:`fastfs.fsio.disktier`). Block fills and exact reads read
from the disk tier first when it holds the range (checked there; a failed check falls back to the
source), and what they and scans fetched from the source is handed to the tier's writer threads (off
the read path). A scan of a small file the tier holds whole keeps only its metadata (no RAM block)
and asks its data file into the page cache. An open of a file (of :data:`DISK_PASSTHROUGH_MIN` or
more) the tier holds complete and has verified goes by passthrough to that disk file when the kernel
route exists, also for sources that are otherwise served.

Scans. Opens are also fed to a per-directory :class:`ScanPolicy`; when it detects a scan, the
directory is listed and its remaining small files are fetched whole in the planned order, keeping
at most :data:`SCAN_LEAD_FILES` ahead of the reader. With learning on, the set of files each
directory's readers opened is recorded and, on the next epoch or after a remount, a scan of that
set starts on the first open.

Concurrency: ``_lock`` guards ``_handles``, ``_entries``, ``_last_key``,
``_implicit``, ``_meta`` and source-file reference counts. Each :class:`FileEntry` has its own lock
guarding its policy and range plan; each :class:`DirScan` its own lock guarding its scan state. No
lock is held across I/O or while waiting for a block; the cache and pool document their own locks.
"""

from __future__ import annotations

import _thread
import bisect
import concurrent.futures
import errno
import functools
import logging
import mmap
import os
import stat
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from fastfs.config.reload import apply_live, needs_remount
from fastfs.config.schema import DEFAULT_BUDGET_CAP, DEFAULT_BUDGET_FRACTION, MIN_BUDGET, Config
from fastfs.fsio import formats
from fastfs.fsio import stats as m
from fastfs.fsio.cache import FAILED, READY, Block, BlockCache, round_up
from fastfs.fsio.disktier import DiskFill, DiskTier
from fastfs.fsio.policy import ROUTE_PASSTHROUGH, ROUTE_SERVED, RangePlan, ScanPolicy, StreamPolicy, choose_route
from fastfs.fsio.pool import FileGroup, PreadPool
from fastfs.fsio.source import DIRECT_ALIGN, Source, SourceFile, cached_share, split, stat_key
from fastfs.fsio.trace import DecisionLog

log = logging.getLogger(__name__)

# Files at least this large get a format probe on first open (smaller ones are read whole anyway).
FORMAT_MIN_SIZE = 1024 * 1024
# Exact demand reads at least this large (and page-aligned) go to a block-read stream through an
# aligned buffer, as one source request instead of the source's read-ahead-sized pieces.
EXACT_ALIGNED_MIN = 64 * 1024
# Exact aligned reads are split into pieces of at least this size, one per source stream.
EXACT_SPLIT_MIN = 256 * 1024
# Block fills are split into pieces of at least this size, one per source stream, read in parallel:
# a reader waiting for a block waits for its slowest piece, not for one stream to carry all of it,
# and queued blocks complete in queue order instead of all together at the end.
FILL_SPLIT_MIN = 1024 * 1024
# Bytes of a format plan released at open, before any read: one block (the first tensor's start),
# so a loader that then reads little does not pay for more; reads release the rest.
FORMAT_INITIAL_LEAD = 4 * 1024 * 1024
# Bytes fetched from the page of each head of a format plan (a zip local header): the kernel reads
# a header as the two pages from the page it starts in (8 KiB requests), so this holds that read.
HEAD_WINDOW = 8 * 1024
# Head windows are fetched only while they total at most 1/HEAD_SHARE of the planned bytes, so a
# full load pays at most ~6 % extra for them (files of many tiny records are read in blocks anyway).
HEAD_SHARE = 16
# Cap of one file's head windows (2,048 records with 8 KiB windows).
MAX_HEAD_BYTES = 16 * 1024 * 1024
# Share of a format plan the previous load of the file read from which the next load of the same
# version gets its plan released whole at open (a loader that read nine tenths reads it all).
WHOLE_SHARE = 0.9
# How far ahead of the furthest read a format plan keeps its ranges in flight at most.
FORMAT_LEAD = 256 * 1024 * 1024
# Bytes per WILLNEED request when fastfs warm fills the page cache of a passthrough file: the kernel
# reads at most max(io_pages, ra_pages) of a request (often 2-4 MiB) and submits it without waiting,
# so small requests in a row fill the device queue. (Warming at every open was measured and lost:
# cold np.load of 256 MiB 0.226 s with it, 0.136 s without, native 0.133 s; torch.load no gain.)
PASSTHROUGH_WARM_CHUNK = 2 * 1024 * 1024
# Files at least this large open by passthrough to their complete disk-tier file: a smaller one is read in
# one or two kernel requests, so passthrough saves little next to its lookup and open, while trusting the
# file first costs an fsync and a read-back of it (served through the engine, it is checked chunk by chunk).
DISK_PASSTHROUGH_MIN = 1024 * 1024
# Largest whole file an exact read hands the disk tier as a copy (larger files are read in blocks, which
# the tier takes without a copy).
DISK_COPY_MAX = 1024 * 1024
# Source lstats in flight at once for one directory listing with attributes (overlaps ~1 ms round trips).
LSTAT_PARALLEL = 16
# A scan keeps at most 1/SCAN_BUDGET_SHARE (half) of the cache budget fetched ahead of the reader: a data set
# larger than the budget read in shuffled order would otherwise evict files fetched ahead before
# their turn comes (fetched twice, read once).
SCAN_BUDGET_SHARE = 2
# Small files a scan keeps fetched ahead of the reader (bounds memory of huge directories).
SCAN_LEAD_FILES = 4096
# Scan fetches in flight per directory (enough to overlap 1.5 ms round trips).
SCAN_PARALLEL = 32
# Directories whose scan state is remembered (least recently used forgotten first).
MAX_DIRS = 1024
# Paths whose scan-fetched metadata is remembered.
MAX_META = 200_000
# Paths whose last file key is remembered (a new version frees the old one's blocks at once).
MAX_VERSIONS = 100_000
# Open-less readers (fuse.no_open) tracked; least recently used closed first.
MAX_IMPLICIT = 256
# Sorts after every (start, end, index) head window of the same start (bisect key for "starts <= offset").
_AFTER_ANY = float("inf")
# Seconds a read waits when an earlier read of the same data already timed out (the kernel retries
# a failed request at once; the source may also have come back meanwhile).
RETRY_WAIT = 1.0
# While reads of a file are stuck on the source (a reader timed out and they have not returned),
# new reads of it fail at once, except one per this many seconds that tries the source again.
STUCK_PROBE_SECONDS = 5.0
# Seconds a read of such a file waits for the stuck reads to return before it fails (a source that
# has just come back answers them within milliseconds).
UNSTUCK_WAIT = 0.25
# Bytes delivered from one file version before its per-file counts join the shared top-files table.
FILE_STATS_BATCH = 4 * 1024 * 1024
# Seconds between saves of the learned access sets.
LEARN_SAVE_SECONDS = 30.0


@dataclass(frozen=True)
class OpenResult:
    """What an open returns to the adapter."""

    fh: int
    """Handle to pass to read_into/release (never 0)."""
    route: str = ROUTE_SERVED
    """``served`` (reads come to the engine) or ``passthrough`` (the kernel reads the source file)."""
    backing_fd: int = -1
    """For passthrough: the open source descriptor to register as the backing file (valid until release)."""
    key: tuple = ()
    """File key of the version opened."""
    st: os.stat_result | None = None
    """Attributes of the version opened."""


class ReplyParts:
    """The pieces of one read's reply when RAM blocks are sent without a copy (see read_into)."""

    __slots__ = ("views", "blocks")

    def __init__(self) -> None:
        self.views: list[memoryview] = []
        self.blocks: list[Block] = []


@dataclass
class FileEntry:
    """State of one open file version shared by its handles."""

    path: str
    key: tuple
    size: int
    src: SourceFile | None
    st: os.stat_result
    policy: StreamPolicy
    lock: threading.Lock = field(default_factory=threading.Lock)
    handles: int = 0
    range_plan: RangePlan | None = None
    probed: bool = False
    planning: bool = False  # a format probe is queued or running (the plan will decide what to fetch)
    mmap_seen: bool = False
    heads: tuple[tuple[int, int, int], ...] = ()  # (start, end, cache index) of fetched head windows, by
    # start (replaced whole, read without lock)
    inline: int = 0  # source reads running on readers' own threads (guarded by lock)
    inline_stuck: int = 0  # of those, counted in stuck: the kernel layer gave up on their readers (lock)
    stuck: int = 0  # source reads (direct or block fills) still running after a reader timed out on
    # them (guarded by lock); while > 0 new reads fail fast (see Engine._fail_fast)
    probe_at: float = 0.0  # monotonic time the last read was let through to a stuck file (guarded by lock)
    unstuck: threading.Event = field(default_factory=lambda: _set(threading.Event()))  # set while
    # stuck == 0 (changed under lock)
    group: FileGroup = field(default_factory=FileGroup)  # this version's jobs in the pool (the pool's lock)
    delivered: int = 0  # bytes delivered, not yet added to the top-files table (guarded by lock)
    direct: int = 0  # bytes read from the source for them outside blocks, likewise
    dkey: tuple = ()  # key of this version in the disk tier (() without one); set once
    disk_fd: int = -1  # descriptor of its complete disk-tier file handed to the kernel as the backing
    # file of passthrough opens (guarded by the engine's lock; closed with the last handle)


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


@dataclass
class MetaEntry:
    """Metadata fetched by a scan: served for lookups and opens while fresh."""

    st: os.stat_result
    key: tuple
    fetched_at: float


@dataclass
class DirScan:
    """Scan state of one directory."""

    policy: ScanPolicy
    lock: threading.Lock = field(default_factory=threading.Lock)
    queue: deque[str] = field(default_factory=deque)
    known: int = 0
    inflight: int = 0
    ahead: dict[str, int] = field(default_factory=dict)  # name -> cache capacity of files fetched, not opened yet
    ahead_bytes: int = 0  # sum of those capacities
    sized: int = 0  # files this scan fetched, and their capacity in all (the mean estimates fetches in flight)
    sized_bytes: int = 0


def default_budget() -> int:
    """min(25% of available memory, 4 GiB), at least the minimum budget."""
    return max(MIN_BUDGET, min(int(psutil.virtual_memory().available * DEFAULT_BUDGET_FRACTION), DEFAULT_BUDGET_CAP))


class Engine:
    """FUSE-free read path of one mount (see the module docstring)."""

    def __init__(self, source: str, config: Config | None = None, stats: m.Stats | None = None) -> None:
        self.config = config or Config()
        self.stats = stats or m.Stats()
        ra = self.config.readahead
        self.source = Source(source, direct=ra.source_direct_io, streams=ra.source_streams)
        budget = self.config.cache.budget or default_budget()
        try:  # the disk tier (cache.disk_dir) first: a directory it refuses fails the start before any thread
            self.disk = DiskTier.open(self.config, self.source.root, self.source.fs_type, budget)
        except BaseException:
            self.source.close()
            raise
        self.block_size = self.config.cache.block_size
        self.cache = BlockCache(budget, self.block_size, self.stats, self.config.cache.check_invariants)
        self.pool = PreadPool(self.config.cache.workers, file_workers=self.config.cache.file_workers)
        self._lock = threading.Lock()
        self._handles: dict[int, FileEntry] = {}
        self._entries: dict[tuple, FileEntry] = {}
        self._last_key: OrderedDict[str, tuple] = OrderedDict()  # path -> file key of its last open
        self._implicit: OrderedDict[str, tuple[FileEntry, float, int]] = OrderedDict()  # path -> (entry, at, fh)
        self._meta: OrderedDict[str, MetaEntry] = OrderedDict()
        self._dirs: OrderedDict[str, DirScan] = OrderedDict()
        self._dirs_lock = threading.Lock()
        self._next_fh = 1
        self._closed = False
        self.passthrough_available = False  # set by the daemon when the kernel connection can do passthrough
        self.inline_reads = False  # set by the daemon when a watchdog bounds requests: exact small reads
        # then run on the reader's thread (see _read_direct)
        self._metadata_threads: concurrent.futures.ThreadPoolExecutor | None = None  # made on first need
        self.trace = DecisionLog(log)  # --log-level debug: opens and pattern decisions, rate-limited
        self.learn = None
        self._saver: threading.Thread | None = None
        self._stop = threading.Event()
        if ra.learn:
            self._start_learning()

    # == metadata ===================================================================================
    def lstat(self, path: str) -> os.stat_result:
        meta = self._fresh_meta(path)
        if meta is not None:
            return meta.st
        return self.source.lstat(path)

    def lstat_many(self, paths: list[str]) -> list[os.stat_result | None]:
        """lstat of each path (None where it failed), in order. On a source that is not local the
        ones not known from a scan's metadata are asked in parallel (:data:`LSTAT_PARALLEL` at a
        time): a directory listing with attributes then costs about one source round trip per
        :data:`LSTAT_PARALLEL` entries instead of one per entry."""
        out: list[os.stat_result | None] = [None] * len(paths)
        missing = []
        for i, path in enumerate(paths):
            meta = self._fresh_meta(path)
            if meta is not None:
                out[i] = meta.st
            else:
                missing.append(i)
        if len(missing) > 1 and not self.source.local:
            results = list(self._meta_pool().map(self._lstat_or_none, [paths[i] for i in missing]))
            for i, st in zip(missing, results, strict=True):
                out[i] = st
        else:
            for i in missing:
                out[i] = self._lstat_or_none(paths[i])
        return out

    def _lstat_or_none(self, path: str) -> os.stat_result | None:
        try:
            return self.source.lstat(path)
        except OSError:
            return None

    def _meta_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """Threads for parallel metadata calls (not the pread pool: they must not queue behind prefetch)."""
        with self._lock:
            if self._metadata_threads is None:
                self._metadata_threads = concurrent.futures.ThreadPoolExecutor(
                    LSTAT_PARALLEL, thread_name_prefix="fastfs-meta"
                )
            return self._metadata_threads

    def scandir(self, path: str) -> list[tuple[str, int, int]]:
        """(name, type bits, inode) of a directory's entries (one source listing, no stat each)."""
        return self.source.scandir(path)

    def listdir(self, path: str) -> list[str]:
        return self.source.listdir(path)

    def readlink(self, path: str) -> str:
        return self.source.readlink(path)

    def statvfs(self) -> os.statvfs_result:
        return self.source.statvfs()

    def access(self, path: str, mode: int) -> None:
        if mode & os.W_OK:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        self.source.access(path, mode)

    def getxattr(self, path: str, name: str) -> bytes:
        return self.source.getxattr(path, name)

    def listxattr(self, path: str) -> list[str]:
        return self.source.listxattr(path)

    def _fresh_meta(self, path: str) -> MetaEntry | None:
        meta = self._meta.get(path)
        if meta is None or time.monotonic() - meta.fetched_at > self._trust_seconds():
            return None
        return meta

    def _trust_seconds(self) -> float:
        return self.config.fuse.attr_timeout

    # == open / release =============================================================================
    def open(
        self,
        path: str,
        flags: int = os.O_RDONLY,
        expect: tuple | None = None,
        cached: bool = False,
        held_route: str = "",
    ) -> OpenResult:
        """Open the current version of *path* (close-to-open: the source is revalidated).

        *expect* is the file key of the version the caller's inode stands for: when the source no
        longer matches it the open fails with ESTALE (the kernel then looks the name up again).
        *cached* says the kernel may hold pages of this version from an earlier open (no format
        probe then). *held_route* is the route other open handles of the same inode use (they must
        all share one); otherwise the route is chosen here (:func:`~fastfs.fsio.policy.choose_route`).
        """
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        route = held_route or choose_route(self.config.fuse.passthrough, self.passthrough_available, self.source.local)
        passthrough = route == ROUTE_PASSTHROUGH
        entry = self._acquire_entry(path, expect, need_source=passthrough, kernel_cached=cached)
        if held_route == ROUTE_PASSTHROUGH:  # on a source that is served, the inode's opens pass through to disk
            served = choose_route(self.config.fuse.passthrough, True, self.source.local) == ROUTE_SERVED
            on_disk = served and self._disk_backing(entry)
        else:
            on_disk = not passthrough and self._disk_backing(entry)
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = entry
            on_disk = on_disk or (passthrough and entry.disk_fd >= 0)
            backing_fd = -1
            if on_disk:
                backing_fd = entry.disk_fd
            elif passthrough and entry.src is not None:
                backing_fd = entry.src.fd
        if on_disk:
            route = ROUTE_PASSTHROUGH
        self.trace("open %s: %d bytes, %s, %s", path, entry.size, route, "seen before" if cached else "first open")
        if on_disk:
            self.stats.add(m.OPENS_DISK)
            self.stats.add(m.BYTES_DISK_OPENED, entry.size)
            if self.config.readahead.enabled:
                self._scan_open(path, entry.size)  # scans and learned sets go on over files read from disk
        elif passthrough:
            self.stats.add(m.OPENS_PASSTHROUGH)
            self.stats.add(m.BYTES_PASSTHROUGH_OPENED, entry.size)
        else:
            self.stats.add(m.OPENS)
            self._after_open(path, entry, probe=not cached)
        return OpenResult(fh, route, backing_fd, entry.key, entry.st)

    def _acquire_entry(
        self, path: str, expect: tuple | None = None, need_source: bool = False, kernel_cached: bool = False
    ) -> FileEntry:
        """Revalidate the source (close-to-open) and return the shared entry of its version.

        Fresh metadata from a scan answers the open without a source round trip when the data is at
        hand: in RAM, on the disk tier, or in the kernel's page cache (*kernel_cached*: the inode was
        opened before)."""
        meta = None if need_source else self._fresh_meta(path)
        src: SourceFile | None = None
        if meta is not None and (
            kernel_cached or self.cache.peek(meta.key, 0) is not None or self._on_disk(path, meta)
        ):
            key, size, st = meta.key, meta.st.st_size, meta.st
        else:
            src = self.source.open_file(path)
            key, size, st = src.key, src.size, src.st
        if expect is not None and key != expect:
            if src is not None:
                src.close()
            raise OSError(errno.ESTALE, "source file changed since it was looked up", path)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = FileEntry(path, key, size, src, st, self._new_policy(size), dkey=self._disk_key(path, key))
                self._entries[key] = entry
                src = None
            if entry.src is None and src is not None:
                entry.src, src = src, None
            entry.handles += 1
            previous = self._last_key.get(path)
            self._last_key[path] = key
            self._last_key.move_to_end(path)
            if len(self._last_key) > MAX_VERSIONS:
                self._last_key.popitem(last=False)
        if src is not None:
            self._put_source(src)
        if previous is not None and previous != key:
            self.cache.invalidate_file(previous)  # the path has a new version: free the old one's blocks
        return entry

    def _disk_key(self, path: str, key: tuple) -> tuple:
        return self.disk.key(path, key) if self.disk is not None else ()

    def _on_disk(self, path: str, meta: MetaEntry) -> bool:
        """Whether the disk tier holds all of the version a scan's metadata describes (its open is then
        answered from that metadata, as for a file the scan holds in RAM)."""
        return self.disk is not None and self.disk.holds(self.disk.key(path, meta.key), 0, meta.st.st_size)

    def _disk_backing(self, entry: FileEntry) -> bool:
        """Whether this open of *entry* (otherwise served) goes by passthrough to its complete file in the
        disk tier, which is then ``entry.disk_fd``: the kernel route must exist and not be turned off.
        Every such open asks the store again, which re-checks the data file's identity."""
        if self.disk is None or not entry.dkey or not self.passthrough_available or entry.size < DISK_PASSTHROUGH_MIN:
            return False
        if self.config.fuse.passthrough == "off":
            return False
        fd = self.disk.complete_fd(entry.dkey)
        if fd is None:
            return False
        with self._lock:
            if entry.disk_fd < 0:
                entry.disk_fd, fd = fd, -1
        if fd >= 0:
            os.close(fd)  # the kernel's backing file of this version is the one opened first
        return True

    def _new_policy(self, size: int) -> StreamPolicy:
        ra = self.config.readahead
        return StreamPolicy(size, ra.initial_window, ra.max_window)

    def release(self, fh: int) -> None:
        with self._lock:
            entry = self._handles.pop(fh, None)
            if entry is None:
                return
            entry.handles -= 1
            src = None
            disk_fd = -1
            last_handle = entry.handles == 0
            if last_handle:
                if self._entries.get(entry.key) is entry and not entry.stuck:
                    del self._entries[entry.key]  # (kept while reads are stuck: the next open knows)
                src, entry.src = entry.src, None
                disk_fd, entry.disk_fd = entry.disk_fd, -1
        if disk_fd >= 0:
            os.close(disk_fd)
        if last_handle:
            self._account_file(entry, 0, 0, flush=True)
            self._learn_load(entry)
        if src is not None:
            self._put_source(src)

    def _unstuck(self, entry: FileEntry) -> None:
        """The last stuck read of *entry* returned: forget the entry if it was kept only for that."""
        with self._lock:
            if entry.handles == 0 and not entry.stuck and self._entries.get(entry.key) is entry:
                del self._entries[entry.key]

    def _put_source(self, src: SourceFile) -> None:
        with self._lock:
            src.refs -= 1
            last = src.refs == 0
        if last:
            src.close()

    def _get_source(self, entry: FileEntry) -> SourceFile:
        """The entry's source file with a reference taken (opened now if the open was served from metadata)."""
        with self._lock:
            src = entry.src
            if src is not None:
                src.refs += 1
                return src
        fresh = self.source.open_file(entry.path)
        if fresh.key != entry.key:
            fresh.close()
            raise OSError(errno.ESTALE, "source file changed since it was opened", entry.path)
        with self._lock:
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

    # == read =======================================================================================
    def read(self, fh: int, offset: int, size: int) -> bytes:
        """Convenience for tests and tools: returns the bytes."""
        buf = bytearray(max(0, size))
        n = self.read_into(fh, offset, memoryview(buf))
        return bytes(buf[:n])

    def read_into(
        self,
        fh: int,
        offset: int,
        dest: memoryview,
        path: str | None = None,
        expect: tuple | None = None,
        parts: ReplyParts | None = None,
    ) -> int:
        """Fill ``dest`` with the file's bytes at ``offset``; returns the count (short only at EOF).

        ``fh`` 0 is an open-less read (``fuse.no_open``) of *path* at version *expect*. With
        *parts*, bytes already in RAM blocks are not copied: *parts* receives, in file order, views
        of the blocks (kept pinned) and of ``dest`` (for bytes read from the source), to be sent as
        they are and then given back with :meth:`release_parts`."""
        entry = self._handles.get(fh) if fh else self._implicit_entry(path, expect)
        if entry is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        if offset < 0:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        want = len(dest)
        end = min(offset + want, entry.size)
        if end <= offset:
            self.stats.request(0, 0)
            return 0
        if entry.heads:
            n = self._serve_head(entry, offset, end, dest)
            if n >= 0:
                if parts is not None:
                    parts.views.append(dest[:n])
                self.stats.request(n, n)
                self._account_file(entry, n, 0)
                return n
        sequential = False
        ra = self.config.readahead
        if ra.enabled:
            with entry.lock:
                plan = entry.policy.on_read(offset, end - offset)
                planned = entry.range_plan is not None and entry.range_plan.contains(offset)
                # inside a format plan the plan alone decides what to fetch ahead: it knows where
                # the loader's ranges end, the stream policy would read on past them
                confirmed = True
                if planned:
                    ranges = entry.range_plan.advance(offset, end)
                    confirmed = entry.range_plan.confirmed
                elif entry.planning and plan.prefetch and offset == 0:
                    # the bet on a read from offset 0 waits for the format plan being made now
                    ranges = []
                else:
                    ranges = list(plan.prefetch)
            # whole blocks at demand priority only for a tight sequential stream (inside a plan: one
            # whose run the plan confirmed); other reads are served exactly while the prefetch
            # brings the blocks in order
            sequential = plan.sequential and confirmed
            if planned and not plan.sequential and not entry.mmap_seen:
                # out-of-order reads inside a planned range: page faults of an mmap load
                entry.mmap_seen = True
                self.stats.add(m.MMAP_STREAMS)
            if plan.started:
                self.stats.add(m.SEQ_STREAMS)
            if plan.reset:
                self.stats.add(m.SEQ_RESETS)
            if plan.new_random:
                self.stats.add(m.RANDOM_STREAMS)
            if (plan.started or plan.reset or plan.new_random) and self.trace.enabled:
                self._trace_stream(entry, offset, plan, planned)
            demand = self._reserve_demand(entry, offset, end) if sequential else []
            if ranges:
                upto, complete = self._prefetch(entry, ranges)
                if plan.prefetch and not planned:
                    with entry.lock:
                        entry.policy.scheduled(plan.stream, upto, complete)
        else:
            demand = []
        try:
            n, cached, direct = self._serve(entry, offset, end, dest, demand, parts)
        finally:
            for block in demand:
                if block is not None:
                    self.cache.unpin(block)
        self.stats.request(n, cached)
        self._account_file(entry, n, direct)
        return n

    def release_parts(self, parts: ReplyParts) -> None:
        """The reply built from *parts* was sent: release its views and unpin its blocks."""
        for view in parts.views:
            view.release()
        parts.views.clear()
        for block in parts.blocks:
            self.cache.unpin(block)
        parts.blocks.clear()

    def _trace_stream(self, entry: FileEntry, offset: int, plan, planned: bool) -> None:
        """Debug line of a stream decision (random reads: once per file version, they repeat)."""
        where = "; inside the format plan, which decides what is fetched" if planned else ""
        if plan.started:
            self.trace("%s: sequential reads at offset %d: prefetching ahead%s", entry.path, offset, where)
        elif plan.reset:
            self.trace("%s: a sequential stream was dropped for a new read at offset %d", entry.path, offset)
        else:
            self.trace.once(
                (entry.key, "random"),
                "%s: read at offset %d continues no stream: served exactly, no prefetch until reads are sequential%s",
                entry.path,
                offset,
                where,
            )

    def _account_file(self, entry: FileEntry, delivered: int, direct: int, flush: bool = False) -> None:
        """Per-file bytes for the top-files table, summed per entry (its own lock) and handed to the
        shared table in batches, so a read does not take a mount-wide lock."""
        with entry.lock:
            entry.delivered += delivered
            entry.direct += direct
            if not flush and entry.delivered < FILE_STATS_BATCH:
                return
            delivered, direct = entry.delivered, entry.direct
            entry.delivered = entry.direct = 0
        if delivered or direct:
            self.stats.file_bytes(entry.path, fetched=direct, delivered=delivered)

    def _reserve_demand(self, entry: FileEntry, offset: int, end: int) -> list[Block | None]:
        """Reserve and queue (demand priority) the missing blocks of [offset, end); pinned, in order."""
        bs = self.block_size
        out: list[Block | None] = []
        for index in range(offset // bs, (end - 1) // bs + 1):
            block = self.cache.get(entry.key, index)
            if block is None:
                block = self._fetch_block(entry, index, demand=True, keep_pin=True)
            out.append(block)
        return out

    def _serve(
        self, entry: FileEntry, offset: int, end: int, dest: memoryview, demand: list, parts: ReplyParts | None
    ) -> tuple[int, int, int]:
        """Fill ``dest`` (or *parts*) with [offset, end) block by block; returns (bytes, from RAM
        cache, from the source)."""
        bs = self.block_size
        pos = offset
        cached = direct = 0
        first = offset // bs
        timeout = self.config.readahead.read_timeout or None
        while pos < end:
            index = pos // bs
            stop = min(end, (index + 1) * bs)
            block = demand[index - first] if demand else None
            pinned_here = False
            if block is None:
                block = self.cache.get(entry.key, index)
                pinned_here = block is not None
            n = -1  # -1: this part comes from the source directly (no block, or its fill failed)
            if block is not None:
                try:
                    n, from_cache = self._copy_block(entry, block, pos, stop, dest[pos - offset :], timeout, parts)
                finally:
                    if pinned_here:
                        self.cache.unpin(block)
                cached += from_cache
            if n < 0:
                n = self._read_exact(entry, pos, dest[pos - offset : stop - offset])
                direct += n
                if parts is not None and n:
                    parts.views.append(dest[pos - offset : pos - offset + n])
            pos += n
            if pos < stop:  # end of file reached early
                break
        return pos - offset, cached, direct

    def _serve_head(self, entry: FileEntry, offset: int, end: int, dest: memoryview) -> int:
        """Serve [offset, end) from a head window holding all of it; -1 when none does (or its fill failed)."""
        k = bisect.bisect_right(entry.heads, (offset, _AFTER_ANY)) - 1  # the last window starting <= offset
        if k < 0:
            return -1
        _start, stop, index = entry.heads[k]
        if end > stop:
            return -1
        block = self.cache.get(entry.key, index)
        if block is None:
            return -1
        try:
            n, _ = self._copy_block(entry, block, offset, end, dest, self.config.readahead.read_timeout or None)
        finally:
            self.cache.unpin(block)
        return n if n == end - offset else -1

    def _copy_block(
        self,
        entry: FileEntry,
        block: Block,
        pos: int,
        stop: int,
        dest: memoryview,
        timeout: float | None,
        parts: ReplyParts | None = None,
    ) -> tuple[int, int]:
        """Copy [pos, stop) of the file from ``block`` to ``dest``, waiting for its fill.

        Returns (bytes copied, of which counted as served from the cache); (-1, 0) when the fill
        failed (errors are never cached: the caller reads the source directly).
        """
        ready = block.state == READY
        if block.state == FAILED:
            return -1, 0
        if not ready:
            if self._fail_fast(entry):
                self._failed_fast(entry)
            fill = block.job
            if fill is not None and not fill.demand:
                for job in fill.jobs:
                    self.pool.promote(job)
            # an earlier reader already gave up on this fill or on another read of the file (this is
            # the read let through to try the source): wait only briefly for the source to come back
            retry = block.errno == errno.ETIMEDOUT or entry.stuck
            wait = min(timeout, RETRY_WAIT) if timeout and retry else timeout
            if not block.done.wait(wait):
                block.errno = errno.ETIMEDOUT
                if isinstance(fill, _Preads):
                    fill.abandon()
                self._timed_out(entry)
        if block.state == FAILED:
            return -1, 0
        block_start = block.start
        n = max(0, min(stop, block_start + block.length) - pos)
        if n == 0:
            return 0, 0
        if parts is None:
            dest[:n] = block.view[pos - block_start : pos - block_start + n]
        else:  # sent from the block itself, which stays pinned until the reply is written
            self.cache.pin(block)
            parts.blocks.append(block)
            parts.views.append(block.view[pos - block_start : pos - block_start + n])
        if block.prefetched and not block.used:
            self.stats.add(m.BYTES_PREFETCH_USED, block.length)
        block.used = True
        if pos + n >= block_start + block.length:
            self.cache.consumed(block)
        return n, n if block.prefetched or ready else 0

    def _timed_out(self, entry: FileEntry) -> None:
        self.stats.add(m.TIMEOUTS)
        self.stats.error("ETIMEDOUT")
        raise OSError(errno.EIO, "source read timed out", entry.path)

    def _fail_fast(self, entry: FileEntry) -> bool:
        """True when a read of *entry* should fail at once: earlier source reads of it are stuck (a
        reader timed out on them and they have not returned), so a new one would only queue behind
        them. One read per :data:`STUCK_PROBE_SECONDS` is let through to notice a source that is back."""
        if not entry.stuck:
            return False
        # the stuck reads may be returning right now (a source that came back): wait a moment for them
        if entry.unstuck.wait(UNSTUCK_WAIT):
            return False
        now = time.monotonic()
        with entry.lock:
            if not entry.stuck:
                return False
            if now - entry.probe_at >= STUCK_PROBE_SECONDS:
                entry.probe_at = now
                return False
        return True

    def abandoned_read(self, fh: int) -> None:
        """The kernel layer gave up on a read of *fh* (its watchdog answered the request while the
        read ran on): if an inline source read of the file is still out, it counts as a stuck read of
        the file until it returns, so later reads of it fail fast instead of hanging one more thread."""
        entry = self._handles.get(fh)
        if entry is None:
            return
        with entry.lock:
            if entry.inline <= entry.inline_stuck:
                return  # no inline read out that is not counted already
            if not entry.stuck:
                entry.probe_at = time.monotonic()
                entry.unstuck.clear()
            entry.stuck += 1
            entry.inline_stuck += 1
        self.stats.add(m.TIMEOUTS)

    def _inline_done(self, entry: FileEntry) -> None:
        with entry.lock:
            entry.inline -= 1
            unstuck = False
            if entry.inline_stuck:
                entry.inline_stuck -= 1
                entry.stuck -= 1
                unstuck = entry.stuck == 0
                if unstuck:
                    entry.unstuck.set()
        if unstuck:
            self._unstuck(entry)

    def _failed_fast(self, entry: FileEntry) -> None:
        self.stats.add(m.FAST_FAILS)
        raise OSError(errno.EIO, "source reads of this file are stuck", entry.path)

    def _read_exact(self, entry: FileEntry, pos: int, view: memoryview) -> int:
        """Bytes a read takes outside blocks: from the disk tier when it holds them (checked there), else
        from the source (:meth:`_read_direct`). A small file read whole from the source this way is
        also given to the tier, as a copy (the reader's buffer goes back to the kernel)."""
        disk = self.disk
        if disk is None or not entry.dkey:
            return self._read_direct(entry, pos, view)
        if disk.holds(entry.dkey, pos, len(view)):
            n = disk.read(entry.dkey, pos, view)
            if n is not None:
                return n
        n = self._read_direct(entry, pos, view)
        if pos == 0 and n == entry.size and 0 < n <= DISK_COPY_MAX:
            disk.store_copy(entry.dkey, entry.size, view[:n])
        return n

    def _read_direct(self, entry: FileEntry, pos: int, view: memoryview) -> int:
        """Demand read of exactly ``view`` from the source (no caching), bounded by read_timeout.

        A large page-aligned read (an mmap read-around, a loader's read outside any prefetch) goes
        to the block-read streams (``O_DIRECT`` where the source has it) through a page-aligned
        bounce buffer, split into up to ``source_streams`` pieces read in parallel: a buffered read
        of a latency-bound source is cut by the source's own small read-ahead into round trips one
        after the other, and one stream's bandwidth would bound it.
        """
        timeout = self.config.readahead.read_timeout
        if timeout and self._fail_fast(entry):
            self._failed_fast(entry)
        src = self._get_source(entry)
        length = len(view)
        aligned = length >= EXACT_ALIGNED_MIN and pos % DIRECT_ALIGN == 0
        if not aligned and (not timeout or self.inline_reads):
            # on the reader's own thread: a hand-off to the pool costs more than the read on a fast
            # source; a hung one is bounded by the kernel layer's watchdog (abandoned_read below)
            with entry.lock:
                entry.inline += 1
            try:
                n = self._timed_pread(src, pos, view, entry.path)
            finally:
                self._put_source(src)
                self._inline_done(entry)
            self.stats.add(m.BYTES_FETCHED_DEMAND, n)
            return n
        size = round_up(length) if aligned else length
        parts = spans(size, min(self.config.readahead.source_streams, length // EXACT_SPLIT_MIN) if aligned else 1)
        done = _thread.allocate_lock()
        done.acquire()

        def finished(batch: _Preads) -> None:
            self._put_source(src)
            done.release()

        bounce = mmap.mmap(-1, size) if aligned else bytearray(length)
        batch = _Preads(self, entry, src, pos, memoryview(bounce), parts, aligned, True, finished)
        if not timeout and len(batch.jobs) == 1:
            batch.jobs[0]()
        else:
            for job in batch.jobs:
                self.pool.submit_demand(job)
        # while an earlier read of this file is stuck past the timeout, wait only briefly
        wait = (min(timeout, RETRY_WAIT) if entry.stuck else timeout) if timeout else -1
        if not done.acquire(timeout=wait):
            if batch.abandon():
                self._timed_out(entry)
            done.acquire()  # it finished as the wait ended: the results are in
        total = min(batch.total(), length)
        view[:total] = batch.view[:total]
        self.stats.add(m.BYTES_FETCHED_DEMAND, total)
        return total

    def _timed_pread(self, src: SourceFile, pos: int, view: memoryview, path: str, aligned: bool = False) -> int:
        t0 = time.perf_counter()
        try:
            n = src.read_into(pos, view, aligned)
        except OSError as e:
            self.stats.error(errno.errorcode.get(e.errno or errno.EIO, "EIO"))
            raise OSError(e.errno or errno.EIO, e.strerror, path) from None
        self.stats.pread(time.perf_counter() - t0)
        return n

    # == block fetches ==============================================================================
    def _fetch_block(self, entry: FileEntry, index: int, demand: bool, keep_pin: bool = False) -> Block | None:
        """Reserve block ``index`` and queue its fill. Returns the (pinned if keep_pin) block or None."""
        start = index * self.block_size
        length = min(self.block_size, entry.size - start)
        if length <= 0:
            return None
        block, created = self.cache.reserve(entry.key, index, length, prefetched=not demand)
        if block is None:
            if not demand:
                self.stats.add(m.BACKPRESSURE)
            return None
        if created and not self._start_fill(entry, block, start, length, demand):
            if keep_pin:
                return block  # failed: the reader goes to the source directly
            self.cache.unpin(block)
            return None
        if not keep_pin:
            self.cache.unpin(block)
        return block

    def _prefetch(self, entry: FileEntry, ranges: list[tuple[int, int]]) -> tuple[int, bool]:
        """Queue prefetch of the blocks covering ``ranges``; returns (end scheduled, complete)."""
        bs = self.block_size
        upto = 0
        for start, stop in ranges:
            for index in range(start // bs, (stop - 1) // bs + 1):
                if self.cache.peek(entry.key, index) is None and self._fetch_block(entry, index, demand=False) is None:
                    return upto, False
                upto = min(stop, (index + 1) * bs)
        return upto, True

    def _start_fill(self, entry: FileEntry, block: Block, start: int, length: int, demand: bool) -> bool:
        """Queue the fill of a block just reserved (the caller holds its pin): from the disk tier when it
        holds the range (one pool job, which falls back to the source), else from the source.

        False when it could not be queued (source unavailable, or prefetch declined: counted as
        backpressure); the block has been failed then.
        """
        if self.disk is not None and self.disk.holds(entry.dkey, start, length):
            fill = DiskFill(self, entry, block, start, length, demand)
            block.job = fill
            if demand:
                self.pool.submit_demand(fill)
                return True
            if self.pool.submit_prefetch(fill):
                return True
            block.job = None
            self.cache.fail(block, 0)
            self.stats.add(m.BACKPRESSURE)
            return False
        return self._start_source_fill(entry, block, start, length, demand)

    def _start_source_fill(self, entry: FileEntry, block: Block, start: int, length: int, demand: bool) -> bool:
        """Queue the fill of a block from the source as parallel pieces (see :meth:`_start_fill`)."""
        if entry.stuck:  # no more reads queued behind the stuck ones of this file: a reader goes to
            # _read_direct, which fails fast (or tries the source once per probe period)
            self.cache.fail(block, 0)
            if not demand:
                self.stats.add(m.BACKPRESSURE)
            return False
        try:
            src = self._get_source(entry)
        except OSError as e:
            self.cache.fail(block, e.errno or errno.EIO)
            return False
        want = min(block.capacity, round_up(length))
        parts = spans(want, min(self.config.readahead.source_streams, want // FILL_SPLIT_MIN))
        done = functools.partial(self._complete_fill, block, length)
        fill = _Preads(self, entry, src, start, block.view, parts, True, demand, done)
        block.job = fill
        if demand:
            for job in fill.jobs:
                self.pool.submit_demand(job)
            return True
        if self.pool.submit_prefetch_all(fill.jobs):
            return True
        block.job = None
        self._put_source(src)
        self.cache.fail(block, 0)
        self.stats.add(m.BACKPRESSURE)
        return False

    def _complete_fill(self, block: Block, length: int, fill: _Preads) -> None:
        """The last piece of a block's fill finished: the block is complete, or failed if a piece failed."""
        try:
            block.job = None
            try:
                n = min(fill.total(), length)
            except OSError as e:
                self.cache.fail(block, e.errno or errno.EIO)
                return
            self.stats.add(m.BYTES_FETCHED_DEMAND if fill.demand else m.BYTES_FETCHED_PREFETCH, n)
            self.stats.file_bytes(fill.path, fetched=n)
            entry = fill.entry
            keep = self.disk is not None and self.disk.keeps(entry.dkey, block, n, length)
            if keep:
                self.cache.pin(block)  # the store's pin, taken while the block cannot be evicted yet
            self.cache.complete(block, n)
            if keep:
                self.disk.store_block(entry.dkey, entry.size, block, n, self.cache.unpin)
        finally:
            self._put_source(fill.src)

    # == after open: formats, scans, learning =======================================================
    def _after_open(self, path: str, entry: FileEntry, probe: bool) -> None:
        """Format probe (first open of a version: later opens find the kernel's cache) and scan bookkeeping."""
        ra = self.config.readahead
        if not ra.enabled:
            return
        if probe and ra.formats and not entry.probed and entry.size >= FORMAT_MIN_SIZE:
            with entry.lock:
                probe = not entry.probed
                entry.probed = True
                entry.planning = probe
            if probe and not self.pool.submit_prefetch(lambda: self._probe_format(entry)):
                entry.planning = False
                self.stats.add(m.BACKPRESSURE)
        self._scan_open(path, entry.size)

    def _probe_format(self, entry: FileEntry) -> None:
        """Read the head, parse it, queue the loader's ranges (runs on a pool worker)."""
        try:
            self._plan_format(entry)
        finally:
            entry.planning = False

    def _plan_format(self, entry: FileEntry) -> None:
        if entry.handles == 0:
            return

        def read_at(offset: int, length: int) -> bytes:
            cached = self._cached_range(entry, offset, length)
            if cached is not None:  # warmed or scanned already: no source read for the probe
                return cached
            if self.disk is not None and self.disk.holds(entry.dkey, offset, length):
                buf = bytearray(max(0, min(length, entry.size - offset)))
                n = self.disk.read(entry.dkey, offset, memoryview(buf))
                if n is not None:
                    return bytes(buf[:n])
            src = self._get_source(entry)
            try:
                buf = bytearray(max(0, min(length, entry.size - offset)))
                n = self._timed_pread(src, offset, memoryview(buf), entry.path)
                self.stats.add(m.BYTES_FETCHED_PREFETCH, n)
                return bytes(buf[:n])
            finally:
                self._put_source(src)

        try:
            # only the head: a file read at random must not pay for a whole block
            head = read_at(0, formats.HEAD_BYTES)
            plan = formats.plan_for(head, entry.size, read_at)
        except OSError:
            return
        if plan is None or not plan.ranges:
            self.trace("%s: no known format in its first bytes: prefetch follows sequential reads only", entry.path)
            return
        self.stats.add(m.FORMAT_PLANS)
        self._fetch_heads(entry, plan)
        max_lead = max(FORMAT_LEAD, 2 * self.config.readahead.max_window)
        share = self.learn.file_share(entry.path, entry.size, entry.key[3]) if self.learn is not None else None
        whole = share is not None and share >= WHOLE_SHARE
        if whole:  # the last load of this version read it all: no need to wait for proof
            self.stats.add(m.LEARNED_WHOLE)
            lead = max_lead
        else:  # the release at open ends on a block boundary (a few bytes past it would fetch a whole block)
            first = plan.ranges[0][0]
            lead = (first + FORMAT_INITIAL_LEAD) // self.block_size * self.block_size - first
            lead = lead if lead > 0 else FORMAT_INITIAL_LEAD
        self.trace(
            "%s: %s format plan of %d ranges (%d bytes, %d record headers): %s",
            entry.path,
            plan.format,
            len(plan.ranges),
            plan.total,
            len(plan.heads),
            "released whole, as the last load read it all" if whole else "released as the loader proves it reads on",
        )
        with entry.lock:
            entry.range_plan = RangePlan(tuple(plan.ranges), lead, max_lead, whole=whole)
            ranges = entry.range_plan.advance()
        self._prefetch(entry, ranges)

    def _cached_range(self, entry: FileEntry, offset: int, length: int) -> bytes | None:
        """[offset, offset+length) clipped at EOF from one ready cache block, or None."""
        end = min(entry.size, offset + length)
        index = offset // self.block_size
        if end <= offset or (end - 1) // self.block_size != index:
            return None
        block = self.cache.get(entry.key, index)
        if block is None:
            return None
        try:
            if block.state != READY or block.start + block.length < end:
                return None
            return bytes(block.view[offset - block.start : end - block.start])
        finally:
            self.cache.unpin(block)

    def _learn_load(self, entry: FileEntry) -> None:
        """The last handle of a planned file closed: remember how much of its plan the load read."""
        plan = entry.range_plan
        if self.learn is None or plan is None or plan.read == 0 or plan.total == 0:
            return  # nothing read through fastfs (the kernel's cache served it): nothing learned
        self.learn.record_file(entry.path, entry.size, entry.key[3], plan.read / plan.total)

    def _fetch_heads(self, entry: FileEntry, plan: formats.Plan) -> None:
        """Queue the page windows of a plan's heads (before its ranges: the loader reads them first)."""
        windows: list[list[int]] = []
        for offset, length in sorted(plan.heads):
            start = offset // DIRECT_ALIGN * DIRECT_ALIGN
            stop = min(entry.size, max(start + HEAD_WINDOW, round_up(offset + length)))
            if windows and start <= windows[-1][1]:
                windows[-1][1] = max(windows[-1][1], stop)
            else:
                windows.append([start, stop])
        total = sum(b - a for a, b in windows)
        if not windows or total > min(MAX_HEAD_BYTES, plan.total // HEAD_SHARE):
            return
        heads = []
        for i, (start, stop) in enumerate(windows):
            index = -1 - i  # negative: never a block index
            block, created = self.cache.reserve(entry.key, index, stop - start, prefetched=True, start=start)
            if block is None:
                self.stats.add(m.BACKPRESSURE)
                break
            if created and not self._start_fill(entry, block, start, stop - start, demand=False):
                self.cache.unpin(block)
                break
            self.cache.unpin(block)
            heads.append((start, stop, index))
        with entry.lock:
            entry.heads = tuple(heads)

    def _dir_scan(self, dir_path: str) -> DirScan:
        with self._dirs_lock:
            ds = self._dirs.get(dir_path)
            if ds is None:
                ds = self._dirs[dir_path] = DirScan(ScanPolicy(self.config.readahead.scan_trigger))
                if len(self._dirs) > MAX_DIRS:
                    self._dirs.popitem(last=False)
            else:
                self._dirs.move_to_end(dir_path)
            return ds

    def _scan_open(self, path: str, size: int) -> None:
        parts = split(path)
        if not parts:
            return
        dir_path = "/" + "/".join(parts[:-1])
        name = parts[-1]
        ds = self._dir_scan(dir_path)
        with ds.lock:
            if ds.policy.epoch_over(name, ds.known):
                ds.policy = ScanPolicy(self.config.readahead.scan_trigger)
                ds.queue.clear()
                ds.ahead.clear()
                ds.ahead_bytes = 0
            start = ds.policy.on_open(name)
            ds.ahead_bytes -= ds.ahead.pop(name, 0)
        learned = None
        if self.learn is not None:
            self.learn.note_plan_used(dir_path, name)
            if self.learn.record_open(dir_path, name, size):
                learned = self.learn.plan(dir_path)
        if learned is not None:
            self.trace("%s: replaying the learned access set of last epoch (%d files)", dir_path, len(learned.names))
            names = self._stale_names(dir_path, learned.names)
            with ds.lock:
                ds.queue.extend(n for n in names if n not in ds.policy.opened)
                ds.known = max(ds.known, len(learned.names))
            self._pump(dir_path, ds)
        if start:
            self.trace("%s: small-file scan: several of its files opened in a short span, fetching the rest", dir_path)
            self.stats.add(m.SCANS)
            if not self.pool.submit_prefetch(lambda: self._start_scan(dir_path, ds)):
                with ds.lock:
                    ds.policy.active = False
        elif ds.queue:
            self._pump(dir_path, ds)

    def _start_scan(self, dir_path: str, ds: DirScan) -> None:
        try:
            listing = self.source.listdir(dir_path)
        except OSError:
            return
        known = len(listing)
        listing = self._stale_names(dir_path, listing)
        with ds.lock:
            ds.known = max(ds.known, known)
            queued = set(ds.queue)
            plan = ds.policy.plan(listing)[: self.config.readahead.scan_max_files]
            ds.queue.extend(n for n in plan if n not in queued)
        self._pump(dir_path, ds)

    def _stale_names(self, dir_path: str, names) -> list[str]:
        """The names whose scan-fetched metadata is missing or expired (the rest need no fetch)."""
        prefix = dir_path.rstrip("/") + "/"
        deadline = time.monotonic() - self._trust_seconds()
        meta = self._meta
        out = []
        for name in names:
            entry = meta.get(prefix + name)
            if entry is None or entry.fetched_at < deadline:
                out.append(name)
        return out

    def _pump(self, dir_path: str, ds: DirScan) -> None:
        """Keep up to SCAN_PARALLEL fetches in flight and SCAN_LEAD_FILES (and a share of the budget)
        fetched ahead."""
        prefix = dir_path.rstrip("/") + "/"
        while True:
            with ds.lock:
                if (
                    not ds.queue
                    or ds.inflight >= SCAN_PARALLEL
                    or len(ds.ahead) >= SCAN_LEAD_FILES
                    # fetches in flight count at the mean size fetched so far (the largest a scan
                    # fetches before the first): their own sizes come later
                    or ds.ahead_bytes + (ds.inflight + 1) * self._scan_size_estimate(ds)
                    > self.cache.budget // SCAN_BUDGET_SHARE
                ):
                    return
                name = ds.queue.popleft()
                if name in ds.policy.opened:
                    continue
                path = prefix + name
                # opened before on this mount: the kernel keeps its pages, only the metadata is
                # fetched (its next open is answered from it, without a source round trip)
                fetch = self._scan_stat if path in self._last_key else self._scan_fetch
                ds.inflight += 1
            if self._fresh_meta(path) is not None or not self.pool.submit_prefetch(
                lambda path=path, fetch=fetch: fetch(dir_path, ds, path)
            ):
                with ds.lock:
                    ds.inflight -= 1
                if self._fresh_meta(path) is None:
                    with ds.lock:
                        ds.queue.appendleft(name)
                    self.stats.add(m.BACKPRESSURE)
                    return

    def _scan_size_estimate(self, ds: DirScan) -> int:
        """Cache capacity a fetch in flight is counted at (the caller holds ``ds.lock``)."""
        if ds.sized:
            return ds.sized_bytes // ds.sized
        return round_up(self.config.readahead.small_file_max)

    def _scan_fetch(self, dir_path: str, ds: DirScan, path: str) -> None:
        """Worker: fetch one small file whole and remember its metadata."""
        try:
            if self._closed:
                return
            try:
                src = self.source.open_file(path)
            except OSError:
                return
            try:
                if src.size > self.config.readahead.small_file_max:
                    return
                if self._scan_meta_only(path, src):
                    return
                if src.size > 0:
                    block, created = self.cache.reserve(src.key, 0, src.size, prefetched=True)
                    if block is None:
                        self.stats.add(m.BACKPRESSURE)
                        with ds.lock:
                            ds.queue.appendleft(path.rsplit("/", 1)[1])
                        return
                    try:
                        if created:
                            try:
                                n = self._timed_pread(src, 0, block.view[: src.size], path)
                            except OSError as e:
                                self.cache.fail(block, e.errno or errno.EIO)
                                return
                            self.stats.add(m.BYTES_FETCHED_PREFETCH, n)
                            self.stats.file_bytes(path, fetched=n)
                            dkey = self._disk_key(path, src.key)
                            keep = self.disk is not None and self.disk.keeps(dkey, block, n, src.size)
                            if keep:
                                self.cache.pin(block)  # the store's pin (see _complete_fill)
                            self.cache.complete(block, n)
                            if keep:
                                self.disk.store_block(dkey, src.size, block, n, self.cache.unpin)
                    finally:
                        self.cache.unpin(block)
                self.stats.add(m.SCAN_FILES)
                self._remember_meta(path, src.st, src.key)
                with ds.lock:
                    name = path.rsplit("/", 1)[1]
                    ds.sized += 1
                    ds.sized_bytes += round_up(src.size)
                    if name not in ds.ahead and name not in ds.policy.opened:
                        ds.ahead[name] = round_up(src.size)
                        ds.ahead_bytes += ds.ahead[name]
            finally:
                src.close()
        finally:
            with ds.lock:
                ds.inflight -= 1
            self._pump(dir_path, ds)

    def _scan_stat(self, dir_path: str, ds: DirScan, path: str) -> None:
        """Worker: the metadata of a small file the kernel holds the pages of (opened before on this
        mount), so a scan's next open of it needs no source round trip either; no data is fetched."""
        try:
            if self._closed:
                return
            try:
                st = self.source.lstat(path)
            except OSError:
                return
            if stat.S_ISREG(st.st_mode) and st.st_size <= self.config.readahead.small_file_max:
                self._remember_meta(path, st, stat_key(st))
        finally:
            with ds.lock:
                ds.inflight -= 1
            self._pump(dir_path, ds)

    def _remember_meta(self, path: str, st: os.stat_result, key: tuple) -> None:
        with self._lock:
            self._meta[path] = MetaEntry(st, key, time.monotonic())
            self._meta.move_to_end(path)
            if len(self._meta) > MAX_META:
                self._meta.popitem(last=False)

    def _scan_meta_only(self, path: str, src: SourceFile) -> bool:
        """A scan's fetch of a small file the disk tier holds whole: only its metadata is kept (the
        open is answered from it, the read filled from the tier), and its data file is asked into the
        page cache ahead; it takes no RAM block, so the scan's lead is not bounded by the RAM budget."""
        if self.disk is None or src.size == 0:
            return False
        dkey = self._disk_key(path, src.key)
        if not self.disk.holds(dkey, 0, src.size) or not self.disk.store.advise(dkey):
            return False
        self.stats.add(m.SCAN_FILES)
        self._remember_meta(path, src.st, src.key)
        return True

    # == open-less reads (fuse.no_open) =============================================================
    def _implicit_entry(self, path: str | None, expect: tuple | None = None) -> FileEntry | None:
        """The entry for an open-less read of ``path`` (fuse.no_open): an implicit handle per path,
        revalidated like an open once its attr_timeout has passed (ESTALE when the source is no
        longer the version *expect* names)."""
        if path is None:
            return None
        now = time.monotonic()
        with self._lock:
            item = self._implicit.get(path)
            if (
                item is not None
                and now - item[1] <= self._trust_seconds()
                and (expect is None or item[0].key == expect)
            ):
                self._implicit.move_to_end(path)
                return item[0]
        entry = self._acquire_entry(path, expect)
        self._after_open(path, entry, probe=True)
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = entry
            previous = self._implicit.pop(path, None)
            self._implicit[path] = (entry, now, fh)
            stale = [previous[2]] if previous is not None else []
            while len(self._implicit) > MAX_IMPLICIT:
                stale.append(self._implicit.popitem(last=False)[1][2])
        for old_fh in stale:
            self.release(old_fh)
        return entry

    # == for warm jobs and cache reports (fastfs.fsio.warm) ==========================================
    def warm(self, path: str, disk: bool = False) -> dict:
        """Fetch a file or tree into the cache (*disk*: into the disk tier) now, with the daemon's own
        rights; returns the job's final progress (blocks until done). The daemon runs warms as
        background jobs instead."""
        from fastfs.fsio.warm import warm_now

        return warm_now(self, path, disk=disk)

    def hold(self, path: str) -> tuple[int, FileEntry]:
        """A handle (and the entry) of the current version of *path*, without what :meth:`open` does
        for a reader (no format probe, scan bookkeeping, learning or open count); :meth:`release` it."""
        entry = self._acquire_entry(path)
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = entry
        return fh, entry

    def passes_through(self) -> bool:
        """True when new opens of this mount go to the kernel by passthrough (warm fills the source's
        page cache then, since reads of those files never come to the RAM cache)."""
        return choose_route(self.config.fuse.passthrough, self.passthrough_available, self.source.local) == (
            ROUTE_PASSTHROUGH
        )

    def page_cache_warm(self, path: str) -> int:
        """Ask the whole source file *path* into the source's page cache (``POSIX_FADV_WILLNEED``, in
        requests of :data:`PASSTHROUGH_WARM_CHUNK`); returns the bytes asked. The device reads them in
        parallel; the call does not wait for them."""
        src = self.source.open_file(path)
        try:
            for offset in range(0, src.size, PASSTHROUGH_WARM_CHUNK):
                os.posix_fadvise(src.fd, offset, min(PASSTHROUGH_WARM_CHUNK, src.size - offset), os.POSIX_FADV_WILLNEED)
            self.stats.add(m.BYTES_PASSTHROUGH_WARMED, src.size)
            return src.size
        finally:
            src.close()

    def page_cache_evict(self, path: str) -> int:
        """Drop the source's page cache of file *path* (``POSIX_FADV_DONTNEED``: clean pages only);
        returns the bytes resident before."""
        src = self.source.open_file(path)
        try:
            before = self._resident(src)
            os.posix_fadvise(src.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            return max(0, before - self._resident(src))
        finally:
            src.close()

    def page_cache_bytes(self, path: str) -> int:
        """Bytes of source file *path* in the source's page cache now (cachestat)."""
        src = self.source.open_file(path)
        try:
            return self._resident(src)
        finally:
            src.close()

    @staticmethod
    def _resident(src: SourceFile) -> int:
        share = cached_share(src.fd, src.size)
        return int((share or 0.0) * src.size)

    def warm_block(self, entry: FileEntry, index: int) -> Block | None:
        """Reserve block *index* of *entry* and queue its fill at prefetch priority; the block comes
        back pinned (:meth:`BlockCache.unpin` it), FAILED when it could not be queued, or None when
        the budget has no room for it."""
        return self._fetch_block(entry, index, demand=False, keep_pin=True)

    def abandon_block(self, entry: FileEntry, block: Block) -> None:
        """A warm gave up waiting for *block*: its fill counts as a stuck read of the file, as when a
        reader times out."""
        fill = block.job
        if block.state != READY and isinstance(fill, _Preads):
            block.errno = errno.ETIMEDOUT
            fill.abandon()
            self.stats.add(m.TIMEOUTS)
            self.stats.error("ETIMEDOUT")

    def version_key(self, path: str) -> tuple[int, int, int, int, int]:
        """Cache key of the version of *path* the source holds now (from an lstat)."""
        return stat_key(self.source.lstat(path))

    # == learning ===================================================================================
    def _start_learning(self) -> None:
        try:
            from fastfs.fsio.learn import AccessLog
        except ImportError:  # pragma: no cover - module ships with the package
            return
        try:
            self.learn = AccessLog(self.source.root, self.config, self.stats)
            self.learn.load()
        except Exception:
            log.warning("learned access sets disabled: state directory unusable", exc_info=True)
            self.learn = None
            return
        self._saver = threading.Thread(target=self._save_loop, name="fastfs-learn", daemon=True)
        self._saver.start()

    def _save_loop(self) -> None:
        while not self._stop.wait(LEARN_SAVE_SECONDS):
            self._save_learned()

    def _save_learned(self) -> None:
        if self.learn is not None and self.learn.dirty:
            try:
                self.learn.save()
            except Exception:
                log.warning("could not save learned access sets", exc_info=True)

    # == control ====================================================================================
    def snapshot(self, top: int = 10) -> dict:
        gauges = self.cache.gauges()
        demand_q, prefetch_q = self.pool.queued()
        with self._lock:
            open_files = len(self._handles) - len(self._implicit)
            entries = list(self._entries.values())
        gauges.update(
            open_files=open_files,
            file_versions=len(entries),
            streams=sum(len(e.policy.streams) for e in entries),
            sequential_streams_active=sum(1 for e in entries for s in e.policy.streams if s.sequential),
            active_scans=sum(1 for d in list(self._dirs.values()) if d.policy.active and (d.queue or d.inflight)),
            queued_demand=demand_q,
            queued_prefetch=prefetch_q,
            pool_workers=self.pool.workers,
        )
        if self.learn is not None:
            accuracy = self.learn.accuracy()
            gauges.update(learned_planned_files=accuracy["planned"], learned_accuracy=round(accuracy["ratio"], 4))
        disk_counters: dict[str, int] = {}
        if self.disk is not None:
            disk_counters, disk_gauges = self.disk.stats()
            gauges.update(disk_gauges)
        self.stats.gauges = gauges
        snap = self.stats.snapshot(top)
        snap["counters"].update(disk_counters)
        return snap

    def reconfigure(self, config: Config) -> list[str]:
        """Apply the settings that change live (config/reload.py LIVE); return the changed ones needing a remount."""
        restart = needs_remount(self.config, config)
        live = apply_live(self.config, config)
        self.config = live
        self.cache.set_budget(config.cache.budget or default_budget())
        with self._lock:
            entries = list(self._entries.values())
        for entry in entries:
            with entry.lock:
                entry.policy.set_windows(live.readahead.initial_window, live.readahead.max_window)
        return restart

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        self.pool.close()
        if self._metadata_threads is not None:
            self._metadata_threads.shutdown(wait=False, cancel_futures=True)
        self._save_learned()
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
            self._handles.clear()
            self._implicit.clear()
        for entry in entries:
            if entry.src is not None:
                self._put_source(entry.src)
                entry.src = None
            if entry.disk_fd >= 0:
                os.close(entry.disk_fd)
                entry.disk_fd = -1
        if self.disk is not None:
            self.disk.close()  # queued writes finish first (the blocks they pin stay valid until then)
        self.cache.close()
        self.source.close()


def spans(length: int, parts: int) -> list[tuple[int, int]]:
    """``[0, length)`` cut into at most ``parts`` contiguous pieces with page-aligned starts."""
    chunk = round_up(-(-length // max(1, parts)))
    return [(a, min(length, a + chunk)) for a in range(0, length, chunk)]


class _Preads:
    """One source read of ``entry``'s file cut into pieces (``spans`` of ``view``, from file offset
    ``pos``) run in parallel as pool jobs (``jobs``, in the file's pool group); the last piece to
    finish calls ``done(self)``.

    ``results`` holds each piece's byte count or error (an ``OSError`` without its traceback, whose
    frames would keep views of ``view`` alive). ``results``, ``left`` and ``abandoned`` (a reader gave up
    waiting: the read counts in ``entry.stuck`` until its last piece returns, and pieces not started yet
    are skipped) are guarded by ``guard``; the rest is set once. ``demand`` is the priority the jobs
    were queued with (a reader waiting for a queued prefetch promotes its jobs).
    """

    __slots__ = (
        "engine",
        "entry",
        "path",
        "src",
        "pos",
        "view",
        "spans",
        "aligned",
        "demand",
        "done",
        "jobs",
        "results",
        "left",
        "abandoned",
        "guard",
    )

    def __init__(
        self,
        engine: Engine,
        entry: FileEntry,
        src: SourceFile,
        pos: int,
        view: memoryview,
        pieces: list[tuple[int, int]],
        aligned: bool,
        demand: bool,
        done: Callable[[_Preads], None],
    ) -> None:
        self.engine, self.entry, self.path, self.src, self.pos, self.view = engine, entry, entry.path, src, pos, view
        self.spans, self.aligned, self.demand, self.done = pieces, aligned, demand, done
        self.jobs = [_Pread(self, i) for i in range(len(pieces))]
        self.results: list[int | OSError] = [0] * len(pieces)
        self.left = len(pieces)
        self.abandoned = False
        self.guard = _thread.allocate_lock()

    def abandon(self) -> bool:
        """A reader gave up waiting; True when pieces were still out (the file now counts a stuck read)."""
        with self.guard:
            if self.left == 0 or self.abandoned:
                return self.left > 0
            self.abandoned = True
        entry = self.entry
        with entry.lock:
            if not entry.stuck:  # the next read let through to try the source is one probe period away
                entry.probe_at = time.monotonic()
                entry.unstuck.clear()
            entry.stuck += 1
        return True

    def total(self) -> int:
        """Bytes read contiguously from the start (a short piece is the end of the file); raises the
        first piece's error."""
        total = 0
        for (a, b), outcome in zip(self.spans, self.results, strict=True):
            if isinstance(outcome, OSError):
                raise outcome
            total += min(outcome, b - a)
            if outcome < b - a:
                break
        return total


class _Pread:
    """One piece of a :class:`_Preads` (a plain object: cheaper than a closure per job); ``group`` is
    its file's pool group (the pool bounds the pieces of one file running at once)."""

    __slots__ = ("batch", "index", "group")

    def __init__(self, batch: _Preads, index: int) -> None:
        self.batch, self.index, self.group = batch, index, batch.entry.group

    def __call__(self) -> None:
        batch = self.batch
        a, b = batch.spans[self.index]
        if batch.abandoned:  # its reader gave up: do not add a read to a source that does not answer
            outcome: int | OSError = OSError(errno.ETIMEDOUT, "abandoned after a timeout", batch.path)
        else:
            try:
                outcome = batch.engine._timed_pread(
                    batch.src, batch.pos + a, batch.view[a:b], batch.path, aligned=batch.aligned
                )
            except OSError as e:
                outcome = OSError(e.errno or errno.EIO, e.strerror, batch.path)
        with batch.guard:
            batch.results[self.index] = outcome
            batch.left -= 1
            last = batch.left == 0
            abandoned = batch.abandoned
        if last:
            if abandoned:  # the source answered at last: reads of this file may wait again
                entry = batch.entry
                with entry.lock:
                    entry.stuck -= 1
                    unstuck = entry.stuck == 0
                    if unstuck:
                        entry.unstuck.set()
                if unstuck:
                    batch.engine._unstuck(entry)
            batch.done(batch)
