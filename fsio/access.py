"""Who is asking: the caller of a request, and what the kernel would let it do.

The daemon reads the source with its own rights (often root), so anything it does on a caller's
behalf beyond a plain read — a warm of a tree, a report of what is cached, the names in the stats —
must first be checked against the caller's rights, exactly as the kernel checks an open through the
mount. With ``allow_other`` the mount has ``default_permissions`` and ``FUSE_POSIX_ACL``: the kernel
applies its generic permission rules (``generic_permission``) to the attributes fastfs reports, which
are the source's mode, owner and group, and to the source's access ACL (``system.posix_acl_access``,
which the daemon answers with the source's own). These functions mirror those rules, purely (no I/O,
no clock), on ``os.stat_result``-like values (an :class:`Attrs` carries the ACL too):

* the owner's bits if the caller's uid owns the file (an owner denied by them is denied even where
  the others' bits would allow; the ACL does not matter for the owner);
* else, when the file has an access ACL and its mode has group bits (which are then the ACL's
  mask), the ACL decides (:func:`acl_permits`, the kernel's ``posix_acl_permission``): a named-user
  entry of the caller's uid, limited by the mask; else the owning group's and every named group's
  entry the caller is in: allowed if one of them grants everything asked (limited by the mask),
  denied if the caller is in one but none does; else the ``other`` entry. A malformed ACL denies;
* else the group's bits if the file's group is the caller's gid or one of its supplementary
  groups, else the other bits;
* root (uid 0), when that denies, may still read and write anything and search any directory
  (``CAP_DAC_OVERRIDE``), but may execute a regular file only if some execute bit is set.

The ACL's binary format (``linux/posix_acl_xattr.h``) is read by :func:`parse_acl`: a little-endian
u32 version (2), then one ``u16 tag, u16 perm, u32 id`` per entry; a value without entries is no ACL.

Opening a file needs search (x) on every directory on the way and read (r) on the file; listing a
directory needs read on it, and looking at its entries needs search on it as well.
"""

from __future__ import annotations

import errno
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

# Permission bits asked for, as the kernel's MAY_READ / MAY_WRITE / MAY_EXEC.
MAY_READ = 4
MAY_WRITE = 2
MAY_EXEC = 1

# The xattrs holding a file's access ACL and a directory's default ACL (for files created in it).
ACL_ACCESS = "system.posix_acl_access"
ACL_DEFAULT = "system.posix_acl_default"
ACL_NAMES = frozenset({ACL_ACCESS, ACL_DEFAULT})
# Errors of reading an ACL xattr that mean the file has none (the source keeps no POSIX ACLs).
NO_ACL_ERRNOS = frozenset({errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})
# Entry tags (linux/posix_acl.h).
ACL_USER_OBJ = 0x01
ACL_USER = 0x02
ACL_GROUP_OBJ = 0x04
ACL_GROUP = 0x08
ACL_MASK = 0x10
ACL_OTHER = 0x20
ACL_TAGS = frozenset({ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER})
# The id of entries that name nobody (owner, owning group, mask, other).
ACL_UNDEFINED_ID = 0xFFFFFFFF
# Version of the xattr format.
ACL_XATTR_VERSION = 2
_ACL_HEADER = struct.Struct("<I")
_ACL_ENTRY = struct.Struct("<HHI")  # tag, perm, id


class StatLike(Protocol):
    """The fields of ``os.stat_result`` the checks read (read-only, as ``os.stat_result``'s are)."""

    @property
    def st_mode(self) -> int: ...

    @property
    def st_uid(self) -> int: ...

    @property
    def st_gid(self) -> int: ...


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


class AclError(ValueError):
    """An ACL xattr value the kernel would refuse (bad version, length or tag)."""


@dataclass(frozen=True)
class AclEntry:
    tag: int
    perm: int
    id: int = ACL_UNDEFINED_ID


@dataclass(frozen=True)
class Acl:
    """A POSIX ACL: its entries in the order stored (the kernel keeps them sorted by tag, then id).
    ``Acl(())`` stands for one that could not be read: it denies everyone it is consulted for."""

    entries: tuple[AclEntry, ...]

    def encode(self) -> bytes:
        """The xattr value (what :func:`parse_acl` reads)."""
        return _ACL_HEADER.pack(ACL_XATTR_VERSION) + b"".join(
            _ACL_ENTRY.pack(e.tag, e.perm, e.id) for e in self.entries
        )

    def umasked(self, umask: int) -> Acl:
        """The ACL with the bits *umask* clears from a mode cleared where the mode keeps them: the
        owner's from ``user::``, the group class's from the mask (or, without one, from the owning
        group's and the named entries), the others' from ``other::``."""
        owner, group, other = (umask >> 6) & 7, (umask >> 3) & 7, umask & 7
        has_mask = any(e.tag == ACL_MASK for e in self.entries)
        cleared = {ACL_USER_OBJ: owner, ACL_OTHER: other}
        if has_mask:
            cleared[ACL_MASK] = group
        else:
            cleared.update({ACL_GROUP_OBJ: group, ACL_USER: group, ACL_GROUP: group})
        return Acl(tuple(AclEntry(e.tag, e.perm & ~cleared.get(e.tag, 0), e.id) for e in self.entries))


def parse_acl(data: bytes | memoryview) -> Acl | None:
    """The ACL in an xattr value, as the kernel reads it (``posix_acl_from_xattr``): None for a value
    without entries (no ACL); :class:`AclError` for a bad version, a length that is not whole
    entries, or an unknown tag."""
    view = memoryview(data)
    if len(view) < _ACL_HEADER.size:
        raise AclError(f"ACL of {len(view)} bytes: no header")
    (version,) = _ACL_HEADER.unpack_from(view)
    if version != ACL_XATTR_VERSION:
        raise AclError(f"ACL version {version}, not {ACL_XATTR_VERSION}")
    body = len(view) - _ACL_HEADER.size
    if body % _ACL_ENTRY.size:
        raise AclError(f"ACL of {len(view)} bytes: not whole entries")
    entries = []
    for pos in range(_ACL_HEADER.size, len(view), _ACL_ENTRY.size):
        tag, perm, eid = _ACL_ENTRY.unpack_from(view, pos)
        if tag not in ACL_TAGS:
            raise AclError(f"ACL entry tag {tag:#x} unknown")
        entries.append(AclEntry(tag, perm, eid if tag in (ACL_USER, ACL_GROUP) else ACL_UNDEFINED_ID))
    return Acl(tuple(entries)) if entries else None


def read_acl(data: bytes | None) -> Acl | None:
    """:func:`parse_acl` of an xattr value (None: the file has none), a malformed one as ``Acl(())``."""
    if data is None:
        return None
    try:
        return parse_acl(data)
    except AclError:
        return Acl(())


@dataclass(frozen=True)
class Attrs:
    """What the kernel checks of a file: its mode, owner, group and access ACL (None: none)."""

    st_mode: int
    st_uid: int
    st_gid: int
    acl: Acl | None = None

    @classmethod
    def of(cls, st: StatLike, acl: Acl | None) -> Attrs:
        return cls(st.st_mode, st.st_uid, st.st_gid, acl)


def needs_acl(st: StatLike, caller: Caller) -> bool:
    """Whether the file's access ACL can change what *caller* may do with it: not for its owner (the
    owner's bits decide), nor where the mode has no group bits (an ACL with an empty mask: the kernel
    does not consult it), nor for root (its capabilities cover what an ACL denies; a malformed ACL,
    which the kernel refuses even to root, is the one difference). Saves reading the ACL otherwise."""
    return not caller.is_root and caller.uid != st.st_uid and bool(st.st_mode & 0o070)


def acl_of(st: StatLike) -> Acl | None:
    """The access ACL of *st* when it carries one (an :class:`Attrs`); plain stat results carry none."""
    return getattr(st, "acl", None)


def acl_permits(acl: Acl, st: StatLike, caller: Caller, want: int) -> bool:
    """The kernel's ``posix_acl_permission`` for a caller other than the owner (see the module docstring)."""
    want &= MAY_READ | MAY_WRITE | MAY_EXEC
    entries = acl.entries
    found = False
    for i, e in enumerate(entries):
        if e.tag == ACL_USER_OBJ:
            if caller.uid == st.st_uid:
                return e.perm & want == want
        elif e.tag == ACL_USER:
            if caller.uid == e.id:
                return _masked(entries, i, want)
        elif e.tag in (ACL_GROUP_OBJ, ACL_GROUP):
            if caller.in_group(st.st_gid if e.tag == ACL_GROUP_OBJ else e.id):
                found = True
                if e.perm & want == want:
                    return _masked(entries, i, want)
        elif e.tag == ACL_OTHER:
            return not found and e.perm & want == want
        elif e.tag != ACL_MASK:
            return False  # (unknown tag: the kernel's -EIO)
    return False  # no "other" entry (or no entry at all): the kernel's -EIO


def _masked(entries: tuple[AclEntry, ...], i: int, want: int) -> bool:
    """Entry *i* matched: it grants *want* if it and the mask after it (if any) have every bit."""
    perm = entries[i].perm
    for e in entries[i + 1 :]:
        if e.tag == ACL_MASK:
            return perm & e.perm & want == want
    return perm & want == want


def permitted(st: StatLike, caller: Caller, want: int) -> bool:
    """True when *caller* has every bit of *want* (MAY_* flags) on a file with these attributes
    (and its access ACL, when *st* is an :class:`Attrs` that carries one)."""
    mode = st.st_mode
    acl = acl_of(st)
    if caller.uid == st.st_uid:
        if (mode >> 6) & want == want:
            return True
    elif acl is not None and mode & 0o070:
        if not acl.entries:
            return False  # unreadable ACL: the kernel fails the check with an error, root included
        if acl_permits(acl, st, caller, want):
            return True
    else:
        bits = (mode >> 3) & 7 if caller.in_group(st.st_gid) else mode & 7
        if bits & want == want:
            return True
    if caller.is_root:
        if want & MAY_EXEC and not stat.S_ISDIR(mode):
            return bool(mode & 0o111)
        return True
    return False


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
