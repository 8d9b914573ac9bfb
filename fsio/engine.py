"""The engine: the whole read path of fastfs behind a small, FUSE-free API.

(Skeleton: pass-through reads; the cache, pool and policies are wired in below.)
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from typing import Callable

from fastfs.config.schema import Config
from fastfs.fsio import stats as S
from fastfs.fsio.source import Source, SourceFile


@dataclass(frozen=True)
class OpenResult:
    """What an open returns to the adapter."""

    fh: int
    """Handle to pass to read_into/release (never 0)."""
    keep_cache: bool
    """True when the kernel may keep its page cache of this file (source unchanged since last open)."""


class Engine:
    """FUSE-free read path of one mount.

    Public API (paths are FUSE paths: ``/`` or ``/dir/name``; errors are ``OSError`` with errno):
    ``lstat``, ``listdir``, ``readlink``, ``statvfs``, ``access``, ``getxattr``, ``listxattr``,
    ``open`` -> :class:`OpenResult`, ``read_into(fh, offset, dest, path=None)`` -> bytes filled,
    ``release``, ``snapshot``, ``warm``, ``reconfigure``, ``close``.
    """

    def __init__(self, source: str, config: Config | None = None, stats: S.Stats | None = None) -> None:
        self.config = config or Config()
        self.stats = stats or S.Stats()
        self.source = Source(source, direct=self.config.readahead.source_direct_io)
        self._lock = threading.Lock()
        self._handles: dict[int, SourceFile] = {}
        self._next_fh = 1
        self.invalidate: Callable[[str], None] | None = None

    # -- metadata -------------------------------------------------------------------------------
    def lstat(self, path: str) -> os.stat_result:
        return self.source.lstat(path)

    def listdir(self, path: str) -> list[str]:
        return self.source.listdir(path)

    def readlink(self, path: str) -> str:
        return self.source.readlink(path)

    def statvfs(self) -> os.statvfs_result:
        return self.source.statvfs()

    def access(self, path: str, mode: int) -> None:
        self.source.access(path, mode)

    def getxattr(self, path: str, name: str) -> bytes:
        return self.source.getxattr(path, name)

    def listxattr(self, path: str) -> list[str]:
        return self.source.listxattr(path)

    # -- data -----------------------------------------------------------------------------------
    def open(self, path: str, flags: int = os.O_RDONLY) -> OpenResult:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        f = self.source.open_file(path)
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._handles[fh] = f
        self.stats.add(S.OPENS)
        return OpenResult(fh, False)

    def read_into(self, fh: int, offset: int, dest: memoryview, path: str | None = None) -> int:
        f = self._handles.get(fh)
        if f is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        if offset < 0:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        n = f.read_into(offset, dest) if offset < f.size else 0
        self.stats.request(len(dest), 0)
        return n

    def read(self, fh: int, offset: int, size: int) -> bytes:
        buf = bytearray(max(0, size))
        n = self.read_into(fh, offset, memoryview(buf))
        return bytes(buf[:n])

    def release(self, fh: int) -> None:
        with self._lock:
            f = self._handles.pop(fh, None)
        if f is not None:
            f.close()

    # -- control --------------------------------------------------------------------------------
    def snapshot(self, top: int = 10) -> dict:
        return self.stats.snapshot(top)

    def close(self) -> None:
        with self._lock:
            handles = list(self._handles.values())
            self._handles.clear()
        for f in handles:
            f.close()
        self.source.close()
