"""The engine: the whole read path of fastfs behind a small, FUSE-free API.

The daemon's operations adapter translates kernel requests into calls of :class:`Engine`; tests
drive it directly. :class:`Engine` is a facade: it receives its parts (:class:`EngineParts`: the
confined source, the disk tier, the RAM cache, the pread pool, the clock; :meth:`EngineParts.build`
makes the defaults, so ``Engine(source_dir, config, stats)`` builds them itself), wires the parts
that carry out the policies, and answers opens, reads and control calls by asking them. The parts,
each in its own module and with one job:

* :class:`~fastfs.fsio.source.Source` (``source``): confined access to the source directory;
  :class:`~fastfs.fsio.source.FileKey` names one version of a file.
* :class:`~fastfs.fsio.shape.Shaper` (``shaper``): the access shape the source is read with
  (parallel pieces over several handles, or one handle per file in order), from the source's mount
  type, the ``readahead.source_shape`` setting and the jump probe; the fills follow it.
* :class:`~fastfs.fsio.cache.BlockCache` (``cache``): the RAM blocks under a hard budget, keyed by
  (file key, block index); head windows under their own key kind (:class:`~fastfs.fsio.source.HeadKey`).
* :class:`~fastfs.fsio.pool.PreadPool` (``pool``): the threads running source reads, demand before
  prefetch, one file never holding it.
* :class:`~fastfs.fsio.disk.tier.DiskTier` (``disk``, optional): the local-disk cache tier.
* :class:`~fastfs.fsio.handles.HandleTable` (``handles``): open file versions
  (:class:`~fastfs.fsio.entry.FileEntry`: identity plus one component per part that keeps state on
  it), the handles naming them (one allocator), each path's last version, open-less readers.
* :class:`~fastfs.fsio.opening.Opener` (``opener``): opens and releases, and the one decision of an
  open's route (served, passthrough to the source, passthrough to the disk tier); its module
  docstring is the walk of an open. A release's source close runs on the
  :class:`~fastfs.fsio.closer.Closer` (``closer``, :meth:`Engine.defer_close`): never on its thread.
* :class:`~fastfs.fsio.fills.Fills` (``fills``): block fills and exact reads from the disk tier or the
  source, timeouts, stuck files and the one retry-wait rule (no reference back to the engine or the
  handle table: source files come from each entry's :class:`~fastfs.fsio.source.SourceRef`).
* :class:`~fastfs.fsio.probe.FormatProbe` (``probe``): the format probe at first open, range plans,
  head windows, what a load read (learning).
* :class:`~fastfs.fsio.scanner.Scanner` (``scanner``): per-directory small-file scans and the
  metadata they fetched (answers lookups and opens while fresh).
* :class:`~fastfs.fsio.readpath.ReadPath` (``reads``): one read as named steps (its module docstring
  is the walk of a read: head window, classify, demand blocks, prefetch, serve, count).
* :class:`~fastfs.fsio.dirs.DirListings` (``dirs``): directory listings checked against the source
  by one stat per listing, and the directories in use; :class:`~fastfs.fsio.refresh.Refresher`
  (``refresher``): the thread re-checking those directories and the open files for growth, started
  when the daemon listens (:meth:`Engine.listen`) to what they find.
* learning (``learn``, :class:`~fastfs.fsio.learn.AccessLog`, with ``readahead.learn``) and its save
  thread, warm (:mod:`fastfs.fsio.warm` drives :meth:`Engine.hold` / :meth:`Engine.warm_block`).

Opens. Close-to-open consistency, as NFS, with a stated bound (``fuse.revalidate``): each open
revalidates the source (open + fstat) and builds the file key; an open for an inode of another
version (``expect``) fails with ESTALE. The kernel has one inode per version (the daemon's node
table), so its page cache of a version is never stale. The route of an open is decided by the
:class:`~fastfs.fsio.opening.Opener` alone. A small version whose data is at hand (RAM, the disk
tier, or the kernel's pages of an inode opened before) is not reopened: metadata younger than the
bound (from a scan's fetch or a lookup) answers the open; older, one stat of the file revalidates
it, or its directory verified unchanged (``fuse.trust_unchanged_dirs``; see
:mod:`fastfs.fsio.scanner`). That is what makes a directory scan fast on high-latency storage and
keeps a second epoch after a pause at one stat per file. An open of a file (of any
size) the disk tier holds complete and has verified goes by
passthrough to that disk file when the kernel route exists, also for sources that are otherwise
served. A new version of a path frees the old one's
blocks at once.

Concurrency: the engine itself keeps only ``config`` (replaced whole by :meth:`reconfigure`, read
without a lock) and the learning thread's stop event; the daemon's two switches
(``passthrough_available``, ``inline_reads``: set once at mount) are the opener's and the fills';
``direct_tallies`` is set once at mount too.
Every part documents its own locks; no lock is held across I/O or while waiting for a block.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from fastfs.config.reload import apply_live, needs_remount
from fastfs.config.schema import DEFAULT_BUDGET_CAP, DEFAULT_BUDGET_FRACTION, MIN_BUDGET, Config
from fastfs.fsio import formats
from fastfs.fsio import stats as m
from fastfs.fsio.cache import Block, BlockCache
from fastfs.fsio.changes import ChangeListener, DirChange, Growth
from fastfs.fsio.closer import Closer
from fastfs.fsio.dirs import DirListings, join_path, parent_of
from fastfs.fsio.disk.tier import DiskTier
from fastfs.fsio.entry import FileEntry
from fastfs.fsio.fills import Fills
from fastfs.fsio.handles import HandleTable
from fastfs.fsio.opening import Opener, OpenResult
from fastfs.fsio.policy import listing_attributes
from fastfs.fsio.pool import PreadPool
from fastfs.fsio.probe import FormatProbe
from fastfs.fsio.readpath import DirectOffer, DirectTally, ReadPath, ReplyParts
from fastfs.fsio.refresh import MIN_FILE_PERIOD, Refresher
from fastfs.fsio.scanner import Scanner
from fastfs.fsio.shape import Shaper, SourceFacts, dir_times_kept
from fastfs.fsio.source import FileKey, Source, SourceFile, jump_probe, stat_key
from fastfs.fsio.trace import DecisionLog

if TYPE_CHECKING:
    from fastfs.fsio.learn import AccessLog

__all__ = ["Engine", "EngineParts", "FileEntry", "OpenResult", "ReplyParts", "default_budget"]

log = logging.getLogger(__name__)

# Bytes per WILLNEED request when fastfs warm fills the page cache of a passthrough file: the kernel
# reads at most max(io_pages, ra_pages) of a request (often 2-4 MiB) and submits it without waiting,
# so small requests in a row fill the device queue. (Warming at every open was measured and lost:
# cold np.load of 256 MiB 0.226 s with it, 0.136 s without, native 0.133 s; torch.load no gain.)
PASSTHROUGH_WARM_CHUNK = 2 * 1024 * 1024
# Seconds between saves of the learned access sets.
LEARN_SAVE_SECONDS = 30.0


def default_budget() -> int:
    """min(25% of available memory, 4 GiB), at least the minimum budget."""
    return max(MIN_BUDGET, min(int(psutil.virtual_memory().available * DEFAULT_BUDGET_FRACTION), DEFAULT_BUDGET_CAP))


@dataclass(frozen=True)
class EngineParts:
    """The parts an :class:`Engine` receives rather than builds (tests may hand in their own)."""

    source: Source
    cache: BlockCache
    pool: PreadPool
    disk: DiskTier | None = None
    clock: Callable[[], float] = time.monotonic  # monotonic seconds (metadata freshness, stuck probes)
    shaper: Shaper | None = None  # the source's access shape (None: from the source's facts and the config)

    @classmethod
    def build(cls, source: str, config: Config, stats: m.Stats) -> EngineParts:
        """The default parts of a mount of *source* with *config*."""
        ra = config.readahead
        src = Source(source, direct=ra.source_direct_io, streams=ra.source_streams)
        budget = config.cache.budget or default_budget()
        try:  # the disk tier (cache.disk_dir) first: a directory it refuses fails the start before any thread
            disk = DiskTier.open(config, src.root, src.fs_type, budget)
        except BaseException:
            src.close()
            raise
        cache = BlockCache(budget, config.cache.block_size, stats, config.cache.check_invariants)
        pool = PreadPool(config.cache.workers, file_workers=config.cache.file_workers)
        return cls(src, cache, pool, disk)


class Engine:
    """FUSE-free read path of one mount: a facade over its parts (see the module docstring)."""

    def __init__(self, source: str | EngineParts, config: Config | None = None, stats: m.Stats | None = None) -> None:
        self.config = config or Config()
        self.stats = stats or m.Stats()
        parts = source if isinstance(source, EngineParts) else EngineParts.build(source, self.config, self.stats)
        ra = self.config.readahead
        self.source = parts.source
        self.source.stats = self.stats  # the source counts the requests fastfs makes of it
        self.source.dirs.trust = self.config.fuse.revalidate_bound  # directories kept: the close-to-open bound
        self.disk = parts.disk
        self.cache = parts.cache
        self.pool = parts.pool
        self.clock = parts.clock
        self.block_size = self.cache.block_size
        self.trace = DecisionLog(log)  # --log-level debug: opens and pattern decisions, rate-limited
        self.learn: AccessLog | None = None
        self._saver: threading.Thread | None = None
        self._stop = threading.Event()
        if ra.learn:
            self._start_learning()
        self.shaper = parts.shaper or Shaper(SourceFacts(self.source.mount_type, self.source.local), ra.source_shape)
        shape = self.shaper.shape
        log.debug(
            "source %s: mount type %s, read %s (%s)", self.source.root, self.source.mount_type or "unknown",
            shape.kind, shape.reason,
        )  # fmt: skip
        self.handles = HandleTable()
        self.fills = Fills(
            self.cache, self.pool, self.stats, self.disk, self.block_size, ra.source_streams, ra.read_timeout,
            self.handles.unstuck, self.clock, self.shaper, functools.partial(jump_probe, self.source),
        )  # fmt: skip
        self.probe = FormatProbe(
            self.cache, self.pool, self.stats, self.disk, self.fills, self.block_size, ra, self.trace, self.learn,
        )  # fmt: skip
        # (object-store clients keep no directory times: their listings are made anew after the bound)
        kept = dir_times_kept(self.source.mount_type)
        self.dirs = DirListings(self.source, self.clock, times_kept=kept, bound=self.config.fuse.revalidate_bound)
        if not kept:
            log.debug("source %s: directory times do not move with their entries: listings last %g s",
                      self.source.root, self.config.fuse.revalidate_bound)  # fmt: skip
        self.scanner = Scanner(
            self.source, self.cache, self.pool, self.stats, self.disk, self.fills, self.handles.versions, ra,
            self.config.fuse, self.trace, self.learn, self.clock, self.dirs,
        )  # fmt: skip
        self.reads = ReadPath(self.cache, self.stats, self.fills, self.probe, self.block_size, ra, self.trace)
        # the kernel layer's tallies of the reads it served itself, taken before a snapshot (set once at
        # mount when its request loop serves direct reads: readpath's module docstring)
        self.direct_tallies: Callable[[], list[tuple[int, DirectTally]]] | None = None
        self.closer = Closer()  # source closes of releases, off the release's thread (fsio/closer.py)
        self.opener = Opener(
            self.config, self.source, self.cache, self.disk, self.handles, self.scanner, self.probe, self.stats,
            self.trace, self._last_handle, self.closer,
        )  # fmt: skip
        self.dirs.listeners.append(self._dir_changed)
        self.refresher = Refresher(
            self.dirs, self.handles, self.cache, self.source, self.config.fuse.dir_timeout,
            file_period=max(MIN_FILE_PERIOD, self.config.fuse.revalidate_bound), clock=self.clock,
            shaper=self.shaper,
        )  # fmt: skip
        self.refresher.listeners.append(self._file_grew)

    @classmethod
    def from_parts(cls, parts: EngineParts, config: Config | None = None, stats: m.Stats | None = None) -> Engine:
        """An engine over parts built elsewhere (the stats given must be the cache's)."""
        return cls(parts, config, stats)

    @property
    def inline_reads(self) -> bool:
        """Set by the daemon when a watchdog bounds requests: exact small reads then run on the reader's
        thread (see :meth:`fastfs.fsio.fills.Fills.read_direct`)."""
        return self.fills.inline_reads

    @inline_reads.setter
    def inline_reads(self, value: bool) -> None:
        self.fills.inline_reads = value

    @property
    def opens_hand_over(self) -> bool:
        """Set by the daemon when its served opens hand small files to the kernel, reading those of a
        fast local source themselves (:mod:`fastfs.fsio.handover`): scans are then not wanted there."""
        return self.scanner.opens_hand_over

    @opens_hand_over.setter
    def opens_hand_over(self, value: bool) -> None:
        self.scanner.opens_hand_over = value

    @property
    def passthrough_available(self) -> bool:
        """Set by the daemon when the kernel connection can pass opens through; reads False once the
        kernel refused a backing file (the opener's own record, see :meth:`refused`)."""
        return self.opener.can_pass_through

    @passthrough_available.setter
    def passthrough_available(self, value: bool) -> None:
        self.opener.kernel_route = value

    # == metadata ===================================================================================
    def lstat(self, path: str) -> os.stat_result:
        if path != "/":
            self.dirs.used(parent_of(path))  # a lookup in it: the refresher re-checks it a while
        return self.scanner.lstat(path)

    def lstat_many(self, paths: list[str]) -> list[os.stat_result | None]:
        """lstat of each path (None where it failed), in order (see :meth:`Scanner.lstat_many`)."""
        return self.scanner.lstat_many(paths)

    def scandir(self, path: str) -> list[tuple[str, int, int]]:
        """(name, type bits, inode) of a directory's entries (one source listing, no stat each)."""
        return self.source.scandir(path)

    def listing(self, path: str) -> list[tuple[str, int, int]]:
        """(name, type bits, inode) of a directory's entries as the source holds them now: one source
        stat, and a new listing only when the directory changed (:mod:`fastfs.fsio.dirs`); the list is
        shared, not to be changed. A new listing is told to the listeners (:meth:`listen`)."""
        return self.dirs.listing(path)

    def listing_attributes(self) -> bool:
        """Whether listings carry attributes (the daemon negotiates READDIRPLUS only then): the
        ``fuse.readdirplus`` setting on local sources, never on others
        (:func:`~fastfs.fsio.policy.listing_attributes`)."""
        return listing_attributes(self.config.fuse.readdirplus, self.source.local)

    def preload(self) -> threading.Thread | None:
        """Import the format parsers on a thread of their own now (:func:`fastfs.fsio.formats.preload`),
        so the first load through a new mount does not wait for them; the daemon calls this once the
        mount is live. Returns the thread (None when format plans are off)."""
        if not self.config.readahead.formats:
            return None
        thread = threading.Thread(target=formats.preload, name="fastfs-preload", daemon=True)
        thread.start()
        return thread

    def listen(self, listener: ChangeListener) -> None:
        """Tell *listener* the directory changes and file growths the engine finds from now on, and start
        the refresher, which re-checks the directories used lately and the open files in the background
        (:mod:`fastfs.fsio.refresh`; an engine nobody listens to runs no such thread)."""
        self.dirs.listeners.append(listener.dir_changed)
        self.refresher.listeners.append(listener.file_grew)
        self.refresher.start()

    def _dir_changed(self, change: DirChange) -> None:
        """A directory was listed anew: the metadata kept of the names it lost goes."""
        if change.vanished:
            self.scanner.forget([join_path(change.path, name) for name in change.vanished])

    def _file_grew(self, growth: Growth) -> None:
        """An open file grew: a scan's metadata of it (the old size) answers no lookup any more."""
        self.scanner.forget([growth.path])

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

    # == open / release =============================================================================
    def open(
        self,
        path: str,
        flags: int = os.O_RDONLY,
        expect: FileKey | None = None,
        cached: bool = False,
        held_route: str = "",
        backed: bool = False,
    ) -> OpenResult:
        """Open the current version of *path* (close-to-open: the source is revalidated).

        *expect* is the file key of the version the caller's inode stands for: when the source no
        longer matches it the open fails with ESTALE (the kernel then looks the name up again).
        *cached* says the kernel may hold pages of this version from an earlier open (no format
        probe then). *held_route* is the route other open handles of the same inode use (they must
        all share one). *backed* says the kernel holds the inode's passthrough backing file already (a
        passthrough open then asks the source for no file: see :meth:`backing`). The route is the
        :class:`~fastfs.fsio.opening.Opener`'s decision."""
        return self.opener.open(path, flags, expect, cached, held_route, backed)

    def backing(self, fh: int) -> OpenResult:
        """Passthrough open *fh*, opened *backed*, with the descriptor to register as its backing file:
        its inode lost its registered one meanwhile (see :meth:`fastfs.fsio.opening.Opener.backing`)."""
        route = self.opener.backing(fh)
        entry = self.handles.get(fh)
        key, st = (entry.key, entry.st) if entry is not None else ((), None)
        return OpenResult(fh, route.kind, route.backing_fd, key, st, route.on_disk)

    def reroute(self, fh: int, held_route: str) -> OpenResult:
        """Open *fh* again decided for *held_route*: the inode's other handles settled that route
        meanwhile (see :meth:`fastfs.fsio.opening.Opener.reroute`)."""
        return self.opener.reroute(fh, held_route)

    def refused(self, fh: int, reason: str) -> OpenResult:
        """The kernel refused the backing file of open *fh*: no open passes through from now on, and
        *fh* is served (see :meth:`fastfs.fsio.opening.Opener.refused`)."""
        return self.opener.refused(fh, reason)

    def release(self, fh: int) -> None:
        self.opener.release(fh)

    def _last_handle(self, entry: FileEntry) -> None:
        """The last handle of *entry* was released: its final byte counts, what the load read (learning).
        (Nothing to do for a version nothing was read through, as a passthrough open's.)"""
        reads = entry.reads
        if reads.delivered or reads.direct:
            self.reads.account_file(entry, 0, 0, flush=True)
        if entry.format.plan is not None:
            self.probe.learn_load(entry)

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
        expect: FileKey | None = None,
        parts: ReplyParts | None = None,
    ) -> int:
        """Fill ``dest`` with the file's bytes at ``offset``; returns the count (short only at EOF).

        ``fh`` 0 is an open-less read (``fuse.no_open``) of *path* at version *expect*. With
        *parts*, bytes already in RAM blocks are not copied: *parts* receives, in file order, views
        of the blocks (kept pinned) and of ``dest`` (for bytes read from the source), to be sent as
        they are and then given back with :meth:`release_parts`. The steps: :mod:`fastfs.fsio.readpath`."""
        entry = self.handles.get(fh) if fh else self._implicit_entry(path, expect)
        if entry is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        if offset < 0:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return self.reads.read_into(entry, offset, dest, parts)

    def direct_offer(self, fh: int) -> DirectOffer | None:
        """May the kernel layer answer reads of open *fh* itself now (see :mod:`fastfs.fsio.readpath`)?"""
        entry = self.handles.get(fh) if fh else None
        return None if entry is None else self.reads.direct_offer(entry)

    def direct_served(self, fh: int, tally: DirectTally) -> None:
        """The kernel layer hands back the reads of open *fh* it served (counted, fed to the policy)."""
        entry = self.handles.get(fh) if fh else None
        if entry is not None:
            self.reads.direct_served(entry, tally)

    def direct_stuck(self, fh: int, count: int) -> None:
        """*count* direct reads of open *fh* run on after the kernel layer answered one of its reads
        (its watchdog): stuck reads of the file until each returns (:meth:`direct_unstuck`)."""
        if count > 0:
            self.reads.direct_stuck(self.handles.get(fh) if fh else None, fh, count)

    def direct_unstuck(self, fh: int) -> None:
        """A direct read of *fh* counted stuck returned (*fh* may be released by now)."""
        self.reads.direct_unstuck(fh)

    def defer_close(self, call: Callable[[], object]) -> None:
        """Run *call*, which closes a source descriptor (a round trip on a FUSE source, never ending on
        a hung one), on the closer's threads: a release never waits on the source (fsio/closer.py)."""
        self.closer.submit(call)

    def release_parts(self, parts: ReplyParts) -> None:
        """The reply built from *parts* was sent: release its views and unpin its blocks."""
        self.reads.release_parts(parts)

    def ram_head(self, fh: int) -> int:
        """Bytes of open *fh*'s version RAM holds ready from offset 0 (a fact of the handover at open,
        :mod:`fastfs.fsio.handover`); 0 for an unknown handle."""
        entry = self.handles.get(fh)
        return 0 if entry is None else self.reads.ram_head(entry)

    def handover_parts(self, fh: int, length: int) -> ReplyParts | None:
        """The first *length* bytes of open *fh*'s version as pinned views of its RAM block, to put into
        the kernel's page cache (None when RAM no longer holds them); then :meth:`handed_over` when the
        kernel took them, and :meth:`release_parts` either way."""
        entry = self.handles.get(fh)
        return None if entry is None else self.reads.handover_parts(entry, length)

    def fast_local(self) -> bool:
        """The source is local and its small reads fast: an open may read a small file itself and hand
        it to the kernel (a fact of the handover at open, :mod:`fastfs.fsio.handover`)."""
        return self.source.local and not self.fills.speed.slow

    def read_at_open(self, fh: int, length: int) -> memoryview | None:
        """The first *length* bytes of open *fh*'s version, read from its source file now, for an inline
        handover (None: not at hand; the reads come as READs); then :meth:`handed_from_source`."""
        entry = self.handles.get(fh)
        return None if entry is None else self.reads.read_at_open(entry, length)

    def handed_from_source(self, fh: int, n: int) -> None:
        """The kernel took the *n* bytes :meth:`read_at_open` gave (counted as handed over)."""
        entry = self.handles.get(fh)
        if entry is not None:
            self.reads.handed_from_source(entry, n)

    def handed_over(self, fh: int, parts: ReplyParts) -> None:
        """The kernel took *parts* (from :meth:`handover_parts`) into its page cache: counted
        (``opens_handed``, ``bytes_handed``, and the bytes as delivered from the cache)."""
        entry = self.handles.get(fh)
        if entry is not None:
            self.reads.handed_over(entry, parts)

    def abandoned_read(self, fh: int) -> None:
        """The kernel layer gave up on a read of *fh* (see :meth:`fastfs.fsio.fills.Fills.abandoned_read`)."""
        entry = self.handles.get(fh)
        if entry is not None:
            self.fills.abandoned_read(entry)

    # == open-less reads (fuse.no_open) =============================================================
    def _implicit_entry(self, path: str | None, expect: FileKey | None = None) -> FileEntry | None:
        """The entry for an open-less read of ``path`` (fuse.no_open): an implicit handle per path,
        revalidated like an open once ``fuse.revalidate`` has passed (ESTALE when the source is no
        longer the version *expect* names)."""
        if path is None:
            return None
        now = self.clock()
        entry = self.handles.implicit(path, now, self.config.fuse.revalidate_bound, expect)
        if entry is not None:
            return entry
        _fh, entry = self.opener.acquire(path, expect, implicit_at=now)
        self.opener.after_open(entry, probe=True)
        return entry

    # == for warm jobs and cache reports (fastfs.fsio.warm) ==========================================
    def hold(self, path: str) -> tuple[int, FileEntry]:
        """A handle (and the entry) of the current version of *path*, without what :meth:`open` does
        for a reader (no format probe, scan bookkeeping, learning or open count); :meth:`release` it."""
        return self.opener.acquire(path)

    def passes_through(self) -> bool:
        """True when new opens of this mount go to the kernel by passthrough (warm fills the source's
        page cache then, since reads of those files never come to the RAM cache)."""
        return self.opener.passes_through()

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
            src.forget_pages()
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
        return int((src.cached_share() or 0.0) * src.size)

    def warm_block(self, entry: FileEntry, index: int) -> Block | None:
        """Reserve block *index* of *entry* and queue its fill at prefetch priority; the block comes
        back pinned (:meth:`BlockCache.unpin` it), FAILED when it could not be queued, or None when
        the budget has no room for it."""
        return self.fills.fetch_block(entry, index, demand=False, keep_pin=True, warm=True)

    def abandon_block(self, entry: FileEntry, block: Block) -> None:
        """A warm gave up waiting for *block*: its fill counts as a stuck read of the file, as when a
        reader times out."""
        self.fills.abandon_block(block)

    def version_key(self, path: str) -> FileKey:
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
    def snapshot(self, top: int = 10) -> dict[str, Any]:  # JSON-ready (fsio/stats.py)
        gauges: dict[str, float] = dict(self.cache.gauges())  # (the learned accuracy is a float)
        demand_q, prefetch_q = self.pool.queued()
        open_files, entries = self.handles.counts()
        streams = sequential = 0
        for entry in entries:
            with entry.lock:  # (the policy is guarded by it)
                policy = entry.reads.policy
                streams += len(policy.streams)
                sequential += sum(1 for s in policy.streams if s.sequential)
        gauges.update(
            open_files=open_files,
            file_versions=len(entries),
            streams=streams,
            sequential_streams_active=sequential,
            active_scans=self.scanner.active_scans(),
            queued_demand=demand_q,
            queued_prefetch=prefetch_q,
            pool_workers=self.pool.workers,
            closes_pending=self.closer.pending(),
        )
        if self.learn is not None:
            accuracy = self.learn.accuracy()
            gauges.update(learned_planned_files=accuracy["planned"], learned_accuracy=round(accuracy["ratio"], 4))
        disk_counters: dict[str, int] = {}
        if self.disk is not None:
            disk_counters, disk_gauges = self.disk.stats()
            gauges.update(disk_gauges)
        self.stats.gauges = gauges
        if self.direct_tallies is not None:  # reads the kernel layer served since (counted first)
            for fh, tally in self.direct_tallies():
                self.direct_served(fh, tally)
        snap = self.stats.snapshot(top)
        snap["counters"].update(disk_counters)
        snap["source"] = self.shaper.report()
        snap["source"]["dir_times_kept"] = self.dirs.times_kept  # (False: listings last fuse.revalidate)
        return snap

    def reconfigure(self, config: Config) -> list[str]:
        """Apply the settings that change live (config/reload.py LIVE); return the changed ones needing a remount."""
        restart = needs_remount(self.config, config)
        live = apply_live(self.config, config)
        self.config = live
        self.opener.reconfigure(live)
        self.cache.set_budget(config.cache.budget or default_budget())
        self.fills.reconfigure(live.readahead.read_timeout)
        self.probe.reconfigure(live.readahead)
        self.scanner.reconfigure(live.readahead)
        self.reads.reconfigure(live.readahead)
        for entry in self.handles.entries():
            with entry.lock:
                entry.reads.policy.set_windows(live.readahead.initial_window, live.readahead.max_window)
        return restart

    def check_invariants(self) -> None:
        """Raise AssertionError when a part's state is inconsistent: the handle table, the scanner and
        the cache (tests run this after steps)."""
        self.handles.check_invariants()
        self.scanner.check_invariants()
        self.cache.check_invariants()

    def close(self) -> None:
        self._stop.set()
        self.refresher.stop()
        self.scanner.close()
        self.fills.close()  # stream runners stop before the pool does
        self.pool.close()
        self._save_learned()
        self.opener.close()  # (its closes go to the closer too)
        self.closer.close()  # (what is queued runs first, CLOSE_WAIT at most: one stuck on a hung source is left)
        if self.disk is not None:
            self.disk.close()  # queued writes finish first (the blocks they pin stay valid until then)
        self.cache.close()
        self.source.close()
