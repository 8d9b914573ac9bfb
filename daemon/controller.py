"""The mount's control requests (stats, warm jobs, cache reports, evictions), apart from the protocol.

The kernel adapter (:mod:`fastfs.daemon.ops`) hands every control request (the names of
:mod:`fastfs.daemon.control`) to a :class:`Controller` with the request's path and
:class:`~fastfs.fsio.access.Caller`; answers are bytes, errors ``OSError`` with the errno to answer.
Nothing here knows the FUSE protocol (messages, node ids, replies): the adapter decodes the request
and encodes the answer, and passes in what only it can do (dropping the kernel's page cache of a file
for an eviction).

Who sees what. The stats snapshot is complete for the mounting user (the daemon's effective uid)
and for root. Any other caller (possible only on an ``allow_other`` mount) gets it through
:func:`fastfs.fsio.stats.redact`: counters, rates, histograms, gauges and error counts, but no path
at all (no top-files table, no source directory). Warm jobs, cache reports and evictions check the
caller's rights on every file (:mod:`fastfs.fsio.warm`); a job's progress is visible only to its
caller and root.

Retries. A getxattr may come twice for one call: a size query (buffer 0, or the first small buffer
``os.getxattr`` tries) and then the real read. An answer that did not fit the first buffer of a
request with an effect (starting a warm, evicting) is kept for :data:`PENDING_TTL` seconds, keyed by
(name, path, uid, pid), and handed to the retry instead of acting twice.

Concurrency: ``_lock`` guards ``_pending``; the warm jobs and the engine guard their own state.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from fastfs.daemon.control import (
    STATS_DIR,
    STATS_TOP_FILES,
    XATTR_CACHED,
    XATTR_DISK_CACHED,
    XATTR_DISK_EVICT,
    XATTR_DISK_WARM,
    XATTR_EVICT,
    XATTR_MAX,
    XATTR_STATS,
    XATTR_WARM,
    XATTR_WARM_CANCEL,
    XATTR_WARM_JOB,
    is_control_path,
)
from fastfs.fsio.access import Caller
from fastfs.fsio.api import EngineAPI
from fastfs.fsio.stats import encode_bounded, redact
from fastfs.fsio.warm import WarmJobs

if TYPE_CHECKING:
    from fastfs.fsio.engine import Engine

ENOATTR = getattr(errno, "ENOATTR", errno.ENODATA)
# Seconds an answer of an effectful request is kept for the retry of a too-small buffer.
PENDING_TTL = 30.0
# Answers kept for retries at most (the oldest are dropped first).
MAX_PENDING = 1024
# The control xattr names, for adapters that must tell them from the source's own attributes.
NAMES = (XATTR_STATS, XATTR_WARM, XATTR_CACHED, XATTR_EVICT, XATTR_DISK_WARM, XATTR_DISK_CACHED, XATTR_DISK_EVICT)


def is_control_xattr(name: str) -> bool:
    """True for the names this controller answers (never passed on to the source)."""
    return name in NAMES or name.startswith(XATTR_WARM_JOB)


class Controller:
    """Control requests of one mount over its engine (see the module docstring)."""

    def __init__(
        self,
        engine: EngineAPI,
        mount_info: dict[str, Any] | None = None,
        owner_uid: int | None = None,
        extra: Callable[[], dict[str, Any]] | None = None,
        settle: Callable[[], object] | None = None,
    ) -> None:
        self.engine = engine
        self.settle = settle  # run before each snapshot: work the kernel connection left for later (releases)
        self.mount_info = dict(mount_info or {})
        self.extra = extra  # more sections of the snapshot from the adapter (no paths in them)
        self.owner_uid = os.geteuid() if owner_uid is None else owner_uid
        # warm jobs run inside the engine's package and use the engine itself (fsio/api.py), which is
        # what the daemon hands over as its EngineAPI
        self.warms = WarmJobs(cast("Engine", engine), hidden=(STATS_DIR,))
        self._lock = threading.Lock()
        self._pending: OrderedDict[tuple[str, str, int, int], tuple[float, bytes]] = OrderedDict()

    # -- stats --------------------------------------------------------------------------------------
    def sees_all(self, caller: Caller | None) -> bool:
        """True for the mounting user and root (and for the daemon itself: *caller* None)."""
        return caller is None or caller.is_root or caller.uid == self.owner_uid

    def snapshot(self, caller: Caller | None = None) -> dict[str, Any]:
        """Engine snapshot plus the mount's identity, redacted unless *caller* sees everything."""
        if self.settle is not None:
            self.settle()
        snap = self.engine.snapshot(STATS_TOP_FILES)
        snap["mount"] = {
            "source": self.mount_info.get("source", ""),
            "mountpoint": self.mount_info.get("mountpoint", ""),
            "pid": os.getpid(),
        }
        if self.extra is not None:
            snap.update(self.extra())
        return snap if self.sees_all(caller) else redact(snap)

    def stats_file(self, caller: Caller | None, redacted: bool = False, limit: int | None = None) -> bytes:
        """The document served as ``.fastfs/stats`` (*redacted*: the view of other users, whoever asks);
        with *limit*, at most that many bytes (top files dropped until it fits, as for the xattr)."""
        snap = self.snapshot(caller)
        if redacted and not snap.get("redacted"):
            snap = redact(snap)
        data = (json.dumps(snap, indent=1) + "\n").encode()
        return data if limit is None or len(data) <= limit else encode_bounded(snap, limit)

    # -- xattr requests -----------------------------------------------------------------------------
    def getxattr(
        self,
        path: str,
        name: str,
        size: int | None,
        caller: Caller,
        pid: int = 0,
        forget_pages: Callable[[], None] | None = None,
    ) -> bytes:
        """Answer control xattr *name* of *path* for *caller*; *size* is the caller's buffer (0 or too
        small: it will ask again). *forget_pages* drops the kernel's page cache of the file (the
        adapter's invalidation): an eviction from RAM calls it, or the next read would be served by
        the kernel and never reach the source. Raises OSError (ENODATA for a name not meant for this
        path)."""
        if name == XATTR_STATS:
            if path != "/":
                raise OSError(ENOATTR, "stats are an attribute of the mount root")
            return encode_bounded(self.snapshot(caller), XATTR_MAX)
        if name.startswith(XATTR_WARM_CANCEL):
            try:
                job_id = int(name[len(XATTR_WARM_CANCEL) :])
            except ValueError:
                raise OSError(ENOATTR, "no such warm job") from None
            return _json(self.warms.cancel(job_id, caller))
        if name.startswith(XATTR_WARM_JOB):
            try:
                job_id = int(name[len(XATTR_WARM_JOB) :])
            except ValueError:
                raise OSError(ENOATTR, "no such warm job") from None
            return _json(self.warms.progress(job_id, caller))
        if name in (XATTR_CACHED, XATTR_DISK_CACHED):
            self._not_control(path)
            cached = self.warms.cached if name == XATTR_CACHED else self.warms.disk_cached
            return _json(cached(path, caller))
        if name in (XATTR_WARM, XATTR_EVICT, XATTR_DISK_WARM, XATTR_DISK_EVICT):
            self._not_control(path)
            key = (name, path, caller.uid, pid)
            kept = self._take_pending(key)
            if kept is not None:
                return kept
            if name in (XATTR_WARM, XATTR_DISK_WARM):
                data = _json({"job": self.warms.start(path, caller, disk=name == XATTR_DISK_WARM).id})
            elif name == XATTR_EVICT:
                data = _json(self.warms.evict(path, caller))
                if forget_pages is not None:
                    forget_pages()
            else:
                data = _json(self.warms.disk_evict(path, caller))
            if size is not None and len(data) > size:
                self._keep_pending(key, data)
            return data
        raise OSError(ENOATTR, "not a control attribute")

    @staticmethod
    def _not_control(path: str) -> None:
        if is_control_path(path):
            raise OSError(errno.ENOTSUP, "not a file of the source", path)

    def _take_pending(self, key: tuple[str, str, int, int]) -> bytes | None:
        now = time.monotonic()
        with self._lock:
            while self._pending:
                oldest = next(iter(self._pending.values()))
                if now - oldest[0] <= PENDING_TTL:
                    break
                self._pending.popitem(last=False)
            kept = self._pending.pop(key, None)
        return None if kept is None else kept[1]

    def _keep_pending(self, key: tuple[str, str, int, int], data: bytes) -> None:
        with self._lock:
            self._pending[key] = (time.monotonic(), data)
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)

    def close(self) -> None:
        self.warms.close()


def _json(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()
