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
import ctypes
import ctypes.util
import dataclasses
import errno
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import TypeGuard, TypeVar

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
# Seconds a check of a mount's state may wait for its daemon (a live one answers statfs at once).
STATE_TIMEOUT = 2.0
# fusectl's directory of FUSE connections (each has an abort file, root only).
CONNECTIONS = "/sys/fs/fuse/connections"
# umount2 flags: abort the connection first (FUSE's umount_begin); detach now.
MNT_FORCE = 1
MNT_DETACH = 2
T = TypeVar("T")
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


def canonical(path: str) -> str:
    """Absolute *path* with its parent's symlinks resolved, without touching *path* itself: a mount
    point may be a hung or dead mount, where even ``lstat`` waits for the daemon."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path)) if path != "/" else path


def find_mount(path: str) -> MountEntry | None:
    """The topmost mount whose mount point is *path*, or None. *path* is compared in its
    :func:`canonical` form first (the mount point itself is never touched), then, when no mount is
    there, after realpath (a symlink to a mount point)."""
    table = mounts()
    for target in (canonical(path), None):
        if target is None:
            target = os.path.realpath(path)
        found = None
        for entry in table:
            if entry.mountpoint == target:
                found = entry
        if found is not None:
            return found
    return None


def is_fastfs(entry: MountEntry | None) -> TypeGuard[MountEntry]:
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


def bounded(fn: Callable[[], T], timeout: float) -> tuple[bool, T | BaseException | None]:
    """Run *fn* in a daemon thread for at most *timeout* seconds: (finished, its result or exception).

    A call on a hung FUSE mount waits for its daemon; this is how the commands bound every such call
    (the thread is left behind, and ends with the process)."""
    box: list[T | BaseException] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box.append(e)

    thread = threading.Thread(target=run, name="fastfs-bounded", daemon=True)
    thread.start()
    thread.join(timeout)
    return (True, box[0]) if box else (False, None)


def mount_state(entry: MountEntry, timeout: float = STATE_TIMEOUT) -> str:
    """``dead``, ``hung`` or ``live`` for a FUSE mount, without ever waiting longer than *timeout*.

    Dead: its daemon's recorded process is gone (or killed and only waiting to exit: a thread stuck
    in a read of a hung source keeps a killed daemon's connection open, so the kernel does not see it
    die), or ``statfs`` fails with ENOTCONN / ECONNABORTED. Hung: ``statfs``, which always reaches the
    daemon (``stat`` may be answered from the kernel's cache), does not come back in time."""
    record = mount_record(entry)
    if record is not None and not daemon_alive(record):
        return "dead"
    finished, outcome = bounded(lambda: os.statvfs(entry.mountpoint), timeout)
    if not finished:
        return "hung"
    if isinstance(outcome, OSError) and outcome.errno in DEAD_ERRNOS:
        return "dead"
    return "live"


def daemon_gone(path: str) -> bool:
    """True when the FUSE mount at *path* has no daemon any more (see :func:`mount_state`)."""
    entry = find_mount(path)
    return entry is not None and mount_state(entry) == "dead"


# -- the daemons' records of their mounts ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MountRecord:
    """What a daemon records about its mount, readable without asking the mount (which may hang)."""

    device: str
    mountpoint: str
    fstype: str
    pid: int
    source: str
    start_ticks: int = 0  # the daemon's start time (/proc/PID/stat), so a reused pid is not taken for it


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
            fields = {k: doc[k] for k in ("device", "mountpoint", "fstype", "pid", "source")}
            record = MountRecord(**fields, start_ticks=int(doc.get("start_ticks", 0)))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if (record.device, record.mountpoint, record.fstype) == (entry.device, entry.mountpoint, entry.fstype):
            return record
    return None


def process_start_ticks(pid: int) -> int | None:
    """Start time of process *pid* in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def daemon_alive(record: MountRecord) -> bool:
    """True while the recorded daemon runs: its process exists, is the one that recorded the mount
    (same start time), is not a zombie, and has not been sent SIGKILL (a killed daemon whose thread
    waits in a hung source's read shows as a zombie leader with SIGKILL pending)."""
    if record.pid <= 0:
        return False
    ticks = process_start_ticks(record.pid)
    if ticks is None or (record.start_ticks and ticks != record.start_ticks):
        return False
    try:
        with open(f"/proc/{record.pid}/status", encoding="ascii", errors="replace") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return False
    if status.get("State", "").strip()[:1] in ("Z", "X"):
        return False
    pending = int(status.get("ShdPnd", "0").strip() or "0", 16)
    return not pending & (1 << (signal.SIGKILL - 1))


# -- unmounting -----------------------------------------------------------------------------------
def run_quiet(cmd: list[str], timeout: float = UNMOUNT_TIMEOUT) -> tuple[int, str]:
    """Run a helper; (returncode, one-line stderr). A missing binary or timeout is a failure."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return 1, one_line(e)
    return r.returncode, one_line(r.stderr or r.stdout)


def connection_id(device: str) -> int:
    """The FUSE connection number of the mount on *device* ``major:minor`` (its name under
    /sys/fs/fuse/connections: the kernel's dev_t, major << 20 | minor)."""
    major, _, minor = device.partition(":")
    return (int(major) << 20) | int(minor)


def abort_connection(entry: MountEntry) -> bool:
    """Abort the FUSE connection of *entry* (root only): every request waiting for its daemon fails at
    once (ECONNABORTED) and new ones fail too, so a dead mount's kernel side can be unmounted and its
    blocked readers return. Through /sys/fs/fuse/connections/N/abort when fusectl is mounted, else
    umount2(MNT_FORCE), whose first step for FUSE is the same abort (the unmount itself may then fail
    as busy). True when the connection was aborted (or the mount is gone)."""
    try:
        with open(f"{CONNECTIONS}/{connection_id(entry.device)}/abort", "w") as f:
            f.write("1")
        return True
    except (OSError, ValueError):
        pass
    err = umount2(entry.mountpoint, MNT_FORCE)
    return err in (0, errno.EBUSY)


def umount2(path: str, flags: int) -> int:
    """umount2(2) of *path*; 0 or the errno (never raises)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.umount2(os.fsencode(path), flags) == 0:
        return 0
    return ctypes.get_errno()


def unmount(mountpoint: str, lazy: bool = False) -> tuple[int, str]:
    """Unmount the fastfs mount on *mountpoint*; returns (0, "") or (status, one-line error).

    A live or hung mount: ``fusermount3 -u`` (``-z`` when *lazy*; then ``umount -l``). A dead mount
    (:func:`mount_state`: its daemon is gone, also one killed while a read of a hung source keeps its
    connection open): the connection is aborted first (root, :func:`abort_connection`), so readers
    blocked on it return, then the mount is detached. Nothing here touches the mount point itself, so
    a dead or hung mount cannot hang the command.

    Refuses (status 1, "... is not a fastfs mount") anything but a fastfs mount, so a foreign FUSE
    file system is never unmounted by fastfs.
    """
    entry = find_mount(mountpoint)
    if entry is None:
        return 1, f"{mountpoint} is not mounted"
    if not is_fastfs(entry):
        return 1, f"{mountpoint} is not a fastfs mount"
    target = entry.mountpoint
    if mount_state(entry) == "dead":
        if os.geteuid() == 0:
            abort_connection(entry)
            if find_mount(target) != entry or umount2(target, MNT_DETACH) == 0:  # the abort may unmount it
                return 0, ""
        rc, err = run_quiet(["fusermount3", "-u", "-z", target])
        return (0, "") if rc == 0 else (rc, err or "fusermount3 failed")
    rc, err = run_quiet(["fusermount3", "-u"] + (["-z"] if lazy else []) + [target])
    if rc == 0:
        return 0, ""
    if lazy:
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
