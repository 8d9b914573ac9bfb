#!/usr/bin/env python3
"""Four processes opening shuffled small files of one directory, direct vs fastfs, on the latency
emulator with serialised lookups of 0.8 ms (the matrix's ``issue14`` preset); prints both times and
the most lookups fastfs answered at once (``kernel.lookups_in_flight_max`` of its stats).

``python benchmarks/probe_lookups.py [--runs N] [--files N]``: data in /dev/shm, page cache dropped
before every run, a fresh fastfs mount per run, medians.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.fastfs_api import XATTR_STATS  # noqa: E402
from benchkit.mounts import fastfs_mount  # noqa: E402
from benchkit.system import drop_caches, mountpoint, require_root  # noqa: E402
from latency_fs import Behaviour, emulated  # noqa: E402

SRC = "/dev/shm/fastfs-bench/lookups"
SIZE = 3073  # bytes per file, the matrix's small files
PROCESSES = 4
SPEC = "dirops=serial,meta=0.8,bw=request"


def _make(count: int) -> None:
    names = os.listdir(SRC) if os.path.isdir(SRC) else []
    if len(names) == count:
        return
    os.makedirs(SRC, exist_ok=True)
    for name in names:
        os.unlink(os.path.join(SRC, name))
    rng = random.Random(1)
    for i in range(count):
        with open(os.path.join(SRC, f"s{i:05d}.bin"), "wb") as f:
            f.write(rng.randbytes(SIZE))


def _read(job: tuple[str, list[str]]) -> int:
    root, names = job
    total = 0
    for name in names:
        with open(os.path.join(root, name), "rb") as f:
            total += len(f.read())
    return total


def _epoch(root: str, count: int) -> float:
    names = sorted(os.listdir(SRC))
    random.Random(2).shuffle(names)
    drop_caches()
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(PROCESSES) as pool:
        total = sum(pool.map(_read, [(root, names[i::PROCESSES]) for i in range(PROCESSES)]))
    elapsed = time.perf_counter() - t0
    assert total == count * SIZE, total
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--files", type=int, default=2000)
    args = parser.parse_args()
    require_root()
    _make(args.files)
    emu, fast = mountpoint("lookups-emu"), mountpoint("lookups-fastfs")
    direct, through, in_flight = [], [], []
    with emulated(SRC, emu, behaviour=Behaviour.parse(SPEC)):
        for _ in range(args.runs):
            direct.append(_epoch(emu, args.files))
            with fastfs_mount(emu, fast):
                through.append(_epoch(fast, args.files))
                kernel = json.loads(os.getxattr(fast, XATTR_STATS)).get("kernel", {})
                in_flight.append(kernel.get("lookups_in_flight_max"))
    d, f = statistics.median(direct), statistics.median(through)
    print(f"emulator {SPEC}; {PROCESSES} processes, {args.files} files of {SIZE} B, shuffled, medians of {args.runs}")
    print(f"direct {d:.3f} s, fastfs {f:.3f} s, direct/fastfs {d / f:.2f}x; most lookups at once {in_flight}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
