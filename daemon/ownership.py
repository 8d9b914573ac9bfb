"""Ownership options: the owner, group and permission bits a mount shows (``fuse.uid``, ``fuse.gid``,
``fuse.file_mode``, ``fuse.dir_mode``, ``fuse.umask``; ``-o uid=,gid=,file_mode=,dir_mode=,umask=``).

Shared nodes and containers mount data whose owners mean nothing to the readers (an NFS export
owned by uid 5000, read by a job running as 1000). These settings replace what the source says:

* ``uid`` / ``gid`` >= 0 become the owner and group of every file and directory;
* ``file_mode`` >= 0 becomes the permission bits of every non-directory, ``dir_mode`` >= 0 those of
  every directory (setuid, setgid and sticky bits are cleared with them);
* ``umask`` then clears bits of every shown mode (symlinks keep 0777, as Linux ignores them).

The file type bits are never changed. With ``fuse.allow_other`` the kernel checks each access
against what is shown (``default_permissions``), so these settings also decide who may read what;
without it only the mounting user can use the mount at all.

POSIX ACLs (``allow_other`` mounts apply the source's: see :mod:`fastfs.fsio.access`) with these
settings (:func:`shown_acl`, applied to ``system.posix_acl_access`` and ``system.posix_acl_default``):

* ``uid`` / ``gid``: the ACL is shown and applied as it is: its owner and owning-group entries are
  those of the shown owner and group, as the mode's bits are; its named entries keep the source's ids.
* ``umask``: the bits it clears from the mode are cleared from the ACL too (``user::``, the mask or
  else the group class, ``other::``), so the umask restricts an ACL as it restricts the mode. Where
  it clears *every* group bit of a source's mode (those bits are the ACL's mask), it clears the
  others' bits as well: the kernel ignores the ACL of a mode without group bits, so the file's named
  users and groups would get the others' bits, which the ACL may deny them (a ``0644`` file with
  ``user:nobody:---`` under ``umask=070``). So the mount never grants what the source denies; the
  price is that such a file (group bits all cleared, others' kept: ``0624`` under ``umask=022``)
  shows no bits for the others, ACL or not.
* ``file_mode`` (non-directories) / ``dir_mode`` (directories): the bits shown replace the source's
  permissions, ACL included: no ACL is shown there (an ACL's entries would contradict the bits the
  option sets: these options are the deliberate exception to "the mount never grants what the source
  denies", with or without ACLs).

This module is pure (no I/O) and knows nothing of the protocol: :func:`translate` works on the three
numbers; the kernel adapter calls it on every attribute reply, with the :class:`Ownership` built once
at mount from the config.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from typing import Any

from fastfs.fsio.access import ACL_NAMES, NO_ACL_ERRNOS, AclError, parse_acl

# Permission bits a symlink always shows (Linux never checks them).
SYMLINK_MODE = 0o777


@dataclass(frozen=True)
class Ownership:
    """What replaces the source's ownership; -1 keeps the source's value (umask 0 clears nothing)."""

    uid: int = -1
    gid: int = -1
    file_mode: int = -1
    dir_mode: int = -1
    umask: int = 0

    @classmethod
    def from_config(cls, fuse_config: Any) -> Ownership | None:
        """The settings of a ``FuseConfig``; None when they change nothing (the common case)."""
        own = cls(**{name: getattr(fuse_config, name, default) for name, default in _DEFAULTS.items()})
        return None if own == cls() else own


_DEFAULTS = {"uid": -1, "gid": -1, "file_mode": -1, "dir_mode": -1, "umask": 0}


def translate(mode: int, uid: int, gid: int, own: Ownership | None) -> tuple[int, int, int]:
    """(st_mode, st_uid, st_gid) as the mount shows them."""
    if own is None:
        return mode, uid, gid
    kind = stat.S_IFMT(mode)
    perm = stat.S_IMODE(mode)
    if stat.S_ISLNK(mode):
        perm = SYMLINK_MODE
    else:
        if stat.S_ISDIR(mode):
            if own.dir_mode >= 0:
                perm = own.dir_mode
        elif own.file_mode >= 0:
            perm = own.file_mode
        group = perm & 0o070
        perm &= ~own.umask
        if group and not perm & 0o070 and not replaces_bits(mode, own):
            perm &= ~0o007  # (see the module docstring: a file's ACL, ignored now, may deny its named entries)
    return (
        kind | perm,
        own.uid if own.uid >= 0 else uid,
        own.gid if own.gid >= 0 else gid,
    )


def replaces_bits(mode: int, own: Ownership | None) -> bool:
    """Whether the permission bits shown for a node of source *mode* are the options' own
    (``file_mode`` for non-directories, ``dir_mode`` for directories): then it shows no ACL."""
    if own is None or stat.S_ISLNK(mode):
        return False
    return (own.dir_mode if stat.S_ISDIR(mode) else own.file_mode) >= 0


def shown_acl(value: bytes, mode: int, own: Ownership | None) -> bytes | None:
    """An ACL xattr's value as the mount shows it for a node of source *mode*: unchanged, with the
    umask applied, or None (no ACL: :func:`replaces_bits`). A value that cannot be parsed is passed on
    unchanged (the kernel then refuses it, and with it every access it would decide)."""
    if replaces_bits(mode, own):
        return None
    if own is None or not own.umask:
        return value
    try:
        acl = parse_acl(value)
    except AclError:
        return value
    return value if acl is None else acl.umasked(own.umask).encode()


def no_acl(name: str, err: int | None) -> bool:
    """Whether reading xattr *name* failing with *err* means "no such ACL" (answered as ENODATA: the
    kernel fails every permission check it asks an ACL for when the answer is another error)."""
    return name in ACL_NAMES and err in NO_ACL_ERRNOS


def shown_xattr(name: str, value: bytes, mode: int, own: Ownership | None) -> bytes | None:
    """The value of the source's xattr *name* as the mount shows it (None: not shown)."""
    return shown_acl(value, mode, own) if name in ACL_NAMES else value


def shown_xattr_names(names: list[str], mode: int, own: Ownership | None) -> list[str]:
    """The source's xattr names as the mount lists them (no ACL where :func:`replaces_bits`)."""
    return [n for n in names if n not in ACL_NAMES] if replaces_bits(mode, own) else names
