"""Reply encoders: the payloads of the kernel's replies, built from plain values.

The counterpart of :mod:`.requests`: handlers return what these build, and nothing else packs a
reply. :class:`Replies` holds what a mount fixes once (entry and attribute timeouts, the ownership
translation of :mod:`fastfs.daemon.ownership`) and builds ``fuse_entry_out`` (:meth:`Replies.entry`),
``fuse_attr_out`` (:meth:`Replies.attr`) and the negative entry (:attr:`Replies.negative`, built once,
see :func:`negative_entry`); the module functions build the rest: :func:`open_reply`,
:func:`statfs`, :func:`xattr` (the size protocol of GETXATTR and LISTXATTR), and the dirent writers
of READDIR (:func:`dirents`) and READDIRPLUS (:func:`fit_plus`, :func:`direntplus`).

Cost: every encoder is one precompiled :class:`struct.Struct` ``pack`` of values computed inline (no
intermediate objects per reply beyond the argument tuple); READ replies are not built here at all:
they are the list of views the engine returns, sent by the session's one ``writev``.

Directory offsets (``fuse_dirent.off``) are opaque to the kernel: it hands back the one of the last
entry it consumed as the next request's offset. The writers take ``cookie``, added to each entry's
index + 1, so the caller can put its own pass number into the upper bits (see
:mod:`fastfs.daemon.listings`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Sequence
from typing import Protocol

from fastfs.daemon.kernel import abi

# Translation of (st_mode, st_uid, st_gid) as the mount shows them; None shows the source's.
Translate = Callable[[int, int, int], tuple[int, int, int]]
# (name, file type bits, inode) of one directory entry.
Dirent = tuple[str, int, int]


class StatLike(Protocol):
    """What an attribute reply reads of an ``os.stat_result`` (virtual nodes have their own)."""

    @property
    def st_ino(self) -> int: ...

    @property
    def st_size(self) -> int: ...

    @property
    def st_blocks(self) -> int: ...

    @property
    def st_atime_ns(self) -> int: ...

    @property
    def st_mtime_ns(self) -> int: ...

    @property
    def st_ctime_ns(self) -> int: ...

    @property
    def st_mode(self) -> int: ...

    @property
    def st_nlink(self) -> int: ...

    @property
    def st_uid(self) -> int: ...

    @property
    def st_gid(self) -> int: ...

    @property
    def st_rdev(self) -> int: ...

    @property
    def st_blksize(self) -> int: ...


_NS = 1_000_000_000
_U64 = 0xFFFFFFFFFFFFFFFF
_U32 = 0xFFFFFFFF
_ENTRY = abi.ENTRY_OUT
_ATTR = abi.ATTR_OUT
_OPEN = abi.OPEN_OUT
_DIRENT = abi.DIRENT
_DIRENT_SIZE = abi.DIRENT.size
_PLUS_BASE = abi.ENTRY_OUT.size + abi.DIRENT.size
_GETXATTR_OUT = abi.GETXATTR_OUT
_NO_ENTRY = bytes(abi.ENTRY_OUT.size)  # node id 0: the kernel links no entry (READDIRPLUS's dot entries)
_PAD = bytes(8)
_S_IFMT = 0o170000  # the file type bits of st_mode
_S_IFDIR = stat.S_IFDIR


def split_seconds(seconds: float) -> tuple[int, int]:
    """Seconds -> (whole seconds, nanoseconds), as the kernel's timeouts travel."""
    whole = int(seconds)
    return whole, int((seconds - whole) * 1e9)


def encode_dev(rdev: int) -> int:
    """st_rdev -> the kernel's 32-bit ``new_encode_dev`` form that fuse_attr.rdev carries."""
    major, minor = os.major(rdev), os.minor(rdev)
    return ((minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)) & 0xFFFFFFFF


def attr_fields(st: StatLike, translate: Translate | None = None) -> tuple[int, ...]:
    """``os.stat_result`` -> the fields of ``struct fuse_attr``, in order (ownership translated)."""
    a_s, a_ns = divmod(st.st_atime_ns, _NS)
    m_s, m_ns = divmod(st.st_mtime_ns, _NS)
    c_s, c_ns = divmod(st.st_ctime_ns, _NS)
    rdev = st.st_rdev
    mode, uid, gid = st.st_mode, st.st_uid, st.st_gid
    if translate is not None:
        mode, uid, gid = translate(mode, uid, gid)
    return (
        st.st_ino,
        st.st_size,
        st.st_blocks,
        a_s & _U64,
        m_s & _U64,
        c_s & _U64,
        a_ns,
        m_ns,
        c_ns,
        mode,
        st.st_nlink & _U32,
        uid,
        gid,
        encode_dev(rdev) if rdev else 0,
        st.st_blksize & _U32,
        0,
    )


def negative_entry(ttl: float) -> bytes:
    """A LOOKUP reply that caches the name as absent for *ttl* seconds (node id 0 with an entry timeout)."""
    whole, nsec = split_seconds(ttl)
    return _ENTRY.pack(0, 0, whole, 0, nsec, 0, *([0] * 16))


class Replies:
    """Entry and attribute replies of one mount (timeouts and ownership fixed at mount)."""

    __slots__ = ("_ev", "_ev_ns", "_av", "_av_ns", "_dv", "_dv_ns", "_translate", "negative")

    def __init__(
        self,
        entry_timeout: float,
        attr_timeout: float,
        negative_timeout: float,
        translate: Translate | None = None,
        dir_timeout: float | None = None,
    ) -> None:
        self._ev, self._ev_ns = split_seconds(entry_timeout)
        self._av, self._av_ns = split_seconds(attr_timeout)
        # directories' attributes: their own timeout (None: attr_timeout), so a directory's times and
        # the kernel's checks of it follow the source within it
        self._dv, self._dv_ns = split_seconds(attr_timeout if dir_timeout is None else dir_timeout)
        self._translate = translate
        cached = split_seconds(negative_timeout) != (0, 0)
        self.negative: bytes | None = negative_entry(negative_timeout) if cached else None
        """The negative LOOKUP reply, or None when absent names are not cached (ENOENT instead)."""

    def entry(self, nodeid: int, st: StatLike) -> bytes:
        """``fuse_entry_out``: node *nodeid* with attributes *st*, cached for the mount's timeouts
        (a directory's attributes for its own)."""
        # (the fields of attr_fields, computed inline: one pack call, no tuple or frame in between)
        a_s, a_ns = divmod(st.st_atime_ns, _NS)
        m_s, m_ns = divmod(st.st_mtime_ns, _NS)
        c_s, c_ns = divmod(st.st_ctime_ns, _NS)
        mode, uid, gid, rdev = st.st_mode, st.st_uid, st.st_gid, st.st_rdev
        av, av_ns = (self._dv, self._dv_ns) if mode & _S_IFMT == _S_IFDIR else (self._av, self._av_ns)
        if self._translate is not None:
            mode, uid, gid = self._translate(mode, uid, gid)
        return _ENTRY.pack(
            nodeid, 0, self._ev, av, self._ev_ns, av_ns,
            st.st_ino, st.st_size, st.st_blocks, a_s & _U64, m_s & _U64, c_s & _U64, a_ns, m_ns, c_ns,
            mode, st.st_nlink & _U32, uid, gid, encode_dev(rdev) if rdev else 0, st.st_blksize & _U32, 0,
        )  # fmt: skip

    def attr(self, st: StatLike) -> bytes:
        """``fuse_attr_out``: attributes *st*, cached for the mount's attribute timeout (a directory's
        for its own)."""
        a_s, a_ns = divmod(st.st_atime_ns, _NS)
        m_s, m_ns = divmod(st.st_mtime_ns, _NS)
        c_s, c_ns = divmod(st.st_ctime_ns, _NS)
        mode, uid, gid, rdev = st.st_mode, st.st_uid, st.st_gid, st.st_rdev
        av, av_ns = (self._dv, self._dv_ns) if mode & _S_IFMT == _S_IFDIR else (self._av, self._av_ns)
        if self._translate is not None:
            mode, uid, gid = self._translate(mode, uid, gid)
        return _ATTR.pack(
            av, av_ns, 0,
            st.st_ino, st.st_size, st.st_blocks, a_s & _U64, m_s & _U64, c_s & _U64, a_ns, m_ns, c_ns,
            mode, st.st_nlink & _U32, uid, gid, encode_dev(rdev) if rdev else 0, st.st_blksize & _U32, 0,
        )  # fmt: skip


def open_reply(fh: int, flags: int, backing_id: int = 0) -> bytes:
    """``fuse_open_out``: handle *fh*, FOPEN_* *flags*, the passthrough backing id (0: none)."""
    return _OPEN.pack(fh, flags, backing_id)


def statfs(sv: os.statvfs_result) -> bytes:
    """``fuse_statfs_out`` of the source's ``statvfs``."""
    return abi.STATFS_OUT.pack(
        sv.f_blocks, sv.f_bfree, sv.f_bavail, sv.f_files, sv.f_ffree, sv.f_bsize, sv.f_namemax, sv.f_frsize, 0
    )


def xattr(value: bytes, size: int) -> bytes:
    """The xattr size protocol: size 0 asks for the length; a too small buffer is ERANGE."""
    if size == 0:
        return _GETXATTR_OUT.pack(len(value), 0)
    if len(value) > size:
        raise OSError(errno.ERANGE, os.strerror(errno.ERANGE))
    return value


def dirents(listing: Sequence[Dirent], start: int, size: int, cookie: int) -> tuple[bytes, int]:
    """READDIR: the entries of *listing* from index *start* that fit *size* bytes, each with offset
    ``cookie + index + 1``; returns (payload, index after the last entry written)."""
    out = bytearray()
    index = start
    pack = _DIRENT.pack
    for index in range(start, len(listing)):
        name, kind, ino = listing[index]
        raw = os.fsencode(name)
        rec = (_DIRENT_SIZE + len(raw) + 7) & ~7
        if len(out) + rec > size:
            return bytes(out), index
        out += pack(ino, cookie + index + 1, len(raw), kind >> 12)
        out += raw
        out += _PAD[: rec - _DIRENT_SIZE - len(raw)]
    return bytes(out), len(listing)


def fit_plus(listing: Sequence[Dirent], start: int, size: int) -> int:
    """READDIRPLUS: the index after the last entry from *start* whose record fits *size* bytes."""
    end, used = start, 0
    while end < len(listing):
        rec = (_PLUS_BASE + len(os.fsencode(listing[end][0])) + 7) & ~7
        if used + rec > size:
            break
        used += rec
        end += 1
    return end


def direntplus(records: Sequence[tuple[bytes | None, str, int, int]], start: int, cookie: int) -> bytes:
    """READDIRPLUS: one record per (entry reply or None for no entry, name, type bits, inode), the
    first at index *start*; offsets as in :func:`dirents`."""
    out = bytearray()
    pack = _DIRENT.pack
    for i, (entry, name, kind, ino) in enumerate(records, start):
        raw = os.fsencode(name)
        rec = (_PLUS_BASE + len(raw) + 7) & ~7
        out += entry if entry is not None else _NO_ENTRY
        out += pack(ino, cookie + i + 1, len(raw), kind >> 12)
        out += raw
        out += _PAD[: rec - _PLUS_BASE - len(raw)]
    return bytes(out)
