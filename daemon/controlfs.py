"""The control file system: the hidden directory ``/.fastfs`` and its ``stats`` file.

Two reserved node ids (:data:`CONTROL_ID`, :data:`STATS_ID`, below the node table's first id) stand
for the directory and the file; the source's own ``.fastfs`` entry in the root, if any, is hidden
(the adapter never looks it up or lists it). The directory lists ``stats``, read-only. The file is a
JSON snapshot of the mount's stats (a :class:`~fastfs.daemon.controller.Controller` builds it for the
request's caller, which decides what it may contain), served two ways:

* opened (the default): each open takes one snapshot, kept under a *virtual handle* (from
  :data:`VIRTUAL_FH_BASE`, far above any handle the engine hands out) until its release, and
  answered with direct I/O, so its reads see exactly that snapshot and its real length;
* without open (``fuse.no_open``): no handle, no direct I/O, so the kernel reads the size it was
  told (:data:`NOFH_STATS_SIZE`, every snapshot padded with spaces to it) and keeps the pages for
  whoever reads next. A read at offset 0 starts a pass with a new snapshot, kept for the rest of the
  pass (one per view: complete or redacted); the read that reaches the end forgets it and drops the
  kernel's pages (``invalidate``), so the next pass reads anew. On an ``allow_other`` mount everyone
  gets the redacted view here (the full one stays available to the owner and root through the
  root's stats xattr).

Concurrency: ``_lock`` guards ``_virtual``, ``_next_vfh`` and ``_open_less``; snapshots are built
outside it. A pass's snapshot is replaced only by a read at offset 0 and forgotten only by the read
that reached the end of that same snapshot (compared by identity under the lock), so a pass that
starts as another ends keeps its own snapshot.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable

from fastfs.daemon.control import STATS_NAME
from fastfs.daemon.controller import Controller
from fastfs.daemon.kernel.replies import Dirent
from fastfs.fsio.access import Caller

# Reserved node ids of the control directory and its stats file (the node table starts at 16).
CONTROL_ID = 2
STATS_ID = 3
# Handles of open stats snapshots start here, far above any handle the engine hands out.
VIRTUAL_FH_BASE = 1 << 62
# Size reported for the stats file before it is opened (reads use direct I/O: the real length wins).
STATS_SIZE_ESTIMATE = 64 * 1024
# no_open: the fixed size of the stats file, each snapshot padded with spaces to it (JSON allows
# trailing whitespace) or, when larger, cut down by dropping top files as the stats xattr is;
# 4x the xattr's 64 KiB, so the full table of top files fits with long paths.
NOFH_STATS_SIZE = 256 * 1024
# Attributes the kernel reports for the virtual nodes' block size.
VIRTUAL_BLKSIZE = 4096


# Both (``nodeid in CONTROL_IDS``: the adapter's test on every request naming a node).
CONTROL_IDS = frozenset({CONTROL_ID, STATS_ID})


class VirtualStat:
    """Attributes of the control directory and stats file (``os.stat_result``-shaped)."""

    __slots__ = (
        "st_mode",
        "st_size",
        "st_nlink",
        "st_ino",
        "st_uid",
        "st_gid",
        "st_atime_ns",
        "st_mtime_ns",
        "st_ctime_ns",
        "st_blocks",
        "st_rdev",
        "st_blksize",
    )

    def __init__(self, mode: int, size: int, nlink: int, ino: int, when_ns: int) -> None:
        self.st_mode, self.st_size, self.st_nlink, self.st_ino = mode, size, nlink, ino
        self.st_uid, self.st_gid = os.getuid(), os.getgid()
        self.st_atime_ns = self.st_mtime_ns = self.st_ctime_ns = when_ns
        self.st_blocks = (size + 511) // 512
        self.st_rdev = 0
        self.st_blksize = VIRTUAL_BLKSIZE


def _error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class ControlFS:
    """The ``/.fastfs`` directory and its stats file (see the module docstring).

    *invalidate* drops the kernel's pages of the stats file (the no_open passes); *allow_other*
    says every caller of a no_open read gets the redacted view."""

    def __init__(self, control: Controller, no_open: bool, allow_other: bool, invalidate: Callable[[], None]) -> None:
        self.control = control
        self.no_open = no_open
        self.allow_other = allow_other
        self._invalidate = invalidate
        self._started_ns = time.time_ns()
        self._lock = threading.Lock()
        self._virtual: dict[int, bytes] = {}  # virtual handle -> its snapshot
        self._next_vfh = VIRTUAL_FH_BASE
        self._open_less: dict[bool, bytes] = {}  # no_open: the pass's snapshot per view (complete or redacted)

    # -- nodes ----------------------------------------------------------------------------------
    def stat(self, nodeid: int) -> VirtualStat:
        """Attributes of the control directory or the stats file."""
        if nodeid == CONTROL_ID:
            return VirtualStat(stat.S_IFDIR | 0o555, 0, 2, CONTROL_ID, self._started_ns)
        # no_open: no direct I/O, so the kernel reads exactly this size (a short read does not shrink it:
        # the rest would read as zeros); every snapshot is padded to it (see read_open_less)
        size = NOFH_STATS_SIZE if self.no_open else STATS_SIZE_ESTIMATE
        return VirtualStat(stat.S_IFREG | 0o444, size, 1, STATS_ID, time.time_ns())

    def lookup(self, parent: int, name: str) -> int:
        """The node id of *name* in control node *parent*."""
        if parent == STATS_ID:
            raise _error(errno.ENOTDIR)
        if name != STATS_NAME:
            raise _error(errno.ENOENT)
        return STATS_ID

    @staticmethod
    def listing() -> list[Dirent]:
        """The control directory's entries, '.' and '..' first."""
        return [(".", stat.S_IFDIR, CONTROL_ID), ("..", stat.S_IFDIR, 1), (STATS_NAME, stat.S_IFREG, STATS_ID)]

    @staticmethod
    def access(nodeid: int, mask: int) -> None:
        if nodeid == STATS_ID and mask & os.X_OK:
            raise _error(errno.EACCES)

    # -- the stats file, opened -----------------------------------------------------------------
    def open(self, nodeid: int, caller: Caller) -> int:
        """A virtual handle holding one snapshot for *caller* (the stats file; the directory is EISDIR)."""
        if nodeid == CONTROL_ID:
            raise _error(errno.EISDIR)
        data = self.control.stats_file(caller)
        with self._lock:
            fh = self._next_vfh
            self._next_vfh += 1
            self._virtual[fh] = data
        return fh

    def read(self, fh: int, offset: int, size: int) -> bytes:
        """Bytes of the snapshot of virtual handle *fh*."""
        with self._lock:
            data = self._virtual.get(fh)
        if data is None:
            raise _error(errno.EBADF)
        return data[offset : offset + size]

    def release(self, fh: int) -> None:
        with self._lock:
            self._virtual.pop(fh, None)

    # -- the stats file, without open (fuse.no_open) ----------------------------------------------
    def read_open_less(self, caller: Caller, offset: int, size: int) -> bytes:
        """A read of the stats file without open: offset 0 starts a pass with a new snapshot (padded to
        :data:`NOFH_STATS_SIZE`), later reads continue the pass's snapshot, the one reaching the end
        forgets it and drops the kernel's pages (see the module docstring)."""
        full = self.control.sees_all(caller) and not self.allow_other
        data = None
        if offset:
            with self._lock:
                data = self._open_less.get(full)
        if data is None:
            fresh = self.control.stats_file(caller if full else None, redacted=not full, limit=NOFH_STATS_SIZE)
            fresh = fresh.ljust(NOFH_STATS_SIZE, b" ")
            with self._lock:
                kept = self._open_less.get(full)
                if offset == 0 or kept is None:  # a new pass, or one whose snapshot is gone: this one
                    self._open_less[full] = data = fresh
                else:  # another read of the pass kept one meanwhile: the pass goes on with it
                    data = kept
        chunk = data[offset : offset + size]
        if offset + len(chunk) >= len(data):
            with self._lock:
                if self._open_less.get(full) is data:  # (not a pass started since: it keeps its own)
                    self._open_less.pop(full)
            self._invalidate()  # the next pass reads anew
        return chunk
