"""faultfs: a small read-only FUSE mirror whose reads can be made to fail or hang, for reliability tests.

It mirrors a backing directory (the real data) and is mounted where fastfs takes its source from, so
fastfs sees a filesystem that misbehaves on demand. The behaviour is controlled at run time through a
control file outside the mount (JSON, replaced atomically by :meth:`FaultFS.set`)::

    {"eio": ["*/bad*"], "hang": ["/slow.bin"], "hang_meta": ["/stuck/*"]}

Patterns are :func:`fnmatch.fnmatchcase` patterns matched against the FUSE path (``/dir/name``).
A read of a file matching ``eio`` fails with EIO; a read of a file matching ``hang`` blocks until the
pattern is removed from the control file (emulates a source that stops answering), bounded by
:data:`MAX_HANG_SECONDS` so a forgotten hang can never wedge a test run. ``hang_meta`` does the same
for the metadata calls of matching paths (getattr, open, readdir). Every other operation is a plain
pass-through of the backing directory. ``max_threads`` of :func:`faultfs_mounted` bounds the
requests served at once (libfuse's own default is 10).

Design choices:
- mfusepy on libfuse 3, multithreaded, so a hanging read blocks one worker while others keep serving.
- ``direct_io`` and zero kernel cache timeouts: every read and lookup reaches this process, so a
  fault applies to the very next request and the kernel page cache never hides one.
- The control file is re-read only when its identity (inode, size, mtime) changes: one ``stat`` per read.

Run standalone: ``python tests/faultfs.py BACKING MOUNTPOINT CONTROL_FILE`` (foreground), or use the
:func:`faultfs_mounted` context manager, which never leaves a mount behind.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# A hanging read gives up after this long so a test that forgets to release it cannot hang forever.
MAX_HANG_SECONDS = 300.0
# How often a hanging read re-checks the control file (short: tests release hangs promptly).
HANG_POLL_SECONDS = 0.05
# Seconds to wait for the mount to appear or go away.
MOUNT_TIMEOUT = 30.0
# Seconds given to an unmount command before falling back to a lazy unmount.
UMOUNT_TIMEOUT = 20.0


class _Control:
    """Cached view of the control file; reloaded when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._eio: tuple[str, ...] = ()
        self._hang: tuple[str, ...] = ()
        self._hang_meta: tuple[str, ...] = ()

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            key = None
        else:
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key == self._key:
                return
        data: dict[str, Any] = {}
        if key is not None:
            try:
                with open(self.path, encoding="utf-8") as f:
                    data = json.load(f) or {}
            except (OSError, ValueError):
                return  # half-written file: keep the previous state, retry on the next request
        with self._lock:
            self._key = key
            self._eio = tuple(data.get("eio", ()))
            self._hang = tuple(data.get("hang", ()))
            self._hang_meta = tuple(data.get("hang_meta", ()))

    def eio(self, path: str) -> bool:
        self._reload()
        return any(fnmatch.fnmatchcase(path, p) for p in self._eio)

    def hang(self, path: str) -> bool:
        self._reload()
        return any(fnmatch.fnmatchcase(path, p) for p in self._hang)

    def hang_meta(self, path: str) -> bool:
        self._reload()
        return any(fnmatch.fnmatchcase(path, p) for p in self._hang_meta)

    def wait_while(self, check, path: str) -> None:
        """Block while *check(path)* holds, at most MAX_HANG_SECONDS (then EIO)."""
        if not check(path):
            return
        deadline = time.monotonic() + MAX_HANG_SECONDS
        while check(path):
            if time.monotonic() > deadline:
                raise OSError(errno.EIO, "hang released by its time bound")
            time.sleep(HANG_POLL_SECONDS)


def _make_operations(backing: str, control_path: str) -> Any:
    os.environ["FUSE_LIBRARY_NAME"] = "fuse3"  # before importing mfusepy: bind libfuse 3
    import mfusepy

    class FaultOps(mfusepy.Operations):
        """Pass-through of *backing* with injectable read faults."""

        use_ns = True

        def __init__(self) -> None:
            self.root = os.path.realpath(backing)
            self.control = _Control(control_path)

        def _full(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            self.control.wait_while(self.control.hang_meta, path)
            st = os.lstat(self._full(path))
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_rdev", "st_blocks", "st_blksize")
            attrs: dict[str, Any] = {k: getattr(st, k) for k in keys}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            return attrs

        def readdir(self, path: str, fh: int) -> list[str]:
            self.control.wait_while(self.control.hang_meta, path)
            return [".", "..", *os.listdir(self._full(path))]

        def readlink(self, path: str) -> str:
            return os.readlink(self._full(path))

        def access(self, path: str, amode: int) -> int:
            if not os.access(self._full(path), amode, follow_symlinks=False):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(self._full(path))
            keys = (
                "f_bavail",
                "f_bfree",
                "f_blocks",
                "f_bsize",
                "f_favail",
                "f_ffree",
                "f_files",
                "f_flag",
                "f_frsize",
                "f_namemax",
            )
            return {k: getattr(sv, k) for k in keys}

        def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
            raise mfusepy.FuseOSError(errno.ENODATA)

        def listxattr(self, path: str) -> list[str]:
            return []

        def open(self, path: str, flags: int) -> int:
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
                raise mfusepy.FuseOSError(errno.EROFS)
            self.control.wait_while(self.control.hang_meta, path)
            return os.open(self._full(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            self.control.wait_while(self.control.hang, path)
            if self.control.eio(path):
                raise mfusepy.FuseOSError(errno.EIO)
            return os.pread(fh, size, offset)

        def release(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

    return mfusepy, FaultOps()


def serve(backing: str, mountpoint: str, control_path: str, max_threads: int = 0) -> None:
    """Mount and serve in the foreground until unmounted or signalled."""
    mfusepy, ops = _make_operations(backing, control_path)
    threads = {"max_threads": max_threads, "max_idle_threads": max_threads} if max_threads else {}
    mfusepy.FUSE(
        ops,
        mountpoint,
        foreground=True,
        nothreads=False,
        direct_io=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
        fsname="faultfs",
        **threads,
    )


def is_mounted(path: str) -> bool:
    """True when *path* is a mount point in the mount table (also for a dead FUSE mount, unlike ismount)."""
    real = os.path.realpath(path)
    with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 1 and re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]) == real:
                return True
    return False


def force_unmount(path: str) -> None:
    """Unmount *path* if it is a FUSE mount: fastfs.daemon.mount.force_unmount, for any FUSE."""
    from fastfs.daemon import mount

    mount.force_unmount(path, any_fuse=True)


class FaultFS:
    """A running faultfs mount; :meth:`set` changes its behaviour immediately."""

    def __init__(self, backing: Path, mnt: Path, control: Path, proc: subprocess.Popen, log_path: Path) -> None:
        self.backing = backing
        self.mnt = mnt
        self.control = control
        self.proc = proc
        self.log_path = log_path

    def set(
        self,
        eio: list[str] | tuple[str, ...] = (),
        hang: list[str] | tuple[str, ...] = (),
        hang_meta: list[str] | tuple[str, ...] = (),
    ) -> None:
        """Replace the fault patterns (atomic rename, so a reader never sees half a file)."""
        tmp = self.control.with_name(self.control.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
        doc = {"eio": list(eio), "hang": list(hang), "hang_meta": list(hang_meta)}
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, self.control)

    def clear(self) -> None:
        """No faults: a plain mirror again (also releases every hanging read)."""
        self.set()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def faultfs_mounted(backing: Path, mnt: Path, workdir: Path, max_threads: int = 0) -> Iterator[FaultFS]:
    """Mount faultfs of *backing* on *mnt*; control and log files go in *workdir*. Always unmounts.
    *max_threads* (0: libfuse's default) bounds the requests it serves at once."""
    workdir.mkdir(parents=True, exist_ok=True)
    control = workdir / "faultfs-control.json"
    log_path = workdir / "faultfs.log"
    control.write_text(json.dumps({"eio": [], "hang": []}), encoding="utf-8")
    env = dict(os.environ, FUSE_LIBRARY_NAME="fuse3")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(backing), str(mnt), str(control), str(max_threads)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    fs = FaultFS(backing, mnt, control, proc, log_path)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not is_mounted(str(mnt)):
            if proc.poll() is not None:
                raise RuntimeError(f"faultfs exited with {proc.returncode}: {fs.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"faultfs did not mount within {MOUNT_TIMEOUT}s: {fs.log()}")
            time.sleep(0.05)
        yield fs
    finally:
        with contextlib.suppress(OSError):
            fs.clear()  # release any hanging read so the unmount is not held up
        force_unmount(str(mnt))
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=UMOUNT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=UMOUNT_TIMEOUT)
        force_unmount(str(mnt))


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: faultfs.py BACKING MOUNTPOINT CONTROL_FILE [MAX_THREADS]")
    serve(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) == 5 else 0)
