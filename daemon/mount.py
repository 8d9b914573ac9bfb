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
  a one-line stats summary, SIGUSR2 reopens the log file (logrotate). The loop also sends periodic
  ``STATUS=`` lines when run by systemd;
* the session's workers, watchdog and notifier (see :mod:`.kernel.session`).

``fastfs mount`` (:mod:`fastfs.daemon.cli.mountcmd`) validates and forks first; only the daemon
process opens the FUSE device. The mount table lives in :mod:`fastfs.daemon.mounttable`.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import os
import resource
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from fastfs.config.loader import ConfigError, load_config, memory_problems, one_line, parse_listen_address
from fastfs.config.reload import apply_live
from fastfs.config.schema import Config
from fastfs.daemon import logsetup, notify
from fastfs.daemon.control import CONTROL_NAME
from fastfs.daemon.health import HealthCheck
from fastfs.daemon.mounttable import (
    UNMOUNT_TIMEOUT,
    MountRecord,
    force_unmount,
    forget_mount,
    process_start_ticks,
    record_mount,
    run_quiet,
)
from fastfs.daemon.summary import summary_line
from fastfs.fsio.api import EngineAPI

if TYPE_CHECKING:
    from fastfs.daemon.kernel.negotiate import Negotiated

log = logging.getLogger("fastfs.mount")

# The kernel's cap on pages per FUSE request (256 = 1 MiB unless an administrator raised it).
MAX_PAGES_LIMIT = "/proc/sys/fs/fuse/max_pages_limit"
# Signals the main loop handles (see the module docstring).
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Upper bound of one main-loop sleep, so queued signals are handled promptly even without a wake-up.
MAIN_TICK = 1.0
# Allocations between two collections of the youngest generation (CPython's default is 700). A request
# allocates a few dozen objects and makes almost no cycles, so at the default a small-file pass ran a
# collection every few files, each walking the young objects the node table and open versions keep:
# 10-15% of the engine's time per file (measured in process, tmpfs, 37-38 us against 41-45 us per
# lookup + open + release). Cycles are still collected, just in larger, rarer batches.
GC_YOUNG_THRESHOLD = 50_000


class MountError(Exception):
    """A one-line reason the mount cannot start."""


def tune_gc() -> None:
    """Collect cycles less often (:data:`GC_YOUNG_THRESHOLD`) and leave out of every collection the
    objects alive once the daemon started (modules, config, the engine's structures): a daemon's
    collections then walk only what its requests made."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


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


# -- readiness reporting --------------------------------------------------------------------------
class Readiness:
    """Reports startup success or failure once, to a pipe (background parent) and to systemd; before
    that, each stage of the start (``stage TEXT`` lines), so the parent can say what it waits for."""

    def __init__(self, fd: int | None = None) -> None:
        self._fd = fd
        self._lock = threading.Lock()  # guards _fd and reported; held across the pipe's small writes
        self.reported = False

    def stage(self, text: str) -> None:
        """What the start does now (one line to the parent; STATUS= under systemd)."""
        with self._lock:
            if self.reported:
                return
            fd = self._fd
            if fd is not None:
                try:
                    os.write(fd, ("stage " + one_line(text) + "\n").encode())
                except OSError:
                    pass
        if fd is None:
            notify.notify("STATUS=" + one_line(text))

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
        self.device = ""  # "major:minor" of the mount once live (names its record and connection)

    # -- setup ----------------------------------------------------------------------------------
    def mount_options(self) -> Any:
        """What the kernel mount is told (fsname shows in the mount table, ``fastfs:SRC`` by default)."""
        from fastfs.daemon.kernel.fusemount import MountOptions

        fc = self.config.fuse
        return MountOptions(
            fsname=fc.fsname or f"fastfs:{self.source}",
            subtype=fc.subtype,
            allow_other=fc.allow_other,
            default_permissions=fc.default_permissions,
            noatime=fc.noatime,
        )

    def wishes(self) -> Any:
        from fastfs.daemon.kernel.negotiate import Wishes

        fc = self.config.fuse
        return Wishes(
            max_pages=fc.max_pages,
            passthrough=fc.passthrough != "off" and os.geteuid() == 0,
            # listings with attributes where the engine's policy says (local sources only)
            readdirplus=self.engine.listing_attributes() if self.engine is not None else fc.readdirplus,
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
        health = HealthCheck(self.mountpoint, self.serving, self.ops.snapshot, self.config.cache.disk_dir)
        try:
            self.metrics_server = metrics.serve(self.ops.snapshot, host, port, self.mountpoint, health.check)
        except OSError as e:
            why = os.strerror(e.errno) if e.errno else one_line(e)
            raise MountError(f"stats.metrics: cannot listen on {host}:{port}: {why}") from None

    def serving(self) -> bool:
        """True while the mount is live: INIT answered and the connection not ended."""
        return self._live and not self._fuse_done.is_set()

    def _install_signals(self) -> None:
        for sig in HANDLED_SIGNALS:
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
                self.readiness.stage(f"mounting {self.mountpoint}")
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
                direct=self.ops.direct_table(),
                late_release=fc.late_release,
                spin_us=fc.spin_us,
            )
            assert self.engine is not None  # (_start_engine ran first)
            self.engine.inline_reads = True  # the watchdog bounds a read that hangs on its own thread
            self.engine.opens_hand_over = True  # served opens hand small files to the kernel (ops.open)
            self.ops.session = self.session
            self.ops.attach_direct(self.session.direct)
            try:
                self.readiness.stage("waiting for the kernel to start the mount (INIT)")
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

    def _on_init(self, negotiated: Negotiated) -> None:
        assert self.engine is not None  # (_start_engine ran first)
        self.engine.passthrough_available = negotiated.passthrough

    def _mark_live(self) -> None:
        try:
            self.readiness.stage(f"checking that {self.mountpoint} answers (a stat of its root reaches the source)")
            st_dev = os.stat(self.mountpoint).st_dev
            self.device = f"{os.major(st_dev)}:{os.minor(st_dev)}"
            self._tune_read_ahead(self.device)
            fstype = self.mount_options().fstype
            ticks = process_start_ticks(os.getpid()) or 0
            record_mount(MountRecord(self.device, self.mountpoint, fstype, os.getpid(), self.source, ticks))
        except OSError as e:
            log.warning("could not stat %s after mounting: %s", self.mountpoint, e.strerror)
        self._live = True
        self._ready.set()
        self.readiness.ok()
        if self.engine is not None:
            self.engine.preload()  # the format parsers' imports, off the first load's path
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
        elif signum == signal.SIGUSR2:
            try:
                paths = logsetup.reopen()
            except logsetup.LogFileError as e:
                log.error("cannot reopen the log (kept the old one): %s", e)
            else:
                log.info("reopened %s", ", ".join(paths) if paths else "nothing: logging to stderr")

    def reload(self) -> list[str]:
        """Re-read the config file and the original -o overrides; apply what can change live."""
        try:
            new = load_config(self.config_path, self.overrides, use_default_path=self.use_default_path)
        except ConfigError as e:
            log.error("reload failed, keeping the running configuration: %s", e)
            return []
        error, warning = memory_problems(new)
        if error:
            log.error("reload failed, keeping the running configuration: %s", error)
            return []
        if warning:
            log.warning("%s", warning)
        # What applies live is config/reload.py's table alone: the engine applies its part of it and
        # names every changed setting that waits for a remount; the daemon applies the rest of it here.
        restart: list[str] = []
        if new.source and os.path.realpath(new.source) != self.source:
            restart.append("source")
        if new.mountpoint and os.path.realpath(new.mountpoint) != self.mountpoint:
            restart.append("mountpoint")
        new = dataclasses.replace(new, source=self.source, mountpoint=self.mountpoint)
        try:
            assert self.engine is not None  # (a reload comes once the mount runs)
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
        self.readiness.stage(f"opening the source {self.source}")
        self._start_engine()
        tune_gc()
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
        if self.device:
            forget_mount(self.device)
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
        for sig in HANDLED_SIGNALS:
            try:
                signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
            except (ValueError, OSError):
                pass
