"""Emulator of latency-bound storage: a read-only FUSE mirror whose every request costs time.

Benchmarks need a source that behaves like network storage (NFS, a parallel file system, an object
store gateway, a FUSE client such as gcsfuse / s3fs / sshfs) on a machine that only has a local disk.
This mirror of a directory charges every read ``latency + size / bandwidth`` and every lookup,
open, readlink and readdir a metadata latency (the cost model and the FUSE operations are in
:mod:`latency_ops`). Its :class:`Behaviour` switches are the ways real sources differ:

* ``latency_ms`` / ``meta_ms``: cost of a data request / of a metadata request (default: the same);
* ``mbps`` and ``bandwidth``: per-stream bandwidth, charged per open handle (``handle``: NFS, one
  TCP stream per file) or per request (``request``: object-store range GETs, each on its own);
* ``read_ahead_kb``: the source mount's own kernel read-ahead (128: the kernel default of an NFS
  or FUSE client; 0: none, buffered reads go to the source page by page; larger values raise it);
* ``cache``: the kernel page cache of the source kept across opens (``keep``: keep_cache, NFS
  close-to-open), dropped at every open (``drop``) or not used at all (``direct``: direct_io);
* ``attr_timeout``: the kernel's attribute / entry cache lifetime (1 s: libfuse's default, close
  to NFS's acregmin);
* ``parallel_dirops``: lookups and readdirs of one directory in parallel (a shim sets
  ``FUSE_PARALLEL_DIROPS`` in the INIT reply) or serialised by the kernel, which is what every
  FUSE source on libfuse 3.14 (Debian 12) gets, since libfuse before 3.16 never passes the flag on;
* ``stream`` (with ``stream_waste_kb``, ``stream_skip_kb``): every handle is one ranged download,
  as in rclone / s3fs / gcsfuse without their file cache: reads continuing the handle's stream
  cost only their transfer, any other read restarts it (a new request latency plus a wasted
  transfer); counted as ``restarts`` and ``transferred_bytes`` vs ``read_bytes``.

Always: many worker threads and a raised ``max_background`` so the kernel may keep many read-ahead
requests in flight. Counters (reads, bytes, opens, getattrs, readdirs, peak concurrency...) are
readable as JSON from the hidden file ``MNT/.latency_fs_stats`` (not listed, costs no latency) and
are printed to the emulator's log at exit.

Usage::

    python benchmarks/latency_fs.py SRC MNT --latency-ms 1.5 --mbps 400 [--foreground]
    python benchmarks/latency_fs.py SRC MNT --behaviour dirops=serial,ra=0,cache=drop,lat=5,bw=request
    python benchmarks/latency_fs.py --umount MNT

From Python (never leaves a mount behind, even on error)::

    with emulated(src, mnt, latency_ms=1.5, mbps=400) as emu:
        ...
        emu.stats()  # -> dict
    with emulated(src, mnt, behaviour=Behaviour.parse("dirops=serial,lat=5")) as emu:
        ...
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from benchkit.system import force_unmount  # noqa: F401 (re-exported: latency_fs.force_unmount)

# Default per-request latency (ms): a same-datacenter network file system round trip.
DEFAULT_LATENCY_MS = 1.5
# Default per-stream bandwidth (MB/s, 10**6 bytes): one TCP stream of a 10 GbE-class client.
DEFAULT_MBPS = 400.0
# Default FUSE worker threads: enough for 16 parallel preads plus lookups from other readers.
DEFAULT_THREADS = 64
# Kernel requests in flight (max_background): a network client pipelines many read-ahead requests.
DEFAULT_MAX_BACKGROUND = 64
# The reliability tests' source (tests/faultfs.py): no costs, no page cache (every read and lookup
# reaches the emulator, so a fault applies to the very next request), zero kernel cache timeouts,
# libfuse's own defaults for threads (10), max_background and serial lookups.
FAULT_SPEC = "lat=0,meta=0,mbps=inf,cache=direct,attr=0,dirops=serial,threads=0,bg=default"
# Kernel attribute / entry cache lifetime (s): the libfuse default, close to NFS's acregmin.
DEFAULT_ATTR_TIMEOUT = 1.0
# Wasted transfer of a restarted ranged stream (KiB): what an abandoned GET had in flight; rclone
# serve on loopback moved about 12 MB per restarted 4 KiB read in this project's measurements.
DEFAULT_STREAM_WASTE_KB = 8192
# A stream read this far ahead (KiB) continues the stream by reading the gap (a skip, not a restart).
DEFAULT_STREAM_SKIP_KB = 1024
# The kernel's own default read-ahead of a new mount (KiB): what "leave it" means.
KERNEL_READ_AHEAD_KB = 128
# Name of the hidden counters file at the mount root (same as latency_ops.STATS_NAME; this module
# does not import latency_ops, which loads libfuse).
STATS_NAME = ".latency_fs_stats"
# Seconds to wait for a mount to become live before giving up.
MOUNT_TIMEOUT = 30.0
# Poll interval (s) while waiting for a mount or an unmount.
POLL_INTERVAL = 0.05
# Seconds to wait for the emulator process to exit after an unmount.
EXIT_TIMEOUT = 15.0
# Seconds an unmounted emulator gets to leave on its own before SIGTERM.
UNMOUNT_EXIT_WAIT = 2.0
# Timeout (s) of fusermount3 / umount helper commands.
UMOUNT_TIMEOUT = 30.0
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


# -- behaviour ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Behaviour:
    """The emulator's switches (see the module docstring); ``parse`` reads ``key=value,...`` specs."""

    latency_ms: float = DEFAULT_LATENCY_MS
    """Cost of every data request (ms)."""
    meta_ms: float | None = None
    """Cost of every lookup / getattr, open, readlink, readdir (ms); None: the same as latency_ms."""
    mbps: float = DEFAULT_MBPS
    """Bandwidth of one stream (MB/s, 10**6 B)."""
    bandwidth: str = "handle"
    """``handle``: one stream per open handle; ``request``: every request its own stream."""
    read_ahead_kb: int | None = None
    """The source mount's kernel read-ahead (KiB); None leaves the kernel's default (128); 0: none."""
    cache: str = "keep"
    """Kernel page cache of the source: ``keep`` across opens, ``drop`` at every open, ``direct`` (none)."""
    attr_timeout: float = DEFAULT_ATTR_TIMEOUT
    """Kernel attribute / entry cache lifetime (s)."""
    parallel_dirops: bool = True
    """Lookups of one directory in parallel (shim) or serialised (libfuse 3.14 as shipped)."""
    threads: int = DEFAULT_THREADS
    """FUSE worker threads (0: libfuse's default, 10)."""
    max_background: int | None = DEFAULT_MAX_BACKGROUND
    """Kernel requests in flight (None: libfuse's default)."""
    stream: bool = False
    """Every handle is one ranged download stream (out-of-order reads restart it)."""
    stream_waste_kb: int = DEFAULT_STREAM_WASTE_KB
    """Wasted transfer charged by a stream restart (KiB)."""
    stream_skip_kb: int = DEFAULT_STREAM_SKIP_KB
    """A read up to this far ahead continues the stream (KiB)."""

    # short spec keys -> field names
    KEYS = {
        "lat": "latency_ms",
        "latency": "latency_ms",
        "meta": "meta_ms",
        "mbps": "mbps",
        "bw": "bandwidth",
        "ra": "read_ahead_kb",
        "cache": "cache",
        "attr": "attr_timeout",
        "dirops": "parallel_dirops",
        "threads": "threads",
        "bg": "max_background",
        "stream": "stream",
        "waste": "stream_waste_kb",
        "skip": "stream_skip_kb",
    }

    def __post_init__(self) -> None:
        if self.bandwidth not in ("handle", "request"):
            raise ValueError(f"bw must be handle or request, not {self.bandwidth!r}")
        if self.cache not in ("keep", "drop", "direct"):
            raise ValueError(f"cache must be keep, drop or direct, not {self.cache!r}")
        if self.latency_ms < 0 or (self.meta_ms or 0) < 0 or self.mbps <= 0 or self.attr_timeout < 0:
            raise ValueError("lat, meta and attr must be >= 0 and mbps > 0")
        if (self.read_ahead_kb is not None and self.read_ahead_kb < 0) or self.threads < 0:
            raise ValueError("ra and threads must be >= 0")
        if self.max_background is not None and self.max_background < 1:
            raise ValueError("bg must be >= 1 (or default)")
        if self.stream and self.bandwidth != "handle":
            raise ValueError("stream=on needs bw=handle (a stream is one handle's download)")
        if self.stream_waste_kb < 0 or self.stream_skip_kb < 0:
            raise ValueError("waste and skip must be >= 0")

    @classmethod
    def parse(cls, spec: str, base: Behaviour | None = None) -> Behaviour:
        """``lat=5,meta=0.8,mbps=400,bw=request,ra=0,cache=drop,attr=1,dirops=serial`` over *base*.

        Raises ValueError with a one-line message for an unknown key or a bad value.
        """
        changes: dict[str, Any] = {}
        for item in (p.strip() for p in spec.split(",")):
            if not item:
                continue
            key, sep, value = item.partition("=")
            name = cls.KEYS.get(key.strip())
            if not sep or name is None:
                raise ValueError(f"bad emulator setting {item!r}: use key=value with key in {', '.join(cls.KEYS)}")
            value = value.strip()
            try:
                if name == "parallel_dirops":
                    if value not in ("parallel", "serial"):
                        raise ValueError
                    changes[name] = value == "parallel"
                elif name == "stream":
                    if value not in ("on", "off"):
                        raise ValueError
                    changes[name] = value == "on"
                elif name in ("bandwidth", "cache"):
                    changes[name] = value
                elif name in ("read_ahead_kb", "max_background"):
                    changes[name] = None if value in ("default", "kernel") else int(value)
                elif name in ("threads", "stream_waste_kb", "stream_skip_kb"):
                    changes[name] = int(value)
                else:
                    changes[name] = float(value)
            except ValueError:
                raise ValueError(f"bad value for emulator setting {key}: {value!r}") from None
        return dataclasses.replace(base or cls(), **changes)

    @property
    def meta_latency_ms(self) -> float:
        return self.latency_ms if self.meta_ms is None else self.meta_ms

    def spec(self) -> str:
        """The full ``key=value,...`` spec of this behaviour (parse(spec()) == self)."""
        ra = "default" if self.read_ahead_kb is None else str(self.read_ahead_kb)
        return (
            f"lat={self.latency_ms:g},meta={self.meta_latency_ms:g},mbps={self.mbps:g},bw={self.bandwidth},"
            f"ra={ra},cache={self.cache},attr={self.attr_timeout:g},"
            f"dirops={'parallel' if self.parallel_dirops else 'serial'},threads={self.threads},"
            f"bg={'default' if self.max_background is None else self.max_background},"
            f"stream={'on' if self.stream else 'off'},waste={self.stream_waste_kb},skip={self.stream_skip_kb}"
        )

    def describe(self) -> str:
        """One line for table titles: ``1.5 ms (+0.8 ms metadata), 400 MB/s per handle, ...``."""
        meta = "" if self.meta_ms is None else f" ({self.meta_ms:g} ms metadata)"
        ra = KERNEL_READ_AHEAD_KB if self.read_ahead_kb is None else self.read_ahead_kb
        return (
            f"{self.latency_ms:g} ms{meta}, {self.mbps:g} MB/s per {self.bandwidth}, read-ahead {ra} KiB, "
            f"page cache {self.cache}, attr {self.attr_timeout:g} s, "
            f"lookups {'parallel' if self.parallel_dirops else 'serialised'}"
            + (f", ranged streams per handle (restart wastes {self.stream_waste_kb} KiB)" if self.stream else "")
        )

    def args(self) -> list[str]:
        """Command-line options of the foreground emulator for this behaviour."""
        out = [
            "--latency-ms",
            str(self.latency_ms),
            "--mbps",
            str(self.mbps),
            "--bandwidth",
            self.bandwidth,
            "--cache",
            self.cache,
            "--threads",
            str(self.threads),
            "--attr-timeout",
            str(self.attr_timeout),
        ]
        if self.meta_ms is not None:
            out += ["--meta-ms", str(self.meta_ms)]
        if self.read_ahead_kb is not None:
            out += ["--read-ahead-kb", str(self.read_ahead_kb)]
        if not self.parallel_dirops:
            out.append("--serial-dirops")
        out += ["--max-background", "default" if self.max_background is None else str(self.max_background)]
        if self.stream:
            out += ["--stream", "--stream-waste-kb", str(self.stream_waste_kb)]
            out += ["--stream-skip-kb", str(self.stream_skip_kb)]
        return out


def behaviour_of(args: argparse.Namespace) -> Behaviour:
    """The Behaviour of parsed command-line options (``--behaviour`` spec first, explicit options over it)."""
    base = Behaviour()
    if getattr(args, "behaviour", None):
        base = Behaviour.parse(args.behaviour)
    changes: dict[str, Any] = {}
    names = ("latency_ms", "meta_ms", "mbps", "bandwidth", "read_ahead_kb", "cache", "attr_timeout", "threads")
    for name in (*names, "stream_waste_kb", "stream_skip_kb"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    bg = getattr(args, "max_background", None)
    if bg is not None:
        changes["max_background"] = None if bg == "default" else int(bg)
    if getattr(args, "serial_dirops", False):
        changes["parallel_dirops"] = False
    if getattr(args, "stream", False):
        changes["stream"] = True
    return dataclasses.replace(base, **changes)


# -- foreground process ---------------------------------------------------------------------------
def run_foreground(args: argparse.Namespace, argv: list[str]) -> int:
    b = behaviour_of(args)
    if b.parallel_dirops and "parallel_dirops_" not in os.environ.get("LD_PRELOAD", ""):
        env = _child_env(True)
        if "LD_PRELOAD" in env and env["LD_PRELOAD"] != os.environ.get("LD_PRELOAD"):
            # Re-execute with the shim preloaded (it must be in place before libfuse is loaded).
            os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)
    import latency_ops  # loads libfuse: only the emulator process needs it

    model = latency_ops.Model(
        latency=b.latency_ms / 1000.0,
        meta_latency=b.meta_latency_ms / 1000.0,
        bytes_per_s=b.mbps * 1e6,
        bandwidth=b.bandwidth,
        cache=b.cache,
        attr_timeout=b.attr_timeout,
        stream=b.stream,
        stream_waste=b.stream_waste_kb * 1024,
        stream_skip=b.stream_skip_kb * 1024,
        max_background=b.max_background,
    )
    on_init = None
    if b.read_ahead_kb is not None:
        kb, mnt = b.read_ahead_kb, args.mnt

        def on_init() -> None:
            threading.Thread(target=_set_read_ahead, args=(mnt, kb), daemon=True).start()

    return latency_ops.serve(args.src, args.mnt, model, b.threads, on_init, args.control, args.fsname)


# -- helpers for callers --------------------------------------------------------------------------
def is_fuse_mount(mountpoint: str) -> bool:
    """True when *mountpoint* is listed as a FUSE mount (reads /proc, never touches the FS)."""
    try:
        return _mount_dev(mountpoint) is not None
    except OSError:
        return False


def read_stats(mountpoint: str) -> dict[str, Any]:
    with open(os.path.join(mountpoint, STATS_NAME), "rb", buffering=0) as f:
        return json.loads(f.readall())


class Emulator:
    """A running emulator mount (from :func:`emulated`)."""

    def __init__(
        self, src: str, mnt: str, proc: subprocess.Popen, log_path: str, behaviour: Behaviour | None = None
    ) -> None:
        self.src = src
        self.mnt = mnt
        self.proc = proc
        self.log_path = log_path
        self.behaviour = behaviour or Behaviour()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stats(self) -> dict[str, Any]:
        return read_stats(self.mnt)

    def counters(self) -> dict[str, float]:
        return self.stats()["counters"]


def _command(
    src: str, mnt: str, behaviour: Behaviour, control: str | None = None, fsname: str | None = None
) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), src, mnt, "--foreground", *behaviour.args()]
    if control:
        cmd += ["--control", control]
    if fsname:
        cmd += ["--fsname", fsname]
    return cmd


def _wait_live(mnt: str, proc: subprocess.Popen, log_path: str, timeout: float, read_ahead_kb: int | None) -> None:
    """Wait until the mount answers its stats file and its read-ahead is what was asked."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                raise RuntimeError(f"latency_fs exited with {proc.returncode}: {f.read()[-2000:]}")
        if is_fuse_mount(mnt):
            try:
                read_stats(mnt)
                if read_ahead_kb is None or read_ahead_kb_of(mnt) == read_ahead_kb:
                    return
            except (OSError, ValueError):
                pass
        time.sleep(POLL_INTERVAL)
    raise RuntimeError(f"latency_fs did not mount {mnt} (with read_ahead_kb {read_ahead_kb}) within {timeout} s")


def _stop(mnt: str, proc: subprocess.Popen) -> None:
    """Unmount and reap the emulator: fusermount3 -u, SIGTERM if still mounted, SIGKILL, lazy unmount."""
    try:
        if proc.poll() is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    ["fusermount3", "-u", "-q", mnt], timeout=UMOUNT_TIMEOUT, capture_output=True, check=False
                )
            try:  # unmounted: libfuse's loop ends by itself; busy or gone already: SIGTERM detaches it
                proc.wait(timeout=UNMOUNT_EXIT_WAIT)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=EXIT_TIMEOUT)
    finally:
        force_unmount(mnt)


def _start(
    src: str, mnt: str, behaviour: Behaviour, log_path: str, control: str | None = None, fsname: str | None = None
) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            _command(src, mnt, behaviour, control, fsname),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


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
    *,
    behaviour: Behaviour | None = None,
    control: str | None = None,
    fsname: str | None = None,
) -> Iterator[Emulator]:
    """Mount the emulator of *src* on *mnt* for the duration of the block; always unmounts.

    The keyword arguments describe the behaviour (``keep_cache=False`` is ``cache="drop"``); a
    *behaviour* given instead overrides all of them. *control*: the fault switches' control file
    (see :mod:`latency_ops`); *fsname*: the mount's name (default ``latency_fs``).
    """
    if behaviour is None:
        behaviour = Behaviour(
            latency_ms=latency_ms,
            mbps=mbps,
            read_ahead_kb=read_ahead_kb,
            threads=threads,
            cache="keep" if keep_cache else "drop",
            attr_timeout=attr_timeout,
            parallel_dirops=parallel_dirops,
        )
    os.makedirs(mnt, exist_ok=True)
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="latency_fs.", suffix=".log")
        os.close(fd)
    proc = _start(src, mnt, behaviour, log_path, control, fsname)
    try:
        _wait_live(mnt, proc, log_path, timeout, behaviour.read_ahead_kb)
        yield Emulator(src, mnt, proc, log_path, behaviour)
    finally:
        _stop(mnt, proc)


# -- command line ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("src", nargs="?", help="directory to mirror")
    p.add_argument("mnt", nargs="?", help="mount point")
    p.add_argument(
        "--behaviour",
        default=None,
        help="settings as key=value,... (lat, meta, mbps, bw=handle|request, ra, cache=keep|drop|direct, attr, "
        "dirops=parallel|serial, threads, stream=on|off, waste=KiB, skip=KiB); the options below override it",
    )
    p.add_argument("--latency-ms", type=float, default=None, help=f"cost of every request (ms, {DEFAULT_LATENCY_MS})")
    p.add_argument("--meta-ms", type=float, default=None, help="cost of every metadata request (default: latency)")
    p.add_argument("--mbps", type=float, default=None, help=f"per-stream bandwidth (MB/s, 10**6 B, {DEFAULT_MBPS})")
    p.add_argument(
        "--bandwidth", choices=("handle", "request"), default=None, help="a stream is one handle or one request"
    )
    p.add_argument(
        "--read-ahead-kb",
        type=int,
        default=None,
        help=f"set the mount's bdi read_ahead_kb (default: leave the kernel's {KERNEL_READ_AHEAD_KB}; 0: none)",
    )
    p.add_argument("--cache", choices=("keep", "drop", "direct"), default=None, help="kernel page cache of the mount")
    p.add_argument("--threads", type=int, default=None, help=f"FUSE worker threads ({DEFAULT_THREADS}; 0: libfuse's)")
    p.add_argument(
        "--max-background",
        default=None,
        help=f"kernel requests in flight ({DEFAULT_MAX_BACKGROUND}; default: libfuse's)",
    )
    p.add_argument("--control", default=None, help="control file of the fault switches (JSON: eio, hang, hang_meta)")
    p.add_argument("--fsname", default="latency_fs", help="name of the mount (latency_fs)")
    p.add_argument("--attr-timeout", type=float, default=None, help="entry/attr cache seconds (1)")
    p.add_argument("--no-keep-cache", action="store_true", help="same as --cache drop")
    p.add_argument(
        "--serial-dirops",
        action="store_true",
        help="do not preload the shim that enables parallel lookups in one directory",
    )
    p.add_argument("--stream", action="store_true", help="every handle is one ranged download stream")
    p.add_argument("--stream-waste-kb", type=int, default=None, help="wasted transfer of a stream restart (KiB)")
    p.add_argument("--stream-skip-kb", type=int, default=None, help="a read this far ahead continues a stream")
    p.add_argument("--foreground", action="store_true", help="stay in the foreground (else return once live)")
    p.add_argument("--log", default=None, help="log file of a background emulator (default: a temp file)")
    p.add_argument("--umount", metavar="MNT", help="unmount an emulator mount and exit")
    args = p.parse_args(argv)
    if args.no_keep_cache and args.cache is None:
        args.cache = "drop"
    if not args.umount and (not args.src or not args.mnt):
        p.error("SRC and MNT are required")
    try:
        args.behaviour_value = behaviour_of(args)
    except ValueError as e:
        p.error(str(e))
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
    behaviour = args.behaviour_value
    proc = _start(args.src, args.mnt, behaviour, log_path)
    try:
        _wait_live(args.mnt, proc, log_path, MOUNT_TIMEOUT, behaviour.read_ahead_kb)
    except RuntimeError as e:
        _stop(args.mnt, proc)
        print(f"latency_fs: {e}", file=sys.stderr)
        return 1
    print(f"latency_fs: pid {proc.pid} mounted {args.mnt} (log {log_path}; {behaviour.describe()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
