"""The argument parser of ``fastfs``: every command, option and help text, in one place.

:func:`build_parser` is the single description of the command line: :mod:`.main` parses with it,
and the shell completions (:mod:`.completion`) and the man page (:mod:`.manpage`) are generated
from it, so they always match this version. Errors of the parser are one line in the fastfs format
(``fastfs: error: ...``, exit status 2).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from fastfs import __version__
from fastfs.config.loader import ConfigError, one_line, parse_size
from fastfs.config.profiles import PROFILES
from fastfs.daemon.cli import bench, completion, stats, warm

# Seconds between `fastfs stats --watch` lines when no interval is given (one line a second reads well).
DEFAULT_WATCH_INTERVAL = 1.0


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
        help="settings, e.g. -o budget=2G,workers=8 or -o readahead.max_window=128M, and the standard mount "
        "options ro, allow_other, allow_root, default_permissions, fsname=NAME, subtype=NAME, noatime, nonempty, "
        "nosuid, nodev (rw is refused: fastfs is read-only); also taken from $FASTFS_OPTIONS, under -o",
    )
    m.add_argument("--allow-other", action="store_true", help="let other users use the mount (as -o allow_other)")
    m.add_argument("--log-level", choices=("debug", "info", "warning", "error"), help="log level")
    m.add_argument("--log-file", metavar="F", help="log file, created 0600 (default: stderr; background: see above)")
    _add_profile_options(m)

    u = sub.add_parser("umount", help="unmount MNT", description="Unmount MNT (recovers a mount whose daemon died).")
    u.add_argument("mountpoint", metavar="MNT")
    u.add_argument("-l", "--lazy", action="store_true", help="detach now, finish when files are closed")

    s = sub.add_parser("stats", help="show statistics of a mount", description="Show what a fastfs mount did.")
    s.add_argument("mountpoint", metavar="MNT", help="the mount, or any path inside it")
    s.add_argument("--json", action="store_true", help="print the raw JSON snapshot")
    s.add_argument(
        "--watch",
        nargs="?",
        type=_watch_interval,
        const=DEFAULT_WATCH_INTERVAL,
        default=None,
        metavar="SECONDS",
        help=f"print per-interval rates every SECONDS (default {DEFAULT_WATCH_INTERVAL:g}, at least"
        f" {stats.MIN_WATCH_INTERVAL:g}) until Ctrl-C",
    )
    s.add_argument("--top", type=int, metavar="N", help="list the N files with most bytes fetched")

    w = sub.add_parser(
        "warm",
        help="prefetch files or trees into a mount's cache, report or drop what is cached",
        description="Prefetch PATHs (inside fastfs mounts) into the cache now, as background jobs of the "
        "daemon, with progress by files and bytes; --check reports how much is cached, --evict drops it. "
        "Exit 1 when anything could not be cached.",
    )
    warm.add_arguments(w)

    i = sub.add_parser(
        "install-service",
        help="install the systemd unit and mount helper",
        description="Install the fastfs@.service systemd unit and the mount.fuse.fastfs helper.",
    )
    i.add_argument("--prefix", default="/", help="install root (default /)")
    r = sub.add_parser(
        "uninstall-service",
        help="remove the systemd unit and mount helper",
        description="Remove what install-service installed: the fastfs@.service unit, the mount.fuse.fastfs link "
        "and the unchanged example config; the instances' configs, state and logs are kept. Refuses while "
        "fastfs@ instances run.",
    )
    r.add_argument("--prefix", default="/", help="install root (default /)")
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

    b = sub.add_parser(
        "bench",
        help="measure whether fastfs helps on your storage",
        description="Read a large file and a directory of small files under PATH directly and through a "
        "temporary fastfs mount, hot (after a warm-up) or, with --drop-caches, cold and hot, and print a table "
        "and a verdict, with a progress line per pass. Nothing under PATH is modified; a PATH on a fastfs mount "
        "is refused.",
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
    b.add_argument(
        "--drop-caches",
        action="store_true",
        help="root only: measure cold passes, dropping the page cache of the WHOLE machine before each",
    )
    b.add_argument("--config", metavar="FILE", help="config of the temporary mount (as for mount)")
    b.add_argument("--profile", choices=_profile_names(), help="profile of the temporary mount")
    b.add_argument("-o", dest="options", action="append", default=[], metavar="KEY=VALUE[,...]", help="mount options")

    c = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, fish)",
        description="Print a completion script: bash: source <(fastfs completion bash), or save it as "
        "/etc/bash_completion.d/fastfs; zsh: save it as _fastfs in a directory of $fpath (fastfs completion zsh > "
        '"${fpath[1]}/_fastfs"); fish: fastfs completion fish > ~/.config/fish/completions/fastfs.fish.',
    )
    c.add_argument("shell", choices=completion.SHELLS, help="shell to complete in")


def _size_arg(text: str) -> int:
    try:
        value = parse_size(text, "size")
    except ConfigError:
        raise argparse.ArgumentTypeError(f"expected a size such as 256M, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive size, got {text!r}")
    return value


def _watch_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds such as 2, got {text!r}") from None
    if not (stats.MIN_WATCH_INTERVAL <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected at least {stats.MIN_WATCH_INTERVAL:g} seconds, got {text!r}")
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
    return list(PROFILES)


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
