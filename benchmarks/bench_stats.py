"""Cost of the statistics counters on the hot read path: counters on vs counters stubbed out.

The config schema has no option that turns counting off, so this measures in-process, which is
also the most precise way to isolate the counting cost: an :class:`fastfs.fsio.engine.Engine` over
a file in RAM (tmpfs) is warmed until the whole file sits in its block cache, then
``Engine.read_into`` is driven in a tight loop of sequential requests, alternating trials with
``engine.stats.enabled = True`` (every counter, histogram and per-file update recorded) and
``False`` (every record call returns at once). No FUSE, no kernel, no source I/O: only the engine's
own cache-hit path, where counting is the largest share of the work.

Reported per request size (4 KiB: small-file reads; 128 KiB: default kernel read-ahead; 1 MiB:
fastfs's read_ahead_kb): throughput of each setting and ``on / off`` (target >= 0.97, i.e. counting
costs at most 3 %). The machine is shared, so the ratio is a paired estimate: ``--runs`` pairs of
short chunks (on then off, or off then on, alternating), each chunk timed with the thread's CPU
clock (``time.thread_time``: time spent descheduled by other processes does not count), the ratio
taken per pair and the median of the pair ratios reported. Throughput columns are the median of
the CPU-clock chunk throughputs.

Run: ``python benchmarks/bench_stats.py [--scale 0.25] [--runs 15]``
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import RAM_ROOT  # noqa: E402
from benchkit.datasets import Dataset  # noqa: E402
from benchkit.report import fmt_x, human_bytes, log, median, print_table  # noqa: E402
from benchkit.units import KIB, MIB  # noqa: E402

# File served from the cache at --scale 1 (must fit in the engine's cache budget).
FILE_BYTES = 256 * MIB
# Request sizes measured: a small-file read, the kernel's default read-ahead, fastfs's read_ahead_kb.
REQUEST_SIZES = (4 * KIB, 128 * KIB, 1 * MIB)
# Default number of on/off chunk pairs per request size (median of the pair ratios reported).
DEFAULT_PAIRS = 200
# A chunk repeats whole passes over its range until it lasts at least this long (CPU seconds).
MIN_CHUNK_SECONDS = 0.03
# Bytes of one pass for small requests (a full pass of 4 KiB requests over 256 MiB takes long).
SMALL_PASS_BYTES = 32 * MIB
# Target ratio counters-on / counters-off.
TARGET = 0.97
# Seconds allowed for warming the file into the cache.
WARM_TIMEOUT = 120.0


def read_pass(engine, fh: int, size: int, request: int, dest: memoryview) -> int:  # noqa: ANN001
    total = 0
    for offset in range(0, size, request):
        total += engine.read_into(fh, offset, dest)
    return total


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="size factor of the cached file")
    p.add_argument("--runs", type=int, default=DEFAULT_PAIRS, help="on/off chunk pairs per request size")
    p.add_argument("--ram-dir", default=RAM_ROOT, help="tmpfs directory for the data")
    args = p.parse_args(argv)

    from fastfs.config.loader import load_config
    from fastfs.fsio.engine import Engine

    ds = Dataset(args.ram_dir, args.scale)
    nbytes = max(MIB, int(FILE_BYTES * args.scale) // MIB * MIB)
    path = ds.raw(f"stats-{nbytes}.bin", nbytes)
    state = tempfile.mkdtemp(prefix="fastfs-bench-state.")
    config = load_config(overrides={"state.dir": state, "readahead.learn": False}, use_default_path=False)
    engine = Engine(ds.dir, config)
    rows = []
    try:
        rel = "/" + os.path.basename(path)
        t0 = time.monotonic()
        warmed = engine.warm(rel)
        log(f"warmed {warmed} in {time.monotonic() - t0:.1f} s")
        fh = engine.open(rel).fh
        for request in REQUEST_SIZES:
            size = nbytes if request >= 64 * KIB else min(nbytes, SMALL_PASS_BYTES)
            dest = memoryview(bytearray(request))
            read_pass(engine, fh, size, request, dest)  # settle the stream state and the cache
            t = time.thread_time()
            read_pass(engine, fh, size, request, dest)
            passes = max(1, math.ceil(MIN_CHUNK_SECONDS / max(time.thread_time() - t, 1e-6)))
            speeds: dict[bool, list[float]] = {True: [], False: []}
            pair_ratios = []
            for pair in range(args.runs):
                chunk: dict[bool, float] = {}
                for enabled in (True, False) if pair % 2 == 0 else (False, True):
                    engine.stats.enabled = enabled
                    t = time.thread_time()
                    for _ in range(passes):
                        read_pass(engine, fh, size, request, dest)
                    chunk[enabled] = size * passes / max(time.thread_time() - t, 1e-9)
                    speeds[enabled].append(chunk[enabled])
                pair_ratios.append(chunk[True] / chunk[False])
            engine.stats.enabled = True
            on, off = median(speeds[True]), median(speeds[False])
            r = median(pair_ratios)
            rows.append(
                [
                    human_bytes(request),
                    f"{on / 1e6:.0f}" if on else "-",
                    f"{off / 1e6:.0f}" if off else "-",
                    "-" if r is None else f"{r:.3f}",
                    "ok" if r is not None and r >= TARGET else "BELOW TARGET",
                ]
            )
            log(f"{human_bytes(request)} requests: on/off {fmt_x(r)}")
        snap = engine.snapshot()
        served = snap["counters"].get("bytes_served_from_cache", 0)
        requested = snap["counters"].get("bytes_requested", 0)
        engine.release(fh)
    finally:
        engine.close()
        shutil.rmtree(state, ignore_errors=True)
    print_table(
        f"stats counters on vs off: Engine.read_into from RAM, {human_bytes(nbytes)} file, {args.runs} pairs",
        ["request", "on MB/s (CPU)", "off MB/s (CPU)", "on/off", f"target >= {TARGET}"],
        rows,
        [
            "no mount option switches counting off (config/schema.py), so this drives the engine in-process",
            f"cache hit share of the counted requests: {fmt_x(served / requested if requested else None)} "
            "(below 1.00x means some requests went to the source and the ratio measures more than counting)",
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
