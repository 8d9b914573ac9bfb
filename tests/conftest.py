"""Shared fixtures: run the CLI, mount a real fastfs in a temporary directory, compare trees.

Every mount made here is torn down even when the test fails: SIGTERM to the daemon, then
``fusermount3 -u``, then ``umount -l``, then SIGKILL. A module-scoped guard additionally unmounts
any FUSE mount left under the pytest temporary root after each test module.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastfs.daemon import mounttable
from fastfs.daemon.control import XATTR_STATS
from fastfs.daemon.mounttable import unescape_field

FASTFS = [sys.executable, "-m", "fastfs"]
# Seconds a daemon gets to exit after SIGTERM before it is unmounted and killed.
STOP_TIMEOUT = 20.0
# Seconds between polls while waiting for a mount to come up.
POLL = 0.05
# Mount option for tests of the engine's read path over a local (tmpfs) source, which the default
# route (fuse.passthrough=auto) would hand to the kernel instead; with the small-file scans a source
# that is not local gets (a fast local source gets none by default: its opens read the files).
SERVED = "fuse.passthrough=off,readahead.local_scans=true"


_STATE_DIR: list[str] = []
# Mount records of the daemons tests start go to a temporary directory, never to /run/fastfs; every
# command the tests run inherits it.
_RUNTIME_DIR = tempfile.mkdtemp(prefix="fastfs-test-run-")
atexit.register(shutil.rmtree, _RUNTIME_DIR, True)
os.environ.setdefault(mounttable.RUNTIME_ENV, _RUNTIME_DIR)
# A suite started in the background by a shell without job control (`sh -c "make test &"`, nohup)
# inherits SIGINT ignored, and so would every reader and CLI the tests start: the tests that press
# ctrl-c on them (a reader of a hung file, `stats --watch`, `warm`) then wait in vain. Children of a
# process that handles SIGINT get the default action at exec, as from an interactive shell.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _session_state_dir() -> str:
    if not _STATE_DIR:
        path = tempfile.mkdtemp(prefix="fastfs-test-state-")
        atexit.register(shutil.rmtree, path, True)
        _STATE_DIR.append(path)
    return _STATE_DIR[0]


def run_cli(
    *args: object,
    timeout: float = 60,
    env: dict | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python -m fastfs ARGS`` (text, captured output); *env* entries extend os.environ.

    Daemons started this way keep learned state in a per-session temporary directory, never in
    the system's /var/lib/fastfs.
    """
    full_env = {**os.environ, "STATE_DIRECTORY": _session_state_dir(), **(env or {})}
    return subprocess.run(
        FASTFS + [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
    )


# -- mount table ----------------------------------------------------------------------------------
def fuse_mounts() -> list[tuple[str, str]]:
    """(mountpoint, fstype) of every FUSE mount visible here."""
    result = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and tail and tail[0].startswith("fuse"):
                result.append((unescape_field(fields[4]), tail[0]))
    return result


def is_mounted(path: str | os.PathLike) -> bool:
    """True when *path* is a FUSE mount point (works for dead mounts, unlike os.path.ismount)."""
    target = os.path.realpath(path)
    return any(mp == target for mp, _ in fuse_mounts())


def force_unmount(path: str | os.PathLike) -> None:
    """Unmount the FUSE mount at *path* while it is one: fastfs.daemon.mounttable.force_unmount, for any FUSE."""
    mounttable.force_unmount(path, any_fuse=True)


# -- mounting -------------------------------------------------------------------------------------
@dataclasses.dataclass
class Mount:
    """A running foreground fastfs daemon."""

    src: Path
    mnt: Path
    proc: subprocess.Popen
    log_path: Path
    pid: int

    def stats(self) -> dict:
        """A JSON snapshot of the mount's stats (the root's ``user.fastfs.stats`` xattr: consistent
        in every mode; MNT/.fastfs/stats holds the same document)."""
        return json.loads(os.getxattr(self.mnt, XATTR_STATS))

    def log(self) -> str:
        """The daemon's log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def _stop(proc: subprocess.Popen, mnt: Path) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
    force_unmount(mnt)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT)
    force_unmount(mnt)


def _live(mnt: Path) -> bool:
    if not os.path.ismount(mnt):
        return False
    try:
        with open(mnt / ".fastfs" / "stats", "rb") as f:
            json.loads(f.read())
    except (OSError, ValueError):
        return False
    return True


@contextlib.contextmanager
def mounted(
    src: str | os.PathLike,
    mnt: str | os.PathLike,
    options: list[str] | None = None,
    config_text: str | None = None,
    env: dict | None = None,
    timeout: float = 30,
    poll: float = POLL,
    preexec_fn=None,
) -> Iterator[Mount]:
    """Run ``fastfs mount SRC MNT --foreground`` until the mount is live (checked every *poll*
    seconds); always cleaned up. *preexec_fn* runs in the daemon's process before it starts (limits)."""
    src, mnt = Path(src), Path(mnt)
    work = Path(tempfile.mkdtemp(prefix="fastfs-test-"))
    log_path = work / "daemon.log"
    cmd = FASTFS + ["mount", str(src), str(mnt), "--foreground"]
    if config_text is not None:
        config_path = work / "fastfs.yaml"
        config_path.write_text(config_text)
        cmd += ["--config", str(config_path)]
    for opt in options or []:
        cmd += ["-o", opt]
    state_dir = work / "state"
    state_dir.mkdir()
    full_env = {**os.environ, "STATE_DIRECTORY": str(state_dir), **(env or {})}
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=full_env,
            preexec_fn=preexec_fn,
        )
    try:
        deadline = time.monotonic() + timeout
        while not _live(mnt):
            if proc.poll() is not None:
                raise AssertionError(f"fastfs exited with {proc.returncode} before mounting:\n{_read(log_path)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"fastfs did not mount {mnt} within {timeout}s:\n{_read(log_path)}")
            time.sleep(poll)
        yield Mount(src, mnt, proc, log_path, proc.pid)
    finally:
        _stop(proc, mnt)
        shutil.rmtree(work, ignore_errors=True)


def rand_bytes(n: int, seed: int) -> bytes:
    """*n* reproducible random bytes."""
    return random.Random(seed).randbytes(n)


def wait_for(predicate, timeout: float = 30.0, interval: float = POLL) -> bool:
    """Poll *predicate* until it is true or *timeout* seconds passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# -- helpers --------------------------------------------------------------------------------------
def evict_page_cache(path: str | os.PathLike) -> None:
    """Drop the kernel page cache of a regular file, or of every regular file of a tree."""
    path = os.fspath(path)
    if os.path.isdir(path) and not os.path.islink(path):
        for root, _dirs, files in os.walk(path):
            for name in files:
                _evict_file(os.path.join(root, name))
    else:
        _evict_file(path)


def _evict_file(path: str) -> None:
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def tree_digest(path: str | os.PathLike) -> str:
    """sha256 over relative names, modes, sizes, mtimes and contents of a tree (symlinks not followed)."""
    root = os.fspath(path)
    h = hashlib.sha256()

    def visit(directory: str, rel: str) -> None:
        for name in sorted(os.listdir(directory)):
            full = os.path.join(directory, name)
            relname = f"{rel}/{name}" if rel else name
            st = os.lstat(full)
            h.update(f"{relname}\0{st.st_mode:o}\0{st.st_size}\0{st.st_mtime_ns}\0".encode("utf-8", "surrogateescape"))
            if stat.S_ISLNK(st.st_mode):
                h.update(os.fsencode(os.readlink(full)))
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
            elif stat.S_ISDIR(st.st_mode):
                visit(full, relname)
            h.update(b"\1")

    visit(root, "")
    return h.hexdigest()


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture
def src(tmp_path: Path) -> Path:
    """An empty source directory."""
    path = tmp_path / "src"
    path.mkdir()
    return path


@pytest.fixture
def mnt(tmp_path: Path) -> Path:
    """An empty mount point directory."""
    path = tmp_path / "mnt"
    path.mkdir()
    return path


@pytest.fixture
def mount(src: Path, mnt: Path) -> Iterator[Mount]:
    """fastfs mounted from ``src`` on ``mnt`` with default options."""
    with mounted(src, mnt) as m:
        yield m


@pytest.fixture(scope="module", autouse=True)
def _no_leftover_mounts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After each test module, unmount any FUSE mount left under the pytest temporary root."""
    yield
    base = os.path.realpath(tmp_path_factory.getbasetemp())
    for mountpoint, _fstype in fuse_mounts():
        if mountpoint == base or mountpoint.startswith(base + os.sep):
            force_unmount(mountpoint)


@pytest.fixture(params=["native", "python"])
def request_loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test on both request loops: the native one (``daemon/kernel/_loop.c``, skipped when it
    was not built) and the Python one, which must answer alike (``$FASTFS_LOOP``, read as a session
    starts; the adapter's tests in tests/ops use it on every test)."""
    from fastfs.daemon.kernel import session

    if request.param == "native" and session.native_loop is None:
        pytest.skip("the native request loop is not built (no C compiler at install)")
    monkeypatch.setenv(session.LOOP_ENV, request.param)
    yield request.param
