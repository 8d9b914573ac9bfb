"""The ``fastfs(1)`` man page, generated from the argument parser.

``make man`` (or ``python -m fastfs.daemon.cli.manpage [-o FILE]``) writes it; nothing is written by
hand but the few sections a parser does not know (environment, signals, files, the mount helper),
so every command and option of this version is in the page with its own help text, and no page
can describe options that are gone (``tests/unit/test_manpage.py`` checks both, and that man
renders it without warnings).

The output is plain roff with the ``man`` macros: one ``.SS`` per command with its description,
usage line and a ``.TP`` per option.
"""

from __future__ import annotations

import argparse
import sys

from fastfs import __version__
from fastfs.config.loader import ENV_OPTIONS
from fastfs.daemon.cli.parser import build_parser
from fastfs.daemon.mounttable import RUNTIME_ENV

# Sections the parser cannot describe: (title, [(term, text), ...]).
_FIXED_SECTIONS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "ENVIRONMENT",
        (
            (
                ENV_OPTIONS,
                "Options as -o takes them (e.g. budget=2G,allow_other), applied under the command line's -o.",
            ),
            ("STATE_DIRECTORY", "Directory of learned state and default logs (set by systemd's StateDirectory=)."),
            (RUNTIME_ENV, "Directory of the daemons' mount records (default /run/fastfs for root)."),
        ),
    ),
    (
        "SIGNALS",
        (
            ("SIGTERM, SIGINT", "Unmount and exit."),
            ("SIGHUP", "Reload the configuration file; settings that cannot change live are named in the log."),
            ("SIGUSR1", "Log a one-line statistics summary."),
            ("SIGUSR2", "Reopen the log file (after logrotate moved it)."),
        ),
    ),
    (
        "FILES",
        (
            ("/etc/fastfs/fastfs.yaml", "Default configuration file; config/fastfs.example.yaml lists every key."),
            ("/etc/fastfs/NAME.yaml", "Configuration of the systemd instance fastfs@NAME."),
            ("MNT/.fastfs/stats", "JSON statistics of a mount (also the user.fastfs.stats attribute of MNT)."),
        ),
    ),
    (
        "MOUNT HELPER",
        (
            (
                "mount -t fuse.fastfs SRC MNT -o OPTIONS",
                "mount.fuse.fastfs, installed by install-service, lets mount(8) and /etc/fstab mount fastfs: "
                "SRC MNT fuse.fastfs ro,allow_other,fsname=NAME,config=/etc/fastfs/NAME.yaml,_netdev 0 0. "
                "The options are those of -o.",
            ),
        ),
    ),
    (
        "EXIT STATUS",
        (
            ("0", "Success."),
            ("1", "An error, printed as one line fastfs: error: ...; status: a mount is dead or unresponsive."),
            ("2", "Bad usage (unknown command or option)."),
            ("130", "Interrupted (Ctrl-C)."),
        ),
    ),
)


def escape(text: str) -> str:
    """*text* safe inside a roff line: backslashes and dashes escaped, no line starting with a control."""
    text = " ".join(text.split())
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _option_term(action: argparse.Action) -> str:
    strings = ", ".join(f"\\fB{escape(s)}\\fR" for s in action.option_strings)
    if action.nargs == 0:
        return strings
    value: str | tuple[str, ...]
    if action.choices:
        value = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        value = action.metavar or action.dest.upper()
    return f"{strings} \\fI{escape(str(value))}\\fR"


def _usage(sub: argparse.ArgumentParser) -> str:
    return " ".join(sub.format_usage().removeprefix("usage:").split())


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The man page of *parser* (default: fastfs's) as roff."""
    parser = parser or build_parser()
    prog = parser.prog
    out = [
        f'.TH {prog.upper()} 1 "" "{prog} {__version__}" "User Commands"',
        ".SH NAME",
        f"{prog} \\- {escape(_lower_first((parser.description or '').rstrip('.')))}",
        ".SH SYNOPSIS",
        f".B {prog}",
        "\\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGUMENTS\\fR]",
        ".SH DESCRIPTION",
        escape(
            f"{prog} mirrors a directory read-only through FUSE, watches how it is read, and fetches what comes "
            "next with many parallel reads into a bounded RAM cache (and optionally a disk tier). Its commands:"
        ),
        ".SH COMMANDS",
    ]
    for name, sub in _subcommands(parser):
        out += [f'.SS "{escape(name)}"', escape(sub.description or ""), ".PP", f".B {escape(_usage(sub))}"]
        for action in sub._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            out += [
                ".TP",
                _option_term(action),
                escape((action.help or "").replace("%(default)s", str(action.default))),
            ]
        positionals = [a for a in sub._actions if not a.option_strings]
        for action in positionals:
            out += [".TP", f"\\fI{escape(str(action.metavar or action.dest))}\\fR", escape(action.help or "")]
    for title, items in _FIXED_SECTIONS:
        out.append(f".SH {title}")
        for term, text in items:
            out += [".TP", f"\\fB{escape(term)}\\fR", escape(text)]
    out += [".SH SEE ALSO", "mount(8), fusermount3(1), systemd.unit(5)", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fastfs.daemon.cli.manpage", description="write the fastfs(1) man page")
    ap.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: standard output)")
    args = ap.parse_args(argv)
    page = render()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
