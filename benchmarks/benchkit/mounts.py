"""fastfs mounts for benchmarks: mounted through the CLI, always unmounted, fresh state by default.

:func:`fastfs_mount` runs ``python -m fastfs mount SRC MNT -o ...`` (which returns once the mount is
live) with ``STATE_DIRECTORY`` pointing at a fresh temporary directory unless the caller passes one
(to keep learned state across a remount on purpose), waits until the stats file answers, and on
exit runs ``fastfs umount`` then the FUSE fallbacks and waits for the daemon (killed if it hangs).
:func:`kernel_requests` reads a mount's request counters through the stats xattr. This module is the
benchmarks' one import of fastfs's control names (the stats file and xattr), so a rename lands here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .fastfs_api import STATS_RELPATH, XATTR_STATS
from .system import alive, find_daemon_pid, force_unmount, is_mounted, peak_rss

# Seconds allowed for `fastfs mount` / `fastfs umount` to return.
CLI_TIMEOUT = 120.0
# Seconds to wait for a mount to serve its stats file.
MOUNT_TIMEOUT = 60.0
# Seconds to wait for the daemon process to exit after an unmount.
DAEMON_EXIT_TIMEOUT = 30.0
# Poll interval (s) while waiting for mounts and processes.
POLL_INTERVAL = 0.05
# Stats file of a fastfs mount, relative to the mount point (the daemon's one definition).
STATS_PATH = STATS_RELPATH
# Extended attribute of a fastfs mount's root that answers the stats snapshot (one GETXATTR request:
# no LOOKUP, OPEN or READ of the stats file among the requests being counted).
STATS_XATTR = XATTR_STATS

FASTFS_CLI = [sys.executable, "-m", "fastfs"]


@dataclass
class FastfsMount:
    """A live fastfs mount started by :func:`fastfs_mount`."""

    src: str
    mnt: str
    state_dir: str
    options: list[str]
    pid: int | None = None
    log: str = ""  # the daemon's log file, as `fastfs mount` printed it ("" when it did not)

    def stats(self) -> dict[str, Any]:
        with open(os.path.join(self.mnt, STATS_PATH), "rb") as f:
            return json.loads(f.read())

    def peak_rss(self) -> int | None:
        return peak_rss(self.pid) if self.pid else None


def stats_xattr(mnt: str) -> dict[str, Any]:
    """The stats snapshot of the fastfs mount at *mnt*, read through its xattr."""
    return json.loads(os.getxattr(mnt, STATS_XATTR))


def kernel_requests(mnt: str) -> dict[str, int]:
    """``kernel.requests`` of the fastfs mount at *mnt*: requests served per opcode name since the mount;
    ``{}`` on a revision without them (before fastfs spoke the protocol itself) or when unreadable."""
    try:
        return dict(stats_xattr(mnt).get("kernel", {}).get("requests", {}))
    except (OSError, ValueError):
        return {}


def _fastfs_pid(stats: dict[str, Any], mnt: str) -> int | None:
    pid = (stats.get("mount") or {}).get("pid") or stats.get("pid")
    return int(pid) if pid else find_daemon_pid(mnt)


@contextlib.contextmanager
def fastfs_mount(
    src: str, mnt: str, options: Sequence[str] = (), state_dir: str | None = None, timeout: float = MOUNT_TIMEOUT
) -> Iterator[FastfsMount]:
    """Mount fastfs (CLI, background) for the duration of the block; always unmounts.

    *state_dir* None gives the mount a fresh, temporary state directory (no learned state leaks
    between runs); pass a directory to keep learned access sets across remounts.
    """
    own_state = state_dir is None
    state = tempfile.mkdtemp(prefix="fastfs-state.") if own_state else state_dir
    assert state is not None
    os.makedirs(mnt, exist_ok=True)
    env = dict(os.environ, STATE_DIRECTORY=state)
    cmd = [*FASTFS_CLI, "mount", src, mnt]
    if options:
        cmd += ["-o", ",".join(options)]
    mount = FastfsMount(src, mnt, state, list(options))
    try:
        res = subprocess.run(cmd, env=env, timeout=CLI_TIMEOUT, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"fastfs mount failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
        said = re.search(r", log (\S+)\)", res.stdout)
        mount.log = said.group(1) if said else ""
        deadline = time.monotonic() + timeout
        while True:
            try:
                mount.pid = _fastfs_pid(mount.stats(), mnt)
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"fastfs did not serve {mnt}/{STATS_PATH} within {timeout} s") from None
                time.sleep(POLL_INTERVAL)
        try:
            yield mount
        except BaseException:
            _keep_log(mount)  # (the state directory, where the log lives, goes below)
            raise
    finally:
        _fastfs_unmount(mnt, mount.pid, env)
        if own_state:
            shutil.rmtree(state, ignore_errors=True)


def _keep_log(mount: FastfsMount) -> None:
    """A run through *mount* failed: copy the daemon's log out of the state directory that goes with the
    mount, and say where it is (a source's error, or the daemon's own, is told there)."""
    if not mount.log or not os.path.exists(mount.log):
        return
    kept = os.path.join(tempfile.gettempdir(), f"fastfs-bench-failed-{os.getpid()}-{time.time_ns()}.log")
    with contextlib.suppress(OSError):
        shutil.copyfile(mount.log, kept)
        print(f"fastfs: a run failed; the daemon's log is kept in {kept}", file=sys.stderr, flush=True)


def _fastfs_unmount(mnt: str, pid: int | None, env: dict[str, str]) -> None:
    """``fastfs umount``, then the FUSE fallbacks; waits for the daemon to exit (kills it if it hangs)."""
    try:
        if is_mounted(mnt):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [*FASTFS_CLI, "umount", mnt], env=env, timeout=CLI_TIMEOUT, capture_output=True, check=False
                )
    finally:
        force_unmount(mnt)
    if pid:
        deadline = time.monotonic() + DAEMON_EXIT_TIMEOUT
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
        if alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
