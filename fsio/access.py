"""Who is asking: the caller of a request, and what the kernel would let it do.

The daemon reads the source with its own rights (often root), so anything it does on a caller's
behalf beyond a plain read — a warm of a tree, a report of what is cached, the names in the stats —
must first be checked against the caller's rights, exactly as the kernel checks an open through the
mount. With ``allow_other`` the mount has ``default_permissions``: the kernel applies its generic
permission rules to the attributes fastfs reports, which are the source's mode, owner and group.
These functions mirror those rules, purely (no I/O, no clock), on ``os.stat_result``-like values:

* exactly one class applies: the owner's bits if the caller's uid owns the file, else the group's
  bits if the file's group is the caller's gid or one of its supplementary groups, else the other
  bits (an owner denied by the owner bits is denied even where the others' bits would allow);
* root (uid 0) may read and write anything and search any directory (``CAP_DAC_OVERRIDE``), but may
  execute a regular file only if some execute bit is set;
* POSIX ACLs are not consulted: FUSE with ``default_permissions`` does not apply them either (the
  group bits of a file with an ACL are its mask).

Opening a file needs search (x) on every directory on the way and read (r) on the file; listing a
directory needs read on it, and looking at its entries needs search on it as well.
"""

from __future__ import annotations

import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

# Permission bits asked for, as the kernel's MAY_READ / MAY_WRITE / MAY_EXEC.
MAY_READ = 4
MAY_WRITE = 2
MAY_EXEC = 1


class StatLike(Protocol):
    """The fields of ``os.stat_result`` the checks read."""

    st_mode: int
    st_uid: int
    st_gid: int


@dataclass(frozen=True)
class Caller:
    """The identity a request runs with: uid, primary gid and supplementary groups."""

    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


ROOT = Caller(0, 0)


def permitted(st: StatLike, caller: Caller, want: int) -> bool:
    """True when *caller* has every bit of *want* (MAY_* flags) on a file with these attributes."""
    mode = st.st_mode
    if caller.is_root:
        if want & MAY_EXEC and not stat.S_ISDIR(mode):
            return bool(mode & 0o111)
        return True
    if caller.uid == st.st_uid:
        bits = (mode >> 6) & 7
    elif caller.in_group(st.st_gid):
        bits = (mode >> 3) & 7
    else:
        bits = mode & 7
    return bits & want == want


def may_read(st: StatLike, caller: Caller) -> bool:
    """A regular file the caller may open for reading (its directories aside: see :func:`may_open`)."""
    return stat.S_ISREG(st.st_mode) and permitted(st, caller, MAY_READ)


def may_search(st: StatLike, caller: Caller) -> bool:
    """A directory the caller may pass through (look names up in)."""
    return stat.S_ISDIR(st.st_mode) and permitted(st, caller, MAY_EXEC)


def may_list(st: StatLike, caller: Caller) -> bool:
    """A directory the caller may list and whose entries it may look at (read and search)."""
    return stat.S_ISDIR(st.st_mode) and permitted(st, caller, MAY_READ | MAY_EXEC)


def may_reach(ancestors: Iterable[StatLike], caller: Caller) -> bool:
    """True when every directory on the way (root first, parent last) is searchable by the caller."""
    return all(may_search(st, caller) for st in ancestors)


def may_open(ancestors: Iterable[StatLike], st: StatLike, caller: Caller) -> bool:
    """True when the caller could open this regular file for reading through the mount."""
    return may_reach(ancestors, caller) and may_read(st, caller)
