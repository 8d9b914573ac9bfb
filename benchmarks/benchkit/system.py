"""Machine-level helpers: dropping the page cache, mount points, forced unmounts, process facts.

Nothing here knows fastfs or the emulator: these are the operations every contender's preparation
shares (``sync; echo 3 > drop_caches`` before a cold run, an empty mount point per mount, a FUSE
mount never left behind). :func:`require_root` also turns SIGTERM into ``SystemExit`` so every
mount's ``finally`` runs when a benchmark is stopped.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from .units import KIB

# Mount points are created under this directory, one subdirectory per benchmark process, so two
# benchmarks running at once never unmount each other's mounts (mountpoint() clears its own path).
MOUNT_ROOT = os.path.join("/tmp/fastfs-bench-mnt", str(os.getpid()))


def drop_caches() -> None:
    """``sync; echo 3 > /proc/sys/vm/drop_caches`` (page cache, dentries and inodes of every mount)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def is_mounted(path: str) -> bool:
    """True when *path* is a mount point per /proc/self/mountinfo (never touches the mount itself)."""
    target = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4].replace("\\040", " ") == target for line in f)


def force_unmount(path: str) -> None:
    """Unmount the FUSE mount at *path* while it is one; never raises: the product's forced unmount,
    for any FUSE (emulators and network clients too)."""
    from .fastfs_api import force_unmount_any

    force_unmount_any(path)


def fs_type(path: str) -> str:
    """Filesystem type of the mount holding *path* (``tmpfs``, ``ext4``...), per /proc/self/mountinfo."""
    target = os.path.realpath(path)
    best, kind = "", "?"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, fields[fields.index("-") + 1]
    return kind


def mountpoint(name: str) -> str:
    """An empty directory under MOUNT_ROOT (this process's) for a mount called *name*."""
    path = os.path.join(MOUNT_ROOT, name)
    if is_mounted(path):
        force_unmount(path)
    os.makedirs(path, exist_ok=True)
    return path


def peak_rss(pid: int) -> int | None:
    """Peak resident set size (VmHWM) of *pid* in bytes, or its current RSS if VmHWM is missing."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * KIB
    except OSError:
        return None
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss
    except Exception:
        return None


def find_daemon_pid(mnt: str) -> int | None:
    """Pid of the fastfs process serving *mnt*, found by command line (fallback when stats lack it)."""
    import psutil

    target = os.path.realpath(mnt)
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if (
            any("fastfs" in c for c in cmd)
            and "mount" in cmd
            and any(os.path.realpath(c) == target for c in cmd if c.startswith("/"))
        ):
            return proc.info["pid"]
    return None


def alive(pid: int) -> bool:
    """True while *pid* exists and is neither a zombie nor dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def require_root() -> None:
    """Exit unless root; also turn SIGTERM into SystemExit so every mount's cleanup runs."""
    if os.geteuid() != 0:
        raise SystemExit("benchmarks need root (drop_caches, mounts)")
    signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
