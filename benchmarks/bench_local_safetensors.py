#!/usr/bin/env python3
"""safetensors ``load_file`` + every tensor touched on local disk, native vs fastfs (default route:
passthrough on a root mount), alternating in each round, cold (page cache dropped) and hot; medians.

``python benchmarks/bench_local_safetensors.py [--scale F] [--rounds N]`` (the file of
``bench_latency``'s local data set, generated there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import DISK_ROOT  # noqa: E402
from benchkit.mounts import fastfs_mount  # noqa: E402
from benchkit.system import drop_caches, mountpoint, require_root  # noqa: E402

NAME = "model.safetensors"


def _load(path: str) -> float:
    from safetensors.numpy import load_file

    t0 = time.perf_counter()
    tensors = load_file(path)
    for array in tensors.values():
        array.reshape(-1)[-1:].copy()  # touch every tensor
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    require_root()
    src = os.path.join(DISK_ROOT, f"scale-{args.scale:g}")
    if not os.path.exists(os.path.join(src, NAME)):
        raise SystemExit(f"{src}/{NAME} missing: run bench_latency.py --scale {args.scale:g} once to make it")
    times: dict[str, list[float]] = {f"{who} {mode}": [] for mode in ("cold", "hot") for who in ("native", "fastfs")}
    with fastfs_mount(src, mountpoint("local-safetensors")) as m:
        for _ in range(args.rounds):
            for who, root in (("native", src), ("fastfs", m.mnt)):
                path = os.path.join(root, NAME)
                drop_caches()
                times[f"{who} cold"].append(_load(path))
                _load(path)
                times[f"{who} hot"].append(_load(path))
    for key, values in times.items():
        print(f"{key}: median {statistics.median(values):.3f} s (runs: {', '.join(f'{v:.3f}' for v in values)})")
    for mode in ("cold", "hot"):
        ratio = statistics.median(times[f"native {mode}"]) / statistics.median(times[f"fastfs {mode}"])
        print(f"{mode}: native / fastfs {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
