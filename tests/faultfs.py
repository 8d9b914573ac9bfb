"""faultfs: the storage emulator in its fault-injection setting, for reliability tests.

There is one storage emulator for tests and benchmarks: ``benchmarks/latency_fs.py`` (the public
side) and ``benchmarks/latency_ops.py`` (its FUSE operations, the only user of mfusepy). This module
is the tests' face of it: a read-only mirror of a backing directory, mounted where fastfs takes its
source from, whose reads can be made to fail or hang on demand through a control file outside the
mount (JSON, replaced atomically by :meth:`FaultFS.set`)::

    {"eio": ["*/bad*"], "hang": ["/slow.bin"], "hang_meta": ["/stuck/*"], "hang_close": ["/big.bin"]}

Patterns are :func:`fnmatch.fnmatchcase` patterns matched against the FUSE path (``/dir/name``). A
read of a file matching ``eio`` fails with EIO; a read matching ``hang`` blocks until the pattern
is removed (bounded by ``latency_ops.MAX_HANG_SECONDS``); ``hang_meta`` does the same for getattr,
open and readdir, ``hang_close`` for the FLUSH of a close (a close of a descriptor of the file then
hangs, as on a hung sshfs or NFS server). Everything else is a plain pass-through of the backing directory.

The setting (``latency_fs.FAULT_SPEC``): no latency, no page cache (``direct_io``) and zero kernel
cache timeouts, so every read and lookup reaches the emulator and a fault applies to the very next
request; libfuse's own defaults for threads (10), ``max_background`` and serialised lookups.
``max_threads`` of :func:`faultfs_mounted` bounds the requests served at once.

Run standalone: ``python tests/faultfs.py BACKING MOUNTPOINT CONTROL_FILE [MAX_THREADS]``
(foreground), or use :func:`faultfs_mounted`, which never leaves a mount behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

import latency_fs  # noqa: E402 - the shared emulator lives next to the benchmarks

# Name of the mount (its fsname, as the test suite always knew it).
FSNAME = "faultfs"


def behaviour(max_threads: int = 0) -> latency_fs.Behaviour:
    """The fault-injection setting; *max_threads* 0 leaves libfuse's default."""
    return latency_fs.Behaviour.parse(f"threads={max_threads}", base=latency_fs.Behaviour.parse(latency_fs.FAULT_SPEC))


def is_mounted(path: str | os.PathLike[str]) -> bool:
    """True when *path* is a mount point in the mount table (also for a dead FUSE mount, unlike ismount)."""
    real = os.path.realpath(path)
    with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 1 and re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]) == real:
                return True
    return False


def force_unmount(path: str | os.PathLike[str]) -> None:
    """Unmount *path* if it is a FUSE mount (the product's forced unmount, for any FUSE)."""
    from benchkit.fastfs_api import force_unmount_any

    force_unmount_any(path)


class FaultFS:
    """A running faultfs mount; :meth:`set` changes its behaviour immediately."""

    def __init__(self, backing: Path, mnt: Path, control: Path, emu: latency_fs.Emulator) -> None:
        self.backing = backing
        self.mnt = mnt
        self.control = control
        self.emu = emu
        self.proc: subprocess.Popen = emu.proc
        self.log_path = Path(emu.log_path)

    def set(
        self,
        eio: list[str] | tuple[str, ...] = (),
        hang: list[str] | tuple[str, ...] = (),
        hang_meta: list[str] | tuple[str, ...] = (),
        hang_close: list[str] | tuple[str, ...] = (),
    ) -> None:
        """Replace the fault patterns (atomic rename, so a reader never sees half a file)."""
        tmp = self.control.with_name(self.control.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
        doc = {"eio": list(eio), "hang": list(hang), "hang_meta": list(hang_meta), "hang_close": list(hang_close)}
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, self.control)

    def clear(self) -> None:
        """No faults: a plain mirror again (also releases every hanging request)."""
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
    control.write_text(json.dumps({"eio": [], "hang": [], "hang_meta": []}), encoding="utf-8")
    log_path = workdir / "faultfs.log"
    with latency_fs.emulated(
        str(backing),
        str(mnt),
        behaviour=behaviour(max_threads),
        control=str(control),
        fsname=FSNAME,
        log_path=str(log_path),
    ) as emu:
        fs = FaultFS(backing, mnt, control, emu)
        try:
            yield fs
        finally:
            with contextlib.suppress(OSError):
                fs.clear()  # release any hanging request so the unmount is not held up


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: faultfs.py BACKING MOUNTPOINT CONTROL_FILE [MAX_THREADS]")
    threads = sys.argv[4] if len(sys.argv) == 5 else "0"
    argv = [sys.argv[1], sys.argv[2], "--foreground", "--control", sys.argv[3], "--fsname", FSNAME]
    argv += ["--behaviour", f"{latency_fs.FAULT_SPEC},threads={threads}"]
    sys.exit(latency_fs.main(argv))
