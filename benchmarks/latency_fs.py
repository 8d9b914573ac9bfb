"""Emulator of latency-bound storage: a read-only FUSE mirror whose every request costs time.

Benchmarks need a source that behaves like network storage (NFS, a parallel file system, an object
store gateway) on a machine that only has a local disk. This mirror of a directory charges:

* every read request: a fixed ``latency`` plus ``size / bandwidth``, where bandwidth is per *stream*;
  a stream is one open file handle. The latency is a sleep taken without any lock, so concurrent
  requests overlap their latencies (a network round trip is not a shared resource). The transfer
  time is then reserved on the handle (``start = max(arrival, handle.busy_until)``), so requests on
  the same handle serialise their transfer while requests on different handles transfer in parallel;
* every lookup / getattr, open, readlink and readdir: one ``latency``.

Everything else is what a network file system client looks like to the kernel: page cache on
(``direct_io`` off, ``keep_cache`` on like NFS close-to-open with an unchanged file), the kernel's
default read-ahead (128 KiB) unless ``--read-ahead-kb`` sets the mount's bdi, parallel directory
operations (``FUSE_CAP_PARALLEL_DIROPS``, checked at init), many worker threads, and a raised
``max_background`` so the kernel may keep many read-ahead requests in flight.

Counters (reads, bytes, opens, getattrs, readdirs, peak concurrency...) are readable as JSON from
the hidden file ``MNT/.latency_fs_stats`` (not listed, costs no latency) and are printed at exit.

Usage::

    python benchmarks/latency_fs.py SRC MNT --latency-ms 1.5 --mbps 400 [--foreground]
    python benchmarks/latency_fs.py --umount MNT

From Python (never leaves a mount behind, even on error)::

    with emulated(src, mnt, latency_ms=1.5, mbps=400) as emu:
        ...
        emu.stats()  # -> dict
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

os.environ["FUSE_LIBRARY_NAME"] = "fuse3"

# Default per-request latency (ms): a same-datacenter network file system round trip.
DEFAULT_LATENCY_MS = 1.5
# Default per-stream bandwidth (MB/s, 10**6 bytes): one TCP stream of a 10 GbE-class client.
DEFAULT_MBPS = 400.0
# Default FUSE worker threads: enough for 16 parallel preads plus lookups from other readers.
DEFAULT_THREADS = 64
# Kernel read-ahead requests in flight (max_background): a network client pipelines many requests.
MAX_BACKGROUND = 64
# Congestion threshold: 3/4 of max_background, the kernel's own default ratio.
CONGESTION_THRESHOLD = 48
# Kernel attribute / entry cache lifetime (s): the libfuse default, close to NFS's acregmin.
DEFAULT_ATTR_TIMEOUT = 1.0
# Name of the hidden counters file at the mount root.
STATS_NAME = ".latency_fs_stats"
# Size reported for the counters file; reads use direct_io so the real (shorter) length wins.
STATS_FILE_SIZE = 1 << 20
# Seconds to wait for a mount to become live before giving up.
MOUNT_TIMEOUT = 30.0
# Poll interval (s) while waiting for a mount or an unmount.
POLL_INTERVAL = 0.05
# Seconds to wait for the emulator process to exit after an unmount.
EXIT_TIMEOUT = 15.0
# Timeout (s) of fusermount3 / umount helper commands.
UMOUNT_TIMEOUT = 30.0
# libfuse 3 capability bit FUSE_CAP_PARALLEL_DIROPS (fuse_common.h): without it the kernel serialises
# lookups and readdirs of one directory on the FUSE inode mutex.
FUSE_CAP_PARALLEL_DIROPS = 1 << 18
# libfuse 3 capability bit FUSE_CAP_ASYNC_READ: the kernel may send several reads of one file at once.
FUSE_CAP_ASYNC_READ = 1 << 0
# Where the parallel-dirops shim is built (keyed by a hash of its source).
SHIM_CACHE_DIR = os.path.join(tempfile.gettempdir(), "latency_fs_shim")
# Seconds allowed for compiling the shim.
SHIM_BUILD_TIMEOUT = 60.0

# libfuse before 3.16 turns FUSE_CAP_PARALLEL_DIROPS on in conn->want but never copies it into the
# INIT reply, so the kernel keeps serialising lookups and readdirs per directory (libfuse PR #861).
# This LD_PRELOAD shim sets FUSE_PARALLEL_DIROPS in the INIT reply written to /dev/fuse, once.
SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>

#define FUSE_KERNEL_VERSION 7
#define FUSE_PARALLEL_DIROPS (1u << 18)
#define OUT_HEADER_SIZE 16
#define MAX_INIT_OUT 256

static int patched;

static int is_dev_fuse(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 10 && minor(st.st_rdev) == 229;
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    static ssize_t (*real_writev)(int, const struct iovec *, int);
    if (!real_writev)
        real_writev = (ssize_t (*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "writev");
    if (!__atomic_load_n(&patched, __ATOMIC_ACQUIRE) && iovcnt == 2 && iov[0].iov_len == OUT_HEADER_SIZE
        && iov[1].iov_len >= 16 && iov[1].iov_len <= MAX_INIT_OUT
        && ((const int32_t *)iov[0].iov_base)[1] == 0
        && ((const uint32_t *)iov[1].iov_base)[0] == FUSE_KERNEL_VERSION && is_dev_fuse(fd)) {
        unsigned char body[MAX_INIT_OUT];
        struct iovec copy[2];
        uint32_t flags;
        memcpy(body, iov[1].iov_base, iov[1].iov_len);
        memcpy(&flags, body + 12, sizeof flags);
        flags |= FUSE_PARALLEL_DIROPS;
        memcpy(body + 12, &flags, sizeof flags);
        copy[0] = iov[0];
        copy[1].iov_base = body;
        copy[1].iov_len = iov[1].iov_len;
        __atomic_store_n(&patched, 1, __ATOMIC_RELEASE);
        return real_writev(fd, copy, 2);
    }
    return real_writev(fd, iov, iovcnt);
}
"""

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
)


class _Handle:
    """One open file: its descriptor and its transfer-time reservation."""

    __slots__ = ("fd", "lock", "busy_until")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.lock = threading.Lock()  # guards busy_until only; never held across a sleep or I/O
        self.busy_until = 0.0


def _import_mfusepy() -> Any:
    import mfusepy

    return mfusepy


def make_operations(
    src: str,
    latency_s: float,
    bytes_per_s: float,
    keep_cache: bool = True,
    attr_timeout: float = DEFAULT_ATTR_TIMEOUT,
    read_ahead_kb: int | None = None,
    mountpoint: str = "",
) -> Any:
    """Build the mfusepy Operations object (imported lazily so --help works without libfuse)."""
    mfusepy = _import_mfusepy()

    class LatencyFS(mfusepy.Operations):
        use_ns = True

        def __init__(self) -> None:
            self.root = os.path.realpath(src)
            self.latency = latency_s
            self.bps = bytes_per_s
            self._lock = threading.Lock()  # guards counters and the handle table only
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

        # -- helpers -----------------------------------------------------------------------
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

        def _charge(self, counter: str) -> None:
            """One metadata round trip: count it and sleep the latency (no lock held)."""
            self._enter(counter)
            try:
                if self.latency > 0:
                    time.sleep(self.latency)
            finally:
                self._leave()

        def snapshot(self) -> dict[str, Any]:
            with self._lock:
                counters = dict(self.counters)
                open_handles = len(self._handles)
            return {
                "latency_ms": self.latency * 1000,
                "mbps": self.bps / 1e6,
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

        # -- lifecycle ---------------------------------------------------------------------
        def init_with_config(self, conn: Any, config: Any) -> None:
            if conn is not None:
                self.capable = int(conn.capable)
                self.proto = f"{conn.proto_major}.{conn.proto_minor}"
                for cap in (FUSE_CAP_PARALLEL_DIROPS, FUSE_CAP_ASYNC_READ):
                    if conn.capable & cap:
                        conn.want |= cap
                self.want = int(conn.want)
                conn.max_background = MAX_BACKGROUND
                conn.congestion_threshold = CONGESTION_THRESHOLD
            if config is not None:
                config.entry_timeout = attr_timeout
                config.attr_timeout = attr_timeout
                config.negative_timeout = attr_timeout
                config.direct_io = 0
                config.kernel_cache = 0
            if read_ahead_kb is not None and mountpoint:
                threading.Thread(target=_set_read_ahead, args=(mountpoint, read_ahead_kb), daemon=True).start()

        # -- metadata ----------------------------------------------------------------------
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
            self._charge("getattrs")
            st = os.lstat(self._real(path))
            return {
                "st_mode": st.st_mode,
                "st_nlink": st.st_nlink,
                "st_size": st.st_size,
                "st_uid": st.st_uid,
                "st_gid": st.st_gid,
                "st_ino": st.st_ino,
                "st_atime": st.st_atime_ns,
                "st_mtime": st.st_mtime_ns,
                "st_ctime": st.st_ctime_ns,
                "st_blocks": st.st_blocks,
                "st_blksize": st.st_blksize,
            }

        def readdir(self, path: str, fh: int) -> list[str]:
            self._charge("readdirs")
            return [".", "..", *os.listdir(self._real(path))]

        def readlink(self, path: str) -> str:
            self._charge("readlinks")
            return os.readlink(self._real(path))

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(self.root)
            return {
                k: getattr(sv, k)
                for k in (
                    "f_bsize",
                    "f_frsize",
                    "f_blocks",
                    "f_bfree",
                    "f_bavail",
                    "f_files",
                    "f_ffree",
                    "f_favail",
                    "f_namemax",
                )
            }

        # -- data --------------------------------------------------------------------------
        def open(self, path: str, fi: Any) -> int:
            if fi.flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))
            if path == "/" + STATS_NAME:  # one frozen snapshot per open, so a multi-read reader sees one JSON
                data = json.dumps(self.snapshot(), indent=1).encode() + b"\n"
                with self._lock:
                    fh = self._next_fh
                    self._next_fh += 1
                    self._virtual[fh] = data
                fi.fh = fh
                fi.direct_io = 1
                return 0
            self._charge("opens")
            fd = os.open(self._real(path), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            with self._lock:
                fh = self._next_fh
                self._next_fh += 1
                self._handles[fh] = _Handle(fd)
            fi.fh = fh
            fi.direct_io = 0
            fi.keep_cache = 1 if keep_cache else 0
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
            """Fill *dest* from the file at *offset*, charging latency + size / bandwidth of this handle."""
            t0 = time.monotonic()
            handle = self._handles[fi.fh]
            self._enter("reads", is_read=True)
            try:
                n = os.preadv(handle.fd, [dest], offset)
                arrival = t0 + self.latency
                with handle.lock:
                    start = max(arrival, handle.busy_until)
                    handle.busy_until = start + n / self.bps
                    deadline = handle.busy_until
                wait = deadline - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            finally:
                self._leave(is_read=True)
            with self._lock:
                self.counters["read_bytes"] += n
                self.counters["read_wait_seconds"] += time.monotonic() - t0
            return n

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

    return LatencyFS()


# -- parallel dirops shim ------------------------------------------------------------------------
def dirops_shim() -> str | None:
    """Path of the compiled parallel-dirops shim, building it on first use; None without a C compiler."""
    import hashlib
    import shutil

    digest = hashlib.sha256(SHIM_SOURCE.encode()).hexdigest()[:16]
    so_path = os.path.join(SHIM_CACHE_DIR, f"parallel_dirops_{digest}.so")
    if os.path.exists(so_path):
        return so_path
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    os.makedirs(SHIM_CACHE_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=SHIM_CACHE_DIR) as tmp:
        c_path = os.path.join(tmp, "shim.c")
        with open(c_path, "w") as f:
            f.write(SHIM_SOURCE)
        out = os.path.join(tmp, "shim.so")
        try:
            subprocess.run(
                [cc, "-shared", "-fPIC", "-O2", "-o", out, c_path, "-ldl"],
                check=True,
                capture_output=True,
                timeout=SHIM_BUILD_TIMEOUT,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        os.replace(out, so_path)
    return so_path


def _child_env(parallel_dirops: bool) -> dict[str, str]:
    """Environment of the foreground emulator: the shim preloaded when wanted and buildable."""
    env = dict(os.environ)
    if parallel_dirops:
        shim = dirops_shim()
        if shim is None:
            print("latency_fs: no C compiler: lookups in one directory stay serialised", file=sys.stderr)
        else:
            env["LD_PRELOAD"] = " ".join(p for p in (shim, env.get("LD_PRELOAD", "")) if p)
    return env


def _fuse_class() -> Any:
    """mfusepy.FUSE whose read callback preads straight into libfuse's buffer (no bytes object, no copy)."""
    import ctypes

    mfusepy = _import_mfusepy()

    class ZeroCopyFUSE(mfusepy.FUSE):
        def read(self, path: Any, buf: Any, size: int, offset: int, fip: Any) -> int:
            fi = fip.contents
            if self.operations.is_virtual(fi.fh):
                return super().read(path, buf, size, offset, fip)
            dest = ctypes.cast(buf, ctypes.POINTER(ctypes.c_char * size)).contents
            return self.operations.read_into(fi, memoryview(dest).cast("B"), offset)

    return ZeroCopyFUSE


# -- bdi read-ahead ------------------------------------------------------------------------------
def _mount_dev(mountpoint: str) -> str | None:
    """``major:minor`` of the FUSE mount at *mountpoint*, read from mountinfo (never touches the FS)."""
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mountinfo") as f:
        found = None
        for line in f:
            fields = line.split()
            mp = fields[4].replace("\\040", " ")
            sep = fields.index("-")
            if mp == target and fields[sep + 1].startswith("fuse"):
                found = fields[2]
        return found


def _set_read_ahead(mountpoint: str, kb: int) -> None:
    """Wait for the mount to appear, then write *kb* to its bdi's read_ahead_kb."""
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while time.monotonic() < deadline:
        dev = _mount_dev(mountpoint)
        if dev:
            try:
                with open(f"/sys/class/bdi/{dev}/read_ahead_kb", "w") as f:
                    f.write(str(kb))
            except OSError as e:
                print(f"latency_fs: cannot set read_ahead_kb: {e}", file=sys.stderr)
            return
        time.sleep(POLL_INTERVAL)


def read_ahead_kb_of(mountpoint: str) -> int | None:
    """Current read_ahead_kb of the FUSE mount at *mountpoint* (None if not mounted)."""
    dev = _mount_dev(mountpoint)
    if not dev:
        return None
    with open(f"/sys/class/bdi/{dev}/read_ahead_kb") as f:
        return int(f.read())


# -- foreground process ---------------------------------------------------------------------------
def run_foreground(args: argparse.Namespace, argv: list[str]) -> int:
    if not args.serial_dirops and "parallel_dirops_" not in os.environ.get("LD_PRELOAD", ""):
        env = _child_env(True)
        if "LD_PRELOAD" in env and env["LD_PRELOAD"] != os.environ.get("LD_PRELOAD"):
            # Re-execute with the shim preloaded (it must be in place before libfuse is loaded).
            os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)
    ops = make_operations(
        args.src,
        args.latency_ms / 1000.0,
        args.mbps * 1e6,
        keep_cache=not args.no_keep_cache,
        attr_timeout=args.attr_timeout,
        read_ahead_kb=args.read_ahead_kb,
        mountpoint=args.mnt,
    )
    status = 0
    try:
        _fuse_class()(
            ops,
            args.mnt,
            raw_fi=True,
            foreground=True,
            nothreads=False,
            ro=True,
            fsname="latency_fs",
            subtype="latency_fs",
            max_threads=str(args.threads),
            max_idle_threads=str(args.threads),
        )
    except RuntimeError as e:  # libfuse's non-zero exit (e.g. a signal while busy): reported, not a traceback
        print(f"latency_fs: fuse_main returned {e}", file=sys.stderr)
        status = 1
    finally:
        print("latency_fs: counters " + json.dumps(ops.snapshot()), file=sys.stderr, flush=True)
    return status


# -- helpers for callers --------------------------------------------------------------------------
def is_fuse_mount(mountpoint: str) -> bool:
    """True when *mountpoint* is listed as a FUSE mount (reads /proc, never touches the FS)."""
    try:
        return _mount_dev(mountpoint) is not None
    except OSError:
        return False


def force_unmount(mountpoint: str) -> None:
    """``fusermount3 -u``, then ``umount -l`` if still mounted; never raises."""
    for cmd in (["fusermount3", "-u", "-q", mountpoint], ["umount", "-l", mountpoint]):
        if not is_fuse_mount(mountpoint):
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(cmd, timeout=UMOUNT_TIMEOUT, capture_output=True, check=False)


def read_stats(mountpoint: str) -> dict[str, Any]:
    with open(os.path.join(mountpoint, STATS_NAME), "rb", buffering=0) as f:
        return json.loads(f.readall())


class Emulator:
    """A running emulator mount (from :func:`emulated`)."""

    def __init__(self, src: str, mnt: str, proc: subprocess.Popen, log_path: str) -> None:
        self.src = src
        self.mnt = mnt
        self.proc = proc
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stats(self) -> dict[str, Any]:
        return read_stats(self.mnt)

    def counters(self) -> dict[str, float]:
        return self.stats()["counters"]


def _command(
    src: str,
    mnt: str,
    latency_ms: float,
    mbps: float,
    read_ahead_kb: int | None,
    threads: int,
    keep_cache: bool,
    attr_timeout: float,
    parallel_dirops: bool = True,
) -> list[str]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        src,
        mnt,
        "--foreground",
        "--latency-ms",
        str(latency_ms),
        "--mbps",
        str(mbps),
        "--threads",
        str(threads),
        "--attr-timeout",
        str(attr_timeout),
    ]
    if read_ahead_kb is not None:
        cmd += ["--read-ahead-kb", str(read_ahead_kb)]
    if not keep_cache:
        cmd.append("--no-keep-cache")
    if not parallel_dirops:
        cmd.append("--serial-dirops")
    return cmd


def _wait_live(mnt: str, proc: subprocess.Popen, log_path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                raise RuntimeError(f"latency_fs exited with {proc.returncode}: {f.read()[-2000:]}")
        if is_fuse_mount(mnt):
            try:
                read_stats(mnt)
                return
            except (OSError, ValueError):
                pass
        time.sleep(POLL_INTERVAL)
    raise RuntimeError(f"latency_fs did not mount {mnt} within {timeout} s")


def _stop(mnt: str, proc: subprocess.Popen) -> None:
    """Unmount and reap the emulator: fusermount3 -u, SIGTERM if still mounted, SIGKILL, lazy unmount."""
    try:
        if proc.poll() is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    ["fusermount3", "-u", "-q", mnt], timeout=UMOUNT_TIMEOUT, capture_output=True, check=False
                )
            if is_fuse_mount(mnt):  # busy (a file still open): let libfuse detach it on SIGTERM
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=EXIT_TIMEOUT)
    finally:
        force_unmount(mnt)


@contextlib.contextmanager
def emulated(
    src: str,
    mnt: str,
    latency_ms: float = DEFAULT_LATENCY_MS,
    mbps: float = DEFAULT_MBPS,
    read_ahead_kb: int | None = None,
    threads: int = DEFAULT_THREADS,
    keep_cache: bool = True,
    attr_timeout: float = DEFAULT_ATTR_TIMEOUT,
    parallel_dirops: bool = True,
    log_path: str | None = None,
    timeout: float = MOUNT_TIMEOUT,
) -> Iterator[Emulator]:
    """Mount the emulator of *src* on *mnt* for the duration of the block; always unmounts."""
    os.makedirs(mnt, exist_ok=True)
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="latency_fs.", suffix=".log")
        os.close(fd)
    cmd = _command(src, mnt, latency_ms, mbps, read_ahead_kb, threads, keep_cache, attr_timeout, parallel_dirops)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        _wait_live(mnt, proc, log_path, timeout)
        yield Emulator(src, mnt, proc, log_path)
    finally:
        _stop(mnt, proc)


# -- command line ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("src", nargs="?", help="directory to mirror")
    p.add_argument("mnt", nargs="?", help="mount point")
    p.add_argument("--latency-ms", type=float, default=DEFAULT_LATENCY_MS, help="cost of every request (ms)")
    p.add_argument("--mbps", type=float, default=DEFAULT_MBPS, help="per-handle bandwidth (MB/s, 10**6 B)")
    p.add_argument(
        "--read-ahead-kb",
        type=int,
        default=None,
        help="set the mount's bdi read_ahead_kb (default: leave the kernel's 128)",
    )
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="FUSE worker threads")
    p.add_argument("--attr-timeout", type=float, default=DEFAULT_ATTR_TIMEOUT, help="entry/attr cache seconds")
    p.add_argument("--no-keep-cache", action="store_true", help="drop the kernel page cache on every open")
    p.add_argument(
        "--serial-dirops",
        action="store_true",
        help="do not preload the shim that enables parallel lookups in one directory",
    )
    p.add_argument("--foreground", action="store_true", help="stay in the foreground (else return once live)")
    p.add_argument("--log", default=None, help="log file of a background emulator (default: a temp file)")
    p.add_argument("--umount", metavar="MNT", help="unmount an emulator mount and exit")
    args = p.parse_args(argv)
    if not args.umount and (not args.src or not args.mnt):
        p.error("SRC and MNT are required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.umount:
        force_unmount(args.umount)
        return 0 if not is_fuse_mount(args.umount) else 1
    if not os.path.isdir(args.src):
        print(f"latency_fs: {args.src}: not a directory", file=sys.stderr)
        return 2
    if args.foreground:
        return run_foreground(args, sys.argv[1:] if argv is None else argv)
    # Background: start a foreground copy detached from this terminal, return once it is live.
    log_path = args.log or tempfile.mkstemp(prefix="latency_fs.", suffix=".log")[1]
    cmd = _command(
        args.src,
        args.mnt,
        args.latency_ms,
        args.mbps,
        args.read_ahead_kb,
        args.threads,
        not args.no_keep_cache,
        args.attr_timeout,
        not args.serial_dirops,
    )
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        _wait_live(args.mnt, proc, log_path, MOUNT_TIMEOUT)
    except RuntimeError as e:
        _stop(args.mnt, proc)
        print(f"latency_fs: {e}", file=sys.stderr)
        return 1
    print(f"latency_fs: pid {proc.pid} mounted {args.mnt} (log {log_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
