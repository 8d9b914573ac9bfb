"""The latency emulator's FUSE operations: a read-only mirror that charges every request time.

This module is what runs inside the emulator process (``latency_fs.py --foreground`` imports it);
callers use :func:`latency_fs.emulated` and never import it themselves. It imports mfusepy (and so
libfuse 3) at import time.

The cost model (:class:`Model`):

* every data read: ``latency`` plus ``size / bandwidth``. The latency is a sleep taken without any
  lock, so concurrent requests overlap their latencies (a round trip is not a shared resource).
  The transfer time is charged per *handle* (``bandwidth="handle"``: one open file is one stream,
  ``start = max(arrival, handle.busy_until)``, so requests on the same handle serialise their
  transfer while requests on different handles transfer in parallel, like NFS or a TCP stream per
  open file) or per *request* (``bandwidth="request"``: every request transfers on its own, like
  range GETs of an object store, each on its own connection);
* every lookup / getattr, open, readlink and readdir: one ``meta_latency``.

Per-handle ranged streams (``stream=True``, with ``bandwidth="handle"``): what rclone, s3fs, goofys,
blobfuse2 and gcsfuse do without their file cache. A handle is one ranged download: its first read
starts it (``latency``), a read that continues where the handle's stream stands costs only its
transfer (no new latency: the bytes are already flowing), a read a little ahead (within
``stream_skip``) continues by reading and discarding the gap (charged as transfer), and any other
read (backwards, or further ahead) *restarts* the download: a new request latency, plus
``stream_waste`` bytes charged on the stream (what the abandoned download had in flight: the
server's read-ahead and socket buffers). A read that arrives ahead of the stream first waits up to
``STREAM_WAIT`` for the reads before it (the kernel sends read-ahead in order, but worker threads
pick requests up in any order; rclone waits the same way). Counted: ``stream_starts``,
``restarts``, ``transferred_bytes`` (delivered + skipped + wasted) and ``wasted_bytes``.

Fault switches (the reliability tests' source, formerly ``tests/faultfs.py``): with a *control*
file, reads and metadata calls can be made to fail or hang at run time. The control file is JSON,
replaced atomically by the test (``{"eio": ["*/bad*"], "hang": ["/slow.bin"], "hang_meta":
["/stuck/*"]}``); patterns are :func:`fnmatch.fnmatchcase` patterns of the FUSE path. A read of a
file matching ``eio`` fails with EIO; a read matching ``hang`` blocks until the pattern is removed
(bounded by :data:`MAX_HANG_SECONDS`, then EIO, so a forgotten hang never wedges a run);
``hang_meta`` does the same for getattr, open and readdir, ``hang_close`` for the FLUSH of a
close (the emulator answers FLUSH only with a control file: a close is then one more round trip, as
on sshfs or s3fs; without one the kernel stops sending it). The file is re-read only when its
identity (inode, size, mtime) changes: one ``stat`` per request, and none without a control file.

What the kernel sees of it is set by :class:`Model` too: the page cache kept across opens
(``cache="keep"``: ``keep_cache``, NFS close-to-open with an unchanged file), dropped at every open
(``"drop"``: no ``keep_cache``) or not used at all (``"direct"``: ``direct_io``, every read reaches
the emulator at the size the reader asked; shared mmaps fail with ENODEV, as on such a mount), and
the attribute / entry timeout. Kernel read-ahead and parallel lookups are set from outside the
operations (the mount's bdi, the INIT reply shim): see :mod:`latency_fs`.

Concurrency: ``LatencyFS._lock`` guards the counters, the in-flight gauges and the handle tables;
each ``_Handle.lock`` (a Condition's lock) guards that handle's ``busy_until`` and stream position.
No lock is held across a sleep or I/O (the stream wait is a condition wait, which releases it).
"""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")

import mfusepy  # noqa: E402

# Kernel read-ahead requests in flight (max_background): a network client pipelines many requests.
MAX_BACKGROUND = 64
# Congestion threshold as a share of max_background: 3/4, the kernel's own default ratio.
CONGESTION_SHARE = 0.75
# Name of the hidden counters file at the mount root.
STATS_NAME = ".latency_fs_stats"
# Size reported for the counters file; reads use direct_io so the real (shorter) length wins.
STATS_FILE_SIZE = 1 << 20
# libfuse 3 capability bit FUSE_CAP_PARALLEL_DIROPS (fuse_common.h): without it the kernel serialises
# lookups and readdirs of one directory on the FUSE inode mutex.
FUSE_CAP_PARALLEL_DIROPS = 1 << 18
# libfuse 3 capability bit FUSE_CAP_ASYNC_READ: the kernel may send several reads of one file at once.
FUSE_CAP_ASYNC_READ = 1 << 0
# Bandwidth accounting modes (see the module docstring).
BANDWIDTH_MODES = ("handle", "request")
# Kernel page cache modes (see the module docstring).
CACHE_MODES = ("keep", "drop", "direct")
# Longest wait (s) of a stream read that arrived ahead of the stream for the reads before it.
STREAM_WAIT = 0.005
# A hanging request gives up after this long (EIO), so a test that forgets to release it cannot hang forever.
MAX_HANG_SECONDS = 300.0
# How often a hanging request re-checks the control file (short: tests release hangs promptly).
HANG_POLL_SECONDS = 0.05

COUNTER_NAMES = (
    "reads",
    "read_bytes",
    "opens",
    "releases",
    "getattrs",
    "readdirs",
    "readlinks",
    "max_inflight",
    "max_inflight_reads",
    "read_wait_seconds",
    "stream_starts",
    "restarts",
    "transferred_bytes",
    "wasted_bytes",
)


@dataclass(frozen=True)
class Model:
    """What each request costs and what the kernel is told (the emulator's behaviour)."""

    latency: float
    """Seconds every data read costs before its transfer."""
    meta_latency: float
    """Seconds every lookup / getattr, open, readlink and readdir costs."""
    bytes_per_s: float
    """Bandwidth of one stream (a handle, or a request with ``bandwidth="request"``)."""
    bandwidth: str = "handle"
    """``handle``: transfers on one open handle serialise; ``request``: every request is its own stream."""
    cache: str = "keep"
    """``keep`` (keep_cache), ``drop`` (page cache dropped at every open) or ``direct`` (direct_io)."""
    attr_timeout: float = 1.0
    """Kernel attribute / entry / negative cache lifetime (s)."""
    stream: bool = False
    """Each handle is one ranged download stream (see the module docstring)."""
    stream_waste: int = 8 << 20
    """Bytes a restarted stream charges (the abandoned download's in-flight data)."""
    stream_skip: int = 1 << 20
    """A read up to this far ahead of the stream continues it (the gap is read and discarded)."""
    max_background: int | None = MAX_BACKGROUND
    """Kernel requests in flight (None: libfuse's default, 12)."""

    def __post_init__(self) -> None:
        if self.bandwidth not in BANDWIDTH_MODES:
            raise ValueError(f"bandwidth must be one of {', '.join(BANDWIDTH_MODES)}, not {self.bandwidth!r}")
        if self.cache not in CACHE_MODES:
            raise ValueError(f"cache must be one of {', '.join(CACHE_MODES)}, not {self.cache!r}")
        if self.bytes_per_s <= 0 or self.latency < 0 or self.meta_latency < 0 or self.attr_timeout < 0:
            raise ValueError("latencies and the attribute timeout must be >= 0, the bandwidth > 0")
        if self.stream and self.bandwidth != "handle":
            raise ValueError("ranged streams are per handle: stream needs bandwidth 'handle'")
        if self.stream_waste < 0 or self.stream_skip < 0:
            raise ValueError("stream waste and skip must be >= 0")


class Faults:
    """Cached view of the control file (see the module docstring); reloaded when the file changes.

    ``_lock`` guards the cached patterns and the file's identity; the file is read without it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._eio: tuple[str, ...] = ()
        self._hang: tuple[str, ...] = ()
        self._hang_meta: tuple[str, ...] = ()
        self._hang_close: tuple[str, ...] = ()

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            key = None
        else:
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key == self._key:
                return
        data: dict[str, Any] = {}
        if key is not None:
            try:
                with open(self.path, encoding="utf-8") as f:
                    data = json.load(f) or {}
            except (OSError, ValueError):
                return  # half-written file: keep the previous state, retry on the next request
        with self._lock:
            self._key = key
            self._eio = tuple(data.get("eio", ()))
            self._hang = tuple(data.get("hang", ()))
            self._hang_meta = tuple(data.get("hang_meta", ()))
            self._hang_close = tuple(data.get("hang_close", ()))

    def _matches(self, which: str, path: str) -> bool:
        self._reload()
        with self._lock:
            patterns = getattr(self, which)
        return any(fnmatch.fnmatchcase(path, p) for p in patterns)

    def eio(self, path: str) -> bool:
        return self._matches("_eio", path)

    def hang(self, path: str) -> bool:
        return self._matches("_hang", path)

    def hang_meta(self, path: str) -> bool:
        return self._matches("_hang_meta", path)

    def hang_close(self, path: str) -> bool:
        return self._matches("_hang_close", path)

    def wait_while(self, check: Callable[[str], bool], path: str) -> None:
        """Block while *check(path)* holds, at most MAX_HANG_SECONDS (then EIO)."""
        if not check(path):
            return
        deadline = time.monotonic() + MAX_HANG_SECONDS
        while check(path):
            if time.monotonic() > deadline:
                raise OSError(errno.EIO, "hang released by its time bound")
            time.sleep(HANG_POLL_SECONDS)


class _Handle:
    """One open file: its descriptor and path, its transfer-time reservation and its stream position."""

    __slots__ = ("fd", "path", "lock", "moved", "busy_until", "stream_pos")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.lock = threading.Lock()  # guards busy_until and stream_pos; never held across a sleep or I/O
        self.moved = threading.Condition(self.lock)  # notified when stream_pos moves
        self.busy_until = 0.0
        self.stream_pos: int | None = None  # where the handle's download stands (None: not started)


class LatencyFS(mfusepy.Operations):
    """Read-only mirror of *src* charging the costs of *model*; counters at ``/.latency_fs_stats``."""

    use_ns = True

    def __init__(
        self, src: str, model: Model, on_init: Callable[[], None] | None = None, control: str | None = None
    ) -> None:
        self.root = os.path.realpath(src)
        self.model = model
        self.faults = Faults(control) if control else None
        self.latency = model.latency
        self.meta_latency = model.meta_latency
        self.bps = model.bytes_per_s
        self.per_request = model.bandwidth == "request"
        self.stream = model.stream
        self.on_init = on_init
        self._lock = threading.Lock()  # guards counters, the in-flight gauges and both handle tables
        self._handles: dict[int, _Handle] = {}
        self._virtual: dict[int, bytes] = {}  # open handles of the counters file -> frozen snapshot
        self._next_fh = 1
        self.counters: dict[str, float] = dict.fromkeys(COUNTER_NAMES, 0)
        self.counters["read_wait_seconds"] = 0.0
        self._inflight = 0
        self._inflight_reads = 0
        self.capable = 0
        self.want = 0
        self.proto = ""
        self.started = time.time()

    # -- helpers -----------------------------------------------------------------------------
    def _real(self, path: str) -> str:
        return self.root + path if path != "/" else self.root

    def _enter(self, counter: str, is_read: bool = False) -> None:
        with self._lock:
            self.counters[counter] += 1
            self._inflight += 1
            if self._inflight > self.counters["max_inflight"]:
                self.counters["max_inflight"] = self._inflight
            if is_read:
                self._inflight_reads += 1
                if self._inflight_reads > self.counters["max_inflight_reads"]:
                    self.counters["max_inflight_reads"] = self._inflight_reads

    def _leave(self, is_read: bool = False) -> None:
        with self._lock:
            self._inflight -= 1
            if is_read:
                self._inflight_reads -= 1

    def _hang_meta(self, path: str) -> None:
        if self.faults is not None:
            self.faults.wait_while(self.faults.hang_meta, path)

    def _charge(self, counter: str) -> None:
        """One metadata round trip: count it and sleep the metadata latency (no lock held)."""
        self._enter(counter)
        try:
            if self.meta_latency > 0:
                time.sleep(self.meta_latency)
        finally:
            self._leave()

    def _new_fh(self) -> int:
        """Next handle number; the caller holds ``_lock``."""
        fh = self._next_fh
        self._next_fh += 1
        return fh

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            counters = dict(self.counters)
            open_handles = len(self._handles)
        return {
            "latency_ms": self.latency * 1000,
            "meta_latency_ms": self.meta_latency * 1000,
            "mbps": self.bps / 1e6,
            "bandwidth": self.model.bandwidth,
            "cache": self.model.cache,
            "attr_timeout": self.model.attr_timeout,
            "stream": self.model.stream,
            "stream_waste": self.model.stream_waste,
            "stream_skip": self.model.stream_skip,
            "pid": os.getpid(),
            "uptime_seconds": round(time.time() - self.started, 3),
            "parallel_dirops": bool(self.want & FUSE_CAP_PARALLEL_DIROPS)
            and "parallel_dirops_" in os.environ.get("LD_PRELOAD", ""),
            "async_read": bool(self.want & FUSE_CAP_ASYNC_READ),
            "capable": hex(self.capable),
            "want": hex(self.want),
            "proto": self.proto,
            "open_handles": open_handles,
            "counters": counters,
        }

    # -- lifecycle -----------------------------------------------------------------------------
    def init_with_config(self, conn: Any, config: Any) -> None:
        if conn is not None:
            self.capable = int(conn.capable)
            self.proto = f"{conn.proto_major}.{conn.proto_minor}"
            for cap in (FUSE_CAP_PARALLEL_DIROPS, FUSE_CAP_ASYNC_READ):
                if conn.capable & cap:
                    conn.want |= cap
            self.want = int(conn.want)
            if self.model.max_background is not None:
                conn.max_background = self.model.max_background
                conn.congestion_threshold = int(self.model.max_background * CONGESTION_SHARE)
        if config is not None:
            t = self.model.attr_timeout
            config.entry_timeout = t
            config.attr_timeout = t
            config.negative_timeout = t
            config.direct_io = 0
            config.kernel_cache = 0
        if self.on_init is not None:
            self.on_init()

    # -- metadata ------------------------------------------------------------------------------
    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        if path == "/" + STATS_NAME:
            now = time.time_ns()
            return {
                "st_mode": stat.S_IFREG | 0o444,
                "st_nlink": 1,
                "st_size": STATS_FILE_SIZE,
                "st_atime": now,
                "st_mtime": now,
                "st_ctime": now,
            }
        self._hang_meta(path)
        self._charge("getattrs")
        st = os.lstat(self._real(path))
        return {
            "st_mode": st.st_mode,
            "st_nlink": st.st_nlink,
            "st_size": st.st_size,
            "st_uid": st.st_uid,
            "st_gid": st.st_gid,
            "st_ino": st.st_ino,
            "st_rdev": st.st_rdev,
            "st_atime": st.st_atime_ns,
            "st_mtime": st.st_mtime_ns,
            "st_ctime": st.st_ctime_ns,
            "st_blocks": st.st_blocks,
            "st_blksize": st.st_blksize,
        }

    def readdir(self, path: str, fh: int) -> list[str]:
        self._hang_meta(path)
        self._charge("readdirs")
        return [".", "..", *os.listdir(self._real(path))]

    def readlink(self, path: str) -> str:
        self._charge("readlinks")
        return os.readlink(self._real(path))

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode, follow_symlinks=False):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        return 0

    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        raise OSError(errno.ENODATA, os.strerror(errno.ENODATA))

    def listxattr(self, path: str) -> list[str]:
        return []

    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self.root)
        names = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail")
        return {k: getattr(sv, k) for k in (*names, "f_namemax")}

    # -- data ----------------------------------------------------------------------------------
    def open(self, path: str, fi: Any) -> int:
        if fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        if path == "/" + STATS_NAME:  # one frozen snapshot per open, so a multi-read reader sees one JSON
            data = json.dumps(self.snapshot(), indent=1).encode() + b"\n"
            with self._lock:
                fh = self._new_fh()
                self._virtual[fh] = data
            fi.fh = fh
            fi.direct_io = 1
            return 0
        self._hang_meta(path)
        self._charge("opens")
        fd = os.open(self._real(path), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        with self._lock:
            fh = self._new_fh()
            self._handles[fh] = _Handle(fd, path)
        fi.fh = fh
        fi.direct_io = 1 if self.model.cache == "direct" else 0
        fi.keep_cache = 1 if self.model.cache == "keep" else 0
        return 0

    def read(self, path: str, size: int, offset: int, fi: Any) -> bytes:
        """Byte-returning read (used by the counters file; data reads go through read_into)."""
        data = self._virtual.get(fi.fh)
        if data is not None:
            return data[offset : offset + size]
        buf = bytearray(size)
        n = self.read_into(fi, memoryview(buf), offset)
        return bytes(buf[:n])

    def read_into(self, fi: Any, dest: memoryview, offset: int) -> int:
        """Fill *dest* from the file at *offset*, charging latency + size / bandwidth (per handle or request)."""
        handle = self._handles[fi.fh]
        if self.faults is not None:
            self.faults.wait_while(self.faults.hang, handle.path)
            if self.faults.eio(handle.path):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
        t0 = time.monotonic()
        self._enter("reads", is_read=True)
        extra = 0  # bytes transferred beyond the n delivered (stream skips and restarts)
        kind = ""
        try:
            n = os.preadv(handle.fd, [dest], offset)
            arrival = t0 + self.latency
            if self.per_request:
                deadline = arrival + n / self.bps
            elif self.stream:
                deadline, extra, kind = self._stream_charge(handle, offset, n, t0)
            else:
                with handle.lock:
                    start = max(arrival, handle.busy_until)
                    handle.busy_until = deadline = start + n / self.bps
            wait = deadline - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        finally:
            self._leave(is_read=True)
        with self._lock:
            self.counters["read_bytes"] += n
            self.counters["transferred_bytes"] += n + extra
            self.counters["read_wait_seconds"] += time.monotonic() - t0
            if kind:
                self.counters[kind] += 1
                if kind == "restarts":
                    self.counters["wasted_bytes"] += self.model.stream_waste
        return n

    def _stream_charge(self, handle: _Handle, offset: int, n: int, t0: float) -> tuple[float, int, str]:
        """Place a read on its handle's download stream: (deadline, extra bytes moved, counter to bump).

        Continuing (at or up to ``stream_skip`` ahead of the stream): transfer only, the skipped gap
        included. Otherwise the stream (re)starts: a request latency, plus ``stream_waste`` on a
        restart. The position moves before the sleep, so the next in-order read queues right behind.
        """
        m = self.model
        with handle.moved:
            pos = handle.stream_pos
            if pos is not None and pos < offset <= pos + m.stream_skip:  # ahead: let earlier reads land
                handle.moved.wait_for(
                    lambda: handle.stream_pos is not None and handle.stream_pos >= offset, timeout=STREAM_WAIT
                )
                pos = handle.stream_pos
            if pos is not None and pos <= offset <= pos + m.stream_skip:
                extra, kind, start = offset - pos, "", max(t0, handle.busy_until)
            else:
                extra = m.stream_waste if pos is not None else 0
                kind = "restarts" if pos is not None else "stream_starts"
                start = max(t0 + self.latency, handle.busy_until)
            handle.stream_pos = offset + n
            handle.busy_until = deadline = start + (n + extra) / self.bps
            handle.moved.notify_all()
        return deadline, extra, kind

    def is_virtual(self, fh: int) -> bool:
        return fh in self._virtual

    def release(self, path: str, fi: Any) -> int:
        if self._virtual.pop(fi.fh, None) is not None:
            return 0
        with self._lock:
            handle = self._handles.pop(fi.fh, None)
            self.counters["releases"] += 1
        if handle is not None:
            os.close(handle.fd)
        return 0


class FaultLatencyFS(LatencyFS):
    """LatencyFS with its fault switches: it also answers FLUSH, which ``hang_close`` makes hang."""

    def flush(self, path: str, fh: int) -> int:
        if self.faults is not None:
            self.faults.wait_while(self.faults.hang_close, path)
        return 0


class ZeroCopyFUSE(mfusepy.FUSE):
    """mfusepy.FUSE whose read callback preads straight into libfuse's buffer (no bytes object, no copy)."""

    def read(self, path: Any, buf: Any, size: int, offset: int, fip: Any) -> int:
        fi = fip.contents
        if self.operations.is_virtual(fi.fh):
            return super().read(path, buf, size, offset, fip)
        dest = ctypes.cast(buf, ctypes.POINTER(ctypes.c_char * size)).contents
        return self.operations.read_into(fi, memoryview(dest).cast("B"), offset)


def serve(
    src: str,
    mnt: str,
    model: Model,
    threads: int,
    on_init: Callable[[], None] | None = None,
    control: str | None = None,
    fsname: str = "latency_fs",
) -> int:
    """Run the emulator in the foreground until unmounted; prints its counters at exit. Returns the status.

    *threads* 0 leaves libfuse's default (10); *control* enables the fault switches; *fsname* names
    the mount (``latency_fs`` also sets the subtype: ``fuse.latency_fs``, any other is plain ``fuse``).
    """
    ops = (FaultLatencyFS if control else LatencyFS)(src, model, on_init, control)
    status = 0
    options: dict[str, Any] = {"fsname": fsname}
    if fsname == "latency_fs":
        options["subtype"] = "latency_fs"
    if threads:
        options.update(max_threads=str(threads), max_idle_threads=str(threads))
    try:
        ZeroCopyFUSE(ops, mnt, raw_fi=True, foreground=True, nothreads=False, ro=True, **options)
    except RuntimeError as e:  # libfuse's non-zero exit (e.g. a signal while busy): reported, not a traceback
        print(f"latency_fs: fuse_main returned {e}", file=sys.stderr, flush=True)
        status = 1
    finally:
        print("latency_fs: counters " + json.dumps(ops.snapshot()), file=sys.stderr, flush=True)
    return status
