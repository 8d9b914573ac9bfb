"""The mount table, read and changed: one module for the daemon and the client commands.

What both sides need to know about mounts lives here and nowhere else: parsing
``/proc/self/mountinfo`` (:func:`mounts`, with its octal escapes), finding the mount *on* a path
(:func:`find_mount`) or *holding* one (:func:`containing_mount`), the one test of "is this a fastfs
mount" (:func:`is_fastfs`), and unmounting (:func:`unmount` for ``fastfs umount``,
:func:`force_unmount` for cleanups that must never raise). The daemon (:mod:`fastfs.daemon.mount`)
uses it to clean up a failed start; the commands of :mod:`fastfs.daemon.cli` use it to find and
recover mounts; tests and benchmarks use :func:`force_unmount` for every FUSE mount they make.

Mount records. A live daemon writes one small JSON file per mount (:class:`MountRecord`: device,
mount point, type, pid, source) into a runtime directory (``/run/fastfs/mounts`` for root), and
removes it when it exits. The commands read it without touching the mount: it tells a killed
daemon (its pid gone) from a hung one, names the FUSE connection to abort, and marks a mount of
another subtype (``-o subtype=``) as fastfs's own.

Nothing here imports the daemon or the commands, so both import it without a circle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import subprocess

from fastfs.config.loader import one_line

MOUNTINFO = "/proc/self/mountinfo"
FSTYPE = "fuse.fastfs"
# Seconds a fusermount3/umount subprocess may take before it is abandoned.
UNMOUNT_TIMEOUT = 30.0
# Root's directory of mount records, and the variable that moves every user's (tests, containers).
ROOT_RUNTIME_DIR = "/run/fastfs"
RUNTIME_ENV = "FASTFS_RUNTIME_DIR"
# Subdirectory of a runtime directory holding one record per mount.
RECORDS = "mounts"
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
    super_options: str = ""  # the file system's own options (for FUSE: user_id=U,group_id=G,...)

    @property
    def user_id(self) -> int | None:
        """The uid that made a FUSE mount (its ``user_id=`` option), or None."""
        for option in self.super_options.split(","):
            key, _, value = option.partition("=")
            if key == "user_id" and value.isdigit():
                return int(value)
        return None


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
            options = tail[2] if len(tail) > 2 else ""
            entries.append(MountEntry(fields[2], unescape_field(fields[4]), tail[0], unescape_field(tail[1]), options))
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

    This is the one test of "is this a fastfs mount" the commands use: a mount of type
    ``fuse.fastfs``, or a FUSE mount of another type (``-o subtype=``) whose daemon recorded it (see
    :func:`mount_record`). Other FUSE file systems (sshfs, rclone, a storage emulator) are never touched.
    """
    if entry is None:
        return False
    return entry.fstype == FSTYPE or (entry.fstype.startswith("fuse.") and mount_record(entry) is not None)


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


# -- the daemons' records of their mounts ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MountRecord:
    """What a daemon records about its mount, readable without asking the mount (which may hang)."""

    device: str
    mountpoint: str
    fstype: str
    pid: int
    source: str


def runtime_dir(uid: int | None = None) -> str | None:
    """The directory of mount records of user *uid* (default: this process's): ``$FASTFS_RUNTIME_DIR``
    when set (tests, containers), else ``/run/fastfs`` for root and ``/run/user/UID/fastfs`` for
    other users (None when that user has no runtime directory)."""
    override = os.environ.get(RUNTIME_ENV)
    if override:
        return override
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return ROOT_RUNTIME_DIR
    base = os.environ.get("XDG_RUNTIME_DIR") if uid == os.geteuid() else None
    base = base or f"/run/user/{uid}"
    return os.path.join(base, "fastfs") if os.path.isdir(base) else None


def _record_path(directory: str, device: str) -> str:
    return os.path.join(directory, RECORDS, device.replace(":", "_") + ".json")


def record_mount(record: MountRecord) -> str | None:
    """Write *record* where the commands look for it (atomically, mode 0644); its path, or None when
    there is no runtime directory or it cannot be written (the mount works without a record)."""
    directory = runtime_dir()
    if directory is None:
        return None
    path = _record_path(directory, record.device)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(record), f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return None
    return path


def forget_mount(device: str) -> None:
    """Remove the record of the mount on *device* (best effort)."""
    directory = runtime_dir()
    if directory is not None:
        with contextlib.suppress(OSError):
            os.unlink(_record_path(directory, device))


def mount_record(entry: MountEntry) -> MountRecord | None:
    """The record of the daemon serving *entry*, or None. A record counts only when its device, mount
    point and type match the entry (device numbers are reused after an unmount) and its file belongs
    to root or to the user who made the mount."""
    owner = entry.user_id
    directories = {runtime_dir(0)}
    if owner is not None:
        directories.add(runtime_dir(owner))
    for directory in filter(None, directories):
        path = _record_path(directory, entry.device)
        try:
            with open(path, encoding="utf-8") as f:
                if os.fstat(f.fileno()).st_uid not in (0, owner):
                    continue
                doc = json.load(f)
            record = MountRecord(**{k: doc[k] for k in ("device", "mountpoint", "fstype", "pid", "source")})
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if (record.device, record.mountpoint, record.fstype) == (entry.device, entry.mountpoint, entry.fstype):
            return record
    return None


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
