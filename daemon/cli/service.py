"""systemd and mount(8) integration: ``fastfs install-service``, ``fastfs uninstall-service`` and the
unit's post-stop cleanup.

Design: the unit file and the example config are shipped as package data and copied, never
generated, so what is installed is exactly what is reviewed and verified in the repository
(``systemd/fastfs@.service``, ``config/fastfs.example.yaml``). Installing rewrites only the two
portable command prefixes of the unit, ``/usr/bin/env fastfs`` and ``/usr/bin/env python3``, into
the absolute paths of the fastfs script and interpreter of this installation: systemd runs units with
a minimal PATH, on which a virtualenv's or pyenv's fastfs is not found (or another Python is). The
``mount.fuse.fastfs`` console script is linked into ``/sbin``, the only place mount(8) looks for
helpers, so ``mount -t fuse.fastfs`` and fstab lines work.

``python -m fastfs.daemon.cli.service cleanup CONFIG`` is the unit's ``ExecStopPost=``. A FUSE mount
outlives its daemon when the daemon dies without unmounting (crash, SIGKILL after the stop
timeout, a start killed before READY=1): the kernel keeps a dead mount that fails every access with
ENOTCONN and blocks the next mount on the same directory. The cleanup reads the mountpoint from the
instance's config and lazily detaches FUSE mounts there, but only dead ones: a live mount (of
this or any other daemon) answers ``statfs`` and is never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from fastfs.config.loader import ConfigError, read_yaml
from fastfs.daemon.mounttable import (
    MNT_DETACH,
    abort_connection,
    canonical,
    find_mount,
    is_fastfs,
    mount_state,
    umount2,
)

UNIT_NAME = "fastfs@.service"
EXAMPLE_NAME = "fastfs.example.yaml"
INSTALLED_EXAMPLE_NAME = "example.yaml"
UNIT_DIR = "etc/systemd/system"
CONFIG_DIR = "etc/fastfs"
# mount(8) looks for helpers in /sbin only (on merged-/usr systems that is /usr/sbin).
HELPER_DIR = "sbin"
HELPER_NAME = "mount.fuse.fastfs"
# Package holding the unit as data once pyproject maps systemd/ into the package tree.
UNIT_PACKAGE = "fastfs.systemd"
CONFIG_PACKAGE = "fastfs.config"
# Repository checkout layout, used when the package data is not installed (editable installs).
_REPO_ROOT = Path(__file__).resolve().parents[2]
REPO_UNIT = _REPO_ROOT / "systemd" / UNIT_NAME
REPO_EXAMPLE = _REPO_ROOT / "config" / EXAMPLE_NAME
# Portable command prefixes in the shipped unit, replaced by absolute paths on install.
ENV_FASTFS = "/usr/bin/env fastfs"
ENV_PYTHON = "/usr/bin/env python3"
# Unit files are world-readable configuration.
FILE_MODE = 0o644
# FUSE mounts stack; a crash loop may have left several dead ones on the same directory.
MAX_STACKED_MOUNTS = 16
# Seconds to wait for fusermount3 when the process may not call umount2 itself.
FUSERMOUNT_TIMEOUT = 30


class InstallError(Exception):
    """Installing failed; the message is one line."""


# -- locating the shipped files ---------------------------------------------------------------
def _package_text(package: str, name: str) -> str | None:
    try:
        return resources.files(package).joinpath(name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        return None


def _shipped_text(package: str, name: str, repo_path: Path) -> str:
    """Package data *name* of *package*, else the repository's copy at *repo_path*."""
    text = _package_text(package, name)
    if text is None and repo_path.is_file():
        text = repo_path.read_text(encoding="utf-8")
    if text is None:
        raise InstallError(f"{name} not found in package {package} nor at {repo_path}")
    return text


def unit_text() -> str:
    """The shipped unit: package data ``fastfs.systemd``, else the repository's ``systemd/``."""
    return _shipped_text(UNIT_PACKAGE, UNIT_NAME, REPO_UNIT)


def example_text() -> str:
    """The shipped example config (package data of ``fastfs.config``)."""
    return _shipped_text(CONFIG_PACKAGE, EXAMPLE_NAME, REPO_EXAMPLE)


def find_script(name: str) -> str:
    """Absolute path of console script *name* (``fastfs``, ``mount.fuse.fastfs``) of this installation.

    The script next to this interpreter comes first: ``shutil.which`` may find a wrapper (pyenv shim)
    or another installation earlier on PATH.
    """
    candidates = [os.path.join(os.path.dirname(sys.executable), name)]
    if os.path.basename(sys.argv[0] or "") == name:
        candidates.append(os.path.abspath(sys.argv[0]))
    found = shutil.which(name)
    if found:
        candidates.append(found)
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    raise InstallError(f"the {name} script was not found next to the interpreter nor on PATH; is fastfs installed?")


def _quote(path: str) -> str:
    """A path as one word of a unit's command line."""
    if re.search(r"[\s\"'\\]", path):
        return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return path


def render_unit(text: str, fastfs_path: str, python_path: str) -> str:
    """*text* with the portable command prefixes of Exec*= lines replaced by absolute paths."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith("Exec"):
            line = line.replace(ENV_FASTFS, _quote(fastfs_path)).replace(ENV_PYTHON, _quote(python_path))
        out.append(line)
    return "".join(out)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- install-service --------------------------------------------------------------------------
def _link_atomic(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def install(args: Any) -> int:
    """``fastfs install-service [--prefix DIR]``: install the unit, the mount helper and the example config.

    The unit and the helper link are (re)written so an upgrade refreshes them; an existing example
    config, and a mount helper that is a regular file (installed by a package), are kept. Returns the
    exit status; problems are reported on one line.
    """
    prefix = Path(getattr(args, "prefix", None) or "/")
    notes: list[str] = []
    try:
        fastfs_script = find_script("fastfs")
        helper_script = find_script(HELPER_NAME)
        unit = render_unit(unit_text(), fastfs_script, os.path.abspath(sys.executable))
        example = example_text()

        unit_path = prefix / UNIT_DIR / UNIT_NAME
        _write_atomic(unit_path, unit)
        notes.append(f"wrote {unit_path}")

        helper_path = prefix / HELPER_DIR / HELPER_NAME
        if helper_path.exists() and not helper_path.is_symlink():
            notes.append(f"kept existing {helper_path}")
        else:
            _link_atomic(helper_path, helper_script)
            notes.append(f"linked {helper_path} -> {helper_script}")

        example_path = prefix / CONFIG_DIR / INSTALLED_EXAMPLE_NAME
        if example_path.exists():
            notes.append(f"kept existing {example_path}")
        else:
            _write_atomic(example_path, example)
            notes.append(f"wrote {example_path}")
    except InstallError as e:
        print(f"fastfs install-service: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        where = f" {e.filename}:" if e.filename else ""
        print(f"fastfs install-service:{where} {e.strerror or e}", file=sys.stderr)
        return 1
    config_dir = prefix / CONFIG_DIR
    print("\n".join(notes))
    print("next:")
    print(f"  cp {example_path} {config_dir}/NAME.yaml   # then set source and mountpoint")
    print("  systemctl daemon-reload")
    print("  systemctl enable --now fastfs@NAME")
    print("or mount from /etc/fstab:  SRC MNT fuse.fastfs ro,_netdev,config=/etc/fastfs/NAME.yaml 0 0")
    return 0


# -- uninstall-service ------------------------------------------------------------------------
def _is_our_unit(path: Path) -> bool:
    """True when *path* is a fastfs unit as install-service writes it (its Exec lines run fastfs)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    shipped = {line for line in unit_text().splitlines() if line and not line.startswith("Exec")}
    return shipped <= set(text.splitlines())


def uninstall(args: Any) -> int:
    """``fastfs uninstall-service [--prefix DIR]``: remove what install-service installed.

    Removed: the unit (when it is fastfs's: every line but the Exec ones as shipped), the
    ``mount.fuse.fastfs`` link (only a symlink to a ``mount.fuse.fastfs`` script: a helper installed
    as a regular file by a package is kept) and the example config when it is unchanged. Kept and
    said so: the instances' configs (``/etc/fastfs/NAME.yaml``), an edited example, learned state and
    logs. Instances still running are named with the command that stops them, and nothing is removed
    while one runs (its unit would vanish under systemd); the exit status is then 1.
    """
    prefix = Path(getattr(args, "prefix", None) or "/")
    prog = "fastfs uninstall-service"
    unit_path = prefix / UNIT_DIR / UNIT_NAME
    helper_path = prefix / HELPER_DIR / HELPER_NAME
    example_path = prefix / CONFIG_DIR / INSTALLED_EXAMPLE_NAME
    notes: list[str] = []
    try:
        if str(prefix) == "/":
            running = _running_instances()
            if running:
                stop = " ".join(running)
                print(
                    f"{prog}: still running: {stop} (stop them first: systemctl disable --now {stop})", file=sys.stderr
                )
                return 1
        if unit_path.exists():
            if _is_our_unit(unit_path):
                unit_path.unlink()
                notes.append(f"removed {unit_path}")
            else:
                notes.append(f"kept {unit_path}: it is not the unit fastfs installs")
        if helper_path.is_symlink():
            if os.path.basename(os.readlink(helper_path)) == HELPER_NAME:
                helper_path.unlink()
                notes.append(f"removed {helper_path}")
            else:
                notes.append(f"kept {helper_path}: it links elsewhere")
        elif helper_path.exists():
            notes.append(f"kept {helper_path}: installed by a package, not by fastfs install-service")
        if example_path.exists():
            if example_path.read_bytes() == example_text().encode("utf-8"):
                example_path.unlink()
                notes.append(f"removed {example_path}")
            else:
                notes.append(f"kept {example_path}: edited")
        config_dir = prefix / CONFIG_DIR
        kept = sorted(p.name for p in config_dir.glob("*.yaml")) if config_dir.is_dir() else []
        if kept:
            notes.append(f"kept the configs in {config_dir}: {', '.join(kept)}")
    except InstallError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        where = f" {e.filename}:" if e.filename else ""
        print(f"{prog}:{where} {e.strerror or e}", file=sys.stderr)
        return 1
    print("\n".join(notes or ["nothing to remove: fastfs's unit and mount helper are not installed"]))
    if any(n.startswith("removed") for n in notes) and str(prefix) == "/":
        print("next: systemctl daemon-reload")
    return 0


def _running_instances() -> list[str]:
    """The fastfs@ units systemd runs now ([] without systemd)."""
    try:
        done = subprocess.run(
            ["systemctl", "list-units", "--plain", "--no-legend", "--state=active", "fastfs@*"],
            capture_output=True,
            text=True,
            timeout=FUSERMOUNT_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    return [line.split()[0] for line in done.stdout.splitlines() if line.startswith("fastfs@")]


# -- ExecStopPost cleanup ---------------------------------------------------------------------
def _detach(path: str) -> bool:
    if umount2(path, MNT_DETACH) == 0:
        return True
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
    if fusermount is None:
        return False
    try:
        done = subprocess.run([fusermount, "-u", "-z", path], capture_output=True, timeout=FUSERMOUNT_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def canonical_mountpoint(path: str) -> str:
    """Absolute path with the parent's symlinks resolved, without touching *path* itself (it may be dead)."""
    return canonical(path)


def cleanup_mountpoint(mountpoint: str) -> int:
    """Detach dead fastfs mounts on *mountpoint* (while the topmost mount there is one); returns how
    many were detached. A dead mount's connection is aborted first (a daemon killed while a read of a
    hung source kept its connection open leaves readers blocked on it); live and hung mounts (their
    daemon runs) are never touched."""
    path = canonical_mountpoint(mountpoint)
    detached = 0
    for _ in range(MAX_STACKED_MOUNTS):
        entry = find_mount(path)
        if not is_fastfs(entry) or entry is None or mount_state(entry) != "dead":
            break
        abort_connection(entry)  # may unmount it already (umount2 with MNT_FORCE when fusectl is absent)
        if find_mount(path) != entry or _detach(path):
            detached += 1
        else:
            break
    return detached


def cleanup(config_path: str) -> int:
    """ExecStopPost: detach a dead mount left on the config's mountpoint. Always returns 0."""
    try:
        mountpoint = read_yaml(config_path).get("mountpoint")
    except ConfigError as e:
        print(f"fastfs cleanup: {e}", file=sys.stderr)
        return 0
    if not mountpoint or not isinstance(mountpoint, str):
        return 0
    try:
        n = cleanup_mountpoint(mountpoint)
    except OSError as e:
        print(f"fastfs cleanup: {mountpoint}: {e.strerror or e}", file=sys.stderr)
        return 0
    if n:
        print(f"fastfs cleanup: detached {n} dead mount(s) on {mountpoint}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastfs.daemon.cli.service", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("cleanup", help="detach a dead fastfs mount left on CONFIG's mountpoint (ExecStopPost)")
    p.add_argument("config")
    p = sub.add_parser("install", help="same as `fastfs install-service`")
    p.add_argument("--prefix", default="/")
    p = sub.add_parser("uninstall", help="same as `fastfs uninstall-service`")
    p.add_argument("--prefix", default="/")
    args = parser.parse_args(argv)
    if args.command == "cleanup":
        return cleanup(args.config)
    return uninstall(args) if args.command == "uninstall" else install(args)


if __name__ == "__main__":
    raise SystemExit(main())
