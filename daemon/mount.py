"""Mount lifecycle: validate, mount, signal readiness, serve, handle signals, unmount.

Threads of a running daemon:

* the serving thread mounts (mount(2) as root, ``fusermount3`` otherwise: :mod:`.kernel.fusemount`),
  answers the kernel's INIT and starts the session's workers (:mod:`.kernel.session`), then waits
  until the connection ends (unmount, or abort). The kernel sends INIT only to a mounted file
  system, and requests to the mount wait for its answer, so once INIT is answered the mount is
  live: the serving thread tunes the mount's read-ahead in ``/sys/class/bdi`` and reports
  readiness (a pipe to the waiting ``fastfs mount`` parent and/or ``READY=1``);
* the main thread owns the signal handlers: they only queue the signal and wake the main loop,
  which then acts: SIGTERM/SIGINT unmount cleanly, SIGHUP reloads the configuration, SIGUSR1 logs
  a one-line stats summary. The loop also sends periodic ``STATUS=`` lines when run by systemd;
* the session's workers, watchdog and notifier (see :mod:`.kernel.session`).

``fastfs mount`` validates and forks first; only the daemon process opens the FUSE device.
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
from fastfs.config.reload import apply_live
from fastfs.config.schema import Config
from fastfs.daemon import logsetup, notify
from fastfs.daemon.control import CONTROL_NAME
from fastfs.daemon.statscli import summary_line
from fastfs.fsio.api import EngineAPI

log = logging.getLogger("fastfs.mount")

MOUNTINFO = "/proc/self/mountinfo"
# The kernel's cap on pages per FUSE request (256 = 1 MiB unless an administrator raised it).
MAX_PAGES_LIMIT = "/proc/sys/fs/fuse/max_pages_limit"
FSTYPE = "fuse.fastfs"
# The FUSE device: the daemon (as root) or fusermount3 (with the caller's own rights) opens it read-write.
FUSE_DEVICE = "/dev/fuse"
# Upper bound of one main-loop sleep, so queued signals are handled promptly even without a wake-up.
MAIN_TICK = 1.0
# Seconds a fusermount3/umount subprocess may take before it is abandoned.
UNMOUNT_TIMEOUT = 30.0


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


def _daemon_gone(mnt: str) -> bool:
    """True when the FUSE mount at *mnt* has no daemon any more (statfs is never cached by the kernel)."""
    try:
        os.statvfs(mnt)
    except OSError as e:
        return e.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


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
        if entry.fstype.startswith("fuse") and _daemon_gone(mnt):  # stat may have come from the kernel's cache
            raise MountError(f"mountpoint {mountpoint} is a dead mount (run: fastfs umount {mountpoint})")
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

    A root daemon opens it directly and ``fusermount3`` opens it with the caller's rights, so the
    check tells a user without access the cause in one line before anything is forked.
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


def force_unmount(mountpoint: str | os.PathLike[str], any_fuse: bool = False) -> None:
    """Best effort, never raises: unmount the mount on *mountpoint* while it is still one to touch:
    ``fusermount3 -u``, then ``fusermount3 -u -z`` (busy), then ``umount -l`` (a dead daemon, no
    fusermount3). To touch is a fastfs mount (cleaning up a failed start); with *any_fuse* any FUSE
    mount (tests and benchmarks: storage emulators, fault injectors). A mount of another kind is never
    touched. The one implementation: tests/conftest.py, tests/faultfs.py and benchmarks/benchkit use it."""
    path = os.fspath(mountpoint)
    for cmd in (["fusermount3", "-u", "-q"], ["fusermount3", "-u", "-z", "-q"], ["umount", "-l"]):
        entry = find_mount(path)
        if entry is None or not (entry.fstype.startswith("fuse") if any_fuse else is_fastfs(entry)):
            return
        run_quiet([*cmd, entry.mountpoint])


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
        self.engine: EngineAPI | None = None
        self.ops: Any = None
        self.metrics_server: Any = None
        self._signals: collections.deque[int] = collections.deque()
        self._wake = threading.Event()
        self._ready = threading.Event()  # readiness resolved (live, or given up)
        self._live = False
        self._fuse_done = threading.Event()
        self._fuse_error: str | None = None
        self._stop_requested = False
        self._unmount_started = False
        self.session: Any = None

    # -- setup ----------------------------------------------------------------------------------
    def mount_options(self) -> Any:
        """What the kernel mount is told (fsname shows in the mount table as ``fastfs:SRC``)."""
        from fastfs.daemon.kernel.fusemount import MountOptions

        fc = self.config.fuse
        return MountOptions(fsname=f"fastfs:{self.source}", subtype="fastfs", allow_other=fc.allow_other)

    def wishes(self) -> Any:
        from fastfs.daemon.kernel.negotiate import Wishes

        fc = self.config.fuse
        return Wishes(
            max_pages=fc.max_pages,
            passthrough=fc.passthrough != "off" and os.geteuid() == 0,
            readdirplus=fc.readdirplus,
            posix_acl=fc.allow_other,  # the kernel applies the source's ACLs (daemon/kernel/negotiate.py)
        )

    def _start_engine(self) -> None:
        from fastfs.daemon.ops import KernelOps
        from fastfs.fsio.disk.directory import DiskCacheError, check_placement
        from fastfs.fsio.engine import Engine

        try:
            if self.config.cache.disk_dir:
                check_placement(self.config.cache.disk_dir, self.source, self.mountpoint)
            self.engine = Engine(self.source, self.config)
            self.ops = KernelOps(self.engine, {"source": self.source, "mountpoint": self.mountpoint})
        except DiskCacheError as e:  # refused before anything is mounted: one line, exit 1
            raise MountError(f"cache.disk_dir {e}") from None
        except OSError as e:
            if self.engine is not None:
                self.engine.close()
                self.engine = None
            raise MountError(f"cannot open source {self.source}: {e.strerror or e}") from None
        if os.path.lexists(os.path.join(self.source, CONTROL_NAME)):
            log.warning(
                "%s has an entry named %s: the name is reserved for fastfs's control directory, so it is "
                "hidden and not reachable through the mount",
                self.source,
                CONTROL_NAME,
            )

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

    def _install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)
        self._wake.set()

    # -- threads --------------------------------------------------------------------------------
    def _raise_page_limit(self) -> None:
        """fuse.max_pages above the kernel's limit: raise the limit as root (said in the log), else warn."""
        wanted = self.config.fuse.max_pages
        try:
            with open(MAX_PAGES_LIMIT) as f:
                limit = int(f.read())
        except (OSError, ValueError):
            return
        if wanted <= limit:
            return
        try:
            with open(MAX_PAGES_LIMIT, "w") as f:
                f.write(str(wanted))
        except OSError as e:
            log.warning(
                "fuse.max_pages=%d exceeds %s (%d) and it cannot be raised (%s): requests stay at %d KiB",
                wanted,
                MAX_PAGES_LIMIT,
                limit,
                e.strerror,
                limit * 4,
            )
            return
        log.info("raised %s from %d to %d for fuse.max_pages (machine-wide)", MAX_PAGES_LIMIT, limit, wanted)

    def _serve(self) -> None:
        """Mount, answer INIT, start the workers, report readiness, wait for the connection to end."""
        from fastfs.daemon.kernel import fusemount
        from fastfs.daemon.kernel.negotiate import NegotiationError
        from fastfs.daemon.kernel.session import Session

        fc = self.config.fuse
        self._raise_page_limit()
        try:
            try:
                fd = fusemount.mount(self.mountpoint, self.mount_options())
            except fusemount.FuseMountError as e:
                self._fuse_error = str(e)
                return
            self.session = Session(
                fd,
                self.ops.handlers(),
                self.wishes(),
                threads=fc.threads,
                request_timeout=fc.request_timeout,
                read_timeout=self.config.readahead.read_timeout,
                on_abandon=self.ops.abandoned,
            )
            self.engine.inline_reads = True  # the watchdog bounds a read that hangs on its own thread
            self.ops.session = self.session
            try:
                self.session.start(on_init=self._on_init)
            except NegotiationError as e:
                self._fuse_error = str(e)
                return
            self._mark_live()
            self.session.wait()
        except BaseException as e:  # noqa: BLE001 - reported as the mount's failure
            self._fuse_error = one_line(f"{type(e).__name__}: {e}")
        finally:
            self._fuse_done.set()
            self._ready.set()
            self._wake.set()

    def _on_init(self, negotiated: Any) -> None:
        self.engine.passthrough_available = negotiated.passthrough

    def _mark_live(self) -> None:
        try:
            st_dev = os.stat(self.mountpoint).st_dev
            self._tune_read_ahead(f"{os.major(st_dev)}:{os.minor(st_dev)}")
        except OSError as e:
            log.warning("could not stat %s after mounting: %s", self.mountpoint, e.strerror)
        self._live = True
        self._ready.set()
        self.readiness.ok()
        negotiated = self.session.negotiated
        log.info(
            "mounted %s on %s (pid %d, %d threads, FUSE %d.%d%s)",
            self.source,
            self.mountpoint,
            os.getpid(),
            self.config.fuse.threads,
            negotiated.major,
            negotiated.minor,
            ", passthrough" if negotiated.passthrough else "",
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
            log.error("lazy unmount of %s failed (%s); aborting the connection", self.mountpoint, err)
            try:
                self.session.abort(os.stat(self.mountpoint).st_dev)
            except OSError:
                pass

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
        # What applies live is config/reload.py's table alone: the engine applies its part of it and
        # names every changed setting that waits for a remount; the daemon applies the rest of it here.
        restart: list[str] = []
        if new.source and os.path.realpath(new.source) != self.source:
            restart.append("source")
        if new.mountpoint and os.path.realpath(new.mountpoint) != self.mountpoint:
            restart.append("mountpoint")
        new = dataclasses.replace(new, source=self.source, mountpoint=self.mountpoint)
        try:
            restart += self.engine.reconfigure(new)
        except Exception as e:  # noqa: BLE001 - a failed reload must not stop the mount
            log.error("reload failed, keeping the running configuration: %s", one_line(e))
            return []
        live = apply_live(self.config, new)
        logsetup.set_level(live.log.level)
        if self.session is not None:
            self.session.set_read_timeout(live.readahead.read_timeout)
        self.config = live
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
            serve_thread = threading.Thread(target=self._serve, name="fastfs-serve", daemon=True)
            serve_thread.start()
            self._loop()
            serve_thread.join(timeout=UNMOUNT_TIMEOUT)
        finally:
            self._shutdown()
        if not self._live:
            message = self._fuse_error or "the connection ended before the mount was ready"
            if not self.readiness.reported:
                self.readiness.error(f"mounting {self.mountpoint} failed: {message}")
            log.error("mounting %s failed: %s", self.mountpoint, message)
            force_unmount(self.mountpoint)
            return 1
        if self._fuse_error:
            log.error("serving %s ended with an error: %s; %s", self.mountpoint, self._fuse_error, self.summary())
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
        if self.session is not None:
            self.session.close()
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
