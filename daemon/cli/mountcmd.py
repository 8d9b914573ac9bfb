"""``fastfs mount`` and ``fastfs umount``: validate, start the daemon, report; recover a mount.

``fastfs mount`` validates the paths, the FUSE device and the whole configuration before anything
is mounted (each problem is one line naming it and what to do). With ``--foreground`` it runs the
:class:`~fastfs.daemon.mount.Daemon` in this process; otherwise it forks the daemon, which reports
readiness or a one-line error through a pipe, so the command returns only once the mount is live.
``--print-config`` shows the effective configuration with where each value came from and exits.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import grp
import os
import select
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from fastfs.config.loader import (
    COMMAND_LINE,
    DEFAULT_PATH,
    ENV_OPTIONS,
    ConfigError,
    environment_overrides,
    load_config,
    load_with_origins,
    memory_problems,
    one_line,
    parse_overrides,
)
from fastfs.config.render import render
from fastfs.daemon import logsetup, mount
from fastfs.daemon.cli import CliError
from fastfs.daemon.mounttable import canonical, find_mount, force_unmount, is_fastfs, mount_state, unmount

# Seconds `fastfs mount` waits for the daemon to report the mount live before giving up.
STARTUP_TIMEOUT = 60.0
# Seconds to wait for a killed or failed daemon child to exit.
CHILD_EXIT_TIMEOUT = 10.0
# Seconds `fastfs mount` waits silently before it says what it waits for, then between repeats of the
# same stage, and how often it looks (a slow source must never leave the user staring at nothing).
WAIT_NOTICE = 2.0
WAIT_REPEAT = 10.0
NOTICE_TICK = 0.25
# Exit status of the daemon child when it fails before reporting.
EXIT_ERROR = 1
# The FUSE device: the daemon (as root) or fusermount3 (with the caller's own rights) opens it read-write.
FUSE_DEVICE = "/dev/fuse"
# fusermount3's configuration: user_allow_other there lets users other than root mount with allow_other.
FUSE_CONF = "/etc/fuse.conf"
# Where --print-config says an option of $FASTFS_OPTIONS came from.
ENV_ORIGIN = f"environment {ENV_OPTIONS}"


# -- validation -----------------------------------------------------------------------------------
def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def check_paths(source: str, mountpoint: str, nonempty: bool = False) -> tuple[str, str]:
    """Validate SRC and MNT; returns their real paths or raises :class:`CliError`: one line naming the
    problem and what to do. *nonempty* (``-o nonempty``) allows a mount point that holds files."""
    try:
        st = os.stat(source)
    except FileNotFoundError:
        raise CliError(f"source {source} does not exist") from None
    except OSError as e:
        raise CliError(f"source {source}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CliError(f"source {source} is not a directory")
    src = os.path.realpath(source)
    # a mount point that is a mount now is judged from the mount table first: touching a dead or hung
    # mount (even lstat) would wait for its daemon
    _check_not_mounted(mountpoint, canonical(mountpoint))
    try:
        st = os.stat(mountpoint)
    except FileNotFoundError:
        if _inside(canonical(mountpoint), src):  # (creating it there would change the source)
            raise CliError(
                f"mountpoint {mountpoint} is inside source {source}: use a directory outside the source"
            ) from None
        raise CliError(f"mountpoint {mountpoint} does not exist (create it: mkdir {mountpoint})") from None
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise CliError(f"mountpoint {mountpoint} is a dead mount (run: fastfs umount {mountpoint})") from None
        raise CliError(f"mountpoint {mountpoint}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise CliError(f"mountpoint {mountpoint} is not a directory")
    mnt = os.path.realpath(mountpoint)
    _check_not_mounted(mountpoint, mnt)  # a symlink to a mount point
    if mnt == src:
        raise CliError(
            f"mountpoint {mountpoint} is the source itself: fastfs mirrors SRC on another, empty directory"
            f" (e.g. mkdir /mnt/{os.path.basename(src) or 'data'} and mount there)"
        )
    if _inside(mnt, src):
        raise CliError(f"mountpoint {mountpoint} is inside source {source}: use a directory outside the source")
    if _inside(src, mnt):
        raise CliError(f"source {source} is inside mountpoint {mountpoint}: use a mount point outside the source")
    if not nonempty:
        try:
            if os.listdir(mnt):
                raise CliError(
                    f"mountpoint {mountpoint} is not empty: use an empty directory, or -o nonempty to hide its files"
                )
        except OSError as e:
            raise CliError(f"mountpoint {mountpoint}: {e.strerror}") from None
    return src, mnt


def _check_not_mounted(mountpoint: str, target: str) -> None:
    """Raise :class:`CliError` when *target* (the mount point's path) is a mount point now."""
    entry = find_mount(target)
    if entry is None or entry.mountpoint != target:
        return
    if entry.fstype.startswith("fuse") and mount_state(entry) == "dead":
        raise CliError(f"mountpoint {mountpoint} is a dead mount (run: fastfs umount {mountpoint})")
    if is_fastfs(entry):
        raise CliError(
            f"mountpoint {mountpoint} is already a fastfs mount ({entry.source}): unmount it first"
            f" (fastfs umount {mountpoint}) or mount on another directory"
        )
    raise CliError(
        f"mountpoint {mountpoint} is already a mount point ({entry.fstype} from {entry.source}):"
        " mount on an empty directory that is not a mount point"
    )


def check_fuse_device(path: str = FUSE_DEVICE) -> None:
    """Raise :class:`CliError` when this process cannot open the FUSE device read-write.

    A root daemon opens it directly and ``fusermount3`` opens it with the caller's rights, so the
    check tells a user without access the cause and the fix in one line before anything is forked.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CliError(f"{path} does not exist: load the fuse module (modprobe fuse) or install fuse3") from None
    except OSError as e:
        raise CliError(f"cannot open {path}: {e.strerror}: {_device_fix(path)}") from None
    os.close(fd)


def _device_fix(path: str) -> str:
    """What a user without read-write access to the FUSE device can do, in a few words."""
    try:
        group = grp.getgrgid(os.stat(path).st_gid).gr_name
    except (OSError, KeyError):
        group = ""
    if group and group != "root":
        return f"add this user to group {group} (usermod -aG {group} USER) and log in again, or mount as root"
    return f"ask root to make it usable by users (chmod 0666 {path}, its usual mode) or mount as root"


def check_other_users(config: Any, fuse_conf: str = FUSE_CONF) -> None:
    """Raise :class:`CliError` when a mount by a user other than root asks for allow_other or
    allow_root and cannot have them (before anything is forked, so the reason is one line)."""
    if os.geteuid() == 0:
        return  # root may allow others; allow_root changes nothing for it
    if config.fuse.allow_root and not config.fuse.allow_other:
        raise CliError(
            "allow_root: only a mount by root can grant it (where it changes nothing); as another user use"
            f" allow_other, which needs user_allow_other in {fuse_conf}"
        )
    if config.fuse.allow_other and not _user_allow_other(fuse_conf):
        raise CliError(
            f"allow_other: a mount by a user other than root needs the line user_allow_other in {fuse_conf}"
            " (ask root to add it), or mount as root"
        )


def _user_allow_other(fuse_conf: str) -> bool:
    try:
        with open(fuse_conf, encoding="utf-8", errors="replace") as f:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return False


# -- mount ----------------------------------------------------------------------------------------
def _overrides(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """The overrides of a mount: ``$FASTFS_OPTIONS``, then -o and the flags (later ones win); and the
    origin of each that came from the environment."""
    environment = environment_overrides()
    overrides: dict[str, Any] = {**environment, **parse_overrides(args.options)}
    if getattr(args, "allow_other", False):
        overrides["fuse.allow_other"] = "true"
    origins = {key: ENV_ORIGIN for key, value in environment.items() if overrides.get(key) == value}
    return overrides, origins


def _mount_config(args: argparse.Namespace) -> tuple[Any, str | None, dict[str, Any]]:
    overrides, _ = _overrides(args)
    if args.log_level:
        overrides["log.level"] = args.log_level
    if args.log_file:
        overrides["log.file"] = os.path.abspath(args.log_file)
    if getattr(args, "profile", None):
        overrides["profile"] = args.profile
    config_path = os.path.abspath(args.config) if args.config else None
    config = load_config(config_path, overrides)
    if config.log.file and not os.path.isabs(config.log.file):
        config = dataclasses.replace(config, log=dataclasses.replace(config.log, file=os.path.abspath(config.log.file)))
    return config, config_path, overrides


def cmd_mount(args: argparse.Namespace) -> int:
    """``fastfs mount``: the exit status (a CliError or ConfigError for user errors)."""
    if getattr(args, "print_config", False):
        return _print_config(args)
    config, config_path, overrides = _mount_config(args)
    source, mountpoint = args.source, args.mountpoint
    if source and not mountpoint:  # one argument: the mount point, the source comes from the config
        source, mountpoint = None, source
    source = source or config.source
    mountpoint = mountpoint or config.mountpoint
    if not source or not mountpoint:
        raise CliError("mount needs SRC and MNT (as arguments or as source/mountpoint in the config)")
    error, warning = memory_problems(config)
    if error:
        raise CliError(error)
    if warning:
        print(f"fastfs: warning: {warning}", file=sys.stderr, flush=True)
    kwargs: dict[str, Any] = {"config_path": config_path, "overrides": overrides, "use_default_path": True}
    with Notice(f"checking the source {source} and the mount point {mountpoint}") as notice:
        src, mnt = check_paths(source, mountpoint, nonempty=config.fuse.nonempty)
        check_other_users(config)
        check_fuse_device()
        config = dataclasses.replace(config, source=src, mountpoint=mnt)
        if not args.foreground:
            return _daemonize(src, mnt, config, kwargs, notice)
    try:
        logsetup.setup(config.log.level, config.log.file or None)
    except logsetup.LogFileError as e:
        raise CliError(str(e)) from None
    try:
        return mount.Daemon(src, mnt, config, **kwargs).run()
    except mount.MountError as e:
        raise CliError(str(e)) from None


class Notice:
    """Says on stderr what ``fastfs mount`` waits for, once :data:`WAIT_NOTICE` seconds passed without
    the mount being live: then each new stage when it begins, and the same one again every
    :data:`WAIT_REPEAT` seconds (a ticker thread, as the wait may be a system call that hangs)."""

    def __init__(self, what: str, out: Any = None) -> None:
        self.what = what
        self.out = out or sys.stderr
        self.started = time.monotonic()
        self._said: tuple[str, float] | None = None  # (stage, when) of the last notice
        self._lock = threading.Lock()  # guards what and _said (the ticker and the caller)
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_loop, name="fastfs-notice", daemon=True)

    def __enter__(self) -> Notice:
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def update(self, what: str) -> None:
        with self._lock:
            self.what = what
        self.tick()

    def tick(self) -> None:
        now = time.monotonic()
        waited = now - self.started
        if waited < WAIT_NOTICE or self._stop.is_set():
            return
        with self._lock:
            if self._said is not None and self._said[0] == self.what and now - self._said[1] < WAIT_REPEAT:
                return
            self._said = (self.what, now)
            line = f"fastfs: waiting ({waited:.0f} s): {self.what}\n"
        try:
            self.out.write(line)
            self.out.flush()
        except (OSError, ValueError):
            pass

    def _tick_loop(self) -> None:
        while not self._stop.wait(NOTICE_TICK):
            self.tick()


def _daemonize(src: str, mnt: str, config: Any, kwargs: dict[str, Any], notice: Notice) -> int:
    log_file = config.log.file or logsetup.default_log_file(mnt, config.state.dir)
    try:
        log_fd = logsetup.open_log_file(log_file, default=not config.log.file)
    except logsetup.LogFileError as e:
        raise CliError(str(e)) from None
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the daemon
        status = EXIT_ERROR
        readiness = mount.Readiness(write_fd)
        try:
            os.close(read_fd)
            os.setsid()
            os.chdir("/")
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(devnull)
            os.close(log_fd)
            logsetup.log_std_streams_to(log_file, default=not config.log.file)
            logsetup.setup(config.log.level, None, journal=False)
            status = mount.Daemon(src, mnt, config, readiness=readiness, **kwargs).run()
        except BaseException as e:  # noqa: BLE001 - the parent shows this one line
            message = str(e) if isinstance(e, (mount.MountError, ConfigError)) else f"{type(e).__name__}: {e}"
            readiness.error(message)
            try:
                sys.stderr.write(f"fastfs: error: {one_line(message)}\n")
                sys.stderr.flush()
            except Exception:  # noqa: BLE001
                pass
        finally:
            os._exit(status)
    os.close(write_fd)
    os.close(log_fd)
    notice.update("the daemon to start")
    try:
        reply = _await_child(read_fd, STARTUP_TIMEOUT, notice.update)
    finally:
        os.close(read_fd)
    if reply == "ok":
        print(f"fastfs: mounted {src} on {mnt} (pid {pid}, log {log_file})", flush=True)
        return 0
    if reply is None:
        _kill_child(pid)
        force_unmount(mnt)
        raise CliError(f"mount did not become ready within {STARTUP_TIMEOUT:.0f}s (log: {log_file})")
    _reap_child(pid)
    force_unmount(mnt)
    if reply.startswith("error "):
        raise CliError(f"{reply[len('error ') :]} (log: {log_file})")
    raise CliError(f"the daemon exited during startup (log: {log_file})")


def _await_child(fd: int, timeout: float, on_stage: Callable[[str], None] = lambda _: None) -> str | None:
    """The child's final one-line report (``ok`` or ``error ...``); '' when it exited without one; None
    on timeout. ``stage TEXT`` lines before it go to *on_stage*."""
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        while b"\n" in data:
            line, data = data.split(b"\n", 1)
            text = line.decode(errors="replace").strip()
            if text.startswith("stage "):
                on_stage(text[len("stage ") :])
            elif text:
                return text
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return data.decode(errors="replace").strip()
        data += chunk


def _reap_child(pid: int) -> None:
    deadline = time.monotonic() + CHILD_EXIT_TIMEOUT
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done:
            return
        time.sleep(0.05)
    _kill_child(pid)


def _kill_child(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _print_config(args: argparse.Namespace) -> int:
    """``fastfs mount [SRC] [MNT] [--config F] [--profile P] [-o ...] --print-config``."""
    _, config_path, overrides = _mount_config(args)  # validates exactly as a mount would
    env_origins = _overrides(args)[1]
    config, origins = load_with_origins(config_path, overrides, use_default_path=True, override_origins=env_origins)
    source, mountpoint = args.source, args.mountpoint
    if source and not mountpoint:
        source, mountpoint = None, source
    paths = {k: os.path.abspath(v) for k, v in (("source", source), ("mountpoint", mountpoint)) if v}
    if paths:
        config = dataclasses.replace(config, **paths)
        origins.update(dict.fromkeys(paths, COMMAND_LINE))
    layers = ["defaults"]
    if config.profile:
        layers.append(f"profile {config.profile}")
    file = config_path or load_default_path()
    if file:
        layers.append(file)
    if env_origins:
        layers.append(ENV_ORIGIN)
    if set(overrides) - set(env_origins) or paths:
        layers.append(COMMAND_LINE)
    header = "fastfs effective configuration (" + " < ".join(layers) + ")"
    sys.stdout.write(render(config, origins, header))
    return 0


def load_default_path() -> str | None:
    """The default config file when it exists (what `fastfs mount` reads without --config)."""
    return DEFAULT_PATH if os.path.isfile(DEFAULT_PATH) else None


# -- umount ---------------------------------------------------------------------------------------
def cmd_umount(args: argparse.Namespace) -> int:
    """``fastfs umount [--lazy] MNT``."""
    mnt = os.path.abspath(args.mountpoint)
    entry = find_mount(mnt)
    if entry is None:
        raise CliError(f"{args.mountpoint} is not mounted")
    if not is_fastfs(entry):
        raise CliError(f"{args.mountpoint} is not a fastfs mount ({entry.fstype})")
    rc, err = unmount(mnt, lazy=args.lazy)
    if rc == 0:
        return 0
    hint = " (files still open? use --lazy)" if "busy" in err.lower() else ""
    raise CliError(f"cannot unmount {args.mountpoint}: {err}{hint}")
