"""The directory scanner and its metadata cache: small-file scans fetched ahead of the reader.

Opens are fed to a per-directory :class:`~fastfs.fsio.policy.ScanPolicy` (:meth:`Scanner.on_open`);
when it detects a scan (several files of one directory opened in a short span), the directory is
listed and its remaining small files are fetched whole in the planned order on the pool, keeping
at most :data:`SCAN_LEAD_FILES` (and 1/:data:`SCAN_BUDGET_SHARE` of the RAM budget) ahead of the
reader and :data:`SCAN_PARALLEL` fetches in flight (:meth:`Scanner._pump`); a reader out of name order
(shuffled, several workers), which may read any part of the directory, has only as many in flight as
the source overlaps (a :class:`~fastfs.fsio.policy.ScanWindow` fed each fetch's time), and its scan
stops on a source that answers one fetch at a time (:meth:`Scanner._window_done`). A reader in name order
is fetched only the names just past it (a strided one, every k-th name, the next names on its
stride), and none while it skips names otherwise (:meth:`~fastfs.fsio.policy.ScanPolicy.may_fetch`);
all scans together evict nothing to fetch while the mount's prefetched bytes not read yet fill their
share of the budget (:meth:`Scanner._mount_share_full`).
Over a client whose listing asks about every entry (s3fs), a scan starts only in a directory listed on
this mount before (its reader's own listing: :meth:`Scanner._may_list`).
With learning on, the set of files each directory's readers opened is recorded and, on the next
epoch or after a remount, a scan of that set starts on the first open (:meth:`Scanner._start_replay`:
after one listing of the directory, which tells the source's client every name at once, and drops
the names gone since); only opens outside it start a scan of the rest.

Each fetch remembers the file's metadata (:class:`MetaEntry`), and so does each lookup that asks the
source (:meth:`Scanner.lstat`, :meth:`Scanner.lstat_many`). Remembered metadata answers lookups and
the open of a file whose data is at hand (the opener asks :meth:`Scanner.meta` and :meth:`Scanner.trust`)
under the close-to-open bound ``fuse.revalidate`` (:attr:`FuseConfig.revalidate_bound`):

* younger than the bound: trusted as it is (``FRESH``: no source request);
* older, but younger than ``attr_timeout``, fetched by a scan, and its directory verified unchanged
  within the bound since before the metadata was fetched (``DIR``, with ``fuse.trust_unchanged_dirs``:
  one directory stat per period shared by every file in it,
  :meth:`fastfs.fsio.dirs.DirListings.verified`): each scan fetch remembers its directory's *basis*
  read before its own request (a lookup's metadata has none: it is revalidated by its file's stat).
  This is what keeps a first pass over a large directory at one request per file on storage
  answering lookups one at a time; a scanned file rewritten in place (no rename) is its gap;
* else the opener revalidates it with one stat of the file (:meth:`Scanner.revalidate`), never a
  reopen: unchanged, the data held is served.

A lookup's own metadata (``MetaEntry.scan`` False) answers only the one open that follows it within
the bound (:meth:`Scanner.take`), never a lookup: so the open that follows a lookup asks the source
nothing, each later open asks again, and a second epoch after a long pause costs one stat per file.
A file the kernel holds the pages of (opened before on this mount) gets only its metadata fetched by
a scan (:meth:`Scanner._scan_stat`); a small file the disk tier holds whole keeps only its metadata
and has its data file asked into the page cache.
Two readers of one file are one source request: an open of a small file whose scan fetch is under
way waits for it (:meth:`Scanner.await_fetch`, at most :data:`SCAN_FETCH_WAIT`) and is answered from
its metadata, and a queued fetch of a file the reader opened first is not made (parallel readers keep
pace with a scan on storage answering lookups one at a time: each file was otherwise opened twice).
A walk of sibling directories (the reader enters a directory right after the sibling before it, in
the listing's order or in name order: :meth:`fastfs.fsio.policy.Siblings.walk_ahead`) has the next
``readahead.walk_ahead`` siblings scanned before the reader gets there (:meth:`Scanner._walk_ahead`).
Scans list their directory through the engine's listings (:mod:`fastfs.fsio.dirs`): one listing
shared with the kernel's, and the basis the fetched files remember.

Concurrency: ``_dirs_lock`` guards ``_dirs`` (the scan states, least recently used forgotten
first), ``_walks`` and ``_siblings``; each :class:`DirScan` has its own ``lock`` guarding all of its
fields. ``_meta_lock`` guards ``_meta``, ``_fetching`` and ``_metadata_threads``; an open waits on a
fetch's event with no lock held. No lock is held across I/O: fetches and lstats run on
the pool or the metadata threads, and ``_pump`` submits outside the scan's lock. ``versions`` (the
handle table's, path -> last version) is read without its lock: one atomic lookup, a hint only.
"""

from __future__ import annotations

import concurrent.futures
import errno
import functools
import os
import stat
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from fastfs.config.schema import MAX_SCAN_WINDOW, FuseConfig, ReadaheadConfig
from fastfs.fsio import stats as m
from fastfs.fsio.cache import BlockCache, round_up
from fastfs.fsio.dirs import Dirent, DirListings, parent_of
from fastfs.fsio.disk.tier import DiskTier
from fastfs.fsio.fills import Fills
from fastfs.fsio.handover import scans_wanted
from fastfs.fsio.latch import Latch
from fastfs.fsio.policy import ScanPolicy, ScanWindow, Siblings
from fastfs.fsio.pool import PreadPool
from fastfs.fsio.shape import replay_lists, scan_lists_first
from fastfs.fsio.source import FileKey, Source, SourceFile, split, stat_key
from fastfs.fsio.trace import DecisionLog

if TYPE_CHECKING:
    from fastfs.fsio.disk.index import Key as DiskKey
    from fastfs.fsio.learn import AccessLog

# Source lstats in flight at once for one directory listing with attributes (overlaps ~1 ms round trips).
LSTAT_PARALLEL = 16
# A scan keeps at most 1/SCAN_BUDGET_SHARE (half) of the cache budget fetched ahead of the reader, and
# no scan fetch evicts while the mount's prefetched bytes not read yet (every scan's and stream's:
# BlockCache.unused_prefetch) fill that share: a data set larger than the budget read in shuffled
# order, from one directory or from many at once (an image folder's classes), would otherwise evict
# files fetched ahead before their turn comes (fetched twice, read once; 10 directories of 40 MB
# read shuffled under a 64 MiB budget: 1.78x the bytes read fetched, 1.00x with the mount's share).
SCAN_BUDGET_SHARE = 2
# Small files a scan keeps fetched ahead of the reader, at most. A shuffled epoch may read any file of
# the directory next, so the lead covers a whole plan (readahead.scan_max_files plans at most 100,000
# names): with 4,096, a shuffled pass over 10,000 files left the reader to fetch most of the rest
# itself, one source round trip each (1.38x direct on serial-lookup storage instead of ~2.5x). The
# bytes ahead are bounded by the budget share (SCAN_BUDGET_SHARE), the names by the plan.
SCAN_LEAD_FILES = 100_000
# Scan fetches in flight per directory, at most (config.schema's MAX_SCAN_WINDOW: enough to overlap 1.5 ms
# round trips); a windowed scan (ScanPolicy.windowed) keeps its ScanWindow's or readahead.scan_window.
SCAN_PARALLEL = MAX_SCAN_WINDOW
# Seconds an open waits, at most, for a scan's fetch of the same file already under way before it
# opens the source itself: a fetch under way is at most SCAN_PARALLEL round trips from done (~25 ms
# of serialised 0.8 ms lookups); a fetch slower than this has a stalled source, where the open's own
# request would wait as well. Without the wait, 16 parallel readers keeping pace with a scan opened
# nearly every file twice at the source (19,100 opens for 10,000 files).
SCAN_FETCH_WAIT = 0.5
# Directories whose scan state is remembered (least recently used forgotten first). Not learn.py's
# MAX_DIRS, which bounds the directories whose access sets are learned.
MAX_SCAN_DIRS = 1024
# Parents whose subdirectory listing is kept indexed for walks (readahead.walk_ahead).
MAX_SIBLING_LISTS = 64
# Paths whose fetched metadata is remembered.
MAX_META = 200_000
# How remembered metadata is trusted (Scanner.trust): younger than the bound; its directory verified.
FRESH = "fresh"
DIR = "dir"

Basis = tuple[tuple[int, int, int, int], int]  # a directory's (key, wall clock before the stat that saw it)


class MetaEntry(NamedTuple):
    """Metadata of a regular file fetched by a scan or a lookup (immutable once made; a tuple: one is
    made per lookup and per revalidating open)."""

    st: os.stat_result
    key: FileKey
    fetched_at: float  # monotonic, before the request
    dir_basis: Basis | None = None  # its directory's state read before the request (None: unknown)
    scan: bool = True  # fetched by a scan (answers lookups and opens); False: by a lookup (one open)
    used: bool = False  # a lookup's metadata that answered its open already


@dataclass
class DirScan:
    """Scan state of one directory (every field guarded by ``lock``; a fetch about to start reads
    ``policy.opened`` without it, as a hint: the reader may open the file right after either way)."""

    policy: ScanPolicy
    lock: threading.Lock = field(default_factory=threading.Lock)
    queue: deque[str] = field(default_factory=deque)  # names to fetch, in order
    known: int = 0  # entries of the directory (listing or learned set), for the policy's epoch test
    inflight: int = 0  # fetches submitted and not finished (and a scan's listing job until it hands over)
    ahead: dict[str, int] = field(default_factory=dict)  # name -> cache capacity of files fetched, not opened yet
    ahead_bytes: int = 0  # sum of those capacities
    sized: int = 0  # files this scan fetched, and their capacity in all (the mean estimates fetches in flight)
    sized_bytes: int = 0
    held: bool = False  # counted once in SCAN_HELD: its reader in name order skipped names it passed
    stride: int = 0  # the reader's stride last told in the decision log (0: none)
    window: ScanWindow | None = None  # fetches in flight of a windowed scan (made at its first fetch)
    unlisted: bool = False  # counted once in SCAN_UNLISTED: not started, its directory not listed (Scanner._may_list)

    def parallel(self, fixed: int = 0) -> int:
        """Fetches this scan keeps in flight at most (the caller holds ``lock``); *fixed*:
        ``readahead.scan_window`` (0: measured by the scan's :class:`ScanWindow`)."""
        if not self.policy.windowed():
            return SCAN_PARALLEL
        if fixed > 0:
            return fixed
        if self.window is None:
            self.window = ScanWindow(SCAN_PARALLEL)
        return self.window.size


class Scanner:
    """Per-directory scans and the metadata they fetched (see the module docstring)."""

    def __init__(
        self,
        source: Source,
        cache: BlockCache,
        pool: PreadPool,
        stats: m.Stats,
        disk: DiskTier | None,
        fills: Fills,
        versions: Mapping[str, FileKey],
        readahead: ReadaheadConfig,
        fuse: FuseConfig,
        trace: DecisionLog,
        learn: AccessLog | None = None,
        clock: Callable[[], float] = time.monotonic,
        dirs: DirListings | None = None,
    ) -> None:
        self.source = source
        self.clock = clock  # monotonic seconds (metadata freshness)
        self.cache = cache
        self.pool = pool
        self.stats = stats
        self.disk = disk
        self.fills = fills  # timed preads and block completion (disk tier hand-off)
        self.versions = versions  # path -> last version opened on this mount (read without lock: a hint)
        self.readahead = readahead  # scan settings (replaced whole by reconfigure; one attribute load)
        self.bound = fuse.revalidate_bound  # seconds fetched metadata is trusted as it is
        self.attr_timeout = fuse.attr_timeout  # and at most this, while its directory is verified unchanged
        self.trust_dirs = fuse.trust_unchanged_dirs
        self.dirs = dirs  # the engine's listings (directory verification, scan listings); None: neither
        self.trace = trace
        self.learn = learn  # the learned access sets (fastfs.fsio.learn.AccessLog) or None
        self.closed = False  # set once by close; fetches queued then do nothing
        # set once at mount: the daemon's opens read a fast local source's small files themselves
        # (fsio.handover), so opens there start and feed no scans (:func:`scans_wanted`)
        self.opens_hand_over = False
        self._dirs: OrderedDict[str, DirScan] = OrderedDict()  # guarded by _dirs_lock
        self._dirs_lock = threading.Lock()
        self._meta: OrderedDict[str, MetaEntry] = OrderedDict()  # guarded by _meta_lock
        self._meta_lock = threading.Lock()
        self._metadata_threads: concurrent.futures.ThreadPoolExecutor | None = None  # made on first need (_meta_lock)
        self._fetching: dict[str, Latch] = {}  # path -> set when its scan fetch ends; _meta_lock
        # Walks (readahead.walk_ahead), guarded by _dirs_lock: parent -> the child directory the reader
        # entered last; parent -> (its listing, that listing's subdirectories indexed) for the last one.
        self._walks: OrderedDict[str, str] = OrderedDict()
        self._siblings: OrderedDict[str, tuple[list[Dirent], Siblings]] = OrderedDict()

    def reconfigure(self, readahead: ReadaheadConfig) -> None:
        self.readahead = readahead

    # -- metadata ---------------------------------------------------------------------------------
    def meta(self, path: str) -> MetaEntry | None:
        """The remembered metadata of *path*, whatever its age (see :meth:`trust`), or None."""
        with self._meta_lock:
            return self._meta.get(path)

    def trust(self, path: str, meta: MetaEntry) -> str:
        """How *meta* (of *path*) may be trusted now: :data:`FRESH` (younger than the bound), :data:`DIR`
        (younger than ``attr_timeout`` and its directory verified unchanged within the bound since
        before it was fetched: at most one directory stat per bound period), or "" (revalidate it)."""
        age = self.clock() - meta.fetched_at
        if self.bound > 0 and age <= self.bound:  # (0: nothing is trusted as it is, every open asks)
            return FRESH
        if not self.trust_dirs or age > self.attr_timeout or meta.dir_basis is None or self.dirs is None:
            return ""
        return DIR if self.dirs.verified(parent_of(path), self.bound) == meta.dir_basis else ""

    def await_fetch(self, path: str, timeout: float = SCAN_FETCH_WAIT) -> bool:
        """Wait for a scan's fetch of *path* under way, if there is one: True when one was and it ended
        within *timeout* (its block, if it kept one, is then in the cache); False at once when none is."""
        with self._meta_lock:
            done = self._fetching.get(path)
        if done is None:
            return False
        ended = done.wait(timeout)
        self.stats.add(m.SCAN_AWAITED if ended else m.SCAN_AWAIT_TIMEOUTS)
        return ended

    def fresh_meta(self, path: str) -> MetaEntry | None:
        """A scan's metadata of *path* while it may be trusted without asking the file (:meth:`trust`):
        it answers lookups, and the scan need not fetch the file again."""
        meta = self.meta(path)
        if meta is None or not meta.scan or not self.trust(path, meta):
            return None
        return meta

    def take(self, path: str, meta: MetaEntry) -> bool:
        """Mark a lookup's metadata *meta* as having answered an open; False when it did already (or
        was replaced meanwhile): each open asks the source unless the lookup just before it did."""
        with self._meta_lock:
            if self._meta.get(path) is not meta or meta.used:
                return False
            self._meta[path] = meta._replace(used=True)
            return True

    def revalidate(self, path: str, meta: MetaEntry) -> MetaEntry | None:
        """One stat of *path* at the source (never an open): its metadata, remembered, when it is still
        the version *meta* names (a scan's stays a scan's, with its directory's basis read before the
        stat; a lookup's is marked used by the open asking), else None (the new metadata is
        remembered as a lookup's). OSError (ENOENT...) is passed on."""
        basis = self._basis(path) if meta.scan else None
        before = self.clock()
        try:
            st = self.source.lstat(path)
        except OSError:
            self.forget([path])
            raise
        if not stat.S_ISREG(st.st_mode):
            self.forget([path])
            return None
        key = stat_key(st)
        same = key == meta.key
        scan = same and meta.scan
        fresh = self.remember_meta(path, st, key, basis if scan else None, before, scan, used=same and not scan)
        return fresh if same else None

    def lstat(self, path: str) -> os.stat_result:
        """Lookup of *path*: a scan's trusted metadata, else the source's lstat, remembered for the one
        open that follows (a lookup's metadata never answers another lookup: the kernel keeps what it
        is told for entry_timeout, and a name deleted meanwhile would stay)."""
        meta = self.fresh_meta(path)
        if meta is not None:
            return meta.st
        before = self.clock()
        st = self.source.lstat(path)
        self._remember_st(path, st, before)
        return st

    def _remember_st(self, path: str, st: os.stat_result, fetched_at: float) -> MetaEntry | None:
        """Remember a lookup's (or a revalidation's) metadata of a regular file, without a directory
        basis: only a scan's metadata is trusted by its directory (a file looked up alone and rewritten
        in place is seen within the bound)."""
        if not stat.S_ISREG(st.st_mode):
            self.forget([path])
            return None
        return self.remember_meta(path, st, stat_key(st), None, fetched_at, scan=False)

    def _basis(self, path: str) -> Basis | None:
        """The basis of *path*'s directory as last seen (read before a request about *path*)."""
        return self.dirs.basis(parent_of(path)) if self.dirs is not None else None

    def lstat_many(self, paths: list[str]) -> list[os.stat_result | None]:
        """lstat of each path (None where it failed), in order. On a source that is not local the
        ones not known from remembered metadata are asked in parallel (:data:`LSTAT_PARALLEL` at a
        time): a directory listing with attributes then costs about one source round trip per
        :data:`LSTAT_PARALLEL` entries instead of one per entry."""
        out: list[os.stat_result | None] = [None] * len(paths)
        missing = []
        for i, path in enumerate(paths):
            meta = self.fresh_meta(path)
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
            return self.lstat(path)
        except OSError:
            return None

    def _meta_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """Threads for parallel metadata calls (not the pread pool: they must not queue behind prefetch)."""
        with self._meta_lock:
            if self._metadata_threads is None:
                self._metadata_threads = concurrent.futures.ThreadPoolExecutor(
                    LSTAT_PARALLEL, thread_name_prefix="fastfs-meta"
                )
            return self._metadata_threads

    def remember_meta(
        self,
        path: str,
        st: os.stat_result,
        key: FileKey,
        basis: Basis | None = None,
        fetched_at: float | None = None,
        scan: bool = True,
        used: bool = False,
    ) -> MetaEntry:
        """Remember *path*'s metadata fetched at *fetched_at* (monotonic, before the request; None: now)
        with its directory's *basis* read before the request (*scan*: by a scan, else a lookup; *used*:
        a lookup's that answered its open already, see :meth:`take`)."""
        entry = MetaEntry(st, key, self.clock() if fetched_at is None else fetched_at, basis, scan, used)
        with self._meta_lock:
            self._meta[path] = entry
            self._meta.move_to_end(path)
            if len(self._meta) > MAX_META:
                self._meta.popitem(last=False)
        return entry

    def forget(self, paths: list[str]) -> None:
        """Drop the metadata of *paths* (their names vanished from a listing of their directory)."""
        with self._meta_lock:
            for path in paths:
                self._meta.pop(path, None)

    def meta_count(self) -> int:
        with self._meta_lock:
            return len(self._meta)

    def _stale_names(self, dir_path: str, names: Iterable[str]) -> list[str]:
        """The names whose remembered metadata is missing or may not be trusted (the rest need no fetch)."""
        prefix = dir_path.rstrip("/") + "/"
        return [name for name in names if self.fresh_meta(prefix + name) is None]

    # -- scans ------------------------------------------------------------------------------------
    def dir_scan(self, dir_path: str) -> DirScan:
        with self._dirs_lock:
            ds = self._dirs.get(dir_path)
            if ds is None:
                ds = self._dirs[dir_path] = DirScan(ScanPolicy(self.readahead.scan_trigger))
                if len(self._dirs) > MAX_SCAN_DIRS:
                    self._dirs.popitem(last=False)
            else:
                self._dirs.move_to_end(dir_path)
            return ds

    def active_scans(self) -> int:
        """Scans with files still to fetch or fetches in flight (a gauge; each state read without its lock)."""
        with self._dirs_lock:
            scans = list(self._dirs.values())
        return sum(1 for d in scans if d.policy.active and (d.queue or d.inflight))

    def on_open(self, path: str, size: int) -> None:
        """Scan bookkeeping of one open of *path* (*size* bytes): may start or feed a scan."""
        ra = self.readahead
        if self.opens_hand_over and not scans_wanted(self.source.local, self.fills.speed.slow, ra.local_scans):
            return  # (a fast local source: each open reads its small file itself)
        parts = split(path)
        if not parts or self.scan_max() <= 0:
            return  # (small_file_max 0: no file is small; a scan would only open each to find it too large)
        dir_path = "/" + "/".join(parts[:-1])
        name = parts[-1]
        ds = self.dir_scan(dir_path)
        with ds.lock:
            arrived = not ds.policy.opened  # the reader's first open in this directory (a new epoch is no arrival)
            if ds.policy.epoch_over(name, ds.known):
                old = ds.policy
                ds.policy = ScanPolicy(self.readahead.scan_trigger)
                if old.replaying:  # (the set still says what the job reads, until learn's epoch replays it)
                    ds.policy.learn(old.learned)
                ds.queue.clear()
                ds.window = None  # (the next epoch's scan measures the source again)
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
            with ds.lock:
                ds.policy.learn(frozenset(learned.names))  # (fetched in any order; opens in it start no scan)
                ds.known = max(ds.known, len(learned.names))
                ds.inflight += 1  # the listing job counts as a fetch in flight until it hands over
            names = learned.names
            if not self.pool.submit_prefetch(lambda: self._start_replay(dir_path, ds, names)):
                self._start_replay(dir_path, ds, names, listed=False)  # (the pool is full: as learned)
        if arrived and len(parts) > 1 and self.readahead.walk_ahead > 0 and self.dirs is not None:
            self._arrived(dir_path)
        if start and not self._may_list(dir_path, ds):
            start = False
        if start:
            self.trace("%s: small-file scan: several of its files opened in a short span, fetching the rest", dir_path)
            self.stats.add(m.SCANS)
            with ds.lock:
                ds.inflight += 1  # the listing job counts as a fetch in flight until it hands over
            if not self.pool.submit_prefetch(lambda: self._start_scan(dir_path, ds, counted=True)):
                with ds.lock:
                    ds.inflight -= 1
                    ds.policy.active = False
        elif ds.queue:
            self._pump(dir_path, ds)

    def _may_list(self, dir_path: str, ds: DirScan) -> bool:
        """May a scan about to start list its directory? Always, but over a client whose listing asks
        about every entry (:func:`~fastfs.fsio.shape.scan_lists_first`) only once the directory was
        listed on this mount (by its reader, or an earlier scan): else no scan starts, counted once per
        directory, and the reader's next open asks again."""
        if self.dirs is None or scan_lists_first(self.source.mount_type) or self.dirs.listed(dir_path):
            return True
        with ds.lock:
            ds.policy.active = False
            told, ds.unlisted = ds.unlisted, True
        if not told:
            self.stats.add(m.SCAN_UNLISTED)
            self.trace(
                "%s: no small-file scan: the source's listing asks about every entry, and its reader did not list it",
                dir_path,
            )
        return False

    # -- walks --------------------------------------------------------------------------------------
    def _arrived(self, dir_path: str) -> None:
        """The reader opened its first file in *dir_path*: when it came from a sibling directory, the
        walk's next siblings are scanned ahead (:meth:`_walk_ahead`, on the pool: it lists the parent)."""
        parent = parent_of(dir_path)
        child = dir_path.rsplit("/", 1)[1]
        with self._dirs_lock:
            previous = self._walks.get(parent)
            self._walks[parent] = child
            self._walks.move_to_end(parent)
            if len(self._walks) > MAX_SCAN_DIRS:  # (bounded like the scan states: one per parent walked)
                self._walks.popitem(last=False)
        if previous is not None and previous != child:
            self.pool.submit_prefetch(functools.partial(self._walk_ahead, parent, previous, child))

    def _walk_ahead(self, parent: str, previous: str, child: str) -> None:
        """Worker: scan the siblings after *child* that :meth:`Siblings.walk_ahead` names, each unless
        it has a scan or a reader already."""
        if self.closed or self.dirs is None:
            return
        try:
            entries = self.dirs.listing(parent)  # shared with the kernel's: one stat when unchanged
        except OSError:
            return
        with self._dirs_lock:
            kept = self._siblings.get(parent)
            if kept is None or kept[0] is not entries:
                # directories, and the entries of unknown type (a FUSE source's DT_UNKNOWN: a scan of one
                # that is no directory fails its one listing request)
                kept = (entries, Siblings.of([e[0] for e in entries if e[1] in (stat.S_IFDIR, 0)]))
                self._siblings[parent] = kept
                if len(self._siblings) > MAX_SIBLING_LISTS:
                    self._siblings.popitem(last=False)
            else:
                self._siblings.move_to_end(parent)
        prefix = parent.rstrip("/") + "/"
        for name in kept[1].walk_ahead(previous, child, self.readahead.walk_ahead):
            path = prefix + name
            ds = self.dir_scan(path)
            with ds.lock:
                if ds.policy.active or ds.policy.opened:
                    continue
                ds.policy.active = True
            self.trace("%s: walk from %s into %s: scanning %s ahead", parent, previous, child, name)
            self.stats.add(m.WALK_AHEAD)
            self._start_scan(path, ds)

    def _start_scan(self, dir_path: str, ds: DirScan, counted: bool = False) -> None:
        """List the directory, queue the scan's plan and start its fetches. *counted*: run as a pool
        job that the caller counted in ``ds.inflight``, handed over to the first fetch by
        :meth:`_pump` however the listing ends."""
        try:
            listing = self._listing(dir_path)
            known = len(listing)
            whole = listing
            listing = self._stale_names(dir_path, listing)
            with ds.lock:
                ds.known = max(ds.known, known)
                if ds.policy.index is None:
                    ds.policy.place(whole)
                queued = set(ds.queue)
                plan = ds.policy.plan(listing)[: self.readahead.scan_max_files]
                ds.queue.extend(n for n in plan if n not in queued)
        except OSError:
            pass  # (no listing: nothing queued; what an earlier plan queued is still fetched)
        finally:
            self._pump(dir_path, ds, finished=counted)

    def _start_replay(self, dir_path: str, ds: DirScan, names: Sequence[str], listed: bool = True) -> None:
        """Pool job of a replay: list the directory (:func:`~fastfs.fsio.shape.replay_lists`: one
        listing the kernel's share, which tells the source's client every name at once, so it opens
        each file of the set without a lookup of its own), queue the learned *names* it still holds
        whose metadata is not at hand, and start the fetches. Unlisted (an error, a client whose
        listing asks about every entry, or *listed* False), the set is queued as learned. Counted in
        ``ds.inflight`` by the caller, handed over to the first fetch by :meth:`_pump` however the
        listing ends."""
        try:
            if listed and replay_lists(self.source.mount_type):
                names = self._listed(dir_path, ds, names)
            stale = self._stale_names(dir_path, names)
            with ds.lock:
                queued = set(ds.queue)
                ds.queue.extend(n for n in stale if n not in ds.policy.opened and n not in queued)
        finally:
            self._pump(dir_path, ds, finished=True)

    def _listed(self, dir_path: str, ds: DirScan, names: Sequence[str]) -> Sequence[str]:
        """Those of *names* that the directory's listing holds (a file gone since is not opened), the
        listing's length counted in ``ds.known``; all of them when the directory cannot be listed."""
        try:
            listing = self._listing(dir_path)
        except OSError:
            return names
        with ds.lock:
            ds.known = max(ds.known, len(listing))
        present = set(listing)
        return [n for n in names if n in present]

    def _listing(self, dir_path: str) -> list[str]:
        """The names in *dir_path*: the listing the kernel's listings share (one stat when unchanged),
        else the source's own."""
        if self.dirs is not None:
            return [entry[0] for entry in self.dirs.listing(dir_path)]
        return self.source.listdir(dir_path)

    def _pump(
        self,
        dir_path: str,
        ds: DirScan,
        finished: bool = False,
        fetched: tuple[str, int] | None = None,
        took: float | None = None,
    ) -> None:
        """Keep up to SCAN_PARALLEL fetches in flight (a windowed scan: its window's) and
        SCAN_LEAD_FILES (and a share of the budget) fetched ahead. *finished*: called by a fetch
        that ended, which leaves the in-flight count in the same locked step that counts its
        successor, so ``inflight`` never reads 0 while a finishing fetch is about to submit the next
        one (a scan seen idle is idle); *fetched*: the name and cache capacity of the file it
        fetched, counted in that step too (one take of the scan's lock per fetch: its pool workers
        queued on it); *took*: the seconds that fetch took (what a windowed scan's window adjusts
        on)."""
        prefix = dir_path.rstrip("/") + "/"
        while True:
            with ds.lock:
                if finished:
                    if took is not None and ds.policy.windowed() and not self.readahead.scan_window:
                        self._window_done(dir_path, ds, took)
                    ds.inflight -= 1
                    finished = False
                    if fetched is not None:
                        name, capacity = fetched
                        ds.sized += 1
                        ds.sized_bytes += capacity
                        if name not in ds.ahead and name not in ds.policy.opened:
                            ds.ahead[name] = capacity
                            ds.ahead_bytes += capacity
                if (
                    not ds.queue
                    or ds.inflight >= ds.parallel(self.readahead.scan_window)
                    or len(ds.ahead) >= SCAN_LEAD_FILES
                    # fetches in flight count at the mean size fetched so far (the largest a scan
                    # fetches before the first): their own sizes come later
                    or ds.ahead_bytes + (ds.inflight + 1) * self._scan_size_estimate(ds)
                    > self.cache.budget // SCAN_BUDGET_SHARE
                    or self._mount_share_full(self._scan_size_estimate(ds))
                ):
                    return
                name = ds.queue[0]
                if name in ds.policy.opened:
                    ds.queue.popleft()
                    continue
                stride = ds.policy.stride()
                if stride != ds.stride:
                    ds.stride = stride
                    if stride:
                        self.trace("%s: scan follows a strided reader: every %d-th name", dir_path, stride)
                if not ds.policy.may_fetch(name):  # (a reader in name order: only its next names)
                    if ds.policy.skips(name):  # (behind it, or off a strided reader's stride)
                        ds.queue.popleft()
                        continue
                    if not ds.held and ds.policy.lead() == 0:
                        ds.held = True
                        self.stats.add(m.SCAN_HELD)
                        self.trace(
                            "%s: scan held: its reader in name order opened %d of the %d names it passed",
                            dir_path,
                            ds.policy.placed,
                            ds.policy.last - ds.policy.first + 1,
                        )
                    return
                ds.queue.popleft()
                path = prefix + name
                # opened before on this mount: the kernel keeps its pages, only the metadata is
                # fetched (its next open is answered from it, without a source round trip)
                fetch = self._scan_stat if path in self.versions else self._scan_fetch
                ds.inflight += 1
            if self.fresh_meta(path) is not None or not self.pool.submit_prefetch(
                functools.partial(fetch, dir_path, ds, path)
            ):
                with ds.lock:
                    ds.inflight -= 1
                if self.fresh_meta(path) is None:
                    with ds.lock:
                        ds.queue.appendleft(name)
                    self.stats.add(m.BACKPRESSURE)
                    return

    def _window_done(self, dir_path: str, ds: DirScan, took: float) -> None:
        """A windowed scan's fetch took *took* seconds: its window adjusts (the caller holds
        ``ds.lock``, the fetch still counted in flight). A window of 0 ends the scan: its queue is
        dropped (the reader opens the rest itself; the next epoch's scan measures again)."""
        before = ds.parallel()
        assert ds.window is not None
        after = ds.window.done(took, ds.inflight)
        if after == before:
            return
        base, now = ds.window.base * 1e3, took * 1e3
        if after == 0:
            ds.queue.clear()
            self.stats.add(m.SCAN_SERIAL)
            self.trace(
                "%s: scan of a shuffled reader stopped: the source answers its fetches one at a time"
                " (%.1f ms a fetch alone, %.1f ms now)",
                dir_path,
                base,
                now,
            )
        else:
            self.trace(
                "%s: scan of a shuffled reader: %d fetches in flight (%.1f ms a fetch alone, %.1f ms now)",
                dir_path,
                after,
                base,
                now,
            )

    def _mount_share_full(self, size: int) -> bool:
        """True when a scan fetch of *size* bytes would evict to make room while the mount's prefetched
        bytes not read yet already fill their share (:data:`SCAN_BUDGET_SHARE`): the fetch waits for
        this directory's next open or fetch. A cache with room takes it (nothing evicted), so
        prefetch abandoned long ago holds up no scan: evictions take the oldest blocks first."""
        cache = self.cache
        share = cache.budget // SCAN_BUDGET_SHARE
        return cache.unused_prefetch + size > share and cache.reserved + size > cache.budget

    def _scan_size_estimate(self, ds: DirScan) -> int:
        """Cache capacity a fetch in flight is counted at (the caller holds ``ds.lock``)."""
        if ds.sized:
            return ds.sized_bytes // ds.sized
        return round_up(self.scan_max())

    def scan_max(self) -> int:
        """Largest file a scan fetches (or remembers the metadata of): small_file_max, and never more than
        one cache block, since a scan fetches a file as block 0 and an open answered from its metadata
        has no source file to read further blocks of the same version from."""
        return min(self.readahead.small_file_max, self.cache.block_size)

    def _disk_key(self, path: str, key: FileKey) -> DiskKey:
        return self.disk.key(path, key) if self.disk is not None else ()

    def _scan_fetch(self, dir_path: str, ds: DirScan, path: str) -> None:
        """Worker: fetch one small file whole and remember its metadata (nothing when the reader
        opened it while the fetch waited for a worker: that open asked the source itself, and a
        second open of it here would be one more round trip for bytes the reader's own read fetches)."""
        fetched: tuple[str, int] | None = None
        took: float | None = None
        try:
            if self.closed:
                return
            # (read without ds.lock, a hint as it would be with it: the reader may open it right after)
            if path.rsplit("/", 1)[1] in ds.policy.opened:
                self.stats.add(m.SCAN_SKIPPED)
                return
            done = Latch()
            with self._meta_lock:
                if path in self._fetching:  # another scan of the same file is under way
                    return
                self._fetching[path] = done
            try:
                began = self.clock()
                fetched = self._fetch_whole(ds, path)
                if fetched is not None:
                    took = self.clock() - began
            finally:
                with self._meta_lock:
                    del self._fetching[path]
                done.set()
        finally:
            self._pump(dir_path, ds, finished=True, fetched=fetched, took=took)

    def _fetch_whole(self, ds: DirScan, path: str) -> tuple[str, int] | None:
        """The fetch of :meth:`_scan_fetch`: one open, one pread into block 0, the metadata remembered;
        returns the file's name and the cache capacity it holds, for :meth:`_pump` to count in the
        scan's state (None: nothing fetched)."""
        basis = self._basis(path)
        before = self.clock()
        try:
            src = self.source.open_file(path)
        except OSError:
            return None
        try:
            if src.size > self.scan_max():
                return None
            if self._scan_meta_only(path, src, basis, before):
                return None
            if src.size > 0:
                block, created = self.cache.reserve(src.key, 0, src.size, prefetched=True)
                if block is None:
                    self.stats.add(m.BACKPRESSURE)
                    with ds.lock:
                        ds.queue.appendleft(path.rsplit("/", 1)[1])
                    return None
                try:
                    if created:
                        try:
                            n = self.fills.timed_pread(src, 0, block.view[: src.size], path)
                        except OSError as e:
                            self.cache.fail(block, e.errno or errno.EIO)
                            return None
                        self.stats.add(m.BYTES_FETCHED_PREFETCH, n)
                        self.stats.file_bytes(path, fetched=n)
                        self.fills.complete_block(block, n, self._disk_key(path, src.key), src.size, src.size)
                finally:
                    self.cache.unpin(block)
            self.stats.add(m.SCAN_FILES)
            self.remember_meta(path, src.st, src.key, basis, before)
            return path.rsplit("/", 1)[1], round_up(src.size)
        finally:
            src.close()

    def _scan_stat(self, dir_path: str, ds: DirScan, path: str) -> None:
        """Worker: the metadata of a small file the kernel holds the pages of (opened before on this
        mount), so a scan's next open of it needs no source round trip either; no data is fetched."""
        try:
            if self.closed:
                return
            basis = self._basis(path)
            before = self.clock()
            try:
                st = self.source.lstat(path)
            except OSError:
                return
            if stat.S_ISREG(st.st_mode) and st.st_size <= self.scan_max():
                self.remember_meta(path, st, stat_key(st), basis, before)
        finally:
            self._pump(dir_path, ds, finished=True)

    def _scan_meta_only(self, path: str, src: SourceFile, basis: Basis | None, fetched_at: float) -> bool:
        """A scan's fetch of a small file the disk tier holds whole: only its metadata is kept (the
        open is answered from it, the read filled from the tier), and its data file is asked into the
        page cache ahead; it takes no RAM block, so the scan's lead is not bounded by the RAM budget."""
        if self.disk is None or src.size == 0:
            return False
        dkey = self._disk_key(path, src.key)
        if not self.disk.holds(dkey, 0, src.size) or not self.disk.store.advise(dkey):
            return False
        self.stats.add(m.SCAN_FILES)
        self.remember_meta(path, src.st, src.key, basis, fetched_at)
        return True

    def check_invariants(self) -> None:
        """Raise AssertionError when the scan states or the metadata cache are inconsistent."""
        with self._meta_lock:
            if len(self._meta) > MAX_META:
                raise AssertionError(f"{len(self._meta)} metadata entries, more than {MAX_META}")
        with self._dirs_lock:
            scans = list(self._dirs.items())
        if len(scans) > MAX_SCAN_DIRS:
            raise AssertionError(f"{len(scans)} scan states, more than {MAX_SCAN_DIRS}")
        for dir_path, ds in scans:
            with ds.lock:
                if ds.inflight < 0 or ds.inflight > SCAN_PARALLEL:
                    raise AssertionError(f"scan of {dir_path}: {ds.inflight} fetches in flight")
                if ds.ahead_bytes != sum(ds.ahead.values()):
                    raise AssertionError(f"scan of {dir_path}: ahead_bytes {ds.ahead_bytes} is not the sum of ahead")

    def close(self) -> None:
        self.closed = True
        with self._meta_lock:
            threads = self._metadata_threads
        if threads is not None:
            threads.shutdown(wait=False, cancel_futures=True)
