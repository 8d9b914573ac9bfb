"""The ``fastfs`` command line: mount, umount, stats, warm, status, bench, install-service,
uninstall-service and completion.

:func:`main` parses with :func:`~fastfs.daemon.cli.parser.build_parser` and runs one command of
the modules of this package. Every user error is one line ``fastfs: error: ...`` on stderr with a
non-zero exit, never a traceback: commands raise :class:`~fastfs.daemon.cli.CliError` (or a
:class:`~fastfs.config.loader.ConfigError`, or an ``OSError`` naming its file), which this module
turns into that line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from fastfs.config.loader import ALIASES, ConfigError, one_line, schema_keys
from fastfs.daemon.cli import CliError, bench, completion, mountcmd, service, stats, status, warm
from fastfs.daemon.cli.parser import build_parser

# Exit status of user errors (argparse uses 2 for usage errors).
EXIT_ERROR = 1
# Exit status after Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


def cmd_stats(args: argparse.Namespace) -> int:
    if args.top is not None and args.top < 1:
        raise CliError("--top needs a positive number")
    try:
        return stats.main(args)
    except stats.StatsError as e:
        raise CliError(str(e)) from None


def cmd_warm(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise CliError("--jobs needs a positive number")
    return int(warm.main(args) or 0)


def cmd_install_service(args: argparse.Namespace) -> int:
    return int(service.install(args) or 0)


def cmd_uninstall_service(args: argparse.Namespace) -> int:
    return int(service.uninstall(args) or 0)


def cmd_bench(args: argparse.Namespace) -> int:
    try:
        return bench.main(args)
    except bench.BenchError as e:
        raise CliError(str(e)) from None


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion.script(args.shell, build_parser(), sorted({*ALIASES, *schema_keys()})))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    try:
        return status.main(args)
    except status.StatusError as e:
        raise CliError(str(e)) from None


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "mount": mountcmd.cmd_mount,
    "umount": mountcmd.cmd_umount,
    "stats": cmd_stats,
    "warm": cmd_warm,
    "install-service": cmd_install_service,
    "uninstall-service": cmd_uninstall_service,
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
        return EXIT_INTERRUPTED
    return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
