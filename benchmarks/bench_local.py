"""fastfs vs native reads on local disk, on the same data, in one run.

What it answers: how much does going through fastfs cost (or gain) when the source is a fast local
disk? Workloads, each timed for native and fastfs:

* ``seq``: plain sequential reader (1 MiB ``readinto`` loop) of a 1 GiB file, cold and hot;
* ``npy``: ``np.load`` of the same 1 GiB float32 .npy, cold and hot;
* ``small``: 10,000 files of 3,073 bytes read in name order (open / read / close), first pass
  (cold) and second pass (same mount, nothing dropped);
* ``small_no_open``: the same through a fastfs mount with ``-o no_open`` (the kernel skips
  OPEN/RELEASE, so a second pass is served from the page cache without a round trip per file).

Cold runs: page cache dropped before each run for both contenders, fastfs remounted (empty RAM
cache, fresh state directory). Hot runs: one warm-up pass, then the timed runs on the same mount.
Medians of ``--runs`` runs (3 by default). Ratios are ``native time / fastfs time``: above 1 means
fastfs is faster, 0.90 means fastfs takes 11 % longer. The kernel request sizes column is the
histogram of read sizes the kernel sent fastfs (from the stats file) in the last run.

Run: ``python benchmarks/bench_local.py [--scale 0.25] [--runs 3] [--only seq,npy]``
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import base_parser, extra_options, selected  # noqa: E402
from benchkit.datasets import Dataset  # noqa: E402
from benchkit.measure import Cell, Fastfs, Native, measure, preimport  # noqa: E402
from benchkit.readers import file_bytes, np_load, read_files, read_seq, small_file_list  # noqa: E402
from benchkit.report import fmt_mbps, fmt_s, fmt_x, human_bytes, log, print_table, ratio  # noqa: E402
from benchkit.system import mountpoint, require_root  # noqa: E402

WORKLOADS = ("seq", "npy", "small", "small_no_open")
# Name of the fastfs mount point (under benchkit.system.MOUNT_ROOT).
MOUNT_NAME = "local-fastfs"


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.split("\n\n")[0], WORKLOADS)
    args = parser.parse_args(argv)
    require_root()
    chosen = selected(args, WORKLOADS)
    ds = Dataset(args.disk_dir, args.scale)
    npy = ds.npy() if {"seq", "npy"} & set(chosen) else None
    small = ds.small_dir() if {"small", "small_no_open"} & set(chosen) else None
    if "npy" in chosen:
        preimport(["numpy"])
    mnt = mountpoint(MOUNT_NAME)
    opts = extra_options(args)
    native = Native(ds.dir)
    fastfs = Fastfs(ds.dir, mnt, opts)
    print(f"fastfs vs native on local disk: data {ds.dir}, scale {args.scale:g}, runs {args.runs}")

    rows = []
    details = []

    def add(label: str, nbytes: int, n: Cell, f: Cell, phase: int = 0) -> None:
        tn, tf = n.med(phase), f.med(phase)
        rows.append(
            [
                label,
                human_bytes(nbytes),
                fmt_s(tn),
                fmt_s(tf),
                fmt_x(ratio(tn, tf)),
                fmt_mbps(nbytes, tn),
                fmt_mbps(nbytes, tf),
                fmt_x(f.fetched_ratio()),
                f.sizes(),
            ]
        )
        for who, cell in (("native", n), ("fastfs", f)):
            if cell.error:
                details.append(f"{label} {who}: {cell.error}")

    native_small: Cell | None = None
    for work in chosen:
        if work in ("seq", "npy"):
            assert npy is not None
            name = os.path.basename(npy)
            reader = read_seq if work == "seq" else np_load

            def fn(root: str, name: str = name, reader: Callable[[str], Any] = reader) -> Any:
                return reader(os.path.join(root, name))

            size = os.path.getsize(npy)
            for cold in (True, False):
                temp = "cold" if cold else "hot"
                log(f"{work} {temp}")
                n = measure(native, [fn], args.runs, cold=cold)
                f = measure(fastfs, [fn], args.runs, cold=cold)
                add(f"{work} {temp}", size, n, f)
        else:
            assert small is not None
            rel = [os.path.relpath(p, ds.dir) for p in small_file_list(small, shuffled=False)]

            def scan(root: str, rel: list[str] = rel) -> int:
                return read_files([os.path.join(root, r) for r in rel])

            size = file_bytes([small])
            log(work)
            if native_small is None:  # the native scan is the same for both fastfs variants
                native_small = measure(native, [scan, scan], args.runs)
            n = native_small
            contender = fastfs if work == "small" else Fastfs(ds.dir, mnt, [*opts, "no_open=true"])
            f = measure(contender, [scan, scan], args.runs)
            add(f"{work} pass 1 (cold)", size, n, f, 0)
            add(f"{work} pass 2", size, n, f, 1)

    print_table(
        "local disk: native vs fastfs (median seconds)",
        [
            "workload",
            "bytes",
            "native s",
            "fastfs s",
            "speedup",
            "native MB/s",
            "fastfs MB/s",
            "fetched/deliv",
            "kernel request sizes (fastfs)",
        ],
        rows,
        [
            "speedup = native time / fastfs time (>1: fastfs faster); fetched/deliv = bytes fastfs read from the "
            "source / bytes it delivered",
            *details,
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
