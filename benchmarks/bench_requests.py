#!/usr/bin/env python3
"""Per-request cost of the kernel boundary: round trips per open, one OPEN, one 4 KiB READ.

Runs on whatever ``fastfs`` is importable, so two revisions compare in one session by running it
twice with ``PYTHONPATH`` pointing at each (``--label`` names the row). The source is tmpfs (no
storage cost); every figure is a median of ``--runs`` passes, next to the same loop on tmpfs
directly:

* ``reopen``: open + read 4 KiB + close of N small files already read once (the page cache holds
  their data; what is left is the cost of the open itself);
* ``open``: os.open + os.close of one file, repeated;
* ``read4k``: 4 KiB preads at distinct random offsets through an ``O_DIRECT`` descriptor (each one a
  READ request served from fastfs's RAM cache; native: the same on tmpfs without O_DIRECT).

Requests per open come from the mount's ``kernel.requests`` counters (absent on revisions before
fastfs spoke the protocol itself: then "-"). The loops are ``benchkit.perop``'s, shared with
``bench_floor.py``, which runs them next to libfuse's C example.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import add_fastfs_options, extra_options  # noqa: E402
from benchkit.fsstats import fmt_requests, requests_per_op  # noqa: E402
from benchkit.mounts import fastfs_mount, kernel_requests  # noqa: E402
from benchkit.perop import SMALL_READ, open_close, open_read_close, page_offsets, preads, stream_gbps  # noqa: E402
from benchkit.system import require_root  # noqa: E402
from benchkit.units import MIB  # noqa: E402

FILES = 2000
OPENS = 5000
READS = 5000
SIZE = 3073
BIG_SIZE = 64 * MIB


def _median_us(fn: Callable[[], float], count: int, runs: int) -> float:
    """Median over *runs* of *fn*'s seconds per operation, in microseconds."""
    return statistics.median(fn() / count * 1e6 for _ in range(runs))


def measure(root: str, names: list[str], big: str, runs: int, direct: bool) -> dict[str, float]:
    paths = [os.path.join(root, name) for name in names]
    offsets = page_offsets(BIG_SIZE, READS, seed=1)
    open_read_close(paths)  # warm
    return {
        "reopen_us": _median_us(lambda: open_read_close(paths), len(paths), runs),
        "open_us": _median_us(lambda: open_close(paths[0], OPENS), OPENS, runs),
        "read4k_us": _median_us(lambda: preads(os.path.join(root, big), offsets, direct=direct), READS, runs),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="fastfs")
    parser.add_argument("--dir", default="/dev/shm/fastfs-bench-requests")
    add_fastfs_options(parser)
    args = parser.parse_args()
    require_root()
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
            f.write(os.urandom(BIG_SIZE))
    native = measure(src, names, big, args.runs, direct=False)
    with fastfs_mount(src, mnt, extra_options(args)):
        stream_gbps(os.path.join(mnt, big), memoryview(bytearray(MIB)))  # into fastfs's RAM cache
        paths = [os.path.join(mnt, name) for name in names]
        open_read_close(paths)  # first pass: lookups, reads
        before = kernel_requests(mnt)
        open_read_close(paths)
        after = kernel_requests(mnt)
        per_open = fmt_requests(requests_per_op(before, after, len(names)) if after else None)
        ours = measure(mnt, names, big, args.runs, direct=True)
    print(f"| {args.label} | requests per open+read({SMALL_READ})+close (hot) | {per_open} |")
    for key, label in (("reopen_us", "open+read+close, hot"), ("open_us", "open+close"), ("read4k_us", "4 KiB read")):
        print(
            f"| {args.label} | {label} | {ours[key]:.1f} us | native {native[key]:.1f} us | "
            f"cost {ours[key] - native[key]:.1f} us |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
