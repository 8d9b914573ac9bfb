"""The ``fastfs`` command line: mount, umount, stats, warm, install-service.

Every user error is one line ``fastfs: error: ...`` on stderr with a non-zero exit, never a
traceback. ``fastfs mount`` validates paths and configuration before anything is mounted; without
``--foreground`` it forks a daemon (before libfuse is loaded), which reports readiness or a one-line
error through a pipe, so the command returns only once the mount is live.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import select
import signal
import sys
import time
from typing import Any, NoReturn

from fastfs import __version__
from fastfs.config.loader import ConfigError, load_config, one_line, parse_overrides

# Seconds `fastfs mount` waits for the daemon to report the mount live before giving up.
STARTUP_TIMEOUT = 60.0
# Seconds to wait for a killed or failed daemon child to exit.
CHILD_EXIT_TIMEOUT = 10.0
# Exit status of user errors (argparse uses 2 for usage errors).
EXIT_ERROR = 1
# Seconds between `fastfs stats --watch` lines when no interval is given (one line a second reads well).
DEFAULT_WATCH_INTERVAL = 1.0


class CliError(Exception):
    """A one-line user error."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors in the fastfs format."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"fastfs: error: {one_line(message)}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fastfs", description="Read-ahead FUSE mirror for machine-learning data.")
    parser.add_argument("--version", action="version", version=f"fastfs {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    m = sub.add_parser(
        "mount",
        help="mount SRC read-only on MNT",
        description="Mount SRC read-only on MNT. Without --foreground the daemon runs in the background "
        "and the command returns once the mount is live; background logs go to --log-file / log.file if "
        "set, else to <basename of MNT>-<hash>.log in the state directory's logs/ (STATE_DIRECTORY or "
        "state.dir), else /var/log/fastfs/ for root or ~/.local/state/fastfs/logs/ for other users "
        "(created 0600, never through a symlink).",
    )
    m.add_argument("source", nargs="?", metavar="SRC", help="directory to mirror (default: source in the config)")
    m.add_argument("mountpoint", nargs="?", metavar="MNT", help="empty directory to mount on (default: config)")
    m.add_argument("--config", metavar="FILE", help="YAML config (default: /etc/fastfs/fastfs.yaml if present)")
    m.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground, log to stderr")
    m.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE[,...]",
        help="config override, e.g. -o budget=2G,workers=8 or -o readahead.max_window=128M",
    )
    m.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="log level")
    m.add_argument("--log-file", metavar="F", help="log file, created 0600 (default: stderr; background: see above)")
    _add_profile_options(m)

    u = sub.add_parser("umount", help="unmount MNT", description="Unmount MNT (recovers a mount whose daemon died).")
    u.add_argument("mountpoint", metavar="MNT")
    u.add_argument("-l", "--lazy", action="store_true", help="detach now, finish when files are closed")

    s = sub.add_parser("stats", help="show statistics of a mount", description="Show what a fastfs mount did.")
    s.add_argument("mountpoint", metavar="MNT")
    s.add_argument("--json", action="store_true", help="print the raw JSON snapshot")
    s.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=DEFAULT_WATCH_INTERVAL,
        default=None,
        metavar="SECONDS",
        help=f"print per-interval rates every SECONDS (default {DEFAULT_WATCH_INTERVAL:g}) until Ctrl-C",
    )
    s.add_argument("--top", type=int, metavar="N", help="list the N files with most bytes fetched")

    w = sub.add_parser(
        "warm",
        help="prefetch files or trees into a mount's cache, report or drop what is cached",
        description="Prefetch PATHs (inside fastfs mounts) into the cache now, as background jobs of the "
        "daemon, with progress by files and bytes; --check reports how much is cached, --evict drops it. "
        "Exit 1 when anything could not be cached.",
    )
    from fastfs.daemon import warm

    warm.add_arguments(w)

    i = sub.add_parser(
        "install-service",
        help="install the systemd unit and mount helper",
        description="Install the fastfs@.service systemd unit and the mount.fuse.fastfs helper.",
    )
    i.add_argument("--prefix", default="/", help="install root (default /)")
    _add_newcomer_commands(sub)
    return parser


def _add_newcomer_commands(sub: Any) -> None:
    """status, bench and completion."""
    st = sub.add_parser(
        "status",
        help="list fastfs mounts with their health and cache",
        description="List every fastfs mount on this machine (or those at MNT...): source, pid, uptime, cache use "
        "and hit ratio; a dead or hung mount is flagged with the command that recovers it (exit status 1).",
    )
    st.add_argument("mountpoints", nargs="*", metavar="MNT", help="only these mounts")
    st.add_argument("--json", action="store_true", help='print {"mounts": [...]} as JSON')

    from fastfs.daemon import bench

    b = sub.add_parser(
        "bench",
        help="measure whether fastfs helps on your storage",
        description="Read a large file and a directory of small files under PATH directly and through a "
        "temporary fastfs mount, cold (as root: caches dropped machine-wide first) and hot, and print a table "
        "and a verdict. Nothing under PATH is modified.",
    )
    b.add_argument("path", metavar="PATH", help="directory (or file) on the storage to measure")
    b.add_argument(
        "--large-bytes",
        type=_size_arg,
        default=bench.DEFAULT_LARGE_BYTES,
        metavar="SIZE",
        help="read at most SIZE of the large file (default 1G)",
    )
    b.add_argument(
        "--small-files",
        type=_positive_int,
        default=bench.DEFAULT_SMALL_FILES,
        metavar="N",
        help=f"read at most N small files (default {bench.DEFAULT_SMALL_FILES})",
    )
    b.add_argument("--json", action="store_true", help="print the measurements as JSON")
    b.add_argument("--config", metavar="FILE", help="config of the temporary mount (as for mount)")
    b.add_argument("--profile", choices=_profile_names(), help="profile of the temporary mount")
    b.add_argument("-o", dest="options", action="append", default=[], metavar="KEY=VALUE[,...]", help="mount options")

    c = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script: source <(fastfs completion bash), or save it as "
        "/etc/bash_completion.d/fastfs.",
    )
    c.add_argument("shell", choices=("bash",), help="shell to complete in")


def _size_arg(text: str) -> int:
    from fastfs.config.loader import parse_size

    try:
        value = parse_size(text, "size")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected a size such as 256M, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _profile_names() -> list[str]:
    from fastfs.config.profiles import PROFILES

    return list(PROFILES)


# -- mount ----------------------------------------------------------------------------------------
def _mount_config(args: argparse.Namespace) -> tuple[Any, str | None, dict[str, Any]]:
    overrides: dict[str, Any] = parse_overrides(args.options)
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
    from fastfs.daemon import mount

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
    try:
        src, mnt = mount.check_paths(source, mountpoint)
        mount.check_fuse_device()
    except mount.MountError as e:
        raise CliError(str(e)) from None
    config = dataclasses.replace(config, source=src, mountpoint=mnt)
    kwargs = {"config_path": config_path, "overrides": overrides, "use_default_path": True}
    if args.foreground:
        from fastfs.daemon import logsetup

        try:
            logsetup.setup(config.log.level, config.log.file or None)
        except logsetup.LogFileError as e:
            raise CliError(str(e)) from None
        try:
            return mount.Daemon(src, mnt, config, **kwargs).run()
        except mount.MountError as e:
            raise CliError(str(e)) from None
    return _daemonize(src, mnt, config, kwargs)


def _daemonize(src: str, mnt: str, config: Any, kwargs: dict[str, Any]) -> int:
    from fastfs.daemon import logsetup, mount

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
    try:
        reply = _await_child(read_fd, STARTUP_TIMEOUT)
    finally:
        os.close(read_fd)
    if reply == "ok":
        print(f"fastfs: mounted {src} on {mnt} (pid {pid}, log {log_file})", flush=True)
        return 0
    if reply is None:
        _kill_child(pid)
        mount.force_unmount(mnt)
        raise CliError(f"mount did not become ready within {STARTUP_TIMEOUT:.0f}s (log: {log_file})")
    _reap_child(pid)
    mount.force_unmount(mnt)
    if reply.startswith("error "):
        raise CliError(f"{reply[len('error ') :]} (log: {log_file})")
    raise CliError(f"the daemon exited during startup (log: {log_file})")


def _await_child(fd: int, timeout: float) -> str | None:
    """The child's one-line report; '' when it exited without one; None on timeout."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


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


def _add_profile_options(m: argparse.ArgumentParser) -> None:
    m.add_argument(
        "--profile",
        choices=_profile_names(),
        help="preset of settings for a workload, under the config file and -o (see --print-config)",
    )
    m.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective configuration as YAML (with where each setting comes from) and exit; "
        "validates the config file and options without mounting",
    )


def _print_config(args: argparse.Namespace) -> int:
    """``fastfs mount [SRC] [MNT] [--config F] [--profile P] [-o ...] --print-config``."""
    from fastfs.config.loader import COMMAND_LINE, load_with_origins
    from fastfs.config.render import render

    _, config_path, overrides = _mount_config(args)  # validates exactly as a mount would
    config, origins = load_with_origins(config_path, overrides, use_default_path=True)
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
    if overrides or paths:
        layers.append(COMMAND_LINE)
    header = "fastfs effective configuration (" + " < ".join(layers) + ")"
    sys.stdout.write(render(config, origins, header))
    return 0


def load_default_path() -> str | None:
    """The default config file when it exists (what `fastfs mount` reads without --config)."""
    from fastfs.config.loader import DEFAULT_PATH

    return DEFAULT_PATH if os.path.isfile(DEFAULT_PATH) else None


# -- umount ---------------------------------------------------------------------------------------
def cmd_umount(args: argparse.Namespace) -> int:
    from fastfs.daemon import mount

    mnt = os.path.abspath(args.mountpoint)
    entry = mount.find_mount(mnt)
    if entry is None:
        raise CliError(f"{args.mountpoint} is not mounted")
    if not mount.is_fastfs(entry):
        raise CliError(f"{args.mountpoint} is not a fastfs mount ({entry.fstype})")
    rc, err = mount.unmount(mnt, lazy=args.lazy)
    if rc == 0:
        return 0
    hint = " (files still open? use --lazy)" if "busy" in err.lower() else ""
    raise CliError(f"cannot unmount {args.mountpoint}: {err}{hint}")


# -- stats / warm / install-service ---------------------------------------------------------------
def cmd_stats(args: argparse.Namespace) -> int:
    from fastfs.daemon import statscli

    if args.top is not None and args.top < 1:
        raise CliError("--top needs a positive number")
    try:
        return statscli.main(args)
    except statscli.StatsError as e:
        raise CliError(str(e)) from None


def cmd_warm(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise CliError("--jobs needs a positive number")
    try:
        from fastfs.daemon.warm import main as warm_main
    except ImportError as e:
        raise CliError(f"warm is not available: {e}") from None
    return int(warm_main(args) or 0)


def cmd_install_service(args: argparse.Namespace) -> int:
    try:
        from fastfs.daemon.service import install
    except ImportError as e:
        raise CliError(f"install-service is not available: {e}") from None
    return int(install(args) or 0)


def cmd_bench(args: argparse.Namespace) -> int:
    from fastfs.daemon import bench

    try:
        return bench.main(args)
    except bench.BenchError as e:
        raise CliError(str(e)) from None


def cmd_completion(args: argparse.Namespace) -> int:
    from fastfs.config.loader import ALIASES, schema_keys
    from fastfs.daemon.completion import bash_script

    sys.stdout.write(bash_script(build_parser(), sorted({*ALIASES, *schema_keys()})))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from fastfs.daemon import status

    try:
        return status.main(args)
    except status.StatusError as e:
        raise CliError(str(e)) from None


COMMANDS = {
    "mount": cmd_mount,
    "umount": cmd_umount,
    "stats": cmd_stats,
    "warm": cmd_warm,
    "install-service": cmd_install_service,
    "status": cmd_status,
    "bench": cmd_bench,
    "completion": cmd_completion,
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``fastfs`` and ``python -m fastfs``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (CliError, ConfigError) as e:
        sys.stderr.write(f"fastfs: error: {one_line(e)}\n")
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"fastfs: error: {where}{e.strerror or one_line(e)}\n")
    except KeyboardInterrupt:
        return 130
    return EXIT_ERROR
