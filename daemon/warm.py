"""``fastfs warm PATH... [-j N]``: load files of a fastfs mount into its RAM cache ahead of a job.

Design: the command never reads file data itself. For every regular file under the given paths
(files, or directory trees walked with ``os.walk`` without following symlinks) it asks the daemon
through the mount's extended-attribute control channel: ``getxattr(FILE, "user.fastfs.warm")``
makes the daemon prefetch that file and answers, once the data is resident, with JSON
``{"files": n, "bytes": n, "seconds": s}`` (plus ``"declined"`` when the cache budget was full).
Requests run *jobs* at a time in a thread pool (each one blocks in the kernel while the daemon
works, so threads overlap them), with a bounded number in flight so a tree of millions of files
does not queue millions of futures.

Every path must lie inside a fastfs mount: the nearest mount point above it must hold
``.fastfs/stats``; otherwise the command prints one line and exits 1 before doing anything.
Per-file failures are counted, at most :data:`MAX_ERRORS_SHOWN` are printed (one line each), and
the exit status is 1 if any file failed. A daemon without warm support answers ENOTSUP (or
ENODATA); the command then says so once and stops.

Output: a progress bar in bytes on stderr (only on a terminal) and one summary line on stdout.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import errno
import json
import os
import stat
import sys
import threading
import time
from dataclasses import dataclass, field

from tqdm import tqdm

XATTR_WARM = "user.fastfs.warm"
STATS_RELPATH = os.path.join(".fastfs", "stats")
CONTROL_DIR = ".fastfs"
# Parallel warm requests by default: enough to keep the daemon's pread pool busy on small files.
DEFAULT_JOBS = 8
# Most parallel requests accepted (each is one blocked thread here and one FUSE worker in the daemon).
MAX_JOBS = 256
# Requests queued per job beyond those running: keeps workers fed without holding the whole tree.
QUEUE_PER_JOB = 4
# Per-file failures printed; the rest are only counted.
MAX_ERRORS_SHOWN = 10
# errno values meaning the daemon has no warm control (older daemon or not a fastfs file).
UNSUPPORTED = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA}
PROG = "fastfs warm"


class WarmError(Exception):
    """A problem with the command line (bad path, not a fastfs mount); one-line message."""


@dataclass
class Result:
    """What a warm run did."""

    files: int = 0
    bytes: int = 0
    failed: int = 0
    skipped: int = 0  # files never asked for because the daemon cannot warm
    partial: int = 0  # files the daemon warmed only in part (its cache budget was full)
    errors: list[str] = field(default_factory=list)
    unsupported: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fastfs warm`` (for the CLI's subcommand parser)."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="file or directory inside a fastfs mount")
    parser.add_argument(
        "-j", "--jobs", type=int, default=DEFAULT_JOBS, help=f"parallel requests (default {DEFAULT_JOBS})"
    )


def find_mount_root(path: str) -> str | None:
    """The fastfs mount root holding *path*, or None when the nearest mount point is not fastfs."""
    current = os.path.abspath(path)
    while True:
        if os.path.ismount(current):
            return current if os.path.exists(os.path.join(current, STATS_RELPATH)) else None
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _resolve(path: str) -> str:
    """Absolute *path* with its parent directories resolved but its last component not followed."""
    absolute = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))


def collect(paths: list[str]) -> list[tuple[str, int]]:
    """Regular files (path, size) under *paths*, validated to lie in fastfs mounts; raises WarmError."""
    files: list[tuple[str, int]] = []
    seen: set[str] = set()
    for arg in paths:
        path = _resolve(arg)
        try:
            st = os.lstat(path)
        except OSError as e:
            raise WarmError(f"{arg}: {e.strerror}") from None
        root = find_mount_root(path)
        if root is None:
            raise WarmError(f"{arg}: not inside a fastfs mount")
        if stat.S_ISREG(st.st_mode):
            if path not in seen:
                seen.add(path)
                files.append((path, st.st_size))
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue  # symlinks and special files are not followed or warmed
        for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
            if dirpath == root and CONTROL_DIR in dirnames:
                dirnames.remove(CONTROL_DIR)
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                try:
                    fst = os.lstat(full)
                except OSError:
                    continue  # vanished since the listing
                if stat.S_ISREG(fst.st_mode) and full not in seen:
                    seen.add(full)
                    files.append((full, fst.st_size))
    return files


def warm_file(path: str) -> dict:
    """Ask the daemon to prefetch *path*; returns its JSON answer (raises OSError / ValueError)."""
    answer = json.loads(os.getxattr(path, XATTR_WARM, follow_symlinks=False))
    if not isinstance(answer, dict):
        raise ValueError("unexpected answer from the daemon")
    return answer


def run(files: list[tuple[str, int]], jobs: int, progress: tqdm | None = None) -> Result:
    """Warm *files* with *jobs* parallel requests."""
    result = Result()
    lock = threading.Lock()
    stop = threading.Event()

    def one(path: str, size: int) -> None:
        if stop.is_set():
            with lock:
                result.skipped += 1
            return
        try:
            answer = warm_file(path)
            got = int(answer.get("bytes", size))
        except OSError as e:
            with lock:
                if e.errno in UNSUPPORTED:
                    stop.set()
                    if not result.unsupported:
                        result.unsupported = f"{path}: the fastfs daemon cannot warm files ({e.strerror})"
                    result.skipped += 1
                    return
                result.failed += 1
                result.errors.append(f"{path}: {e.strerror or e}")
            return
        except (ValueError, TypeError) as e:
            with lock:
                result.failed += 1
                result.errors.append(f"{path}: bad answer from the daemon: {e}")
            return
        with lock:
            result.files += 1
            result.bytes += got
            if answer.get("declined"):
                result.partial += 1
        if progress is not None:
            progress.update(size)

    with cf.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="warm") as pool:
        pending: set[cf.Future] = set()
        for path, size in files:
            if len(pending) >= jobs * (1 + QUEUE_PER_JOB):
                done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for f in done:
                    f.result()
            pending.add(pool.submit(one, path, size))
        for f in cf.as_completed(pending):
            f.result()
    return result


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def main(args: argparse.Namespace) -> int:
    """Entry point of ``fastfs warm`` (*args*: ``paths``, ``jobs``); returns the exit status."""
    jobs = getattr(args, "jobs", None) or DEFAULT_JOBS
    if not 1 <= jobs <= MAX_JOBS:
        print(f"{PROG}: -j must be between 1 and {MAX_JOBS}", file=sys.stderr)
        return 1
    try:
        files = collect(list(args.paths))
    except WarmError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    total = sum(size for _, size in files)
    start = time.monotonic()
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="warm",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
        leave=False,
    ) as bar:
        result = run(files, jobs, bar)
    seconds = time.monotonic() - start
    for line in result.errors[:MAX_ERRORS_SHOWN]:
        print(f"{PROG}: {line}", file=sys.stderr)
    if len(result.errors) > MAX_ERRORS_SHOWN:
        print(f"{PROG}: ... and {len(result.errors) - MAX_ERRORS_SHOWN} more failed files", file=sys.stderr)
    if result.unsupported:
        print(f"{PROG}: {result.unsupported}; {result.skipped} files not warmed", file=sys.stderr)
    if result.partial:
        print(f"{PROG}: {result.partial} files only partly cached: the cache budget is full", file=sys.stderr)
    rate = result.bytes / seconds / 1e9 if seconds > 0 else 0.0
    failed = f", {result.failed} failed" if result.failed else ""
    print(f"warmed {result.files} files, {_human(result.bytes)} in {seconds:.2f} s ({rate:.2f} GB/s){failed}")
    return 1 if result.failed or result.unsupported else 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog=PROG, description="load files of a fastfs mount into its RAM cache")
    add_arguments(_parser)
    raise SystemExit(main(_parser.parse_args()))
