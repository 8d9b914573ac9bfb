"""FUSE operations: a thin adapter from libfuse callbacks to :class:`fastfs.fsio.engine.Engine`.

Design: every decision about caching and prefetch lives in the engine; this module only translates
arguments and errors. Paths are FUSE paths (``/`` or ``/dir/name``); times are nanoseconds
(``use_ns``). Errors: an ``OSError`` from the engine becomes ``-errno``; anything else becomes EIO
with one rate-limited log line (there is no per-request logging).

The mount is read-only: every write-type operation answers EROFS.

A hidden virtual directory ``/.fastfs`` holds ``stats``: a JSON snapshot of the engine's counters
plus the mount's identity. It is not listed by ``readdir("/")`` (a source entry of that name is
hidden too), its reads never reach the engine (so they are not counted as data reads), and each
open serves one consistent snapshot from memory with ``direct_io`` (the size reported by
``getattr`` is only an estimate of the next snapshot). Control requests (the stats file, the
``user.fastfs.*`` extended attributes of :mod:`fastfs.daemon.control`) are answered by a
:class:`~fastfs.daemon.controller.Controller`; the only thing this adapter adds is the caller of
the request (uid, gid, pid from the FUSE context, supplementary groups by
:mod:`fastfs.daemon.caller`), which decides what the answer may contain.

:class:`FastFUSE` replaces the binding's ``read`` so the engine fills libfuse's reply buffer in
place (no intermediate ``bytes``), and ``fgetattr`` so ``struct stat`` is filled field by field.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from fastfs.daemon import fusebind
from fastfs.daemon.caller import caller_of
from fastfs.daemon.control import CONTROL_NAME, STATS_DIR, STATS_FILE, STATS_NAME
from fastfs.daemon.control import is_control_path as _is_virtual
from fastfs.daemon.controller import Controller, is_control_xattr
from fastfs.daemon.fusebind import FUSE, FuseOSError, Operations
from fastfs.fsio.access import ROOT, Caller

log = logging.getLogger("fastfs.ops")

__all__ = ["STATS_DIR", "STATS_FILE", "VIRTUAL_FH_BASE", "FastFUSE", "FastOps"]

ENOATTR = getattr(errno, "ENOATTR", errno.ENODATA)
# Handles of open stats snapshots start here, far above any handle the engine hands out.
VIRTUAL_FH_BASE = 1 << 62
# At most one log line per operation name in this many seconds for unexpected errors.
ERROR_LOG_INTERVAL = 10.0
# Largest read the allocating helper :meth:`FastOps.read` serves (kernel requests use read_into).
MAX_READ_SIZE = 64 * 1024 * 1024

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


class _RateLimitedLog:
    """One log line per key per interval, counting what it suppressed."""

    def __init__(self, interval: float = ERROR_LOG_INTERVAL) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, key: str, exc: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -self.interval) < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        more = f" ({suppressed} similar suppressed)" if suppressed else ""
        log.error("%s failed with %s: %s; answered EIO%s", key, type(exc).__name__, exc, more)


def _errno_of(exc: OSError) -> int:
    code = exc.errno
    return code if isinstance(code, int) and code > 0 else errno.EIO


def _translate(func: Callable[..., Any]) -> Callable[..., Any]:
    """OSError -> FuseOSError(errno); any other exception -> EIO with a rate-limited log line."""
    name = func.__name__

    @functools.wraps(func)
    def wrapper(self: FastOps, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(self, *args, **kwargs)
        except FuseOSError:
            raise
        except OSError as e:
            raise FuseOSError(_errno_of(e)) from None
        except Exception as e:
            self._errors.log(name, e)
            raise FuseOSError(errno.EIO) from None

    return wrapper


def _readonly(func: Callable[..., Any]) -> Callable[..., Any]:
    """A write-type operation: always EROFS."""

    @functools.wraps(func)
    def wrapper(self: FastOps, *args: Any, **kwargs: Any) -> Any:
        raise FuseOSError(errno.EROFS)

    return wrapper


def attrs_of(st: os.stat_result) -> dict[str, int]:
    """``os.stat_result`` -> the ``st_*`` dict the binding expects (times in nanoseconds)."""
    return {
        "st_mode": st.st_mode,
        "st_ino": st.st_ino,
        "st_nlink": st.st_nlink,
        "st_uid": st.st_uid,
        "st_gid": st.st_gid,
        "st_size": st.st_size,
        "st_rdev": st.st_rdev,
        "st_blocks": st.st_blocks,
        "st_blksize": st.st_blksize,
        "st_atime": st.st_atime_ns,
        "st_mtime": st.st_mtime_ns,
        "st_ctime": st.st_ctime_ns,
    }


def _copy_out(data: bytes, offset: int, dest: memoryview) -> int:
    if offset < 0:
        raise FuseOSError(errno.EINVAL)
    if offset >= len(data):
        return 0
    n = min(len(dest), len(data) - offset)
    dest[:n] = data[offset : offset + n]
    return n


class FastOps(Operations):
    """libfuse callbacks over one :class:`~fastfs.fsio.engine.Engine`.

    ``mount_info`` (source, mountpoint) is added to stats snapshots. ``invalidate`` (set by the
    daemon) asks the kernel to drop its cache of a path; it is used for the stats file in
    ``fuse.no_open`` mode, where the kernel keeps the file's pages between opens.
    """

    use_ns = True

    def __init__(self, engine: Any, mount_info: dict[str, Any] | None = None, no_open: bool | None = None) -> None:
        self.engine = engine
        self.mount_info = dict(mount_info or {})
        self.no_open = bool(engine.config.fuse.no_open if no_open is None else no_open)
        self.fuse_handle: int | None = None
        self.on_init: Callable[[int | None], None] | None = None
        self.invalidate: Callable[[str], None] | None = None
        self._errors = _RateLimitedLog()
        self._lock = threading.Lock()
        self._virtual: dict[int, bytes] = {}
        self._next_vfh = VIRTUAL_FH_BASE
        self._nofh_stats: dict[bool, bytes] = {}  # no_open mode: the stats file as sized by getattr,
        # per view (complete or redacted)
        self._started_ns = int(time.time() * 1e9)
        self.control = Controller(engine, self.mount_info)
        self.context: Callable[[], tuple[int, int, int]] = fusebind.fuse_get_context

    # -- lifecycle ------------------------------------------------------------------------------
    def init_with_config(self, conn_info: Any, config_3: Any) -> None:
        self.fuse_handle = fusebind.current_fuse()
        if self.on_init is not None:
            self.on_init(self.fuse_handle)

    # -- caller and stats snapshot ---------------------------------------------------------------
    def request_caller(self) -> tuple[Caller, int]:
        """The caller of the current request and its pid; outside a request (a direct call from the
        daemon itself) root."""
        try:
            uid, gid, pid = self.context()
        except ValueError:  # no FUSE context: not a kernel request
            return ROOT, 0
        return caller_of(uid, gid, pid), pid

    def snapshot(self) -> dict[str, Any]:
        """Complete engine snapshot plus the mount's identity (metrics, status lines)."""
        return self.control.snapshot()

    def _stats_bytes(self, caller: Caller | None = None) -> bytes:
        return self.control.stats_file(caller)

    def _open_virtual(self, data: bytes) -> int:
        with self._lock:
            fh = self._next_vfh
            self._next_vfh += 1
            self._virtual[fh] = data
        return fh

    def _virtual_attrs(self, path: str) -> dict[str, int]:
        base = {
            "st_uid": os.getuid(),
            "st_gid": os.getgid(),
            "st_atime": self._started_ns,
            "st_mtime": self._started_ns,
            "st_ctime": self._started_ns,
        }
        if path == STATS_DIR:
            return {**base, "st_mode": stat.S_IFDIR | 0o555, "st_nlink": 2, "st_size": 0}
        if path == STATS_FILE:
            caller = self.request_caller()[0]
            data = self._stats_bytes(caller)
            if self.no_open:
                self._nofh_stats[self.control.sees_all(caller)] = data
            now = time.time_ns()
            return {
                **base,
                "st_mode": stat.S_IFREG | 0o444,
                "st_nlink": 1,
                "st_size": len(data),
                "st_mtime": now,
                "st_ctime": now,
            }
        raise FuseOSError(errno.ENOENT)

    # -- metadata -------------------------------------------------------------------------------
    @_translate
    def getattr(self, path: str, fh: Any = None) -> dict[str, int]:
        if _is_virtual(path):
            return self._virtual_attrs(path)
        return attrs_of(self.engine.lstat(path))

    @_translate
    def readdir(self, path: str, fh: Any = None) -> list[str]:
        if path == STATS_DIR:
            return [".", "..", STATS_NAME]
        if _is_virtual(path):
            raise FuseOSError(errno.ENOTDIR)
        names = self.engine.listdir(path)
        if path == "/" and CONTROL_NAME in names:  # reserved: the control directory stands there
            names = [n for n in names if n != CONTROL_NAME]
        return [".", "..", *names]

    @_translate
    def readlink(self, path: str) -> str:
        if _is_virtual(path):
            raise FuseOSError(errno.EINVAL)
        return self.engine.readlink(path)

    @_translate
    def statfs(self, path: str) -> dict[str, int]:
        sv = self.engine.statvfs()
        return {
            "f_bsize": sv.f_bsize,
            "f_frsize": sv.f_frsize,
            "f_blocks": sv.f_blocks,
            "f_bfree": sv.f_bfree,
            "f_bavail": sv.f_bavail,
            "f_files": sv.f_files,
            "f_ffree": sv.f_ffree,
            "f_favail": sv.f_favail,
            "f_flag": sv.f_flag | os.ST_RDONLY,
            "f_namemax": sv.f_namemax,
        }

    @_translate
    def access(self, path: str, amode: int) -> int:
        if amode & os.W_OK:
            raise FuseOSError(errno.EROFS)
        if _is_virtual(path):
            if path not in (STATS_DIR, STATS_FILE):
                raise FuseOSError(errno.ENOENT)
            if path == STATS_FILE and amode & os.X_OK:
                raise FuseOSError(errno.EACCES)
            return 0
        self.engine.access(path, amode)
        return 0

    @_translate
    def getxattr(self, path: str, name: str, position: int = 0, size: int | None = None) -> bytes:
        """``size`` (when known) is the caller's buffer; 0 or too small means it will ask again."""
        if is_control_xattr(name):
            caller, pid = self.request_caller()
            return self.control.getxattr(path, name, size, caller, pid)
        if _is_virtual(path):
            raise FuseOSError(ENOATTR)
        try:
            return self.engine.getxattr(path, name)
        except OSError as e:
            if e.errno in (errno.ENODATA, ENOATTR):
                raise FuseOSError(ENOATTR) from None
            raise

    @_translate
    def listxattr(self, path: str) -> list[str]:
        if _is_virtual(path):
            return []
        return list(self.engine.listxattr(path))

    # -- data -----------------------------------------------------------------------------------
    @_translate
    def open(self, path: str, fi: Any) -> int:
        """With ``raw_fi`` *fi* is the ``fuse_file_info`` (fh and keep_cache are set on it); given a
        plain int of flags, the handle is returned instead."""
        flags = fi if isinstance(fi, int) else fi.flags
        if flags & WRITE_FLAGS:
            raise FuseOSError(errno.EROFS)
        if _is_virtual(path):
            if path == STATS_DIR:
                raise FuseOSError(errno.EISDIR)
            if path != STATS_FILE:
                raise FuseOSError(errno.ENOENT)
            fh = self._open_virtual(self._stats_bytes(self.request_caller()[0]))
            keep_cache, direct_io = False, True
        elif self.no_open:
            raise FuseOSError(errno.ENOSYS)
        else:
            result = self.engine.open(path, flags)
            fh, keep_cache, direct_io = result.fh, result.keep_cache, result.direct_io
        if isinstance(fi, int):
            return fh
        fi.fh = fh
        fi.keep_cache = 1 if keep_cache else 0
        fi.direct_io = 1 if direct_io else 0
        return 0

    @_translate
    def read_into(self, path: str | None, fh: int, offset: int, dest: memoryview) -> int:
        """Fill *dest* from *fh* at *offset*; returns the byte count (short only at EOF)."""
        if fh >= VIRTUAL_FH_BASE:
            data = self._virtual.get(fh)
            if data is None:
                raise FuseOSError(errno.EBADF)
            return _copy_out(data, offset, dest)
        if fh == 0:
            if path is None:
                raise FuseOSError(errno.EBADF)
            if _is_virtual(path):
                return self._read_nofh_stats(path, offset, dest)
            return self.engine.read_into(0, offset, dest, path)
        return self.engine.read_into(fh, offset, dest)

    def _read_nofh_stats(self, path: str, offset: int, dest: memoryview) -> int:
        """Stats file read without open (``fuse.no_open``): serve the snapshot sized by getattr."""
        if path != STATS_FILE:
            raise FuseOSError(errno.EISDIR if path == STATS_DIR else errno.ENOENT)
        caller = self.request_caller()[0]
        full = self.control.sees_all(caller)
        data = self._nofh_stats.get(full)
        if data is None:
            data = self._nofh_stats[full] = self._stats_bytes(caller)
        n = _copy_out(data, offset, dest)
        if offset + n >= len(data):
            self._nofh_stats.pop(full, None)
            if self.invalidate is not None:
                self.invalidate(STATS_FILE)
        return n

    def read(self, path: str | None, size: int, offset: int, fh: Any) -> bytes:
        """Allocating read (the mount uses :meth:`read_into` through :class:`FastFUSE`)."""
        fh = getattr(fh, "fh", fh)
        if not isinstance(size, int) or size < 0 or size > MAX_READ_SIZE:
            raise FuseOSError(errno.EINVAL)
        buf = bytearray(size)
        n = self.read_into(path, fh, offset, memoryview(buf))
        return bytes(buf[:n])

    @_translate
    def release(self, path: str | None, fh: Any) -> int:
        fh = getattr(fh, "fh", fh)
        if fh >= VIRTUAL_FH_BASE:
            with self._lock:
                self._virtual.pop(fh, None)
        elif fh:
            self.engine.release(fh)
        return 0

    # -- write-type operations: the mount is read-only -------------------------------------------
    @_readonly
    def create(self, path: str, mode: int, fi: Any = None) -> int: ...

    @_readonly
    def write(self, path: str, data: bytes, offset: int, fh: Any) -> int: ...

    @_readonly
    def truncate(self, path: str, length: int, fh: Any = None) -> int: ...

    @_readonly
    def unlink(self, path: str) -> int: ...

    @_readonly
    def mkdir(self, path: str, mode: int) -> int: ...

    @_readonly
    def rmdir(self, path: str) -> int: ...

    @_readonly
    def rename(self, old: str, new: str) -> int: ...

    @_readonly
    def symlink(self, target: str, source: str) -> int: ...

    @_readonly
    def link(self, target: str, source: str) -> int: ...

    @_readonly
    def chmod(self, path: str, mode: int) -> int: ...

    @_readonly
    def chown(self, path: str, uid: int, gid: int) -> int: ...

    @_readonly
    def utimens(self, path: str, times: Any = None) -> int: ...

    @_readonly
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int: ...

    @_readonly
    def removexattr(self, path: str, name: str) -> int: ...

    @_readonly
    def mknod(self, path: str, mode: int, dev: int) -> int: ...


_TIME_FIELDS = (("st_atime", "st_atimespec"), ("st_mtime", "st_mtimespec"), ("st_ctime", "st_ctimespec"))
_PLAIN_FIELDS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_rdev", "st_blocks", "st_blksize")


_kept_thread_states: set[int] = set()
_kept_lock = threading.Lock()


def _keep_thread_state() -> None:
    """Keep this libfuse worker's Python thread state alive between callbacks.

    ctypes wraps each callback from a foreign thread in PyGILState_Ensure/Release, which creates and
    destroys a thread state every time; one extra Ensure (never released) makes the later ones reuse
    it. libfuse keeps its workers (max_idle_threads = fuse.threads), so the set stays small.
    """
    ident = threading.get_ident()
    with _kept_lock:
        if ident in _kept_thread_states:
            return
        _kept_thread_states.add(ident)
    ctypes.pythonapi.PyGILState_Ensure()


class FastFUSE(FUSE):
    """The binding's FUSE class with an in-place ``read`` and a direct ``fgetattr``.

    Construct with ``raw_fi=True``: ``open`` then receives the ``fuse_file_info`` to set ``fh`` and
    ``keep_cache`` on; ``read`` and ``release`` here pass the plain handle on.
    """

    def _wrapper(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() not in _kept_thread_states:
            _keep_thread_state()
        return super()._wrapper(func, *args, **kwargs)

    def read(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
        fh = fip.contents.fh
        if size <= 0:
            return 0
        address = ctypes.cast(buf, ctypes.c_void_p).value
        dest = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
        name = None
        if path is not None and (fh == 0 or fh >= VIRTUAL_FH_BASE):
            name = path.decode(self.encoding, self.errors)
        return self.operations.read_into(name, fh, offset, dest)

    def release(self, path: bytes | None, fip: Any) -> int:
        name = None if path is None else path.decode(self.encoding, self.errors)
        return self.operations.release(name, fip.contents.fh)

    def fgetattr(self, path: bytes | None, buf: Any, fip: Any) -> int:
        name = None if path is None else path.decode(self.encoding, self.errors)
        attrs = self.operations.getattr(name, None)
        ctypes.memset(buf, 0, ctypes.sizeof(fusebind.c_stat))
        st = buf.contents
        for key in _PLAIN_FIELDS:
            value = attrs.get(key)
            if value is not None:
                setattr(st, key, value)
        for key, spec in _TIME_FIELDS:
            value = attrs.get(key)
            if value is not None:
                ts = getattr(st, spec)
                ts.tv_sec, ts.tv_nsec = divmod(int(value), 1_000_000_000)
        return 0

    def getxattr(self, path: bytes, name: bytes, value: Any, size: int, *args: Any) -> int:
        data = self.operations.getxattr(
            path.decode(self.encoding, self.errors), name.decode(self.encoding, self.errors), 0, size if value else 0
        )
        if not value:
            return len(data)
        if len(data) > size:
            return -errno.ERANGE
        ctypes.memmove(value, data, len(data))
        return len(data)
