"""Opens and releases of file versions, and the one place that decides the route of an open.

An open is read one of three ways, its :class:`Route`:

* **served** (``kind`` ``served``): reads come to the engine (RAM cache, prefetch, stats);
* **passthrough to the source** (``kind`` ``passthrough``, ``backing_fd`` the source file): the kernel
  reads the source file itself, at the source's own speed;
* **passthrough to the disk tier** (``passthrough``, ``on_disk``, ``backing_fd`` the tier's file): the
  kernel reads the complete, verified copy the disk tier holds of a version (of any size), also for
  sources that are otherwise served.

:meth:`Opener.decide` makes the decision from everything it depends on, and nothing else does:

1. the route the inode's other open handles hold (*held*; the kernel requires every open handle of
   one inode to use one route and backing file): held ``served`` stays served; held ``passthrough``
   stays passthrough, to the disk tier's copy when the source itself would be served;
2. ``fuse.passthrough`` (``off``/``auto``/``on``) and whether the source is local
   (:func:`~fastfs.fsio.policy.choose_route`, pure);
3. the kernel connection: it can pass through (:attr:`Opener.kernel_route`, set by the daemon once
   the connection is negotiated) and has not refused a backing file (:attr:`Opener.refused_backing`,
   recorded by the opener itself, see :meth:`Opener.refused`);
4. the disk tier: a complete, verified copy of the version (:meth:`Opener.disk_backing`);
5. the entry: the handles of one version share one backing file (its disk copy once one is
   attached, else its source file).
6. on a source read as one stream per file (:mod:`fastfs.fsio.shape`'s sequential shape) with
   ``fuse.passthrough`` ``auto`` and no disk tier, a file above the small-file scan's size passes
   through unless its loader maps it where a jump wastes a download, or the version was opened
   before (a reload is served, so RAM keeps it for the next): :func:`~fastfs.fsio.policy.stream_route_applies`
   and :func:`~fastfs.fsio.policy.stream_file_route`, pure; the name or the first page tells the
   loader (:meth:`FormatProbe.loader_maps`), and the entry keeps the answer. Where the shape still
   waits for the jump probe (a FUSE client fastfs does not know), the open that starts the probe on
   its file, and an open of another file of a probe's size while it runs, wait for the answer first,
   until :data:`~fastfs.fsio.shape.SETTLE_WAIT` after the probe started at most.

A backing file the kernel refuses is a second decision made here (:meth:`Opener.refused`): the
refusal is recorded, so no later open passes through, and the open is decided again, served. So is
an open whose inode's handles settled the other route meanwhile (:meth:`Opener.reroute`): the same
handle, decided again for the held route, without reopening the source.

The open walk, from the kernel's OPEN to its reply (:mod:`fastfs.daemon.ops` is the kernel side)::

    KernelOps.open(request, OpenIn)                          daemon/ops.py
      -> Engine.open -> Opener.open                          revalidate (close-to-open): open + fstat the
           Opener.acquire                                    source; for data at hand, metadata within
                                                             fuse.revalidate, else one stat; a handle on
             HandleTable.attach                              the version's entry (one locked step)
           Opener.decide -> Route                            the route, from the inputs above
           count it, format probe / scan bookkeeping
      -> NodeTable.acquire(node, route, join=True)           the inode's handles share the first open's
                                                             route (daemon/nodes.py)
         [other route held: Engine.reroute -> Opener.reroute (same handle, decided for the held route)]
         [passthrough, no backing id yet: Session.backing_open -> NodeTable.attach_backing;
          refused: NodeTable.fall_back + Engine.refused -> Opener.refused (recorded; served)]
      -> replies.open_reply                                  daemon/kernel/replies.py

Releases (:meth:`Opener.release`) drop the handle; the last handle of a version gives back the
handles' source reference, closes the disk-tier backing file and tells the engine
(``on_last_handle``: final byte counts, what the load read for learning).

Concurrency: the opener keeps ``config`` (replaced whole by :meth:`Opener.reconfigure`), the two
capability switches ``kernel_route`` (set once at mount) and ``refused_backing`` (set once, by the
first refusal), and ``natural``, the route those make with the configuration (made again by
whoever changes one of them); all are single attribute loads and stores, read without a lock (an
open racing a refusal may still pass through: the kernel refuses it too, and it is decided again). An entry's
``disk_fd`` is set under the entry's lock by :meth:`disk_backing` while the opening handle keeps the
entry (so never concurrently with its last release, which takes it under the table's lock). No lock
is held across a source open or the disk tier's checks.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from collections.abc import Callable
from typing import NamedTuple

from fastfs.config.schema import Config
from fastfs.fsio import stats as m
from fastfs.fsio.cache import BlockCache
from fastfs.fsio.closer import Closer
from fastfs.fsio.disk.tier import DiskTier
from fastfs.fsio.entry import FileEntry
from fastfs.fsio.handles import HandleTable
from fastfs.fsio.policy import (
    ROUTE_PASSTHROUGH,
    ROUTE_SERVED,
    StreamPolicy,
    choose_route,
    stream_file_route,
    stream_route_applies,
)
from fastfs.fsio.probe import FormatProbe
from fastfs.fsio.scanner import FRESH, MetaEntry, Scanner
from fastfs.fsio.shape import PROBE_MIN_SIZE, SETTLE_WAIT
from fastfs.fsio.source import FileKey, HeadKey, Source, SourceFile, SourceRef
from fastfs.fsio.trace import DecisionLog

__all__ = ["OpenResult", "Opener", "Route"]

log = logging.getLogger(__name__)

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


class Route(NamedTuple):
    """How one open is read (see the module docstring)."""

    kind: str
    """``served`` (reads come to the engine) or ``passthrough`` (the kernel reads ``backing_fd``)."""
    backing_fd: int = -1
    """For passthrough: the descriptor to register as the backing file (valid until the handle's release)."""
    on_disk: bool = False
    """For passthrough: ``backing_fd`` is the disk tier's copy, not the source file."""


SERVED = Route(ROUTE_SERVED)
# A passthrough open of an inode whose backing file the kernel holds already (see Opener.open's backed).
BACKED = Route(ROUTE_PASSTHROUGH)


class OpenResult(NamedTuple):
    """What an open returns to the adapter (a tuple: one is built per open)."""

    fh: int
    """Handle to pass to read_into/release (never 0)."""
    route: str = ROUTE_SERVED
    """``served`` (reads come to the engine) or ``passthrough`` (the kernel reads ``backing_fd``)."""
    backing_fd: int = -1
    """For passthrough: the open descriptor to register as the backing file (valid until release)."""
    key: FileKey | tuple[()] = ()
    """File key of the version opened."""
    st: os.stat_result | None = None
    """Attributes of the version opened."""
    on_disk: bool = False
    """For passthrough: the backing file is the disk tier's copy of the version."""


class Opener:
    """Opens, releases and the route of each open (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        source: Source,
        cache: BlockCache,
        disk: DiskTier | None,
        handles: HandleTable,
        scanner: Scanner,
        probe: FormatProbe,
        stats: m.Stats,
        trace: DecisionLog,
        on_last_handle: Callable[[FileEntry], None],
        closer: Closer,
    ) -> None:
        self.config = config  # replaced whole by reconfigure
        self.closer = closer  # closes what a release gives back (a source round trip) off its thread
        self.source = source
        self.cache = cache
        self.disk = disk
        self.handles = handles
        self.scanner = scanner
        self.probe = probe
        self.stats = stats
        self.trace = trace
        self.on_last_handle = on_last_handle  # the last handle of a version was released
        self._kernel_route = False  # the kernel connection can pass opens through (set by the daemon at INIT)
        self._refused_backing = False  # the kernel refused a backing file: no open passes through any more
        self.natural = ROUTE_SERVED
        """The route of the source's files now, disk tier aside: :func:`~fastfs.fsio.policy.choose_route`
        of the configuration, the kernel's capability and the source, made again whenever one of them
        changes (every open reads it)."""
        self._route_inputs_changed()

    def reconfigure(self, config: Config) -> None:
        self.config = config
        self._route_inputs_changed()

    @property
    def kernel_route(self) -> bool:
        """The kernel connection can pass opens through (set by the daemon once negotiated)."""
        return self._kernel_route

    @kernel_route.setter
    def kernel_route(self, value: bool) -> None:
        self._kernel_route = value
        self._route_inputs_changed()

    @property
    def refused_backing(self) -> bool:
        """The kernel refused a backing file: no open passes through any more (set by :meth:`refused`)."""
        return self._refused_backing

    def _route_inputs_changed(self) -> None:
        self.natural = self._natural(self.can_pass_through)

    @property
    def can_pass_through(self) -> bool:
        """The kernel route exists and has not refused a backing file."""
        return self._kernel_route and not self._refused_backing

    def passes_through(self) -> bool:
        """True when new opens of this mount's source go to the kernel by passthrough."""
        return self.natural == ROUTE_PASSTHROUGH

    # == open ========================================================================================
    def open(
        self,
        path: str,
        flags: int = os.O_RDONLY,
        expect: FileKey | None = None,
        cached: bool = False,
        held: str = "",
        backed: bool = False,
    ) -> OpenResult:
        """Open the current version of *path* (close-to-open: the source is revalidated) and decide its
        route (*held*: the route the inode's other open handles use, "" when none; *cached*: the kernel
        may hold pages of this version from an earlier open, so no format probe; *backed*: the kernel
        holds a backing file of this version for the inode, registered by an earlier passthrough open
        and still registered, so a passthrough open needs no source file: the version is revalidated
        like data at hand, and the route carries no descriptor, see :meth:`backing`). ESTALE when
        the source is no longer the version *expect* names."""
        if flags & WRITE_FLAGS:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        passthrough = (held or self.natural) == ROUTE_PASSTHROUGH
        backed = backed and passthrough
        fh, entry = self.acquire(path, expect, passthrough and not backed, cached, backed=backed)
        try:
            route = self.decide(entry, held, backed)
        except BaseException:
            self.release(fh)
            raise
        return self._opened(fh, entry, route, first=not cached)

    def reroute(self, fh: int, held: str) -> OpenResult:
        """The second decision of open *fh*: the inode's other handles settled route *held* meanwhile, so
        the open is decided again for it (same handle and version, no source reopen; it counts on its
        new route as well)."""
        entry = self._entry(fh)
        try:
            route = self.decide(entry, held)
        except BaseException:
            self.release(fh)
            raise
        return self._opened(fh, entry, route, first=False)

    def refused(self, fh: int, reason: str) -> OpenResult:
        """The kernel refused the backing file of open *fh* (*reason*): recorded, so no open of this
        mount passes through any more (logged once), and *fh* decided again: served."""
        if not self._refused_backing:
            self._refused_backing = True
            self._route_inputs_changed()
            log.warning("passthrough unavailable (%s); serving every file", reason)
        entry = self._entry(fh)
        return self._opened(fh, entry, SERVED, first=False)

    def backing(self, fh: int) -> Route:
        """The backing file to register for passthrough open *fh*, decided *backed* (:meth:`open`), whose
        inode's registered backing file went before the adapter could share it: the version's source
        file (opened now if need be; the handles hold it from then on), or its disk-tier copy when one
        is attached to the entry."""
        return self._passthrough(self._entry(fh), False)

    def _entry(self, fh: int) -> FileEntry:
        entry = self.handles.get(fh)
        if entry is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return entry

    def _natural(self, kernel_can: bool) -> str:
        """The route of the source's files, disk tier aside (:func:`~fastfs.fsio.policy.choose_route`)."""
        return choose_route(self.config.fuse.passthrough, kernel_can, self.source.local)

    def decide(self, entry: FileEntry, held: str = "", backed: bool = False) -> Route:
        """The route of an open of *entry* (whose handle the caller holds), from the inputs the module
        docstring lists: the held route first, then the source's own route, then the disk tier
        (*backed*: see :meth:`open`)."""
        if held == ROUTE_SERVED:
            return SERVED
        if held == ROUTE_PASSTHROUGH:  # on a source that is served, the inode's opens pass through to disk
            on_disk = self._natural(True) == ROUTE_SERVED and self.disk_backing(entry)
            return self._passthrough(entry, on_disk, backed)
        if self.natural == ROUTE_PASSTHROUGH:
            return self._passthrough(entry, False, backed)
        if self.disk_backing(entry):
            return self._passthrough(entry, True)
        if self._stream_route(entry) == ROUTE_PASSTHROUGH:
            return self._passthrough(entry, False)
        return SERVED

    def _stream_route(self, entry: FileEntry) -> str:
        """The route of a large file on a source read as one stream per file, from whether its loader
        maps it (:func:`~fastfs.fsio.policy.stream_file_route`; the first open of the version reads its
        first bytes, :meth:`FormatProbe.loader_maps`); ``served`` where that does not apply."""
        shaper = self.probe.fills.shaper
        mode, small = self.config.fuse.passthrough, self.scanner.scan_max()
        tier = self.disk is not None
        if not stream_route_applies(mode, self.can_pass_through, self.natural, True, entry.size, small, tier):
            return ROUTE_SERVED  # (not even on a stream client)
        if shaper.provisional and entry.size >= PROBE_MIN_SIZE:
            # the source's shape waits for the jump probe (a client fastfs does not know), started by
            # this open when due, or running: a stream client's in-order loader would be served on one
            # stream for its whole read, at half the client's own speed (two 1 GiB files read by two
            # processes on the emulated stream client: 0.53-0.66x direct), so the open waits for the
            # answer, until SETTLE_WAIT after the probe started at most (a probe hung on its file
            # holds up the opens of other files only that long, and of smaller files never)
            self.probe.fills.probe_shape(entry, at_open=True)
            shaper.wait_probe(SETTLE_WAIT)
        if not shaper.stream:
            return ROUTE_SERVED
        state = entry.format
        # opened again: passed through before (the entry kept while idle), or read before (RAM holds its start)
        reused = state.passed or self.cache.peek(entry.key, 0) is not None
        known, waste = state.maps, shaper.jumps_waste
        maps = self.probe.loader_maps(entry) if known is None and waste and not reused else known
        route = stream_file_route(maps, waste, reused)
        passes = route == ROUTE_PASSTHROUGH
        self.stats.add(m.STREAM_ROUTE_PASSTHROUGH if passes else m.STREAM_ROUTE_SERVED)
        if passes:
            state.passed = True
        if reused:
            self.trace(
                "open %s: served on a source read as one stream per file: opened again, RAM keeps it", entry.path
            )
        elif known is None:  # (the version's first decision, or a source whose jumps waste nothing)
            if not waste:
                why = "a jump on this client costs one ranged request: every loader reads it as well directly"
            elif passes:
                why = "its loader reads in order: the client streams it as well as fastfs would"
            else:
                why = "its loader maps it (or its head was unreadable): fastfs reads it once, in order"
            self.trace("open %s: %s on a source read as one stream per file: %s", entry.path, route, why)
        return route

    def _passthrough(self, entry: FileEntry, on_disk: bool, backed: bool = False) -> Route:
        """A passthrough route of *entry*: to its disk-tier copy when it has one attached (the handles of
        one version share one backing file), else to its source file (opened now when the open was
        answered from metadata: the handles hold it from then on), or, *backed* (the kernel holds the
        inode's backing file already), to no descriptor at all."""
        fd = entry.disk_fd
        if on_disk or fd >= 0:
            return Route(ROUTE_PASSTHROUGH, fd, True)
        if backed:
            return BACKED
        ref = entry.source
        file = ref.file
        if file is None:  # our handle holds the version: the file got stays the handles' after put
            file = ref.get()
            ref.put(file)
        return Route(ROUTE_PASSTHROUGH, file.fd, False)

    def disk_backing(self, entry: FileEntry) -> bool:
        """Whether an open of *entry* (otherwise served) goes by passthrough to its complete file in the
        disk tier, which is then ``entry.disk_fd``: the kernel route must exist and not be turned off.
        Every such open asks the store again, which re-checks the data file's identity. Any size: served
        through the engine, each small file of a later epoch still cost a READ and a checked read of its
        tier file in the daemon (1,872 files of 112 KiB from the tier: 1.43-1.62 s an epoch served,
        0.75-1.01 s by passthrough; the local disk itself 0.33-0.38 s, the C passthrough example over
        that disk 0.64-0.75 s: a C FUSE daemon pays the same lookup and open round trips)."""
        if self.disk is None or not entry.dkey or not self.can_pass_through:
            return False
        if self.config.fuse.passthrough == "off":
            return False
        fd = self.disk.complete_fd(entry.dkey)
        if fd is None:
            return False
        with entry.lock:
            if entry.disk_fd < 0:
                entry.disk_fd, fd = fd, -1
        if fd >= 0:
            os.close(fd)  # the kernel's backing file of this version is the one opened first
        return True

    def _opened(self, fh: int, entry: FileEntry, route: Route, first: bool) -> OpenResult:
        """Count an open decided on *route*; served opens get their format probe (*first*: the kernel
        holds no pages of the version) and scan bookkeeping."""
        path = entry.path
        self.trace("open %s: %d bytes, %s, %s", path, entry.size, route.kind, "first open" if first else "seen before")
        if route.on_disk:
            self.stats.add(m.OPENS_DISK)
            self.stats.add(m.BYTES_DISK_OPENED, entry.size)
            if self.config.readahead.enabled:
                self.scanner.on_open(path, entry.size)  # scans and learned sets go on over files read from disk
        elif route.kind == ROUTE_PASSTHROUGH:
            self.stats.add(m.OPENS_PASSTHROUGH)
            self.stats.add(m.BYTES_PASSTHROUGH_OPENED, entry.size)
        else:
            self.stats.add(m.OPENS)
            self.after_open(entry, probe=first)
        if self.cache.checking:  # debug switch (cache.check_invariants): the handle table after a change
            self.handles.check_invariants()
        return OpenResult(fh, route.kind, route.backing_fd, entry.key, entry.st, route.on_disk)

    def after_open(self, entry: FileEntry, probe: bool) -> None:
        """Format probe (first open of a version: later opens find the kernel's cache) and scan bookkeeping."""
        if not self.config.readahead.enabled:
            return
        if probe:
            self.probe.maybe_probe(entry)
        self.scanner.on_open(entry.path, entry.size)

    # == handles =====================================================================================
    def acquire(
        self,
        path: str,
        expect: FileKey | None = None,
        need_source: bool = False,
        kernel_cached: bool = False,
        implicit_at: float | None = None,
        backed: bool = False,
    ) -> tuple[int, FileEntry]:
        """Revalidate the source (close-to-open) and return a new handle on the shared entry of its
        version (with *implicit_at*: the path's implicit handle, see :meth:`HandleTable.attach`).

        A version whose data is at hand (:meth:`_held`) is not reopened: remembered metadata (a scan's
        fetch, a lookup) answers the open while :meth:`Scanner.trust` trusts it (no source request),
        else one stat of the file revalidates it (:meth:`Scanner.revalidate`); *need_source* (a
        passthrough open without a backing file registered) always opens the source, and *backed* (the
        kernel holds the inode's backing file) counts as data at hand whatever the version's size but is
        always revalidated by its stat, never trusted from remembered metadata: that backing file is
        mostly the source file itself (a kept id always is), whose bytes a rewrite in place changes
        under the version (same inode), and a version trusted from metadata fetched before the
        rewrite would pass the new bytes through under the old size (a mix of versions; an ``mmap``
        of the old size faults with SIGBUS past the new end). Served data and the disk tier's copies
        are the version's own: trusting metadata there serves the old version whole."""
        known = self.scanner.meta(path)
        meta = None if need_source else known
        if meta is not None and not backed and not self._held(path, meta, kernel_cached):
            meta = self._awaited(path, meta)
        if meta is not None:
            how = "" if backed else self.scanner.trust(path, meta)  # backed: see the docstring
            if how and not meta.scan and (how != FRESH or meta.used or not self.scanner.take(path, meta)):
                how = ""  # a lookup's metadata answers the one open right after it, nothing more
            if how:
                self.stats.add(m.OPENS_FROM_META if how == FRESH else m.OPENS_DIR_VERIFIED)
            else:
                meta = self.scanner.revalidate(path, meta)  # one stat, never a reopen
                if meta is not None:
                    self.stats.add(m.OPENS_REVALIDATED)
        src: SourceFile | None = None
        if meta is not None:
            key, size, st = meta.key, meta.st.st_size, meta.st
        else:
            src = self.source.open_file(path)
            key, size, st = src.key, src.size, src.st
            if known is not None and not known.scan:
                self.scanner.take(path, known)  # this open asked the source: the lookup's answer is spent
        if expect is not None and key != expect:
            if src is not None:
                src.close()
                if known is not None and known.key != key:  # the kernel's retry looks the name up again:
                    self.scanner.forget([path])  # at the source, not in metadata the source just belied
            raise OSError(errno.ESTALE, "source file changed since it was looked up", path)

        def make() -> FileEntry:
            ra = self.config.readahead
            policy = StreamPolicy(size, ra.initial_window, ra.max_window)
            dkey = self.disk.key(path, key) if self.disk is not None else ()
            return FileEntry(path, key, size, st, SourceRef(self.source, path, key), policy, dkey)

        attached = self.handles.attach(path, key, src, make, implicit_at)
        attached.entry.opened_at = self.scanner.clock()
        if attached.src is not None:
            # the version's handles hold a file already: this open's own is closed off its thread (the
            # reply waits for no FLUSH round trip)
            self._put_later(attached.entry, attached.src)
        previous = attached.previous
        if previous is not None and previous != key:  # the path has a new version: free the old one's blocks
            self.cache.invalidate_file(previous)
            self.cache.invalidate_file(HeadKey(previous))
        for old_fh in attached.stale:
            self.release(old_fh)
        return attached.fh, attached.entry

    def _held(self, path: str, meta: MetaEntry, kernel_cached: bool) -> bool:
        """Whether the version *meta* describes can be read without its source file at hand: a small one
        (whole in block 0, :meth:`Scanner.scan_max`) in RAM or in the kernel's pages (*kernel_cached*),
        or any one the disk tier holds whole. (A larger version answered from metadata would open its
        source at its first uncached read, and fail with ESTALE if it changed meanwhile.)"""
        small = meta.st.st_size <= self.scanner.scan_max()
        if small and (kernel_cached or self.cache.peek(meta.key, 0) is not None):
            return True
        return self._on_disk(path, meta)

    def _awaited(self, path: str, meta: MetaEntry) -> MetaEntry | None:
        """The metadata a scan's fetch of the small file *path*, under way and waited for (at most
        :data:`~fastfs.fsio.scanner.SCAN_FETCH_WAIT`), remembered with its data in RAM, when it is of
        the version *meta* describes: the open is then answered from it instead of opening the source
        a second time. None when no fetch was under way, it failed or it found another version."""
        if meta.st.st_size > self.scanner.scan_max() or not self.scanner.await_fetch(path):
            return None
        fetched = self.scanner.meta(path)
        if fetched is None or fetched.key != meta.key or self.cache.peek(meta.key, 0) is None:
            return None
        return fetched

    def _on_disk(self, path: str, meta: MetaEntry) -> bool:
        """Whether the disk tier holds all of the version a scan's metadata describes (its open is then
        answered from that metadata, as for a file the scan holds in RAM)."""
        return self.disk is not None and self.disk.holds(self.disk.key(path, meta.key), 0, meta.st.st_size)

    def release(self, fh: int) -> None:
        """Drop handle *fh* (nothing when it is not open); the last handle of a version gives back its
        source reference and disk-tier backing file."""
        released = self.handles.release(fh)
        if self.cache.checking:  # debug switch (cache.check_invariants): the handle table after a change
            self.handles.check_invariants()
        if released is None:
            return
        if released.disk_fd >= 0:
            os.close(released.disk_fd)
        if released.last_handle:
            self.on_last_handle(released.entry)
            if released.superseded:  # its path has a newer version: nothing reads these blocks any more
                self.cache.invalidate_file(released.entry.key)
                self.cache.invalidate_file(HeadKey(released.entry.key))
        if released.src is not None:  # (its last reference closes the source file: a round trip)
            self._put_later(released.entry, released.src)

    def _put_later(self, entry: FileEntry, src: SourceFile) -> None:
        """Give *src* back to *entry*'s source reference on the closer: the last reference closes it,
        a round trip on a FUSE source (fsio/closer.py)."""
        self.closer.submit(functools.partial(entry.source.put, src))

    def close(self) -> None:
        """Forget every handle, giving back what the handles held (the engine is closing)."""
        for entry in self.handles.close():
            src = entry.source.drop()
            if src is not None:
                self._put_later(entry, src)
            if entry.disk_fd >= 0:
                os.close(entry.disk_fd)
                entry.disk_fd = -1
