#!/usr/bin/env python3
"""Per-request cost of the kernel boundary: round trips per open, one OPEN, one 4 KiB READ.

Runs on whatever ``fastfs`` is importable, so two revisions compare in one session by running it
twice with ``PYTHONPATH`` pointing at each (``--label`` names the row). The source is tmpfs (no
storage cost); every figure is a median of ``--runs`` passes, next to the same loop on tmpfs
directly:

* ``reopen``: open + read 4 KiB + close of N small files already read once (the page cache holds
  their data; what is left is the cost of the open itself);
* ``open``: os.open + os.close of one file, repeated;
* ``read4k``: 4 KiB preads at random offsets through an ``O_DIRECT`` descriptor (each one a READ
  request served from fastfs's RAM cache; native: the same on tmpfs without O_DIRECT).

Requests per open come from the mount's ``kernel.requests`` counters (absent on revisions before
fastfs spoke the protocol itself: then "-").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.fastfs_api import XATTR_STATS  # noqa: E402
from benchkit.mounts import fastfs_mount  # noqa: E402

FILES = 2000
OPENS = 5000
READS = 5000
SIZE = 3073


def _median_us(fn, count: int, runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) / count * 1e6)
    return statistics.median(samples)


def reopen(root: str, names: list[str]) -> None:
    for name in names:
        fd = os.open(os.path.join(root, name), os.O_RDONLY)
        os.read(fd, 4096)
        os.close(fd)


def opens(path: str, count: int) -> None:
    for _ in range(count):
        os.close(os.open(path, os.O_RDONLY))


def reads(path: str, count: int, direct: bool) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    size = os.fstat(fd).st_size
    rng = random.Random(1)
    import mmap

    buf = mmap.mmap(-1, 4096)
    try:
        for _ in range(count):
            os.preadv(fd, [buf], rng.randrange(size // 4096) * 4096)
    finally:
        os.close(fd)
        buf.close()


def requests(mnt: str) -> dict[str, int]:
    try:
        return json.loads(os.getxattr(mnt, XATTR_STATS)).get("kernel", {}).get("requests", {})
    except OSError:
        return {}


def measure(root: str, names: list[str], big: str, runs: int, direct: bool) -> dict[str, float]:
    reopen(root, names)  # warm
    return {
        "reopen_us": _median_us(lambda: reopen(root, names), len(names), runs),
        "open_us": _median_us(lambda: opens(os.path.join(root, names[0]), OPENS), OPENS, runs),
        "read4k_us": _median_us(lambda: reads(os.path.join(root, big), READS, direct), READS, runs),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="fastfs")
    parser.add_argument("--dir", default="/dev/shm/fastfs-bench-requests")
    parser.add_argument("-o", dest="options", action="append", default=[])
    args = parser.parse_args()
    src = os.path.join(args.dir, "src")
    mnt = os.path.join(args.dir, "mnt")
    os.makedirs(os.path.join(src, "small"), exist_ok=True)
    os.makedirs(mnt, exist_ok=True)
    names = [f"small/{i:05d}.bin" for i in range(FILES)]
    rng = random.Random(0)
    for name in names:
        path = os.path.join(src, name)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(rng.randbytes(SIZE))
    big = "big.bin"
    if not os.path.exists(os.path.join(src, big)):
        with open(os.path.join(src, big), "wb") as f:
            f.write(os.urandom(64 << 20))
    native = measure(src, names, big, args.runs, direct=False)
    options = list(args.options)
    with fastfs_mount(src, mnt, options) as m:
        with open(os.path.join(mnt, big), "rb") as f:  # into fastfs's RAM cache
            while f.read(1 << 20):
                pass
        reopen(mnt, names)  # first pass: lookups, reads
        before = requests(mnt)
        reopen(mnt, names)
        after = requests(mnt)
        per_open = {}
        for key in set(before) | set(after):
            delta = after.get(key, 0) - before.get(key, 0)
            if delta and key not in ("getxattr",):
                per_open[key] = round(delta / len(names), 2)
        ours = measure(mnt, names, big, args.runs, direct=True)
        del m
    print(f"| {args.label} | requests per open+read+close (hot) | {per_open or '-'} |")
    for key, label in (("reopen_us", "open+read+close, hot"), ("open_us", "open+close"), ("read4k_us", "4 KiB read")):
        print(
            f"| {args.label} | {label} | {ours[key]:.1f} us | native {native[key]:.1f} us | "
            f"cost {ours[key] - native[key]:.1f} us |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
