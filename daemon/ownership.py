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

This module is pure (no I/O) and knows nothing of the protocol: :func:`translate` works on the three
numbers; the kernel adapter calls it on every attribute reply, with the :class:`Ownership` built once
at mount from the config.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from typing import Any

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
        perm &= ~own.umask
    return (
        kind | perm,
        own.uid if own.uid >= 0 else uid,
        own.gid if own.gid >= 0 else gid,
    )
