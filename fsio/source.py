"""Confined access to the source directory.

The daemon must never touch a path outside SRC, even if SRC changes under it (a directory swapped
for a symlink between a lookup and an open). Every path is resolved relative to a descriptor of the
source root with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` when the kernel has it (5.6+),
else component by component with ``O_NOFOLLOW``. Metadata calls use the parent directory's
descriptor plus ``follow_symlinks=False`` on the last component: the root's own for a name in the
root, else an ``O_PATH`` descriptor of the directory, kept for later calls (:class:`DirFds`) while
it is younger than ``dir_trust`` seconds (the engine sets the close-to-open bound,
``fuse.revalidate``: the directory a path names is metadata like any other), so a stat costs one
request instead of three (open, stat, close) on a path used again within the bound.

Data reads are always ``os.preadv`` at an explicit offset (no shared file position). With
``direct`` the source is opened with ``O_DIRECT`` where supported (not tmpfs): fastfs then keeps
the only cached copy and the source sees our large requests instead of its own small read-ahead;
reads into unaligned buffers or at unaligned tails fall back to a buffered descriptor.

A source that is another FUSE client (rclone, s3fs, sshfs) may die and be mounted again at the same
path while fastfs stays mounted (its service restarted). The root descriptor then belongs to a dead
connection (every call answers ENOTCONN), where a reader of the path reaches the new mount. A call
that gets one of :data:`GONE_ERRNOS` therefore opens the root by its path again (:meth:`Source.reattach`,
at most once per :data:`REATTACH_PERIOD`) and, when that is a live file system of the kind mounted
(not the empty directory under a mount taken down and not made again yet), is made once more on it.
Files opened on the dead mount stay dead, as a reader's descriptors of it do; the new mount's files
are new versions (another device).

Descriptors. Each open file version holds one descriptor; the extra block-read streams of large
files are drawn from a per-mount budget (:func:`stream_fd_budget` of the descriptor limit), so
streams never take the descriptors open files need: when the budget is used up, block reads go
to the file's first descriptor instead (slower on some sources, never an EMFILE for a reader).
Block reads rotate over the streams (the parallel shape), or go to the first one alone
(``single``: the sequential shape, see :mod:`fastfs.fsio.shape`).

Requests counted. This module is the one place that talks to the source, so it counts what fastfs
asks of it (:data:`~fastfs.fsio.stats.SOURCE_OPENS`, ``SOURCE_STATS``, ``SOURCE_LISTINGS``) into the
stats the engine hands it (``Source.stats``): the number to compare with what the reader itself
would ask (one lookup and one open per file read directly). Path walks to a parent directory are
not counted (the source's client caches them); data reads are the pread counters.

What the source is, for the choice of its access shape: its mount's type from the mount table
(:func:`mount_type_of`, the fstype of the longest mount point holding the source root: ``ext4``,
``nfs4``, ``fuse.rclone``) and, for FUSE clients nobody knows, :func:`jump_probe`: the cost of a
read continuing the last one on one handle against one that jumps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import resource
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from fastfs.fsio import shape
from fastfs.fsio import stats as m

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(os.uname().machine)
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
# O_DIRECT needs buffer, offset and length aligned to the logical block size; 4 KiB covers all disks.
DIRECT_ALIGN = 4096

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_openat2_works: bool | None = None


_OPEN_HOW = struct.Struct("QQQ")  # struct open_how: flags, mode, resolve
_NR_OPENAT2 = ctypes.c_long(_SYS_OPENAT2 or 0)
_HOW_SIZE = ctypes.c_size_t(_OPEN_HOW.size)
# open_how buffers by open flags, built once (the kernel only reads them): an open is on every OPEN's
# path, and building the buffer and the ctypes arguments anew cost a few microseconds each time.
_HOWS: dict[int, ctypes.Array[ctypes.c_char]] = {}


def _openat2(dirfd: int, rel: str, flags: int) -> int:
    buf = _HOWS.get(flags)
    if buf is None:
        how = _OPEN_HOW.pack(flags | os.O_CLOEXEC, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
        buf = _HOWS.setdefault(flags, ctypes.create_string_buffer(how, len(how)))
    fd: int = _syscall(_NR_OPENAT2, ctypes.c_int(dirfd), os.fsencode(rel), buf, _HOW_SIZE)  # restype c_long: an int
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), rel)
    return fd


# errnos of a source whose connection is gone: a FUSE client that died answers the first two until its
# mount is taken down, an NFS client ESTALE for an export made again (Source.reattach then opens the
# root by its path again, when the root itself fails: a file's own ESTALE or a dead mount inside the
# source leaves it alone).
GONE_ERRNOS = frozenset({errno.ENOTCONN, errno.ECONNABORTED, errno.ESTALE})
# Seconds between two reopens of the source root after a gone errno: a dead mount not taken down yet
# answers every call at once, and each request of a busy reader would otherwise reopen the path.
REATTACH_PERIOD = 1.0

# Directories whose O_PATH descriptors are kept for metadata calls at once (least recently used closed
# first): a working set of directories read at once (a data set's class folders are read one after
# the other) fits, and they are few next to the descriptors open files hold.
KEPT_DIRS = 64

# Descriptors left to everything but source files (FUSE device, sockets, log, state files, pipes).
FD_RESERVE = 64
# Share of the other descriptors the extra block-read streams of a mount may hold at once; the rest
# stays for open files (one descriptor each) and transient opens of scans, probes and warms.
STREAM_FD_SHARE = 0.5


def stream_fd_budget(fd_limit: int) -> int:
    """Extra block-read descriptors a mount may hold at once under a descriptor limit of *fd_limit*."""
    return max(0, int((fd_limit - FD_RESERVE) * STREAM_FD_SHARE))


def fd_limit() -> int:
    """This process's soft limit on open descriptors (RLIMIT_NOFILE)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def split(path: str) -> list[str]:
    """FUSE path ``/a/b`` -> ``["a", "b"]``; rejects ``..`` and empty components. (Every open splits
    its path: a path of plain components, the daemon's own, is split without a pass over its parts.)"""
    if path[:1] == "/" and "/." not in path and "//" not in path and path[-1:] != "/":
        return path[1:].split("/")
    parts = [p for p in path.split("/") if p and p != "."]
    if any(p == ".." for p in parts):
        raise OSError(errno.EACCES, "path escapes the source", path)
    return parts


class _DirFd:
    """One O_PATH descriptor of a source directory, shared by the metadata calls using it (``refs``:
    those calls, plus one while :class:`DirFds` keeps it; the last one gone closes it)."""

    __slots__ = ("fd", "opened_at", "refs", "ident")

    def __init__(self, fd: int, opened_at: float, refs: int) -> None:
        self.fd = fd
        self.opened_at = opened_at
        self.refs = refs
        self.ident: tuple[int, int] | None = None  # (device, inode) of a kept one, read when it is kept


class DirFds:
    """The O_PATH descriptors of directories used lately (see the module docstring): a path's
    directory is the one opened at most ``trust`` seconds ago (0: each call opens it, as without
    this), at most :data:`KEPT_DIRS` kept.

    Concurrency: ``_lock`` guards ``_kept`` and every descriptor's ``refs``; a descriptor is closed
    (outside the lock) only by whoever drops its last reference, so no call ever stats through a
    descriptor closed under it, or through its number reused."""

    def __init__(self, open_dir: Callable[[list[str]], int], clock: Callable[[], float] = time.monotonic) -> None:
        self._open_dir = open_dir  # opens a directory beneath the root (O_PATH), confined
        self._clock = clock
        self.trust = 0.0  # seconds a kept descriptor stands for its path (set by the engine; 0: none kept)
        self._lock = threading.Lock()
        self._kept: dict[str, _DirFd] = {}  # directory path ("a/b") -> its descriptor, least recently used first

    def get(self, parts: list[str]) -> _DirFd:
        """The directory ``root/parts`` (a reference the caller gives back with :meth:`put`)."""
        key = "/".join(parts)
        now = self._clock()
        trust = self.trust
        with self._lock:
            kept = self._kept.pop(key, None)
            if kept is not None:
                if now - kept.opened_at <= trust:
                    self._kept[key] = kept  # (to the end: most recently used)
                    kept.refs += 1
                    return kept
                kept.refs -= 1  # too old: not kept any more (closed now, or by its last user)
                if kept.refs:
                    kept = None
        if kept is not None:
            os.close(kept.fd)
        fresh = _DirFd(self._open_dir(parts), now, 1)
        if trust <= 0:
            return fresh
        try:
            st = os.fstat(fresh.fd)
        except BaseException:
            os.close(fresh.fd)
            raise
        fresh.ident = (st.st_dev, st.st_ino)
        closing: list[_DirFd] = []
        with self._lock:
            old = self._kept.pop(key, None)  # (kept by a concurrent call meanwhile: this one wins)
            self._kept[key] = fresh
            fresh.refs += 1
            if old is not None:
                closing.append(old)
            while len(self._kept) > KEPT_DIRS:
                closing.append(self._kept.pop(next(iter(self._kept))))
            for d in closing:
                d.refs -= 1
            closing = [d for d in closing if not d.refs]
        for d in closing:
            os.close(d.fd)
        return fresh

    def verify(self, parts: list[str], st: os.stat_result) -> None:
        """A stat of the directory ``root/parts`` found *st* now: a kept descriptor of another directory
        (removed, or replaced by a rename, since it was kept) is not kept any more, so the next call
        in it opens the one the path names now. (Within the bound it would have answered from the
        directory that was there: a file listed in the new one, ENOENT at its lookup for up to the
        bound.)"""
        key = "/".join(parts)
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or kept.ident == (st.st_dev, st.st_ino):
                return
            del self._kept[key]
            kept.refs -= 1
            if kept.refs:
                return
        os.close(kept.fd)

    def put(self, d: _DirFd) -> None:
        """Give back a reference :meth:`get` handed out."""
        with self._lock:
            d.refs -= 1
            last = not d.refs
        if last:
            os.close(d.fd)

    def close(self) -> None:
        """Drop every kept descriptor (those still in use close with their last call)."""
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
            for d in kept:
                d.refs -= 1
            kept = [d for d in kept if not d.refs]
        for d in kept:
            os.close(d.fd)


class Source:
    """The source tree, reached only through descriptors beneath its root.

    Thread-safe: holds the root descriptor (replaced only by :meth:`reattach`, under ``_root_lock``,
    with ``_generation``; a replaced one stays open until :meth:`close`, so a call still using its
    number never reaches another file), the kept directory descriptors (``dirs``, a :class:`DirFds`
    with its own lock) and the count of extra block-read descriptors open (``stream_fds``, at most
    ``stream_budget``), guarded by ``_budget_lock``. ``stats`` (where the requests are counted;
    None: not counted) is set once by the engine before any request.
    """

    def __init__(self, root: str, direct: bool = True, streams: int = 1, stream_budget: int | None = None) -> None:
        self.root = os.path.realpath(root)
        self.root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.direct = direct and hasattr(os, "O_DIRECT")
        self.streams = streams
        self.fs_type = fs_type(self.root_fd)
        self.local = self.fs_type in LOCAL_FS_TYPES
        self.mount_type = read_mount_type(self.root)  # "ext4", "nfs4", "fuse.rclone" ("" when unknown)
        self.stream_budget = stream_fd_budget(fd_limit()) if stream_budget is None else stream_budget
        self.stream_fds = 0
        self._budget_lock = threading.Lock()
        self.stats: m.Stats | None = None
        self.dirs = DirFds(self._open_dir)  # its trust is the close-to-open bound, set by the engine
        self._root_lock = threading.Lock()
        self._generation = 0  # roots attached since the first (read without the lock: one load)
        self._reattached_at = -REATTACH_PERIOD  # monotonic time of the last reopen tried (_root_lock)
        self._old_roots: list[int] = []  # replaced root descriptors, closed by close() (_root_lock)

    def count(self, kind: str) -> None:
        """One request of *kind* (``SOURCE_OPENS``, ``SOURCE_STATS``, ``SOURCE_LISTINGS``) asked of the source."""
        stats = self.stats
        if stats is not None:
            stats.add(kind)

    def take_stream(self) -> bool:
        """Reserve one extra block-read descriptor of the mount's budget; False when it is used up."""
        with self._budget_lock:
            if self.stream_fds >= self.stream_budget:
                return False
            self.stream_fds += 1
            return True

    def give_streams(self, n: int) -> None:
        """Return *n* reserved block-read descriptors (closed, or never opened)."""
        if n:
            with self._budget_lock:
                self.stream_fds -= n

    def close(self) -> None:
        self.dirs.close()
        with self._root_lock:
            old, self._old_roots = self._old_roots, []
        for fd in old:
            os.close(fd)
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    def reattach(self, generation: int) -> bool:
        """A call made on the root of *generation* got one of :data:`GONE_ERRNOS`: when the root itself
        no longer answers, open it by its path again (one caller at a time, at most once per
        :data:`REATTACH_PERIOD`) and keep that when it is a live file system of the kind the source was
        at mount (statfs type, and the mount table's type where it was known). True when the call may
        be made again: a root newer than *generation* is attached, by this call or another. The stat
        and the open run without the lock (a hung mount at the path holds up this caller only; the
        others pass their error on meanwhile)."""
        with self._root_lock:
            if self._generation != generation:
                return True
            now = time.monotonic()
            if now - self._reattached_at < REATTACH_PERIOD:
                return False
            self._reattached_at = now
        if self._root_answers():
            with self._root_lock:
                self._reattached_at = -REATTACH_PERIOD  # (the error was the call's own, not the root's)
            return False
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return False  # (still the dead mount: its calls keep failing until it is taken down)
        same = fs_type(fd) == self.fs_type
        if same and self.mount_type:
            same = read_mount_type(self.root) == self.mount_type
        if not same:  # (the directory under a mount taken down, not mounted again yet)
            os.close(fd)
            return False
        with self._root_lock:
            if self._generation != generation:  # (another caller attached one meanwhile, a period later)
                os.close(fd)
                return True
            self._old_roots.append(self.root_fd)
            self.root_fd = fd
            self._generation += 1
        self.dirs.close()  # (descriptors of the dead mount's directories)
        self.count(m.SOURCE_REATTACHED)
        log.warning("source %s: its mount's connection was gone; opened it again by its path", self.root)
        return True

    def _on_root(self, call: Callable[..., _T], *args: Any) -> _T:
        """*call*(*args*), made once more on a root opened again when it failed with one of
        :data:`GONE_ERRNOS` and :meth:`reattach` says so."""
        generation = self._generation
        try:
            return call(*args)
        except OSError as e:
            if e.errno not in GONE_ERRNOS or not self.reattach(generation):
                raise
        return call(*args)

    def _root_answers(self) -> bool:
        """True when the root descriptor still answers a stat (its connection is not gone)."""
        try:
            os.fstat(self.root_fd)
        except OSError:
            return False
        return True

    # -- resolution -------------------------------------------------------------------------
    def open_rel(self, parts: list[str], flags: int) -> int:
        """Open ``root/parts`` without following any symlink; returns a descriptor."""
        return self._on_root(self._open_rel, parts, flags)

    def _open_rel(self, parts: list[str], flags: int) -> int:
        global _openat2_works
        rel = "/".join(parts) or "."
        if _openat2_works is not False and _SYS_OPENAT2 is not None:
            try:
                fd = _openat2(self.root_fd, rel, flags)
                _openat2_works = True
                return fd
            except OSError as e:
                if e.errno not in (errno.ENOSYS, errno.EPERM) or _openat2_works:
                    if e.errno == errno.EXDEV:  # escaped the root: treat as absent
                        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), rel) from None
                    if e.errno == errno.ELOOP:  # a symlink on the way
                        raise OSError(errno.ENOENT if parts[:-1] else errno.ELOOP, os.strerror(e.errno), rel) from None
                    raise
                _openat2_works = False
        return self._open_walk(parts, flags)

    def _open_walk(self, parts: list[str], flags: int) -> int:
        fd = os.dup(self.root_fd)
        try:
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                f = (flags if last else os.O_RDONLY | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC
                nfd = os.open(part, f, dir_fd=fd)
                os.close(fd)
                fd = nfd
            if not parts:
                nfd = os.open(".", flags | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _open_dir(self, parts: list[str]) -> int:
        return self.open_rel(parts, os.O_RDONLY | os.O_DIRECTORY | os.O_PATH)

    def _parent(self, path: str) -> tuple[int, str]:
        parts = split(path)
        if not parts:
            return os.dup(self.root_fd), "."
        return self._open_dir(parts[:-1]), parts[-1]

    # -- metadata ---------------------------------------------------------------------------
    def lstat(self, path: str) -> os.stat_result:
        return self._on_root(self._lstat, path)

    def _lstat(self, path: str) -> os.stat_result:
        parts = split(path)
        stats = self.stats
        if stats is not None:  # (count() inlined: every open and lookup comes here)
            stats.add(m.SOURCE_STATS)
        if len(parts) < 2:  # the root, or a name in it: relative to the root's own descriptor
            st = os.stat(parts[0], dir_fd=self.root_fd, follow_symlinks=False) if parts else os.stat(self.root_fd)
        else:
            d = self.dirs.get(parts[:-1])
            try:
                st = os.stat(parts[-1], dir_fd=d.fd, follow_symlinks=False)
            finally:
                self.dirs.put(d)
        if parts and stat.S_ISDIR(st.st_mode):  # (every listing's check comes here: see DirFds.verify)
            self.dirs.verify(parts, st)
        return st

    def fstat(self, fd: int) -> os.stat_result:
        """The attributes of an open source file now (one request to the source, counted)."""
        self.count(m.SOURCE_STATS)
        return os.fstat(fd)

    def listdir(self, path: str) -> list[str]:
        self.count(m.SOURCE_LISTINGS)
        fd = self.open_rel(split(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def scandir(self, path: str) -> list[tuple[str, int, int]]:
        """(name, file type bits of st_mode (0 when the source does not tell), inode number) of one
        directory's entries, from one getdents pass (no stat per entry)."""
        self.count(m.SOURCE_LISTINGS)
        fd = self.open_rel(split(path), os.O_RDONLY | os.O_DIRECTORY)
        try:
            listed = _read_dirents(fd)
            if listed is not None:
                return listed
            out = []
            with os.scandir(fd) as it:
                for entry in it:
                    out.append((entry.name, _entry_type(entry), entry.inode()))
            return out
        finally:
            os.close(fd)

    def readlink(self, path: str) -> str:
        fd, name = self._parent(path)
        try:
            return os.readlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    def statvfs(self) -> os.statvfs_result:
        return self._on_root(lambda: os.statvfs(self.root_fd))

    def access(self, path: str, mode: int) -> None:
        self.lstat(path)  # ENOENT for a missing path rather than EACCES
        fd, name = self._parent(path)
        try:
            if not os.access(name, mode, dir_fd=fd, follow_symlinks=False, effective_ids=False):
                raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        finally:
            os.close(fd)

    def _xattr_fd(self, path: str) -> int:
        self.count(m.SOURCE_OPENS)
        return self.open_rel(split(path), os.O_RDONLY | os.O_NONBLOCK)

    def getxattr(self, path: str, name: str) -> bytes:
        st = self.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            raise OSError(errno.ENODATA, os.strerror(errno.ENODATA), path)
        fd = self._xattr_fd(path)
        try:
            return os.getxattr(fd, name)
        finally:
            os.close(fd)

    def listxattr(self, path: str) -> list[str]:
        st = self.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return []
        fd = self._xattr_fd(path)
        try:
            return os.listxattr(fd)
        finally:
            os.close(fd)

    # -- data -------------------------------------------------------------------------------
    def open_file(self, path: str) -> SourceFile:
        """Open a regular file for reading (ELOOP/ENOENT for symlinks, EISDIR etc. passed on). An open
        the source answers with EBADFD (its descriptor in a bad state, never a property of the path) is
        made again once: GlusterFS's client (10.3, open-behind on, 2 ms delay) failed the open of one
        small file of 10,000 so in 2 of about 50 passes of 16 threads reading through fastfs, whose
        scan opened the same files beside them. A second EBADFD is passed on."""
        parts = split(path)
        try:
            return self._open_file(parts, path)
        except OSError as e:
            if e.errno != errno.EBADFD:
                raise
        self.count(m.SOURCE_OPEN_RETRIES)
        log.info("source open of %s answered EBADFD: opening it again", path)
        return self._open_file(parts, path)

    def _open_file(self, parts: list[str], path: str) -> SourceFile:
        self.count(m.SOURCE_OPENS)
        fd = self.open_rel(parts, os.O_RDONLY | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL, "not a regular file", path)
            os.set_blocking(fd, True)
            return SourceFile(fd, st, self, parts, self.streams)
        except BaseException:
            os.close(fd)
            raise


class _Dirent64(ctypes.Structure):
    """glibc's ``struct dirent`` on 64-bit Linux (what readdir(3) returns)."""

    _fields_ = [
        ("d_ino", ctypes.c_uint64),
        ("d_off", ctypes.c_int64),
        ("d_reclen", ctypes.c_ushort),
        ("d_type", ctypes.c_ubyte),
        ("d_name", ctypes.c_char * 256),
    ]


# d_type of readdir(3) -> file type bits (DT_UNKNOWN and the rest: 0, the kernel asks with a lookup).
_DT_MODE = {4: stat.S_IFDIR, 8: stat.S_IFREG, 10: stat.S_IFLNK}
_libc.fdopendir.argtypes = [ctypes.c_int]
_libc.fdopendir.restype = ctypes.c_void_p
_libc.readdir.argtypes = [ctypes.c_void_p]
_libc.readdir.restype = ctypes.POINTER(_Dirent64)
_libc.closedir.argtypes = [ctypes.c_void_p]
_DOTS = (b".", b"..")


def _read_dirents(fd: int) -> list[tuple[str, int, int]] | None:
    """(name, type bits, inode) of the entries of directory *fd* from readdir(3) alone: the d_type the
    source gave, 0 where it gave DT_UNKNOWN (``os.scandir``'s ``is_dir()`` would stat each such entry at
    the source: a round trip per file on FUSE sources, which list without types). None where this
    libc is not known to match (the caller falls back to ``os.scandir``)."""
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "aarch64"):
        return None
    dup = os.dup(fd)
    handle = _libc.fdopendir(dup)
    if not handle:
        os.close(dup)
        return None
    out: list[tuple[str, int, int]] = []
    try:
        while True:
            ctypes.set_errno(0)
            entry = _libc.readdir(handle)
            if not entry:
                err = ctypes.get_errno()
                if err:
                    raise OSError(err, os.strerror(err))
                return out
            d = entry.contents
            name = d.d_name
            if name in _DOTS:
                continue
            out.append((os.fsdecode(name), _DT_MODE.get(d.d_type, 0), d.d_ino))
    finally:
        _libc.closedir(handle)  # (closes the duplicate)


def _entry_type(entry: os.DirEntry[str]) -> int:
    try:
        if entry.is_symlink():
            return stat.S_IFLNK
        if entry.is_dir(follow_symlinks=False):
            return stat.S_IFDIR
        if entry.is_file(follow_symlinks=False):
            return stat.S_IFREG
    except OSError:
        return 0
    return 0  # fifo, socket, device, or unknown: the kernel asks with a lookup


# statfs(2) f_type of filesystems on local block devices or in RAM: the FUSE passthrough route's
# "auto" takes these (reading them directly is as fast as fastfs could be, and costs no request).
LOCAL_FS_TYPES = frozenset(
    {
        0xEF53,  # ext2/3/4
        0x58465342,  # xfs
        0x9123683E,  # btrfs
        0x01021994,  # tmpfs
        0xF2F52010,  # f2fs
        0x2FC12FC1,  # zfs
        0xCA451A4E,  # bcachefs
        0x794C7630,  # overlayfs (containers over a local disk)
        0x4D44,  # vfat
        0x5346544E,  # ntfs
        0x7366746E,  # ntfs3
        0x2011BAB0,  # exfat
        0x858458F6,  # ramfs
        0x73717368,  # squashfs
        0x3153464A,  # jfs
        0x52654973,  # reiserfs
    }
)
_STATFS_SIZE = 120  # struct statfs on 64-bit Linux; f_type is its first word
_libc.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
_libc.fstatfs.restype = ctypes.c_int


def fs_type(fd: int) -> int:
    """statfs(2) ``f_type`` of the filesystem holding *fd* (0 when unknown)."""
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    if _libc.fstatfs(fd, buf) != 0:
        return 0
    f_type: int = struct.unpack_from("q", buf.raw)[0]
    return f_type & 0xFFFFFFFF


MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    """The mount table escapes space, tab, newline and backslash as octal ``\\NNN``."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and all(c in "01234567" for c in code):
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_type_of(path: str, mountinfo: str) -> str:
    """The fstype (``ext4``, ``fuse.rclone``) of the mount holding the absolute, resolved *path*, from
    the text of a mountinfo table: the longest mount point that is *path* or one of its parents (of
    several on the same point, the last: it covers the earlier ones). "" when no line matches."""
    best, best_len = "", -1
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = _unescape(fields[4])
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best_len:
            best, best_len = _unescape(tail[0]), len(point)
    return best


def read_mount_type(path: str, mountinfo: str | None = None) -> str:
    """The fstype of the mount holding *path* from this process's mount table (*mountinfo*: another
    table's file; "" when unreadable)."""
    try:
        with open(mountinfo or MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError:
        return ""
    return mount_type_of(os.path.realpath(path), text)


def _probe_open(source: Source, parts: list[str], direct: bool) -> int:
    """A fresh handle for the jump probe: O_DIRECT (the source's page cache and read-ahead would
    answer the continuing reads), else buffered with read-ahead off for it (``POSIX_FADV_RANDOM``)."""
    source.count(m.SOURCE_OPENS)
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return source.open_rel(parts, os.O_RDONLY | os.O_DIRECT)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    fd = source.open_rel(parts, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


def jump_probe(source: Source, path: str, size: int, read: int = shape.PROBE_READ) -> tuple[float, float]:
    """Seconds of the cheapest read continuing the handle's last one and of the cheapest jump, on one
    fresh handle of *path* (*size* bytes), with the reads of :func:`fastfs.fsio.shape.probe_reads`
    (the confirming second jump only when the first looked like a restart). Raises OSError when the
    file cannot be probed (too small, vanished, a read failed or came short)."""
    reads = shape.probe_reads(size, read)
    if not reads:
        raise OSError(errno.EINVAL, "file too small for the jump probe", path)
    parts = split(path)
    buf = mmap.mmap(-1, read)  # page-aligned, for O_DIRECT
    view = memoryview(buf)
    direct = True
    try:
        while True:
            fd = _probe_open(source, parts, direct)
            try:
                took: dict[str, list[float]] = {shape.CONTINUE: [], shape.JUMP: []}
                for kind, offset in reads:
                    jumps, continues = took[shape.JUMP], took[shape.CONTINUE]
                    if kind == shape.JUMP and jumps and not shape.jumps_restart(min(continues), min(jumps)):
                        break  # the first jump cost what a continuing read does: no restart to confirm
                    t0 = time.perf_counter()
                    n = os.preadv(fd, [view], offset)
                    seconds = time.perf_counter() - t0
                    if n != read:
                        raise OSError(errno.EIO, f"probe read at {offset} returned {n} of {read} bytes", path)
                    if kind in took:
                        took[kind].append(seconds)
                return min(took[shape.CONTINUE]), min(took[shape.JUMP])
            except OSError as e:
                if not direct or e.errno != errno.EINVAL:
                    raise
                direct = False  # the handle opened O_DIRECT but its reads refuse it: buffered then
            finally:
                os.close(fd)
    finally:
        view.release()
        buf.close()


class FileKey(NamedTuple):
    """Identity of one version of a source file (the RAM cache's file key): a changed source file has
    another size, mtime or ctime, so it never matches a cached key. Equal to the plain 5-tuple."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int


class HeadKey(NamedTuple):
    """Cache file key of a version's head windows (small page windows a format plan fetched at open,
    indexed by window number): another key kind than the version's own blocks (``FileKey``)."""

    file: FileKey


def stat_key(st: os.stat_result) -> FileKey:
    """Identity of one version of a file: a changed source never matches a cached key."""
    return FileKey(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_SYS_CACHESTAT = {"x86_64": 451, "aarch64": 451}.get(os.uname().machine)
# A file with at least this share of its pages in the source's page cache is read buffered:
# O_DIRECT would go to the device for data RAM already holds.
CACHED_SHARE = 0.5
# Files smaller than this are never read with O_DIRECT (a second open costs more than it saves).
DIRECT_MIN_SIZE = 1024 * 1024
# Largest single read on the one stream of the sequential shape: a block is read as consecutive reads
# of at most this (the largest FUSE request, 256 pages), because a larger O_DIRECT read reaches a
# FUSE source as several requests sent at once, which its threads take in any order: out of order
# for a client that serves the handle as one ranged download.
STREAM_READ_MAX = 1024 * 1024
_direct_lock = threading.Lock()


def cached_share(fd: int, size: int) -> float | None:
    """Share of the file's pages in the page cache via cachestat(2) (Linux 6.5+); None if unknown."""
    if _SYS_CACHESTAT is None or size <= 0:
        return None
    rng = ctypes.create_string_buffer(struct.pack("QQ", 0, 0))
    out = ctypes.create_string_buffer(40)
    rc = _syscall(ctypes.c_long(_SYS_CACHESTAT), ctypes.c_uint(fd), rng, out, ctypes.c_uint(0))
    if rc != 0:
        return None
    nr_cache: int = struct.unpack_from("Q", out.raw)[0]
    return min(1.0, nr_cache * 4096 / size)


class SourceFile:
    """An open source file: the descriptor it was opened with, plus block-read streams.

    Block reads (whole, aligned cache blocks) rotate over up to ``max_streams`` descriptors opened
    on first need, with ``O_DIRECT`` when the source supports it and does not already hold the file
    in its page cache: network filesystems and object-store mounts serve each open handle as its
    own stream, so parallel block reads on several handles are not limited to one stream's
    bandwidth. Other reads use the first descriptor, buffered.

    Reference counted through its :class:`SourceRef` (shared between the handles of the same version
    and the reads in flight); closed when the last user puts it back. ``refs`` is guarded by that
    ref's lock; ``_streams`` and ``_direct`` are changed under ``_direct_lock``.
    """

    __slots__ = ("fd", "st", "key", "size", "refs", "_source", "_parts", "_streams", "_direct", "_max", "_rr")

    def __init__(
        self, fd: int, st: os.stat_result, source: Source | None, parts: list[str], max_streams: int = 1
    ) -> None:
        self.fd = fd
        self.st = st
        self.key = stat_key(st)
        self.size = st.st_size
        self.refs = 1
        self._source = source
        self._parts = parts
        self._streams: list[int] = []
        eligible = source is not None and st.st_size >= DIRECT_MIN_SIZE
        self._direct: bool | None = None if eligible and source is not None and source.direct else False
        self._max = max_streams if eligible else 0
        self._rr = 0

    def _stream_fd(self, single: bool = False) -> tuple[int, bool]:
        """A block-read descriptor and whether it is O_DIRECT (opens another stream while below the cap).

        *single* (the sequential shape): always the first stream, and only an O_DIRECT one; the
        file's own descriptor when the source does not take O_DIRECT or holds the file in its cache."""
        if self._max == 0:
            return self.fd, False
        if self._direct is None:
            share = cached_share(self.fd, self.size)
            with _direct_lock:
                if self._direct is None:
                    self._direct = share is None or share < CACHED_SHARE
        if single:
            if not self._direct:
                return self.fd, False
            streams = self._streams
            if streams:
                return streams[0], True
        source = self._source
        assert source is not None  # _max > 0 only with a source
        # the racy first test keeps the budget lock off the read path once the budget is used up
        if len(self._streams) < self._max and source.stream_fds < source.stream_budget and source.take_stream():
            kept = False
            direct = self._direct
            flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
            try:
                source.count(m.SOURCE_OPENS)
                fd = source.open_rel(self._parts, flags)
                if source.fstat(fd).st_ino != self.st.st_ino:
                    os.close(fd)
                    fd = -1
            except OSError:
                fd = -1
            with _direct_lock:
                if fd >= 0 and self.fd >= 0 and len(self._streams) < self._max and direct == self._direct:
                    self._streams.append(fd)
                    fd = -1
                    kept = True
                elif fd < 0:
                    if direct and not self._streams:
                        self._direct = False  # O_DIRECT unsupported here (tmpfs): buffered streams
                    else:
                        self._max = len(self._streams)  # cannot open more: keep what we have
            if fd >= 0:
                os.close(fd)
            if not kept:
                source.give_streams(1)
        streams = self._streams
        if not streams:
            return self.fd, False
        if single:
            return (streams[0], True) if self._direct else (self.fd, False)
        self._rr += 1
        return streams[self._rr % len(streams)], bool(self._direct)

    def read_into(self, offset: int, view: memoryview, aligned: bool = False, single: bool = False) -> int:
        """Fill *view* from *offset* (loops over short reads, EINTR retried by Python); returns bytes read.

        *aligned* marks a block read (buffer address and length multiples of DIRECT_ALIGN): it goes
        to one of the block-read streams (*single*: the first one, see :meth:`_stream_fd`, in
        consecutive reads of at most :data:`STREAM_READ_MAX`); an O_DIRECT failure (EINVAL)
        finishes buffered.
        """
        total = 0
        want = len(view)
        fd, direct = self.fd, False
        if aligned and offset % DIRECT_ALIGN == 0 and want % DIRECT_ALIGN == 0:
            fd, direct = self._stream_fd(single)
        if direct:
            piece = STREAM_READ_MAX if single else want
            try:
                while total < want:
                    n = os.preadv(fd, [view[total : total + piece]], offset + total)
                    if n <= 0:
                        return total
                    total += n
                    if total % DIRECT_ALIGN:
                        if offset + total >= self.size:
                            return total  # the end of the file as opened: nothing more to read
                        break  # short read before it (EOF moved, or the source's own limit): finish buffered
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                total = 0
            fd = self.fd
        while total < want:
            n = os.preadv(fd, [view[total:]], offset + total)
            if n <= 0:
                break
            total += n
        return total

    def cached_share(self) -> float | None:
        """Share of the file the source holds in its page cache (:func:`cached_share`; None: unknown)."""
        return cached_share(self.fd, self.size)

    def forget_pages(self) -> None:
        """Ask the source to drop the file from its page cache (``POSIX_FADV_DONTNEED``: clean pages
        not in use): a warm's evict, or what a read of fastfs's own brought in, its read-ahead included,
        which the reader must not find there (:meth:`fastfs.fsio.probe.FormatProbe.loader_maps`)."""
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        with _direct_lock:
            fds = [self.fd, *self._streams]
            self.fd = -1
            self._streams = []
            self._max = 0
        for fd in fds:
            if fd >= 0:
                os.close(fd)
        if self._source is not None:
            self._source.give_streams(len(fds) - 1)


class SourceRef:
    """The source file of one open file version, shared by its handles and the reads in flight.

    The handles of the version hold the file together, as one reference, from the first handle to
    the last (:meth:`hold`, :meth:`drop`: the handle table calls them, under its own lock, as it counts
    handles). Every block fill, exact read and format probe takes a reference of its own with
    :meth:`get` for as long as its preads run and gives it back with :meth:`put`, so the release of the
    last handle never closes a descriptor under a read: the last :meth:`put` closes it. When the open
    was answered from a scan's metadata the version has no file yet: :meth:`get` opens it then and
    checks it is still the version (ESTALE otherwise); the handles keep it from then on.

    Concurrency: ``_lock`` guards ``file``, ``held`` and the ``refs`` of the files it hands out; it is
    taken after the handle table's lock (never the other way round) and never held across an open or
    a close. ``file`` is also read without it, as a hint (reports, the route of a passthrough open,
    whose handle keeps the file held).
    """

    __slots__ = ("_source", "path", "key", "file", "held", "_lock")

    def __init__(self, source: Source, path: str, key: FileKey) -> None:
        self._source = source  # reopens the file when the open was answered from metadata
        self.path = path
        self.key = key
        self.file: SourceFile | None = None  # the file the handles hold (one reference for all of them)
        self.held = False  # the version has handles
        self._lock = threading.Lock()

    def hold(self, file: SourceFile | None) -> SourceFile | None:
        """A handle was counted on the version: the handles hold its file from now on, *file* (just
        opened, with its one reference) becoming it unless they have one. Returns the file not kept,
        for the caller to :meth:`put` back outside the table's lock, or None."""
        with self._lock:
            self.held = True
            if self.file is None and file is not None:
                self.file, file = file, None
        return file

    def drop(self) -> SourceFile | None:
        """The last handle was released: the handles' reference, for the caller to :meth:`put` back
        (outside the table's lock), or None when they held no file."""
        with self._lock:
            self.held = False
            file, self.file = self.file, None
        return file

    def get(self) -> SourceFile:
        """The version's source file with a reference taken for the caller (opened now if the open was
        answered from metadata); :meth:`put` it back."""
        with self._lock:
            file = self.file
            if file is not None:
                file.refs += 1
                return file
        fresh = self.fresh()
        with self._lock:
            file = self.file
            if file is None:
                if not self.held:
                    return fresh  # the last handle went meanwhile: the caller's reference is the only one
                self.file = fresh  # the handles keep it; the caller's reference is the second
                fresh.refs += 1
                return fresh
            file.refs += 1
        fresh.close()  # another read opened it first
        return file

    def fresh(self) -> SourceFile:
        """A new source file of the version, the caller's alone to :meth:`SourceFile.close` (not shared
        with the handles): for a read whose handle must end with it, such as the first page read to
        choose an open's route (on a client that serves a handle as one ranged download, the handles'
        own file, kept open, would have the client read ahead on it for nothing). ESTALE when the
        source is no longer the version."""
        fresh = self._source.open_file(self.path)
        if fresh.key != self.key:
            fresh.close()
            raise OSError(errno.ESTALE, "source file changed since it was opened", self.path)
        return fresh

    def put(self, file: SourceFile) -> None:
        """Give back a reference :meth:`get`, :meth:`hold` or :meth:`drop` handed out (the last one closes)."""
        with self._lock:
            file.refs -= 1
            last = file.refs == 0
        if last:
            file.close()
