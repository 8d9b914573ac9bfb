"""Disk cache tier end to end: later epochs and reloads after a remount, against the local disk itself.

The data sets live in RAM behind the latency emulator (default 1.5 ms per request, 400 MB/s per
handle) and, byte for byte the same, on the local disk (``--disk-dir``); the disk tier
(``cache.disk_dir``) is made on that same local filesystem, so every figure compares with the disk's
own speed. fastfs mounts the emulator with a RAM budget of a fifth of the small-file data set
(``cache.budget``), so the data set is 5x what RAM may hold. Workloads (``--only``):

* ``dataset``: ``DATASET_BYTES`` (2 GiB at ``--scale 1``) of small files (``SMALL_FILE`` bytes each),
  every file opened and read whole, one after the other, in a new shuffled order each epoch;
* ``checkpoint``: a 1 GiB file (``--scale``d) read sequentially in 1 MiB reads.

Columns (medians of ``--runs``; the page cache is dropped before every timed pass, so each pass
reads from the storage or the disk, not from memory):

* ``direct``: the data read straight from the emulator mount;
* ``local disk``: the same data read straight from the local disk (the disk's own speed);
* ``no tier e1``: the first epoch through fastfs without a disk tier;
* ``tier e1``: the first epoch through fastfs with an empty disk tier (it writes the tier as it goes);
* ``tier e2``: the next epoch on the same mount, after the tier's writes are done (RAM holds a
  fifth of the data set at most; files are verified as soon as complete, so they pass through);
* ``tier e3``: one more epoch on the same mount (every file goes by passthrough to its disk file);
* ``remount``: the epoch after unmounting and mounting again with the same tier and state directory
  (a reload after a restart: files are verified on their first open, served through fastfs meanwhile);
* ``remount e2``: the next epoch of that mount (large files pass through to the disk now).

Ratios: ``e2/disk``, ``remount/disk`` = local disk time / fastfs time (issue 16's target: >= 0.8x);
``e2/direct``, ``remount/direct`` = direct time / fastfs time (target: >= 5x); ``e1 cost`` = tier e1 /
no tier e1 - 1 (target: <= 5 %). Below the table: what the tier did in the last run (bytes read from
it, written, dropped, opens by passthrough to it).

Run: ``python benchmarks/bench_disktier.py [--scale 0.25] [--runs 3] [--only dataset]``; a smoke run:
``--scale 0.05 --runs 1``. Needs root.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import add_emulator_options, base_parser, extra_options, selected  # noqa: E402
from benchkit.datasets import Dataset  # noqa: E402
from benchkit.mounts import FastfsMount, fastfs_mount  # noqa: E402
from benchkit.readers import read_files, read_seq, small_file_list  # noqa: E402
from benchkit.report import fmt_s, fmt_x, human_bytes, log, median, print_table, ratio, timed  # noqa: E402
from benchkit.system import drop_caches, mountpoint, require_root  # noqa: E402
from benchkit.units import GIB, KIB, MIB, SEED  # noqa: E402
from latency_fs import DEFAULT_LATENCY_MS, DEFAULT_MBPS, emulated  # noqa: E402

WORKLOADS = ("dataset", "checkpoint")
# Bytes of the small-file data set at --scale 1, and the size of each file (an encoded image sample).
DATASET_BYTES = 2 * GIB
SMALL_FILE = 112 * KIB
# The data set is this many times the fastfs RAM budget.
RAM_FACTOR = 5
# Smallest RAM budget fastfs accepts (config.schema.MIN_BUDGET).
MIN_BUDGET = 16 * MIB
# Seconds to wait for the tier's writes between epoch 1 and epoch 2, and then for the checkpoint's
# verification (none comes when a write was dropped: the file is not complete on disk then).
SETTLE_SECONDS = 600.0
VERIFY_SECONDS = 30.0
# Shuffle seed of each epoch (a training loop reshuffles every epoch); direct and local use epoch 2's.
EPOCH_SEEDS = {"e1": SEED, "e2": SEED + 1, "e3": SEED + 2, "remount": SEED + 3, "remount e2": SEED + 4}
EMU_MOUNT = "disktier-emu"
FASTFS_MOUNT = "disktier-fastfs"
COLUMNS = ("direct", "local disk", "no tier e1", "tier e1", "tier e2", "tier e3", "remount", "remount e2")


def settle(m: FastfsMount, verified: int = 0) -> None:
    """Wait until the tier has written what it queued, then until it verified *verified* files."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while m.stats()["gauges"].get("disk_queue_bytes", 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline = time.monotonic() + VERIFY_SECONDS
    while m.stats()["counters"].get("disk_verified_files", 0) < verified:
        if time.monotonic() > deadline:
            log("no verification came: the file is not whole on disk (a write was dropped)")
            return
        time.sleep(0.1)


def cold(fn: Callable[[], Any]) -> float:
    drop_caches()
    return timed(fn)


def run_once(
    work: str,
    emu_mnt: str,
    local: str,
    fastfs_mnt: str,
    opts: list[str],
    tier_root: str,
    readers: dict[str, Callable[[str], Any]],
    large: bool,
) -> tuple[dict[str, float], dict[str, Any]]:
    """One run of every column for one workload; returns (seconds by column, last tier snapshot)."""
    t: dict[str, float] = {}
    log(f"{work}: direct")
    t["direct"] = cold(lambda: readers["e2"](emu_mnt))
    log(f"{work}: local disk")
    t["local disk"] = cold(lambda: readers["e2"](local))
    log(f"{work}: fastfs without a disk tier")
    with fastfs_mount(emu_mnt, fastfs_mnt, opts) as m:
        t["no tier e1"] = cold(lambda: readers["e1"](m.mnt))
    tier = tempfile.mkdtemp(prefix="tier.", dir=tier_root)
    state = tempfile.mkdtemp(prefix="fastfs-state.")
    os.rmdir(tier)  # fastfs creates it (0700)
    tier_opts = [*opts, f"cache.disk_dir={tier}"]
    try:
        log(f"{work}: fastfs with a disk tier: epochs 1, 2, 3")
        with fastfs_mount(emu_mnt, fastfs_mnt, tier_opts, state_dir=state) as m:
            t["tier e1"] = cold(lambda: readers["e1"](m.mnt))
            settle(m, verified=1 if large else 0)
            t["tier e2"] = cold(lambda: readers["e2"](m.mnt))
            settle(m, verified=1 if large else 0)
            t["tier e3"] = cold(lambda: readers["e3"](m.mnt))
        log(f"{work}: fastfs with the disk tier after a remount: epochs 1, 2")
        with fastfs_mount(emu_mnt, fastfs_mnt, tier_opts, state_dir=state) as m:
            t["remount"] = cold(lambda: readers["remount"](m.mnt))
            snap = m.stats()
            settle(m, verified=1 if large else 0)
            t["remount e2"] = cold(lambda: readers["remount e2"](m.mnt))
    finally:
        shutil.rmtree(tier, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
    return t, snap


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.split("\n\n")[0], WORKLOADS)
    add_emulator_options(parser, DEFAULT_LATENCY_MS, DEFAULT_MBPS)
    args = parser.parse_args(argv)
    require_root()
    chosen = selected(args, WORKLOADS)
    disk = Dataset(args.disk_dir, args.scale)
    ram = Dataset(args.ram_dir, args.scale, mirror_of=disk)
    count = max(RAM_FACTOR * 40, int(DATASET_BYTES * args.scale) // SMALL_FILE)
    dataset_bytes = count * SMALL_FILE
    budget = max(MIN_BUDGET, dataset_bytes // RAM_FACTOR)
    opts = [*extra_options(args), f"cache.budget={budget}"]
    tier_root = os.path.join(args.disk_dir, "tiers")
    os.makedirs(tier_root, exist_ok=True)

    # workload -> (local disk root, bytes, reader by epoch of a root directory, one large file)
    plans: dict[str, tuple[str, int, dict[str, Callable[[str], Any]], bool]] = {}
    if "dataset" in chosen:
        ram_dir = ram.sized_files("disktier-small", count, SMALL_FILE)
        disk.sized_files("disktier-small", count, SMALL_FILE)
        rel = os.path.relpath(ram_dir, ram.dir)
        names = {e: [os.path.basename(p) for p in small_file_list(ram_dir, True, s)] for e, s in EPOCH_SEEDS.items()}
        readers = {e: (lambda root, n=n: read_files([os.path.join(root, rel, x) for x in n])) for e, n in names.items()}
        plans["dataset"] = (disk.dir, dataset_bytes, readers, False)
    if "checkpoint" in chosen:
        ram_ckpt = ram.raw("disktier-ckpt.bin")
        disk.raw("disktier-ckpt.bin")
        name = os.path.basename(ram_ckpt)
        readers = {e: (lambda root: read_seq(os.path.join(root, name))) for e in EPOCH_SEEDS}
        plans["checkpoint"] = (disk.dir, os.path.getsize(ram_ckpt), readers, True)

    emu_mnt = mountpoint(EMU_MOUNT)
    fastfs_mnt = mountpoint(FASTFS_MOUNT)
    print(
        f"disk tier on emulated storage: {args.latency_ms:g} ms + size / {args.mbps:g} MB/s per handle; "
        f"RAM budget {human_bytes(budget)} (the data set / {RAM_FACTOR}); local disk and tier under "
        f"{args.disk_dir}; scale {args.scale:g}, runs {args.runs}"
    )
    rows: list[list[str]] = []
    notes: list[str] = []
    with emulated(ram.dir, emu_mnt, args.latency_ms, args.mbps) as emu:
        for work in chosen:
            local, nbytes, readers, large = plans[work]
            times: dict[str, list[float]] = {c: [] for c in COLUMNS}
            snap: dict[str, Any] = {}
            for _ in range(args.runs):
                try:
                    t, snap = run_once(work, emu.mnt, local, fastfs_mnt, opts, tier_root, readers, large)
                except Exception as e:  # a failing run is reported, the benchmark goes on
                    notes.append(f"{work}: FAILED {type(e).__name__}: {e}")
                    log(f"{work}: FAILED {type(e).__name__}: {e}")
                    continue
                for column, seconds in t.items():
                    times[column].append(seconds)
            med = {c: median(v) for c, v in times.items()}
            cost = ratio(med["tier e1"], med["no tier e1"])
            rows.append(
                [
                    work,
                    human_bytes(nbytes),
                    *(fmt_s(med[c]) for c in COLUMNS),
                    fmt_x(ratio(med["local disk"], med["tier e2"])),
                    fmt_x(ratio(med["local disk"], med["remount"])),
                    fmt_x(ratio(med["local disk"], med["tier e3"])),
                    fmt_x(ratio(med["direct"], med["tier e2"])),
                    fmt_x(ratio(med["direct"], med["remount"])),
                    "-" if cost is None else f"{100 * (cost - 1):+.1f}%",
                ]
            )
            if snap:
                c = snap.get("counters", {})
                fetched = c.get("bytes_fetched_demand", 0) + c.get("bytes_fetched_prefetch", 0)
                notes.append(
                    f"{work} (remount epoch 1, last run): read from the tier {human_bytes(c.get('disk_hit_bytes', 0))},"
                    f" from the source {human_bytes(fetched)},"
                    f" opens by passthrough to the tier {c.get('opens_disk', 0)},"
                    f" served opens {c.get('opens', 0)}, corrupt entries {c.get('disk_corrupt_dropped', 0)}"
                )
    print_table(
        f"disk tier: emulated storage ({args.latency_ms:g} ms, {args.mbps:g} MB/s per handle) vs local disk, "
        "cold, median seconds",
        [
            "workload",
            "bytes",
            *(f"{c} s" for c in COLUMNS),
            "e2/disk",
            "remount/disk",
            "e3/disk",
            "e2/direct",
            "remount/direct",
            "e1 cost",
        ],
        rows,
        [
            "x/disk = local disk time / fastfs time (target >= 0.8x); x/direct = direct time / fastfs time (>= 5x)",
            "e1 cost = first epoch with the tier vs without it (target <= +5%)",
            *notes,
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
