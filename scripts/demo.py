#!/usr/bin/env python3
"""fastfs demo (``make demo``): the two jobs fastfs is for, on a small generated data set.

1. Large arrays: a few float32 ``.npy`` files loaded with ``np.load`` (large sequential reads).
2. Many small files: a directory of 3,073-byte samples (a CIFAR-10 image each) read one by one.

The script writes the data into a temporary source directory, mounts it with the command-line
interface in background mode (``python -m fastfs mount SRC MNT``), and runs each job twice
through the mount (first pass from the disk, second pass from the caches) next to the same reads
done directly on SRC. The source's page cache is dropped before each first pass so both sides
start cold. Every byte read is compared with the generated data; any difference makes the script
exit 1. It ends with ``fastfs stats MNT`` and always unmounts (``fastfs umount``, then
``fusermount3 -u``, then ``umount -l``) before removing the temporary directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

FASTFS = [sys.executable, "-m", "fastfs"]
MIB = 1024 * 1024
# Arrays and their size: large enough to show streaming bandwidth, small enough to run in seconds.
ARRAYS = 3
ARRAY_MIB = 64
# Small files: a CIFAR-10 sized sample (3 x 32 x 32 bytes + 1 label byte) each.
SMALL_FILES = 2000
SMALL_SIZE = 3073
# Seed of the generated data (the same bytes on every run).
SEED = 20240601
# Seconds allowed for the mount to become ready, and for each helper command.
MOUNT_TIMEOUT = 60.0
COMMAND_TIMEOUT = 60.0


def log(message: str) -> None:
    print(message, flush=True)


def write_data(src: Path, arrays: int, array_mib: int, small_files: int) -> tuple[dict[str, np.ndarray], list[bytes]]:
    """Write the arrays and the small files into *src*; returns what was written."""
    rng = np.random.default_rng(SEED)
    written: dict[str, np.ndarray] = {}
    for i in range(arrays):
        values = rng.standard_normal(array_mib * MIB // 4, dtype=np.float32).reshape(-1, 1024)
        name = f"array{i}.npy"
        np.save(src / name, values)
        written[name] = values
    small_dir = src / "small"
    small_dir.mkdir()
    samples = [rng.bytes(SMALL_SIZE) for _ in range(small_files)]
    for i, data in enumerate(samples):
        (small_dir / f"{i:05d}.bin").write_bytes(data)
    return written, samples


def drop_page_cache(root: Path) -> None:
    """Drop the page cache of every file under *root* (flushed first, or dirty pages would stay)."""
    os.sync()
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    mismatches = fn()
    return time.perf_counter() - start, mismatches


def load_arrays(root: Path, expected: dict[str, np.ndarray]) -> int:
    """np.load every array under *root*; returns the number that differ from *expected*."""
    bad = 0
    for name, values in expected.items():
        loaded = np.load(root / name)
        if loaded.dtype != values.dtype or loaded.shape != values.shape or not np.array_equal(loaded, values):
            log(f"MISMATCH: {root / name}")
            bad += 1
    return bad


def read_small(root: Path, expected: list[bytes]) -> int:
    """Read every small file under *root*; returns the number that differ from *expected*."""
    bad = 0
    small = root / "small"
    for i, data in enumerate(expected):
        with open(small / f"{i:05d}.bin", "rb") as f:
            if f.read() != data:
                log(f"MISMATCH: {small / f'{i:05d}.bin'}")
                bad += 1
    return bad


def run(cmd: list[str], timeout: float = COMMAND_TIMEOUT, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env} if env else None
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=full_env)


def is_mounted(path: Path) -> bool:
    target = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == target for line in f if len(line.split()) > 1)


def wait_ready(mnt: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.ismount(mnt) and (mnt / ".fastfs" / "stats").exists():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{mnt} did not become a fastfs mount within {timeout:.0f} s")


def unmount(mnt: Path) -> bool:
    """Unmount *mnt* by the gentlest way that works; True when nothing is mounted there any more."""
    for cmd in (FASTFS + ["umount", str(mnt)], ["fusermount3", "-u", str(mnt)], ["umount", "-l", str(mnt)]):
        if not is_mounted(mnt):
            return True
        try:
            run(cmd)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return not is_mounted(mnt)


def rate(amount: float, seconds: float, unit: str) -> str:
    if unit == "GB/s":
        return f"{amount / seconds / 1e9:8.2f} GB/s" if seconds > 0 else "       - GB/s"
    return f"{amount / seconds:8.0f} files/s" if seconds > 0 else "       - files/s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=ARRAYS, help=f"number of .npy arrays (default {ARRAYS})")
    parser.add_argument("--array-mib", type=int, default=ARRAY_MIB, help=f"MiB per array (default {ARRAY_MIB})")
    parser.add_argument("--small-files", type=int, default=SMALL_FILES, help=f"small files (default {SMALL_FILES})")
    parser.add_argument("--dir", default=None, help="parent of the temporary directory (default: system temp)")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="fastfs-demo-", dir=args.dir))
    src, mnt = work / "src", work / "mnt"
    src.mkdir()
    mnt.mkdir()
    mounted = False
    try:
        log(f"writing {args.arrays} x {args.array_mib} MiB arrays and {args.small_files} x {SMALL_SIZE} B files")
        arrays, samples = write_data(src, args.arrays, args.array_mib, args.small_files)
        array_bytes = sum(a.nbytes for a in arrays.values())

        results: dict[tuple[str, str], tuple[float, str]] = {}
        mismatches = 0

        def measure(side: str, root: Path) -> None:
            nonlocal mismatches
            for job, fn, amount, unit in (
                ("arrays", lambda: load_arrays(root, arrays), array_bytes, "GB/s"),
                ("small files", lambda: read_small(root, samples), len(samples), "files/s"),
            ):
                drop_page_cache(src)
                for n in ("first", "second"):
                    seconds, bad = timed(fn)
                    mismatches += bad
                    results[(f"{job}, {n} pass", side)] = (seconds, rate(amount, seconds, unit))

        log("reading directly from SRC")
        measure("direct", src)

        log(f"mounting {src} on {mnt}")
        state = src.parent / "state"  # learned access sets of this demo stay in its temp dir
        state.mkdir(exist_ok=True)
        r = run(FASTFS + ["mount", str(src), str(mnt)], timeout=MOUNT_TIMEOUT, env={"STATE_DIRECTORY": str(state)})
        mounted = True
        if r.returncode != 0:
            log(f"fastfs mount failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
            return 2
        wait_ready(mnt, MOUNT_TIMEOUT)
        log("reading through the fastfs mount")
        measure("fastfs", mnt)

        log("")
        log(f"{'':28}{'direct (SRC)':>26}{'fastfs (MNT)':>26}")
        for key in dict.fromkeys(k for k, _ in results):
            cells = []
            for side in ("direct", "fastfs"):
                seconds, text = results[(key, side)]
                cells.append(f"{text} {seconds:6.2f} s")
            log(f"{key:28}{cells[0]:>26}{cells[1]:>26}")
        log("")
        r = run(FASTFS + ["stats", str(mnt)])
        log(f"$ fastfs stats {mnt}")
        log((r.stdout + r.stderr).rstrip())
        log("")
        if mismatches:
            log(f"FAILED: {mismatches} files differ from the source")
            return 1
        log(f"OK: every byte verified ({array_bytes + len(samples) * SMALL_SIZE} bytes per pass, 4 passes)")
        return 0
    finally:
        if mounted and not unmount(mnt):
            log(f"could not unmount {mnt}; leaving {work} in place")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
