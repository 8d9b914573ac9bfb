"""What changed at the source: pure rules for files, directories and their listings.

fastfs is close-to-open: an open trusts what it knows of a file only while that knowledge is
younger than ``fuse.revalidate``; a directory listing is checked against the source directory
at each listing. These functions decide, from attributes alone, what a revalidation found. They do
no I/O, read no clock (times are arguments) and start no thread; the engine and the daemon call them
with what they read from the source.

Files (:func:`classify`):

* ``SAME``: same object, same size and times: the version the caller knows;
* ``GREW``: same object (device, inode, type), larger, and neither mtime nor ctime went backwards:
  a file being appended to (a log, a shard being written). Its open handles stay the same version
  and see the new bytes and size; the caller confirms with :data:`GROWTH_CHECK` bytes before the
  old end that the file was not rewritten (:func:`tail_range`), since an append and a rewrite both
  move mtime and ctime;
* ``CHANGED``: anything else (replaced, rewritten, truncated, another type): a new version;
* ``GONE``: the name no longer exists.

Directories (:func:`listing_valid`): a listing stays valid while the directory's identity and
times are those it was taken at, and was not taken in the same timestamp tick as the directory's
last change (:data:`RACY_SECONDS`: a change later in that tick would leave mtime as it was, as
git's "racily clean" index entries). :func:`vanished` names the entries a new listing lost (the
kernel is told to forget them).

What the engine found is handed to its listeners (the daemon, which tells the kernel) as values:
:class:`DirChange` (a directory was listed anew because it changed, or had not been listed) and
:class:`Growth` (an open file version grew); :class:`ChangeListener` is what a listener implements.
"""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Iterable
from typing import NamedTuple, Protocol

# Bytes before a grown file's old end that are read again and compared with what was cached: an
# append leaves them as they were, a rewrite of the same name almost never does.
GROWTH_CHECK = 4096
# A listing taken less than this many seconds after the directory's mtime is not trusted later:
# sources with coarse timestamps (1 s on some network and FUSE filesystems) may not move mtime for a
# second change within the same tick.
RACY_SECONDS = 2.0


class Change(enum.Enum):
    SAME = "same"
    GREW = "grew"
    CHANGED = "changed"
    GONE = "gone"


def identity(st: os.stat_result) -> tuple[int, int, int]:
    """(device, inode, file type) of a source object."""
    return (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode))


def classify(old: os.stat_result, new: os.stat_result | None) -> Change:
    """What became of the object *old* describes, now that the source says *new* (None: gone)."""
    if new is None:
        return Change.GONE
    if identity(old) != identity(new):
        return Change.CHANGED
    if (old.st_size, old.st_mtime_ns, old.st_ctime_ns) == (new.st_size, new.st_mtime_ns, new.st_ctime_ns):
        return Change.SAME
    if (
        stat.S_ISREG(new.st_mode)
        and new.st_size > old.st_size
        and new.st_mtime_ns >= old.st_mtime_ns
        and new.st_ctime_ns >= old.st_ctime_ns
    ):
        return Change.GREW
    return Change.CHANGED


def tail_range(old_size: int) -> tuple[int, int]:
    """(offset, length) of the bytes before a grown file's old end that must read as cached."""
    length = min(old_size, GROWTH_CHECK)
    return old_size - length, length


def is_fresh(fetched_at: float, now: float, bound: float) -> bool:
    """Whether metadata read at *fetched_at* may answer an open at *now* (monotonic seconds)."""
    return bound > 0 and now - fetched_at <= bound


def dir_key(st: os.stat_result) -> tuple[int, int, int, int]:
    """What a directory listing is valid for: the directory's identity and its times."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def listing_valid(listed_key: tuple[int, int, int, int], listed_wall_ns: int, now_st: os.stat_result) -> bool:
    """Whether a listing taken at *listed_wall_ns* (wall clock, ns) for the directory state
    *listed_key* still describes the directory the source shows now as *now_st*."""
    if dir_key(now_st) != listed_key:
        return False
    changed_ns = max(now_st.st_mtime_ns, now_st.st_ctime_ns)
    return listed_wall_ns - changed_ns >= RACY_SECONDS * 1e9


def vanished(old: Iterable[str], new: Iterable[str]) -> list[str]:
    """Names of *old* that *new* no longer has, in *old*'s order."""
    present = set(new)
    return [name for name in old if name not in present]


class DirChange(NamedTuple):
    """A directory listed anew: it changed since its last listing, or had none (``vanished`` empty)."""

    path: str
    names: frozenset[str]
    """Every name the directory holds now."""
    vanished: tuple[str, ...]
    """Names of the previous listing that are gone (its order)."""


class Growth(NamedTuple):
    """An open file version that only grew (:data:`Change.GREW`, its old end's bytes checked): its
    handles now read it up to ``new.st_size``."""

    path: str
    old: os.stat_result
    """The attributes its handles had (their version's, or those of its previous growth)."""
    new: os.stat_result
    """The attributes they have now."""


class ChangeListener(Protocol):
    """Told by the engine what it found changed at the source (from a reader's request or from the
    refresher's thread; it must not block: the daemon queues its kernel notifications)."""

    def dir_changed(self, change: DirChange) -> None: ...

    def file_grew(self, growth: Growth) -> None: ...
