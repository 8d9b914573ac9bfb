"""Mount lifecycle: validate, mount, signal readiness, serve, handle signals, unmount.

Threads of a running daemon:

* the FUSE thread runs ``fuse_main`` (libfuse's multithreaded loop) until the mount goes away;
* the main thread owns the signal handlers. Python handlers were installed before ``fuse_main``
  starts, so libfuse (which only replaces default handlers) leaves them alone; they only queue the
  signal and wake the main loop, which then acts: SIGTERM/SIGINT unmount cleanly, SIGHUP reloads
  the configuration, SIGUSR1 logs a one-line stats summary. The loop also sends periodic
  ``STATUS=`` lines when run by systemd;
* the readiness thread polls ``/proc/self/mountinfo`` until the mount is live and libfuse's init
  has run, tunes the mount's read-ahead in ``/sys/class/bdi``, then reports readiness (a pipe to
  the waiting ``fastfs mount`` parent and/or ``READY=1``);
* the invalidation thread serves asynchronous kernel invalidations (the stats file in no_open
  mode, whose pages are locked by the very read that asks). The engine's invalidations (a source
  file changed, detected on open) are synchronous, so the kernel has dropped stale attributes and
  pages before the open returns; the engine calls them outside its locks, so the kernel may wait
  for in-flight reads of that file without a cycle.

This module does not import the FUSE binding at load time: ``fastfs mount`` validates and forks
first, and only the daemon process loads libfuse.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import logging
import os
import resource
import signal
import stat
import subprocess
import threading
import time
from typing import Any

from fastfs.config.loader import ConfigError, load_config, one_line, parse_listen_address
from fastfs.config.schema import Config
from fastfs.daemon import logsetup, notify
from fastfs.daemon.control import CONTROL_NAME
from fastfs.daemon.statscli import summary_line

log = logging.getLogger("fastfs.mount")

MOUNTINFO = "/proc/self/mountinfo"
FSTYPE = "fuse.fastfs"
# The FUSE device: libfuse (and fusermount3, with the caller's own rights) must open it read-write.
FUSE_DEVICE = "/dev/fuse"
# Seconds to wait for the kernel mount and libfuse init before giving up.
READY_TIMEOUT = 60.0
# Seconds between mountinfo polls while waiting for the mount (cheap; startup takes ~100 ms).
READY_POLL = 0.02
# Upper bound of one main-loop sleep, so queued signals are handled promptly even without a wake-up.
MAIN_TICK = 1.0
# Seconds a fusermount3/umount subprocess may take before it is abandoned.
UNMOUNT_TIMEOUT = 30.0
# Paths awaiting kernel invalidation beyond which new requests are dropped (a mass change is rare).
MAX_PENDING_INVALIDATIONS = 65536


class MountError(Exception):
    """A one-line reason the mount cannot start."""


# -- /proc/self/mountinfo -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MountEntry:
    """One line of mountinfo."""

    device: str  # "major:minor"
    mountpoint: str
    fstype: str
    source: str


def unescape_field(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal ``\\NNN``."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(mountinfo: str = MOUNTINFO) -> list[MountEntry]:
    """All mounts visible to this process, in mount order."""
    entries = []
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, sep, right = line.partition(" - ")
            fields = left.split()
            tail = right.split()
            if not sep or len(fields) < 5 or len(tail) < 2:
                continue
            entries.append(MountEntry(fields[2], unescape_field(fields[4]), tail[0], unescape_field(tail[1])))
    return entries


def find_mount(path: str) -> MountEntry | None:
    """The topmost mount whose mount point is *path* (compared after realpath), or None."""
    target = os.path.realpath(path)
    found = None
    for entry in mounts():
        if entry.mountpoint == target:
            found = entry
    return found


def is_fastfs(entry: MountEntry | None) -> bool:
    """True for a fastfs mount, live or dead (the kernel keeps the type of a mount whose daemon died).

    This is the one test of "is this a fastfs mount" the daemon's commands use: other FUSE file
    systems (sshfs, rclone, a storage emulator) have other types and are never touched.
    """
    return entry is not None and entry.fstype == FSTYPE


def containing_mount(path: str) -> MountEntry | None:
    """The mount holding *path*: the topmost mount on the longest mount point that is *path* or one of
    its parents (after realpath of *path*), or None."""
    target = os.path.realpath(path)
    best: MountEntry | None = None
    for entry in mounts():
        point = entry.mountpoint
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best.mountpoint)):
            best = entry
    return best


# -- validation -----------------------------------------------------------------------------------
def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def check_paths(source: str, mountpoint: str) -> tuple[str, str]:
    """Validate SRC and MNT; returns their real paths or raises :class:`MountError` (one line)."""
    try:
        st = os.stat(source)
    except FileNotFoundError:
        raise MountError(f"source {source} does not exist") from None
    except OSError as e:
        raise MountError(f"source {source}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MountError(f"source {source} is not a directory")
    src = os.path.realpath(source)
    mnt = os.path.realpath(mountpoint)
    try:
        st = os.stat(mountpoint)
    except FileNotFoundError:
        raise MountError(f"mountpoint {mountpoint} does not exist") from None
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise MountError(f"mountpoint {mountpoint} is a dead mount (run: fastfs umount {mountpoint})") from None
        raise MountError(f"mountpoint {mountpoint}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MountError(f"mountpoint {mountpoint} is not a directory")
    entry = find_mount(mnt)
    if entry is not None:
        raise MountError(f"mountpoint {mountpoint} is already a mount point ({entry.fstype} from {entry.source})")
    try:
        if os.listdir(mnt):
            raise MountError(f"mountpoint {mountpoint} is not empty")
    except OSError as e:
        raise MountError(f"mountpoint {mountpoint}: {e.strerror}") from None
    if _inside(mnt, src):
        raise MountError(f"mountpoint {mountpoint} is inside source {source}")
    if _inside(src, mnt):
        raise MountError(f"source {source} is inside mountpoint {mountpoint}")
    return src, mnt


def check_fuse_device(path: str = FUSE_DEVICE) -> None:
    """Raise :class:`MountError` when this process cannot open the FUSE device read-write.

    libfuse opens it directly, and ``fusermount3`` opens it with the caller's rights too, so a user
    without access would otherwise get only "libfuse failed (status N)", the cause being in the log.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise MountError(f"cannot open {path}: {e.strerror} (FUSE needs read-write access to it)") from None
    os.close(fd)


def raise_fd_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open descriptors to its hard limit; returns (before, after).

    The usual soft limit of 1024 is far below what a mount serving hundreds of open files needs
    (the engine sizes its descriptor budget from the limit in force when it starts).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as e:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, one_line(e))
        return soft, soft
    return soft, hard


# -- unmounting -----------------------------------------------------------------------------------
def run_quiet(cmd: list[str], timeout: float = UNMOUNT_TIMEOUT) -> tuple[int, str]:
    """Run a helper; (returncode, one-line stderr). A missing binary or timeout is a failure."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return 1, one_line(e)
    return r.returncode, one_line(r.stderr or r.stdout)


def unmount(mountpoint: str, lazy: bool = False) -> tuple[int, str]:
    """Unmount the fastfs mount on *mountpoint*: ``fusermount3 -u`` (``-z`` when *lazy*), then, for a dead
    mount (its daemon gone) or a lazy request, ``umount -l``. Returns (0, "") or (status, one-line error).

    Refuses (status 1, "... is not a fastfs mount") anything but a fastfs mount, so a foreign FUSE
    file system is never unmounted by fastfs.
    """
    entry = find_mount(mountpoint)
    if entry is None:
        return 1, f"{mountpoint} is not mounted"
    if not is_fastfs(entry):
        return 1, f"{mountpoint} is not a fastfs mount"
    target = entry.mountpoint
    rc, err = run_quiet(["fusermount3", "-u"] + (["-z"] if lazy else []) + [target])
    if rc == 0:
        return 0, ""
    dead = False
    try:
        os.stat(target)
    except OSError as e:
        dead = e.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    if dead or lazy:
        rc2, err2 = run_quiet(["umount", "-l", target])
        if rc2 == 0:
            return 0, ""
        err = err2 or err
    return rc or 1, err or "fusermount3 failed"


def force_unmount(mountpoint: str) -> None:
    """Best effort, for cleaning up a failed start: the fastfs mount on *mountpoint* (if any) is
    unmounted, lazily when it is busy or dead. Never touches another file system."""
    if unmount(mountpoint)[0] != 0 and is_fastfs(find_mount(mountpoint)):
        unmount(mountpoint, lazy=True)


# -- readiness reporting --------------------------------------------------------------------------
class Readiness:
    """Reports startup success or failure once, to a pipe (background parent) and to systemd."""

    def __init__(self, fd: int | None = None) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self.reported = False

    def _send(self, text: str) -> bool:
        with self._lock:
            if self.reported:
                return False
            self.reported = True
            fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.write(fd, (text + "\n").encode())
            except OSError:
                pass
            finally:
                os.close(fd)
        return True

    def ok(self) -> None:
        if self._send("ok"):
            notify.notify("READY=1")

    def error(self, message: str) -> None:
        self._send("error " + one_line(message))


class _Invalidator:
    """Feeds paths to ``fuse_invalidate_path`` from its own thread (deduplicated), for callers that
    run inside a request the kernel must finish before it can invalidate."""

    def __init__(self) -> None:
        self.handle: int | None = None
        self._cond = threading.Condition()
        self._pending: dict[str, None] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="fastfs-invalidate", daemon=True)
        self._thread.start()

    def submit(self, path: str) -> None:
        with self._cond:
            if self.handle and len(self._pending) < MAX_PENDING_INVALIDATIONS:
                self._pending[path] = None
                self._cond.notify()

    def _run(self) -> None:
        from fastfs.daemon import fusebind

        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                paths = list(self._pending)
                self._pending.clear()
                handle = self.handle
            for path in paths:
                fusebind.invalidate_path(handle, path)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self.handle = None
            self._cond.notify()
        self._thread.join(timeout=5)


# -- the daemon -----------------------------------------------------------------------------------
class Daemon:
    """One mount, from engine start to unmount. :meth:`run` returns the process exit status."""

    def __init__(
        self,
        source: str,
        mountpoint: str,
        config: Config,
        *,
        config_path: str | None = None,
        overrides: dict[str, Any] | None = None,
        use_default_path: bool = True,
        readiness: Readiness | None = None,
    ) -> None:
        self.source = source
        self.mountpoint = mountpoint
        self.config = config
        self.config_path = config_path
        self.overrides = dict(overrides or {})
        self.use_default_path = use_default_path
        self.readiness = readiness or Readiness()
        self.engine: Any = None
        self.ops: Any = None
        self.metrics_server: Any = None
        self._signals: collections.deque[int] = collections.deque()
        self._wake = threading.Event()
        self._ready = threading.Event()  # readiness resolved (live, or given up)
        self._live = False
        self._init_done = threading.Event()
        self._fuse_done = threading.Event()
        self._fuse_error: str | None = None
        self._stop_requested = False
        self._unmount_started = False
        self._invalidator: _Invalidator | None = None

    # -- setup ----------------------------------------------------------------------------------
    def fuse_options(self) -> dict[str, Any]:
        """Keyword options for the binding (become ``-o`` options of fuse_main)."""
        fc = self.config.fuse
        fsname = f"fastfs:{self.source}".replace("\\", "\\\\").replace(",", "\\,")
        opts: dict[str, Any] = {
            "ro": True,
            "fsname": fsname,
            "subtype": "fastfs",
            "entry_timeout": fc.entry_timeout,
            "attr_timeout": fc.attr_timeout,
            "negative_timeout": fc.negative_timeout,
            "max_idle_threads": fc.threads,
            "max_threads": fc.threads,
        }
        if fc.allow_other:
            opts["allow_other"] = True
            opts["default_permissions"] = True
        return opts

    def _start_engine(self) -> None:
        from fastfs.daemon.ops import FastOps
        from fastfs.fsio.engine import Engine

        try:
            self.engine = Engine(self.source, self.config)
        except OSError as e:
            raise MountError(f"cannot open source {self.source}: {e.strerror or e}") from None
        if os.path.lexists(os.path.join(self.source, CONTROL_NAME)):
            log.warning(
                "%s has an entry named %s: the name is reserved for fastfs's control directory, so it is "
                "hidden and not reachable through the mount",
                self.source,
                CONTROL_NAME,
            )
        self.ops = FastOps(self.engine, {"source": self.source, "mountpoint": self.mountpoint})
        self._invalidator = _Invalidator()
        self.engine.invalidate = self._invalidate_now
        self.ops.invalidate = self._invalidator.submit
        self.ops.on_init = self._on_init

    def _start_metrics(self) -> None:
        listen = self.config.stats.metrics
        if not listen:
            return
        host, port = parse_listen_address(listen)
        try:
            from fastfs.daemon import metrics
        except ImportError as e:
            log.warning("metrics endpoint %s not started: %s", listen, e)
            return
        try:
            self.metrics_server = metrics.serve(self.ops.snapshot, host, port, self.mountpoint)
        except OSError as e:
            why = os.strerror(e.errno) if e.errno else one_line(e)
            raise MountError(f"stats.metrics: cannot listen on {host}:{port}: {why}") from None

    def _invalidate_now(self, path: str) -> None:
        """Drop the kernel's attributes and pages of *path* (no-op before libfuse's init)."""
        from fastfs.daemon import fusebind

        handle = self.ops.fuse_handle
        if handle and not self._fuse_done.is_set():
            fusebind.invalidate_path(handle, path)

    def _on_init(self, handle: int | None) -> None:
        if self._invalidator is not None:
            self._invalidator.handle = handle
        self._init_done.set()

    def _install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)
        self._wake.set()

    # -- threads --------------------------------------------------------------------------------
    def _fuse_main(self) -> None:
        from fastfs.daemon.ops import FastFUSE

        try:
            FastFUSE(self.ops, self.mountpoint, raw_fi=True, foreground=True, **self.fuse_options())
        except RuntimeError as e:
            self._fuse_error = f"libfuse failed (status {e}; its message is in the log)"
        except BaseException as e:  # noqa: BLE001 - reported as the mount's failure
            self._fuse_error = one_line(f"{type(e).__name__}: {e}")
        finally:
            self._fuse_done.set()
            self._wake.set()

    def _await_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        entry = None
        while True:
            if self._init_done.is_set():
                entry = find_mount(self.mountpoint)
                if entry is not None and entry.fstype == FSTYPE:
                    break
            if self._fuse_done.is_set():
                # The kernel's INIT only reaches a mounted file system, so a loop that ended
                # cleanly after it served a mount that was unmounted before this poll saw it.
                if not (self._init_done.is_set() and self._fuse_error is None):
                    return
                entry = None
                break
            if time.monotonic() > deadline:
                self.readiness.error(f"mount did not become ready within {READY_TIMEOUT:.0f}s")
                self._stop_requested = True
                self._ready.set()  # lets the main loop unmount whatever came up
                self._wake.set()
                return
            time.sleep(READY_POLL)
        if entry is not None:
            self._tune_read_ahead(entry.device)
        self._live = True
        self._ready.set()
        self.readiness.ok()
        log.info(
            "mounted %s on %s (pid %d, %d FUSE threads)",
            self.source,
            self.mountpoint,
            os.getpid(),
            self.config.fuse.threads,
        )
        self._wake.set()

    def _tune_read_ahead(self, device: str) -> None:
        kb = self.config.fuse.read_ahead_kb
        if not kb:
            return
        path = f"/sys/class/bdi/{device}/read_ahead_kb"
        try:
            with open(path, "w") as f:
                f.write(str(kb))
        except OSError as e:
            log.warning("could not set read-ahead of %s to %d KiB (%s): %s", self.mountpoint, kb, path, e.strerror)

    def _unmount(self) -> None:
        rc, err = run_quiet(["fusermount3", "-u", self.mountpoint])
        if rc == 0 or self._fuse_done.is_set():
            return
        log.warning(
            "unmount of %s failed (%s); detaching lazily, serving open files until closed", self.mountpoint, err
        )
        rc, err = run_quiet(["fusermount3", "-u", "-z", self.mountpoint])
        if rc != 0 and not self._fuse_done.is_set():
            log.error("lazy unmount of %s failed (%s); stopping the FUSE loop", self.mountpoint, err)
            from fastfs.daemon import fusebind

            fusebind.exit_loop(self.ops.fuse_handle)

    # -- signals --------------------------------------------------------------------------------
    def _handle_signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            if not self._stop_requested:
                log.info("received %s, unmounting %s", signal.Signals(signum).name, self.mountpoint)
                notify.notify("STOPPING=1")
            self._stop_requested = True
        elif signum == signal.SIGHUP:
            self.reload()
        elif signum == signal.SIGUSR1:
            log.info("stats: %s", self.summary())

    def reload(self) -> list[str]:
        """Re-read the config file and the original -o overrides; apply what can change live."""
        try:
            new = load_config(self.config_path, self.overrides, use_default_path=self.use_default_path)
        except ConfigError as e:
            log.error("reload failed, keeping the running configuration: %s", e)
            return []
        restart: list[str] = []
        old = self.config
        if new.source and os.path.realpath(new.source) != self.source:
            restart.append("source")
        if new.mountpoint and os.path.realpath(new.mountpoint) != self.mountpoint:
            restart.append("mountpoint")
        restart += [
            f"fuse.{f.name}"
            for f in dataclasses.fields(new.fuse)
            if getattr(new.fuse, f.name) != getattr(old.fuse, f.name)
        ]
        if new.stats.metrics != old.stats.metrics:
            restart.append("stats.metrics")
        if new.log.file != old.log.file:
            restart.append("log.file")
        new = dataclasses.replace(new, source=self.source, mountpoint=self.mountpoint)
        reconfigure = getattr(self.engine, "reconfigure", None)
        if reconfigure is None:
            log.warning("this engine cannot apply settings live; they take effect on the next mount")
        else:
            try:
                restart += list(reconfigure(new))
            except Exception as e:  # noqa: BLE001 - a failed reload must not stop the mount
                log.error("reload failed, keeping the running configuration: %s", one_line(e))
                return []
        logsetup.set_level(new.log.level)
        self.config = new
        keys = sorted(set(restart))
        log.info("reloaded; needs restart: %s", ", ".join(keys) if keys else "none")
        return keys

    def summary(self) -> str:
        try:
            return summary_line(self.ops.snapshot())
        except Exception as e:  # noqa: BLE001 - stats must never take the daemon down
            return f"stats unavailable: {one_line(e)}"

    # -- main -----------------------------------------------------------------------------------
    def run(self) -> int:
        """Mount and serve until unmounted or signalled; 0 after a clean stop, 1 if the mount failed."""
        raise_fd_limit()
        self._start_engine()
        try:
            self._start_metrics()
            self._install_signals()
            fuse_thread = threading.Thread(target=self._fuse_main, name="fastfs-fuse", daemon=True)
            fuse_thread.start()
            ready_thread = threading.Thread(target=self._await_ready, name="fastfs-ready", daemon=True)
            ready_thread.start()
            self._loop()
            fuse_thread.join(timeout=UNMOUNT_TIMEOUT)
            ready_thread.join(timeout=UNMOUNT_TIMEOUT)  # it decides whether the mount was ever live
        finally:
            self._shutdown()
        if not self._live:
            message = self._fuse_error or "the FUSE loop ended before the mount was ready"
            if not self.readiness.reported:
                self.readiness.error(f"mounting {self.mountpoint} failed: {message}")
            log.error("mounting %s failed: %s", self.mountpoint, message)
            force_unmount(self.mountpoint)
            return 1
        if self._fuse_error:
            log.error(
                "the FUSE loop of %s ended with an error: %s; %s", self.mountpoint, self._fuse_error, self.summary()
            )
            force_unmount(self.mountpoint)
            return 1
        log.info("unmounted %s; %s", self.mountpoint, self.summary())
        return 0

    def _loop(self) -> None:
        interval = self.config.stats.status_interval
        next_status = time.monotonic() + interval
        while True:
            self._wake.wait(timeout=max(0.01, min(MAIN_TICK, next_status - time.monotonic())))
            self._wake.clear()
            while self._signals:
                self._handle_signal(self._signals.popleft())
            if self._fuse_done.is_set():
                return
            if self._stop_requested and self._ready.is_set() and not self._unmount_started:
                self._unmount_started = True
                threading.Thread(target=self._unmount, name="fastfs-unmount", daemon=True).start()
            now = time.monotonic()
            if now >= next_status:
                interval = self.config.stats.status_interval
                next_status = now + interval
                if self._ready.is_set() and os.environ.get("NOTIFY_SOCKET"):
                    notify.notify("STATUS=" + self.summary())

    def _shutdown(self) -> None:
        if self._invalidator is not None:
            self._invalidator.stop()
        if self.metrics_server is not None:
            try:
                self.metrics_server.shutdown()
            except Exception as e:  # noqa: BLE001 - exit must proceed
                log.warning("metrics endpoint shutdown failed: %s", one_line(e))
        control = getattr(self.ops, "control", None)
        if control is not None:
            try:
                control.close()  # warm jobs stop before the engine they use
            except Exception as e:  # noqa: BLE001 - exit must proceed
                log.warning("warm jobs shutdown failed: %s", one_line(e))
        if self.engine is not None:
            try:
                self.engine.close()
            except Exception as e:  # noqa: BLE001 - exit must proceed
                log.warning("engine shutdown failed: %s", one_line(e))
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            try:
                signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
            except (ValueError, OSError):
                pass
