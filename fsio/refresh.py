"""The refresher: one background thread keeping what readers hold close to the source between requests.

Close-to-open checks happen when a reader asks (an open, a listing). Two things are held without
asking again, and this thread re-checks them, a bounded number per tick:

* **directories used lately** (a name looked up in them, or listed, within :data:`DIR_USE_WINDOW`):
  the kernel may hold their names and failed lookups. Each is re-checked every ``fuse.dir_timeout``
  (:meth:`~fastfs.fsio.dirs.DirListings.check`: one stat, a new listing only when it changed, told to
  the listeners, who tell the kernel), at most :data:`MAX_DIR_CHECKS` per tick;
* **open file versions** (entries with handles): re-checked for growth every ``fuse.revalidate``
  seconds (the engine's ``file_period``, at least :data:`MIN_FILE_PERIOD`; :meth:`Refresher.check_file`),
  at most :data:`MAX_FILE_CHECKS` per tick, the first a period after the version's latest open (the
  open was its close-to-open check: a file opened and closed within a period is never checked here,
  which spares a pass over small files one source stat a file caught open).

What is due is decided by :func:`due` (pure: table tests); the thread does the I/O. With more
directories (files) in use than a tick checks, each is checked every ``ceil(n / limit)`` periods:
the work stays bounded, the bound stretches. With nothing used within the window and no file open it
makes no source request at all: it only looks at its own tables every :data:`IDLE_POLL` seconds.

Growth of one open version (:meth:`Refresher.check_file`):

1. its attributes now: ``fstat`` of the source file its handles hold (no path walk, and the inode the
   handles read, whatever became of the name), else an ``lstat`` of its path;
2. :func:`~fastfs.fsio.changes.classify` against the version's attributes: ``SAME``: the
   :data:`~fastfs.fsio.changes.GROWTH_CHECK` bytes before its end are remembered once (RAM's copy,
   else a fresh read kept only if a second stat shows the file unchanged), the reference a later
   growth is checked against. A source read in the sequential shape (a stream-oriented client:
   :mod:`fastfs.fsio.shape`) is never read there for it: a read at the end of a file on a handle
   streaming it restarts the client's download (over rclone, one np.load of 256 MiB then made the
   server read 1.30-1.34x the file, against 1.06x for a direct read); the sample is taken from RAM
   at a later check, once the stream has brought the end in, or never; ``CHANGED`` or ``GONE``: the
   handles keep their version, the entry is not checked again;
3. ``GREW``: the bytes before the old end are read again and compared with the RAM cache's copy when
   it holds them, else with the remembered sample; different: it was rewritten, not appended to
   (``CHANGED``). With neither (it grew before its first check and RAM holds none of its end) the
   times alone decide, as the rule says: "as far as mtime/ctime tell" (the gap below);
4. applied (:meth:`Refresher._grow`): the entry's size and attributes (the read path clips at the
   size), its stream policy's file size, its source reference's key (a reopen is checked against
   it), no disk-tier key (a growing file is not kept on the tier), and its last partial RAM block
   dropped: it holds the old end, and a read past it would stop there. A block pinned or being
   filled is dropped at the next check instead, and the listeners told again (a read that ended at
   the old end meanwhile may have made the kernel shrink its size). The bytes before the new end are
   sampled (the reference of the next growth), then the listeners hear a
   :class:`~fastfs.fsio.changes.Growth`; the daemon moves the kernel inode's attributes to the grown
   file and drops its cached attributes (and, served, its pages from the old end on).

The one gap: a file rewritten in place (same inode) and grown before its sample was taken (within
one file period, ``fuse.revalidate``, of the open; on a sequential-shape source, before RAM held its
end), whose end RAM does not hold (passthrough opens never fill RAM), has no reference to compare
with and is taken for grown by its times alone. Passthrough readers of a file rewritten in place
read its new bytes from the source in any case.

A version read by passthrough from its disk-tier copy is not checked: the kernel reads a copy of the
old size. The entry's key (its RAM blocks' key) stays that of the version opened: the blocks before
the old end hold the same bytes; new opens of the grown file are a new version as before.

Concurrency: the thread alone runs ticks and owns ``_watches``; ``listeners`` is appended to before
:meth:`Refresher.start`. Growth changes an entry's ``size``, ``st`` and ``dkey`` and its policy's
file size under the entry's lock (readers load each once, without it); no lock is held across I/O.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any, NamedTuple, TypeVar

from fastfs.fsio.cache import READY, BlockCache
from fastfs.fsio.changes import Change, Growth, classify, tail_range
from fastfs.fsio.dirs import DirListings
from fastfs.fsio.entry import FileEntry
from fastfs.fsio.handles import HandleTable
from fastfs.fsio.shape import Shaper
from fastfs.fsio.source import Source, SourceFile, stat_key

__all__ = [
    "DIR_USE_WINDOW",
    "IDLE_POLL",
    "MAX_DIR_CHECKS",
    "MAX_FILE_CHECKS",
    "MIN_FILE_PERIOD",
    "REVALIDATE_SECONDS",
    "Due",
    "Refresher",
    "due",
]

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

# Seconds after its last use during which a directory is re-checked: the kernel keeps names for
# entry_timeout (60 s by default) and may hold them longer while they are used; a few minutes
# covers a job's working directories without re-checking every directory a tree walk once passed.
DIR_USE_WINDOW = 300.0
# Directories re-checked per tick at most: one stat each (a listing when changed), so a tick's
# source requests stay bounded whatever the number of directories used.
MAX_DIR_CHECKS = 32
# Open file versions re-checked for growth per tick at most (one fstat each, a 4 KiB read rarely).
MAX_FILE_CHECKS = 64
# Seconds between growth checks of an open file version when none is given; the engine gives
# ``fuse.revalidate`` (its bound, FuseConfig.revalidate_bound), at least MIN_FILE_PERIOD.
REVALIDATE_SECONDS = 1.0
# Shortest period of growth checks (fuse.revalidate may be 0: the thread must not spin).
MIN_FILE_PERIOD = 0.1
# Seconds the thread sleeps when nothing is watched (it then only looks at its own tables).
IDLE_POLL = 1.0
# Shortest sleep between ticks: checks falling due within it are done together.
MIN_SLEEP = 0.05
# Seconds close waits for the thread: one stuck in a hung source's call is left behind (a daemon thread).
STOP_WAIT = 2.0
# Never checked (a new watch is due at once).
NEVER = float("-inf")


class Due(NamedTuple):
    """What :func:`due` picked."""

    keys: list[Any]  # of the caller's key type (a NamedTuple cannot be generic on Python 3.10)
    """The items to check now, the one checked longest ago first."""
    wake: float | None
    """Seconds until the next tick: when an item falls due, at most a period (the items due beyond
    the limit wait for it: a tick's work stays bounded); None: nothing watched."""


def due(items: Iterable[tuple[K, float, float]], now: float, period: float, window: float | None, limit: int) -> Due:
    """From *items* (key, last used, last checked; ``-inf``: never), those to check at *now*: each item
    used within *window* seconds (None: every item) is watched, and due once its last check is at
    least *period* seconds old; at most *limit* of them, the one checked longest ago first (so with
    more than *limit* items watched, each is checked every ``ceil(n / limit)`` periods)."""
    ready: list[tuple[float, K]] = []
    wake: float | None = None
    for key, used, checked in items:
        if window is not None and now - used > window:
            continue
        age = now - checked
        if age >= period:
            ready.append((checked, key))
        else:
            left = period - age
            wake = left if wake is None or left < wake else wake
    if not ready:
        return Due([], wake)
    ready.sort(key=lambda item: item[0])
    picked = [key for _, key in ready[:limit]]
    return Due(picked, period if wake is None or period < wake else wake)


class FileWatch:
    """What the refresher keeps about one open file version (its thread alone uses it)."""

    __slots__ = ("checked_at", "sample", "done", "partial", "grown_from")

    def __init__(self, checked_at: float = NEVER) -> None:
        self.checked_at = checked_at  # monotonic time of the last check (first: the open, FileEntry.opened_at)
        self.sample: tuple[int, bytes] | None = None  # (end, the GROWTH_CHECK bytes before it), read fresh
        self.done = False  # rewritten, replaced or gone: its handles keep their version, no more checks
        self.partial = -1  # index of a RAM block that may still end at an old end (to drop), -1: none
        self.grown_from: os.stat_result | None = None  # attributes before the growth whose block is pending


class Refresher:
    """The background re-checks of directories used lately and of open files (module docstring)."""

    def __init__(
        self,
        dirs: DirListings,
        handles: HandleTable,
        cache: BlockCache,
        source: Source,
        dir_period: float,
        file_period: float = REVALIDATE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        shaper: Shaper | None = None,
    ) -> None:
        self.dirs = dirs
        self.shaper = shaper  # the mount's source shape: sequential, no tail sample read from the source
        self.handles = handles
        self.cache = cache
        self.source = source
        self.dir_period = dir_period
        self.file_period = file_period
        self.clock = clock
        self.listeners: list[Callable[[Growth], None]] = []  # appended before start, then read
        self.ticks = 0  # ticks that did work (tests, reports)
        self._watches: dict[FileEntry, FileWatch] = {}  # the thread's own
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    # -- the thread -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread (once; later calls do nothing)."""
        with self._start_lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="fastfs-refresh", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._start_lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=STOP_WAIT)

    def _run(self) -> None:
        sleep = 0.0
        while not self._stop.wait(sleep):
            try:
                sleep = self.tick()
            except Exception:  # noqa: BLE001 - the thread must go on
                log.exception("refresher tick failed")
                sleep = IDLE_POLL

    def tick(self) -> float:
        """One round of due checks; returns the seconds to sleep until the next."""
        now = self.clock()
        dirs = due(self.dirs.watched(), now, self.dir_period, DIR_USE_WINDOW, MAX_DIR_CHECKS)
        for path in dirs.keys:
            self.dirs.check(path)
        entries = [e for e in self.handles.entries() if e.handles > 0]
        watches = self._watches
        if len(watches) != len(entries) or any(e not in watches for e in entries):
            # an open is its version's close-to-open check: the first growth check is a period after
            # it (checked at once, every small file a tick caught open, or not yet released, cost one
            # more source stat: over s3fs a HEAD, for 640 of 2,000 files read by 4 processes)
            self._watches = watches = {e: watches.get(e) or FileWatch(e.opened_at) for e in entries}
        files = due(
            ((e, now, w.checked_at) for e, w in watches.items() if not w.done),
            now,
            self.file_period,
            None,
            MAX_FILE_CHECKS,
        )
        for entry in files.keys:
            watch = watches[entry]
            try:
                self.check_file(entry, watch)
            except OSError as e:
                log.debug("growth check of %s failed: %s", entry.path, e)
            watch.checked_at = self.clock()
        if dirs.keys or files.keys:
            self.ticks += 1
        waits = [w for w in (dirs.wake, files.wake) if w is not None]
        if not waits:
            return IDLE_POLL
        return min(IDLE_POLL, max(MIN_SLEEP, min(waits)))

    # -- growth -----------------------------------------------------------------------------------
    def check_file(self, entry: FileEntry, watch: FileWatch) -> Change | None:
        """One growth check of open version *entry* (see the module docstring); returns what it found
        (None: not checked)."""
        if watch.done or entry.disk_fd >= 0:
            return None
        if watch.partial >= 0:
            self._drop_partial(entry, watch)
        old = entry.st
        current = self._attrs(entry)
        change = classify(old, current)
        if change is Change.SAME:
            if watch.sample is None or watch.sample[0] != entry.size:
                self._take_sample(entry, watch)
            return change
        if change is not Change.GREW:
            watch.done = True
            return change
        assert current is not None  # (GREW: it exists)
        offset, length = tail_range(entry.size)
        reference = self._cached(entry, offset, length)
        if reference is None and watch.sample is not None and watch.sample[0] == entry.size:
            reference = watch.sample[1]
        file, shared = self._file(entry)
        try:
            if (file.st.st_dev, file.st.st_ino) != (old.st_dev, old.st_ino):
                watch.done = True  # the name was replaced meanwhile (a path check of a file the handles do not hold)
                return Change.CHANGED
            if reference is not None and self._read(file, offset, length) != reference:
                watch.done = True  # the bytes before the old end changed: rewritten, not appended to
                return Change.CHANGED
        finally:
            self._give_back(entry, file, shared)
        self._grow(entry, watch, old, current)
        return change

    def _attrs(self, entry: FileEntry) -> os.stat_result | None:
        """The version's attributes now (None: its name is gone and its handles hold no file)."""
        ref = entry.source
        if ref.file is not None:
            try:
                file = ref.get()
            except OSError:
                file = None
            if file is not None:
                try:
                    return self.source.fstat(file.fd)
                finally:
                    ref.put(file)
        try:
            return self.source.lstat(entry.path)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise

    def _file(self, entry: FileEntry) -> tuple[SourceFile, bool]:
        """A source file to read the version's bytes from: the one its handles hold (shared: put it
        back), else the path opened now (closed after)."""
        ref = entry.source
        if ref.file is not None:
            try:
                return ref.get(), True
            except OSError:
                pass
        return self.source.open_file(entry.path), False

    @staticmethod
    def _give_back(entry: FileEntry, file: SourceFile, shared: bool) -> None:
        if shared:
            entry.source.put(file)
        else:
            file.close()

    @staticmethod
    def _read(file: SourceFile, offset: int, length: int) -> bytes:
        buf = bytearray(length)
        n = file.read_into(offset, memoryview(buf))
        return bytes(buf[:n])

    def _take_sample(self, entry: FileEntry, watch: FileWatch) -> None:
        """Remember the bytes before the version's end: RAM's copy when it holds them, else read from
        the source and kept only if the file is still unchanged after."""
        size, st = entry.size, entry.st
        offset, length = tail_range(size)
        data = b"" if length == 0 else self._cached(entry, offset, length)
        if data is not None:
            watch.sample = (size, data)
            return
        if self.shaper is not None and self.shaper.sequential:
            return  # a read at the end would restart the stream's download: RAM's copy, at a later check
        file, shared = self._file(entry)
        try:
            if (file.st.st_dev, file.st.st_ino) != (st.st_dev, st.st_ino):
                return
            data = self._read(file, offset, length)
            after = self.source.fstat(file.fd)
        finally:
            self._give_back(entry, file, shared)
        if classify(st, after) is Change.SAME and len(data) == length:
            watch.sample = (size, data)

    def _cached(self, entry: FileEntry, offset: int, length: int) -> bytes | None:
        """[offset, offset + length) of the version from its RAM blocks, or None when they lack any of it."""
        cache = self.cache
        bs = cache.block_size
        out = bytearray()
        pos, end = offset, offset + length
        while pos < end:
            block = cache.get(entry.key, pos // bs)
            if block is None:
                return None
            try:
                if block.state != READY or not block.start <= pos < block.start + block.length:
                    return None
                stop = min(end, block.start + block.length)
                out += block.view[pos - block.start : stop - block.start]
                pos = stop
            finally:
                cache.unpin(block)
        return bytes(out)

    def _grow(self, entry: FileEntry, watch: FileWatch, old: os.stat_result, new: os.stat_result) -> None:
        """Apply a checked growth to *entry* and tell the listeners (module docstring, step 4)."""
        old_size = entry.size
        with entry.lock:
            entry.size = new.st_size
            entry.st = new
            entry.dkey = ()
            entry.reads.policy.file_size = new.st_size
        entry.source.key = stat_key(new)  # (one store: a reopen compares with it)
        watch.sample = None
        bs = self.cache.block_size
        if old_size % bs:
            watch.partial = old_size // bs
            watch.grown_from = old
            self._drop_partial(entry, watch, notify=False)
        self._take_sample(entry, watch)  # the reference of its next growth, before anyone reads on
        self._notify(Growth(entry.path, old, new))

    def _drop_partial(self, entry: FileEntry, watch: FileWatch, notify: bool = True) -> None:
        """Drop the RAM block that may end at an old end of *entry* once it can be (not pinned, not
        being filled); a block already holding the bytes the size now asks for stays."""
        index = watch.partial
        block = self.cache.peek(entry.key, index)
        if block is not None and block.state == READY:
            want = min(self.cache.block_size, entry.size - block.start)
            if block.length >= want:
                block = None  # filled since the growth: it holds the new bytes
        if block is not None and not self.cache.discard(entry.key, index):
            return  # pinned or being filled: tried again at the next check
        grown_from, watch.partial, watch.grown_from = watch.grown_from, -1, None
        if notify and block is not None and grown_from is not None:
            self._notify(Growth(entry.path, grown_from, entry.st))

    def _notify(self, growth: Growth) -> None:
        for listener in self.listeners:
            try:
                listener(growth)
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the refresher
                log.exception("growth listener failed for %s", growth.path)
