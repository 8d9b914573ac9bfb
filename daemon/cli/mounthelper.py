"""``mount.fuse.fastfs``: the mount(8) helper behind ``mount -t fuse.fastfs`` and /etc/fstab.

mount(8) runs ``mount.fuse.fastfs SRC MNT [-sfnv] -o OPTIONS`` for

    mount -t fuse.fastfs SRC MNT -o ro,budget=2G
    SRC  MNT  fuse.fastfs  ro,budget=2G,config=/etc/fastfs/x.yaml,_netdev  0 0     (fstab)

Design: the option string is translated by a pure function, :func:`map_options`, into what
``fastfs mount`` takes (``--config FILE`` and ``-o key=value`` overrides); options meant for
mount(8), systemd or the kernel's generic mount flags are dropped. The result is validated with
the same :func:`~fastfs.config.loader.load_config` the daemon uses before anything is started,
so a typo fails at once with one line naming the option. Then ``fastfs mount`` runs in its
background mode, which returns only once the mount is live (or has failed), so mount(8) and
systemd's .mount units see the usual helper contract: exit 0 means mounted.

The standard FUSE options mean what they mean for ``fastfs mount -o`` (one table, in
:mod:`fastfs.config.loader`): ``ro`` changes nothing, ``fsname=``/``subtype=`` name the mount in the
mount table, ``default_permissions``, ``allow_other``, ``allow_root``, ``noatime``, ``nonempty``.
fastfs is read-only; ``rw`` is accepted here and the mount is read-only anyway (as squashfs or
iso9660 do), because mount(8) adds ``rw`` to the options of every helper call that names neither,
so refusing it would break a plain ``mount -t fuse.fastfs SRC MNT`` and ``defaults`` in fstab
(``fastfs mount -o rw`` is refused).

``SRC`` may be a placeholder (``fastfs`` or ``none``, when no such directory exists) if the config
file names ``source``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping

from fastfs.config.loader import (
    ALIASES,
    NO_OP_OPTIONS,
    ConfigError,
    did_you_mean,
    load_config,
    one_line,
    option_type,
    schema_keys,
)

PROG = "mount.fuse.fastfs"
# mount(8) exit status for bad usage or options, and for a mount that failed (see mount(8) RETURN CODES).
EXIT_USAGE = 1
EXIT_MOUNT_FAILED = 32
# Seconds allowed for `fastfs mount` to mount and return (a hung network source must not hang boot).
MOUNT_TIMEOUT = 300
# mount(8) runs helpers with PATH removed; the daemon and its tools need a sane one.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# SRC values meaning "take the source from the config file".
SOURCE_PLACEHOLDERS = ("fastfs", "none")

# Options for mount(8), fstab consumers and the kernel's generic flags, ignored by fastfs (the mount is
# always read-only, nodev and nosuid, so none of them changes what it does). ``rw`` is among them:
# mount(8) adds it to every helper call that names neither ro nor rw (``fastfs mount -o rw`` is refused).
# The standard FUSE options (ro, default_permissions, fsname, subtype, noatime, allow_root, nonempty,
# allow_other) are fastfs options with their usual meaning: see config/loader.py.
GENERIC_OPTIONS = frozenset(
    {
        "rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group",
        "_netdev", "nofail", "atime", "relatime", "norelatime", "strictatime", "nostrictatime",
        "lazytime", "nolazytime", "diratime", "nodiratime", "dev", "suid", "exec",
        "noexec", "sync", "async", "dirsync", "silent", "loud", "mand", "nomand", "iversion", "noiversion",
    }
)  # fmt: skip
# Prefixes of options addressed to other programs: x-systemd.*, x-gvfs-*, X-mount.*, comment=...
GENERIC_PREFIXES = ("x-", "X-", "comment=")
# Options of the generic mount.fuse helper or of mount(8) that fastfs cannot honour.
UNSUPPORTED = {
    "remount": "remounting is not supported (unmount and mount again)",
    "bind": "bind mounts are not made by the fastfs helper",
    "rbind": "bind mounts are not made by the fastfs helper",
    "setuid": "running the daemon as another user is not supported",
    "drop_privileges": "dropping privileges is not supported",
}
# Top-level config keys that mount(8) passes as arguments instead.
POSITIONAL_KEYS = ("source", "mountpoint")
# Top-level config keys accepted as options (profile=training).
TOP_LEVEL_OPTIONS = ("profile",)


def _split(optstring: str) -> list[str]:
    """Split on commas outside double quotes (libmount's quoting: ``opt="a,b"``)."""
    items: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in optstring:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            items.append("".join(current))
            current = []
            continue
        current.append(ch)
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def map_options(optstring: str | None) -> tuple[str | None, dict[str, str], list[str]]:
    """Mount option string -> (config file or None, ``{dotted key: value}`` overrides, errors).

    Aliases (``budget``, ``workers``, ...) become their dotted keys; ``NAME`` alone means
    ``NAME=true`` and ``noNAME`` means ``NAME=false`` for boolean aliases. Keys are not checked
    against the schema here (:func:`validate` does that); an option that is neither an alias nor
    ``section.key`` is an error.
    """
    config: str | None = None
    overrides: dict[str, str] = {}
    errors: list[str] = []
    for item in _split(optstring or ""):
        key, sep, raw = item.partition("=")
        key = key.strip()
        value = _unquote(raw) if sep else "true"
        if key in GENERIC_OPTIONS or item.startswith(GENERIC_PREFIXES) or (key in NO_OP_OPTIONS and not sep):
            continue
        if key in UNSUPPORTED:
            errors.append(f"{key}: {UNSUPPORTED[key]}")
            continue
        if key == "config":
            if not sep or not value:
                errors.append("config: expected config=FILE")
            elif config is not None and config != value:
                errors.append(f"config: given twice ({config} and {value})")
            else:
                config = value
            continue
        if key in POSITIONAL_KEYS:
            errors.append(f"{key}: given by mount's arguments, not as an option")
            continue
        if not sep and key.startswith("no") and key[2:] in ALIASES and key != "no_open":
            key, value = key[2:], "false"
        dotted = ALIASES.get(key, key)
        if ("." not in dotted and dotted not in TOP_LEVEL_OPTIONS) or not all(dotted.split(".")):
            hint = did_you_mean(key, [*ALIASES, *schema_keys()])
            errors.append(f"{key}: unknown option{hint} (use a fastfs option such as budget=2G or section.key=value)")
            continue
        if not sep and option_type(dotted) not in (None, "bool"):
            errors.append(f"{key}: missing a value (write {key}=VALUE)")
            continue
        if "," in value:
            errors.append(f"{key}: values containing commas are not supported")
            continue
        overrides[dotted] = value
    return config, overrides, errors


def validate(config_path: str | None, overrides: Mapping[str, str], source: str, mountpoint: str) -> str:
    """Load the config as the daemon will; returns the source to mount. Raises ConfigError."""
    flat = dict(overrides)
    if source:
        flat["source"] = source
    flat["mountpoint"] = mountpoint
    config = load_config(config_path, flat)
    if not config.source:
        raise ConfigError("source: not given (mount argument or `source` in the config file)")
    return config.source


def build_command(source: str, mountpoint: str, config_path: str | None, overrides: Mapping[str, str]) -> list[str]:
    """The ``fastfs mount`` command line (background mode: returns once mounted)."""
    cmd = [sys.executable, "-m", "fastfs", "mount", source, mountpoint]
    if config_path:
        cmd += ["--config", config_path]
    for key, value in overrides.items():
        cmd += ["-o", f"{key}={value}"]
    return cmd


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="mount(8) helper for fuse.fastfs mounts")
    p.add_argument("source", help="directory to mirror (or fastfs/none to use the config's source)")
    p.add_argument("mountpoint")
    p.add_argument("-o", dest="options", action="append", default=[], help="comma-separated mount options")
    p.add_argument("-s", dest="sloppy", action="store_true", help="accepted for mount(8); options are strict")
    p.add_argument("-f", dest="fake", action="store_true", help="validate only, do not mount")
    p.add_argument("-n", dest="nomtab", action="store_true", help="accepted for mount(8) (no mtab is written)")
    p.add_argument("-v", dest="verbose", action="store_true", help="print the fastfs command")
    p.add_argument("-t", dest="type", help="accepted for mount(8) (fuse.fastfs)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``mount.fuse.fastfs``; returns mount(8)'s exit status convention."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed its one-line usage error
        return EXIT_USAGE if e.code else 0
    config_path, overrides, errors = map_options(",".join(args.options))
    if errors:
        print(f"{PROG}: {'; '.join(errors)}", file=sys.stderr)
        return EXIT_USAGE
    source = args.source
    if source in SOURCE_PLACEHOLDERS and not os.path.isdir(source):
        source = ""
    mountpoint = os.path.abspath(args.mountpoint)
    try:
        source = validate(config_path, overrides, source, mountpoint)
    except ConfigError as e:
        print(f"{PROG}: {one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    cmd = build_command(source, mountpoint, config_path, overrides)
    if args.verbose:
        print(f"{PROG}: {' '.join(cmd)}", file=sys.stderr)
    if args.fake:
        return 0
    env = dict(os.environ)
    env.setdefault("PATH", DEFAULT_PATH)
    try:
        # `fastfs mount` reports success with one line; mount(8) helpers are silent unless -v
        stdout = None if args.verbose else subprocess.DEVNULL
        done = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, timeout=MOUNT_TIMEOUT)
    except subprocess.TimeoutExpired:
        print(f"{PROG}: fastfs mount did not finish within {MOUNT_TIMEOUT} s", file=sys.stderr)
        return EXIT_MOUNT_FAILED
    except OSError as e:
        print(f"{PROG}: cannot run fastfs: {e.strerror or e}", file=sys.stderr)
        return EXIT_MOUNT_FAILED
    return 0 if done.returncode == 0 else EXIT_MOUNT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
