"""The one place that loads the FUSE binding (mfusepy on libfuse 3).

mfusepy picks its C library from ``FUSE_LIBRARY_NAME`` at import time; fastfs is written against the
libfuse 3 high-level API, so the variable is forced (not defaulted) to ``fuse3`` before the import.
Besides re-exporting the binding's classes, this module wraps the two libfuse calls mfusepy does not
expose with the handle fastfs needs: ``fuse_invalidate_path`` (drop the kernel's cached attributes and
pages of a path whose source changed) and ``fuse_exit`` on an explicit ``struct fuse *``.
"""

from __future__ import annotations

import ctypes
import errno
import os

os.environ["FUSE_LIBRARY_NAME"] = "fuse3"

import mfusepy  # noqa: E402  (must follow the environment variable above)
from mfusepy import (  # noqa: E402
    FUSE,
    FuseOSError,
    Operations,
    c_stat,
    fuse_get_context,
)

__all__ = [
    "FUSE",
    "FuseOSError",
    "Operations",
    "c_stat",
    "current_fuse",
    "exit_loop",
    "fuse_get_context",
    "invalidate_path",
    "libfuse_version",
]

_lib = mfusepy._libfuse
_lib.fuse_invalidate_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_lib.fuse_invalidate_path.restype = ctypes.c_int
_lib.fuse_exit.argtypes = [ctypes.c_void_p]
_lib.fuse_exit.restype = None


def libfuse_version() -> tuple[int, int]:
    """(major, minor) of the loaded libfuse."""
    return mfusepy.fuse_version_major, mfusepy.fuse_version_minor


def current_fuse() -> int | None:
    """The ``struct fuse *`` of the calling FUSE request thread (call from ``init``), or None."""
    ctx = _lib.fuse_get_context()
    if not ctx:
        return None
    return ctx.contents.fuse or None


def invalidate_path(fuse_handle: int | None, path: str) -> int:
    """Ask the kernel to forget cached attributes and data of *path*; returns 0 or -errno.

    Must not be called from a thread serving a FUSE request for the same file (the kernel waits for
    that request's pages); the daemon calls it from a dedicated thread.
    """
    if not fuse_handle:
        return -errno.ENOTCONN
    return _lib.fuse_invalidate_path(ctypes.c_void_p(fuse_handle), os.fsencode(path))


def exit_loop(fuse_handle: int | None) -> None:
    """Flag the session of *fuse_handle* as finished (its loop returns on the next request)."""
    if fuse_handle:
        _lib.fuse_exit(ctypes.c_void_p(fuse_handle))
