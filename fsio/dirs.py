"""Directory listings checked against the source: one stat per listing, a new listing only on change.

Every listing of a directory the kernel asks for (the daemon's READDIR/READDIRPLUS at offset 0) comes
here (:meth:`DirListings.listing`): the directory is stat'ed once at the source and its last listing
is handed out again while :func:`~fastfs.fsio.changes.listing_valid` says it still describes the
directory (same device, inode, mtime and ctime, and not taken within the timestamp tick of the
directory's last change); otherwise the source is listed again. So a listing is as fresh as the
source at every listing, and costs one source stat when nothing changed.

The directories in use are remembered (:meth:`DirListings.used`: the engine calls it for each lookup
in a directory, a listing counts too) with when they were last used and last checked, so the
refresher (:mod:`fastfs.fsio.refresh`) can re-check those used lately without a listing
(:meth:`DirListings.check`, the same stat-then-maybe-relist step): a directory the kernel holds names
or failed lookups of is then checked within ``fuse.dir_timeout`` even when nobody lists it. A
directory never listed is not listed by its first check: that stat is what later checks compare with
(the names the kernel holds were looked up at most a period before it, so a change in between falls
within the racy tick before that stat, in which case the first check lists it).

Verification for opens (:meth:`DirListings.verified`): a file's metadata fetched while the directory
was in a known state (its *basis*: the directory's key and the wall clock before the stat that saw
it, :meth:`DirListings.basis`, read before the file's own request) still names the same file while
the directory is in that state: no name in it was created, deleted or renamed since. Opens older
than ``fuse.revalidate`` ask for the directory's basis verified within that bound: the last stat
that confirmed it (``verified_at``) when recent enough, else one re-check (the same step as the
refresher's, shared by every open of the directory in the period). A file rewritten in place does
not change its directory: that gap is ``fuse.trust_unchanged_dirs``'s trade (config/schema.py).

Sources whose directory times do not move when their entries change (object-store clients:
:func:`~fastfs.fsio.shape.dir_times_kept`, ``times_kept`` False) cannot be checked by a stat: there a
listing is handed out again for ``bound`` seconds (``fuse.revalidate``, the close-to-open bound) after
it was made and is made anew after that; the refresher checks nothing there (a stat tells nothing,
and a listing of every directory in use each period would ask the source for more than its readers
do), and no basis is ever verified (opens then check the file itself). Before this, a file made on the
server of an rclone mount never showed in a listing through fastfs: the directory's times stayed.

Each new listing is told to the listeners as a :class:`~fastfs.fsio.changes.DirChange` (the names
now, the names the previous listing had that are gone): the engine drops the metadata it keeps of
vanished names, the daemon tells the kernel to drop the names it holds that vanished and the failed
lookups that now exist. A directory listed for the first time is told too, without vanished names:
names it had before may still be held by the kernel from lookups, and the daemon compares those.

Bounds: at most :data:`MAX_DIRS` directories remembered (the least recently used forgotten first),
and the listings kept hold at most :data:`MAX_ENTRIES` entries in all (the least recently used
listing dropped first; a directory whose listing was dropped is listed again at its next use).

Clocks: ``clock`` (monotonic seconds) times uses and checks; ``wall_ns`` (wall clock, ns) stamps a
listing for the racy-tick rule, which compares it with the source's mtime: a source whose clock is
ahead of this machine's only makes listings look racy (listed again, never stale); one behind by
more than :data:`~fastfs.fsio.changes.RACY_SECONDS` may miss a second change within one timestamp
tick of the first until the directory changes again.

Concurrency: ``_lock`` guards ``_dirs`` (its order and membership), ``_entries`` and each state's
``listed`` and ``seen``; ``used_at``, ``checked_at`` and ``verified_at`` are single float stores,
written without it (a use is recorded on the lookup path, one dict read and one store) and read by
the refresher and by :meth:`DirListings.verified` as hints. A
kept listing is never changed, only replaced. The source is stat'ed and listed outside the lock;
listeners are called outside it, on the caller's thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from fastfs.fsio.changes import DirChange, dir_key, listing_valid, vanished
from fastfs.fsio.source import Source

__all__ = ["MAX_DIRS", "MAX_ENTRIES", "Dirent", "DirListings", "DirState"]

log = logging.getLogger(__name__)

# Directories whose use and listing are remembered (the least recently used forgotten first).
MAX_DIRS = 4096
# Entries of the kept listings in all (a few hundred bytes each: about 100-200 MB at most).
MAX_ENTRIES = 1_000_000
# Never checked: the first check of a directory used before it was ever listed lists it.
NEVER = float("-inf")

# (name, file type bits, inode) of one directory entry, as the source lists it.
Dirent = tuple[str, int, int]


class Listed:
    """One listing of a directory (immutable once made)."""

    __slots__ = ("key", "listed_ns", "entries", "names")

    def __init__(self, key: tuple[int, int, int, int], listed_ns: int, entries: list[Dirent]) -> None:
        self.key = key  # (device, inode, mtime, ctime) of the directory the listing is valid for
        self.listed_ns = listed_ns  # wall clock before the stat the listing is validated by
        self.entries = entries
        self.names = frozenset(e[0] for e in entries)


class DirState:
    """What is remembered of one directory (see the module docstring for what guards what)."""

    __slots__ = ("used_at", "checked_at", "verified_at", "listed", "seen")

    def __init__(self, used_at: float) -> None:
        self.used_at = used_at  # monotonic time of the last lookup in it or listing of it
        self.checked_at = NEVER  # monotonic time of the last stat that validated (or made) its listing
        self.verified_at = NEVER  # monotonic time before the last stat that showed its basis current
        self.listed: Listed | None = None  # its last listing, while kept (_lock)
        self.seen: tuple[tuple[int, int, int, int], int] | None = None  # without a listing: (key, wall
        # clock before the stat) of its first check, which later checks compare with (_lock)


class DirListings:
    """The listings of the directories in use and when each was used and checked (module docstring)."""

    def __init__(
        self,
        source: Source,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
        max_dirs: int = MAX_DIRS,
        max_entries: int = MAX_ENTRIES,
        times_kept: bool = True,
        bound: float = 1.0,
    ) -> None:
        self.source = source
        self.times_kept = times_kept  # the source's directory times move with their entries (module docstring)
        self.bound = bound  # seconds a listing is handed out again where they do not
        self.clock = clock
        self.wall_ns = wall_ns
        self.max_dirs = max_dirs
        self.max_entries = max_entries
        self.listeners: list[Callable[[DirChange], None]] = []  # appended before use (at mount), then read
        self._lock = threading.Lock()
        self._dirs: OrderedDict[str, DirState] = OrderedDict()  # path -> state, least recently listed first
        self._entries = 0  # entries of the kept listings

    # -- uses -------------------------------------------------------------------------------------
    def used(self, path: str) -> None:
        """A name was looked up in directory *path* (the kernel may now hold it, or its absence)."""
        now = self.clock()
        state = self._dirs.get(path)  # (one atomic dict read: a state just forgotten only loses this use)
        if state is not None:
            state.used_at = now
            return
        with self._lock:
            self._state_locked(path, now)

    def watched(self) -> list[tuple[str, float, float]]:
        """(path, last used, last checked) of every directory remembered (for the refresher)."""
        with self._lock:
            return [(path, s.used_at, s.checked_at) for path, s in self._dirs.items()]

    # -- listings ---------------------------------------------------------------------------------
    def listing(self, path: str) -> list[Dirent]:
        """The entries of directory *path* as the source holds them now: its kept listing when one
        source stat shows it still valid, else a new listing (told to the listeners). The list is
        shared: callers must not change it."""
        now = self.clock()
        state = self._dirs.get(path)
        if state is not None:
            state.used_at = now
        listed = state.listed if state is not None else None
        if state is not None and listed is not None and not self.times_kept:  # (no stat tells more)
            if now - state.checked_at <= self.bound:
                return listed.entries
            listed = None  # (past the bound: made anew)
        stamp = self.wall_ns()  # before the stat: a change after it is either seen by it or racy
        st = self.source.lstat(path)
        if state is not None and listed is not None and listing_valid(listed.key, listed.listed_ns, st):
            state.checked_at = state.verified_at = now
            return listed.entries
        return self._relist(path, st, stamp, now, now)

    def check(self, path: str) -> bool:
        """The refresher's re-check of directory *path*: one stat, and a new listing (told to the
        listeners) when it changed since its last listing or since the stat that was its first check
        (that first check lists nothing unless the directory changed within the racy tick before it:
        the names the kernel holds were looked up at most a period before). True when it was listed
        anew. A directory that is gone is forgotten. On a source whose directory times are not kept
        nothing is checked: a stat tells nothing there, and listing every directory in use at every
        period would ask the source for far more than its readers do (its listings are made anew on
        demand, past the bound)."""
        if not self.times_kept:
            return False
        now = self.clock()
        state = self._dirs.get(path)
        try:
            stamp = self.wall_ns()
            st = self.source.lstat(path)
            basis: tuple[tuple[int, int, int, int], int] | None = None
            if state is not None:
                listed = state.listed
                basis = (listed.key, listed.listed_ns) if listed is not None else state.seen
            if basis is None and listing_valid(dir_key(st), stamp, st):
                basis = (dir_key(st), stamp)  # a first check outside the tick of a change: trusted
            if basis is not None and listing_valid(basis[0], basis[1], st):
                with self._lock:
                    state = self._state_locked(path, NEVER)
                    if state.listed is None and state.seen is None:
                        state.seen = basis
                    state.checked_at = state.verified_at = now
                return False
            self._relist(path, st, stamp, now, NEVER)
            return True
        except (FileNotFoundError, NotADirectoryError):
            self.forget(path)
            return False
        except OSError as e:  # (EACCES, EIO...): checked again a period later, not at once
            log.debug("re-check of directory %s failed: %s", path, e)
            if state is not None:
                state.checked_at = now
            return False

    # -- verification for opens --------------------------------------------------------------------
    def basis(self, path: str) -> tuple[tuple[int, int, int, int], int] | None:
        """The state of directory *path* as last seen: (its key, the wall clock before the stat that saw
        it), or None when never seen. No source request: read before a file's own request, it is what
        :meth:`verified` later compares with."""
        state = self._dirs.get(path)
        if state is None:
            return None
        with self._lock:
            listed = state.listed
            return (listed.key, listed.listed_ns) if listed is not None else state.seen

    def verified(self, path: str, within: float) -> tuple[tuple[int, int, int, int], int] | None:
        """The basis of directory *path* as confirmed by a stat at most *within* seconds ago: the last
        one when recent enough, else one re-check now (:meth:`check`, which lists it anew when it
        changed). None when it could not be checked (gone, an error), and always on a source whose
        directory times are not kept."""
        if not self.times_kept:
            return None
        now = self.clock()
        state = self._dirs.get(path)
        if state is None or now - state.verified_at > within:
            self.check(path)
            state = self._dirs.get(path)
            if state is None or state.verified_at < now:
                return None
        return self.basis(path)

    def forget(self, path: str) -> None:
        with self._lock:
            state = self._dirs.pop(path, None)
            if state is not None and state.listed is not None:
                self._entries -= len(state.listed.entries)

    def listed(self, path: str) -> bool:
        """True when *path* was listed on this mount and its listing is still remembered (however old:
        what the source's client learned from it, such as its attribute cache, may still hold)."""
        state = self._dirs.get(path)
        return state is not None and state.listed is not None

    def kept(self, path: str) -> list[Dirent] | None:
        """The kept listing of *path* (reports and tests), or None."""
        state = self._dirs.get(path)
        listed = state.listed if state is not None else None
        return None if listed is None else listed.entries

    def __len__(self) -> int:
        return len(self._dirs)

    def _relist(self, path: str, st: os.stat_result, stamp: int, now: float, used: float) -> list[Dirent]:
        """List *path* at the source (*st*: its stat, taken after the wall clock read *stamp*), keep the
        listing unless it alone is over the bound, and tell the listeners."""
        entries = self.source.scandir(path)
        fresh = Listed(dir_key(st), stamp, entries)
        with self._lock:
            state = self._state_locked(path, used)
            previous = state.listed
            if previous is not None:
                self._entries -= len(previous.entries)
            if len(entries) <= self.max_entries:
                state.listed, state.seen = fresh, None
                self._entries += len(entries)
            else:  # too large to keep: its stat stands in for it (the next change lists it again)
                state.listed, state.seen = None, (fresh.key, stamp)
            state.checked_at = state.verified_at = now
            self._dirs.move_to_end(path)
            self._trim_locked(path)
        gone = () if previous is None else tuple(vanished([e[0] for e in previous.entries], fresh.names))
        change = DirChange(path, fresh.names, gone)
        for listener in self.listeners:
            try:
                listener(change)
            except Exception:  # noqa: BLE001 - a listener's bug must not fail the listing
                log.exception("directory change listener failed for %s", path)
        return entries

    def _state_locked(self, path: str, now: float) -> DirState:
        state = self._dirs.get(path)
        if state is None:
            state = self._dirs[path] = DirState(now)
            self._trim_locked(path)
        elif now > state.used_at:
            state.used_at = now
        return state

    def _trim_locked(self, keep: str) -> None:
        """Forget the least recently listed directories beyond the bounds (never *keep*)."""
        while len(self._dirs) > self.max_dirs or self._entries > self.max_entries:
            oldest = next(iter(self._dirs))
            if oldest == keep:
                if len(self._dirs) == 1:
                    return
                self._dirs.move_to_end(oldest)
                continue
            state = self._dirs.pop(oldest)
            if state.listed is not None:
                self._entries -= len(state.listed.entries)


def parent_of(path: str) -> str:
    """The directory holding *path* ("/" for a name in the root)."""
    return os.path.dirname(path) or "/"


def join_path(directory: str, name: str) -> str:
    """The path of *name* in *directory*."""
    return ("" if directory == "/" else directory) + "/" + name
