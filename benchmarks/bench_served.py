#!/usr/bin/env python3
"""Throughput served from fastfs's RAM: one ``readv`` stream of a 512 MiB file whose blocks fastfs
holds, the page cache dropped before each pass (``fuse.passthrough=off``), with 1 MiB requests
(``fuse.max_pages=256``) and 4 MiB requests (``1024``), alternating, a fresh mount per round; tmpfs
read directly for reference.

``python benchmarks/bench_served.py [--rounds N]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.mounts import fastfs_mount  # noqa: E402
from benchkit.perop import stream_gbps  # noqa: E402
from benchkit.system import drop_caches, mountpoint, require_root  # noqa: E402
from benchkit.units import MIB  # noqa: E402

SRC = "/dev/shm/fastfs-bench/served"
FILE_MIB = 512
# (fuse.max_pages, fuse.read_ahead_kb): 1 MiB and 4 MiB requests
SETTINGS = ((256, 1024), (1024, 4096))
READ_SIZES = (MIB, 4 * MIB)
PASSES = 3  # timed passes per mount and read size (median)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    require_root()
    os.makedirs(SRC, exist_ok=True)
    big = os.path.join(SRC, "big.bin")
    if (os.path.getsize(big) if os.path.exists(big) else 0) != FILE_MIB * MIB:
        with open(big, "wb") as f:
            for _ in range(FILE_MIB):
                f.write(os.urandom(MIB))
    buf = memoryview(bytearray(max(READ_SIZES)))
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for pages, ra in SETTINGS:
            opts = ["fuse.passthrough=off", f"fuse.max_pages={pages}", f"fuse.read_ahead_kb={ra}", "budget=2G"]
            with fastfs_mount(SRC, mountpoint("served"), opts) as m:
                path = os.path.join(m.mnt, "big.bin")
                stream_gbps(path, buf[:MIB])  # fills fastfs's RAM cache
                for size in READ_SIZES:
                    passes = []
                    for _ in range(PASSES):
                        drop_caches()
                        passes.append(stream_gbps(path, buf[:size]))
                    key = f"fastfs max_pages={pages} ({pages * 4 // 1024} MiB requests), readv {size // MIB} MiB"
                    results.setdefault(key, []).append(statistics.median(passes))
        drop_caches()
        results.setdefault("tmpfs directly, readv 1 MiB", []).append(stream_gbps(big, buf[:MIB]))
    for key, values in results.items():
        print(f"{key}: {statistics.median(values):.2f} GB/s (rounds: {', '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
