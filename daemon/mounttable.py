"""The mount table, read and changed: one module for the daemon and the client commands.

What both sides need to know about mounts lives here and nowhere else: parsing
``/proc/self/mountinfo`` (:func:`mounts`, with its octal escapes), finding the mount *on* a path
(:func:`find_mount`) or *holding* one (:func:`containing_mount`), the one test of "is this a fastfs
mount" (:func:`is_fastfs`), and unmounting (:func:`unmount` for ``fastfs umount``,
:func:`force_unmount` for cleanups that must never raise). The daemon (:mod:`fastfs.daemon.mount`)
uses it to clean up a failed start; the commands of :mod:`fastfs.daemon.cli` use it to find and
recover mounts; tests and benchmarks use :func:`force_unmount` for every FUSE mount they make.

Nothing here imports the daemon or the commands, so both import it without a circle.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess

from fastfs.config.loader import one_line

MOUNTINFO = "/proc/self/mountinfo"
FSTYPE = "fuse.fastfs"
# Seconds a fusermount3/umount subprocess may take before it is abandoned.
UNMOUNT_TIMEOUT = 30.0
# errnos of a FUSE mount whose daemon is gone.
DEAD_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)


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


def daemon_gone(path: str) -> bool:
    """True when the FUSE mount at *path* has no daemon any more (ENOTCONN / ECONNABORTED).

    statfs always reaches the daemon, unlike stat, which the kernel may answer from its attribute
    cache (attr_timeout) long after the daemon died.
    """
    try:
        os.statvfs(path)
    except OSError as e:
        return e.errno in DEAD_ERRNOS
    return False


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
        dead = e.errno in DEAD_ERRNOS
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
