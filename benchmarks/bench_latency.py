"""The read-ahead engine on latency-bound storage: direct reads vs fastfs vs the in-process upper bound.

Setup: the data set lives in RAM (tmpfs) behind the latency emulator (``latency_fs.py``: every
request costs ``--latency-ms`` plus size / ``--mbps`` per open handle, kernel read-ahead 128 KiB,
like a network file system client). Three contenders read the same files:

* ``direct``: the workload reads the emulator mount itself;
* ``fastfs``: fastfs is mounted with SRC = the emulator mount and the workload reads fastfs;
* ``bound``: an in-process reader with 16 threads of ``os.preadv`` in 8 MiB chunks on one shared
  descriptor per file (the technique of paddle.load's ``num_workers``) on the emulator mount: the
  best an in-process parallel reader gets for the bytes the workload needs (I/O only: a loader's
  CPU work comes on top of it). ``--bound-per-thread-fd`` adds a column where each thread opens
  its own descriptor (16 emulated streams per file).

Workloads (``--only`` picks some): ``npy`` (np.load of a 1 GiB .npy), ``torch`` / ``paddle``
(torch.load / paddle.load of a ~1 GiB state dict of 16 MiB tensors), ``small_sorted`` /
``small_shuffled`` (10,000 files of 3,073 bytes, open / read / close, name order or shuffled),
``random4k`` (2,000 random 4 KiB preads in a 1 GiB file), ``two_procs`` (two processes each
reading a different 1 GiB file at once), and ``local_seq`` / ``local_npy`` / ``local_torch`` /
``local_paddle`` (the large-file workloads on local disk, cold and hot, native vs fastfs).

Every cold run: fastfs remounted (empty RAM cache, fresh state directory), page cache dropped
(``echo 3 > drop_caches``, which also drops the emulator mount's cached pages and dentries).
Medians of ``--runs`` runs. Ratios: ``speedup = direct / fastfs`` (>1: fastfs faster),
``of bound = bound / fastfs`` (1.00: fastfs as fast as the in-process parallel reader).
``fetched/deliv`` is bytes fastfs read from the source / bytes the kernel asked of it;
``storage`` is the emulator's request count x mean request size per run.
The last table shows the daemon's peak RSS (VmHWM) against its cache budget.

Run: ``python benchmarks/bench_latency.py [--scale 0.25] [--runs 3] [--only npy,small_shuffled]``
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import add_emulator_options, base_parser, extra_options, selected  # noqa: E402
from benchkit.clients import processes_read  # noqa: E402
from benchkit.datasets import Dataset  # noqa: E402
from benchkit.measure import Cell, Fastfs, Native, measure, preimport  # noqa: E402
from benchkit.readers import (
    RANDOM_SIZE,
    file_bytes,
    np_load,
    paddle_load,
    parallel_files,
    parallel_preads,
    parallel_read,
    random_offsets,
    random_preads,
    read_files,
    read_seq,
    small_file_list,
    torch_load,
)  # noqa: E402
from benchkit.report import fmt_mbps, fmt_s, fmt_x, human_bytes, log, print_table, ratio  # noqa: E402
from benchkit.system import mountpoint, require_root  # noqa: E402
from latency_fs import DEFAULT_LATENCY_MS, DEFAULT_MBPS, emulated  # noqa: E402

EMULATED = ("npy", "torch", "paddle", "small_sorted", "small_shuffled", "random4k", "two_procs")
LOCAL = ("local_seq", "local_npy", "local_torch", "local_paddle")
WORKLOADS = EMULATED + LOCAL
# Loader libraries each workload needs imported before timing.
IMPORTS = {
    "npy": "numpy",
    "torch": "torch",
    "paddle": "paddle",
    "local_npy": "numpy",
    "local_torch": "torch",
    "local_paddle": "paddle",
}
# Mount point names (under benchkit.system.MOUNT_ROOT).
EMU_MOUNT = "latency-emu"
FASTFS_MOUNT = "latency-fastfs"
LOCAL_MOUNT = "latency-local-fastfs"


class Workload:
    """One workload: its files (relative names), its reader and its upper-bound reader."""

    def __init__(
        self,
        name: str,
        files: list[str],
        nbytes: int,
        run: Callable[[str], Any],
        bound: Callable[[str], Any] | None,
        bound_shared: Callable[[str], Any] | None = None,
    ) -> None:
        self.name = name
        self.files = files
        self.nbytes = nbytes
        self.run = run
        self.bound = bound
        self.bound_shared = bound_shared


def build_workloads(ds: Dataset, chosen: list[str]) -> dict[str, Workload]:
    out: dict[str, Workload] = {}
    base = {w.removeprefix("local_") for w in chosen}

    def large(name: str, path: str, reader: Callable[[str], Any]) -> None:
        rel = os.path.basename(path)
        out[name] = Workload(
            name,
            [rel],
            os.path.getsize(path),
            lambda root: reader(os.path.join(root, rel)),
            lambda root: parallel_read([os.path.join(root, rel)]),
            lambda root: parallel_read([os.path.join(root, rel)], fd_per_thread=False),
        )

    if base & {"npy", "seq", "two_procs"}:
        npy = ds.npy()
        large("npy", npy, np_load)
        large("seq", npy, read_seq)
    if base & {"torch"}:
        large("torch", ds.torch_state(), torch_load)
    if base & {"paddle"}:
        large("paddle", ds.paddle_state(), paddle_load)
    if base & {"small_sorted", "small_shuffled"}:
        small = ds.small_dir()
        size = file_bytes([small])
        for shuffled in (False, True):
            rel = [os.path.relpath(p, ds.dir) for p in small_file_list(small, shuffled)]
            name = "small_shuffled" if shuffled else "small_sorted"
            out[name] = Workload(
                name,
                rel,
                size,
                lambda root, rel=rel: read_files([os.path.join(root, r) for r in rel]),
                lambda root, rel=rel: parallel_files([os.path.join(root, r) for r in rel]),
            )
    if base & {"random4k", "two_procs"}:
        raw = ds.raw()
        rel = os.path.basename(raw)
        offsets = random_offsets(os.path.getsize(raw))
        out["random4k"] = Workload(
            "random4k",
            [rel],
            len(offsets) * RANDOM_SIZE,
            lambda root: random_preads(os.path.join(root, rel), offsets),
            lambda root: parallel_preads(os.path.join(root, rel), offsets),
        )
        if "two_procs" in base:
            pair = [os.path.basename(ds.npy()), rel]
            out["two_procs"] = Workload(
                "two_procs",
                pair,
                file_bytes([ds.path(p) for p in pair]),
                lambda root: processes_read([os.path.join(root, p) for p in pair]),
                lambda root: parallel_read([os.path.join(root, p) for p in pair]),
                lambda root: parallel_read([os.path.join(root, p) for p in pair], fd_per_thread=False),
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.split("\n\n")[0], WORKLOADS)
    add_emulator_options(parser, DEFAULT_LATENCY_MS, DEFAULT_MBPS)
    parser.add_argument(
        "--emu-read-ahead-kb",
        type=int,
        default=None,
        help="read_ahead_kb of the emulator mount (default: kernel default 128)",
    )
    parser.add_argument(
        "--bound-per-thread-fd",
        action="store_true",
        help="also time the bound reader with one descriptor per thread (16 streams per file)",
    )
    args = parser.parse_args(argv)
    require_root()
    chosen = selected(args, WORKLOADS)
    disk = Dataset(args.disk_dir, args.scale)
    ram = Dataset(args.ram_dir, args.scale, mirror_of=disk)
    emu_work = build_workloads(ram, [w for w in chosen if w in EMULATED])
    local_work = build_workloads(disk, [w for w in chosen if w in LOCAL])
    preimport(sorted({IMPORTS[w] for w in chosen if w in IMPORTS}))
    opts = extra_options(args)
    rss_rows: list[list[str]] = []
    print(
        f"latency-bound storage: {args.latency_ms:g} ms + size / {args.mbps:g} MB/s per handle; "
        f"scale {args.scale:g}, runs {args.runs}"
    )

    def rss_row(label: str, cell: Cell) -> None:
        peak, limit = cell.peak_rss(), cell.budget()
        rss_rows.append([label, human_bytes(peak), human_bytes(limit), fmt_x(ratio(peak, limit))])

    if emu_work:
        emu_mnt = mountpoint(EMU_MOUNT)
        fastfs_mnt = mountpoint(FASTFS_MOUNT)
        rows: list[list[str]] = []
        notes: list[str] = []
        with emulated(ram.dir, emu_mnt, args.latency_ms, args.mbps, read_ahead_kb=args.emu_read_ahead_kb) as emu:
            direct = Native(emu.mnt, emu)
            fastfs = Fastfs(emu.mnt, fastfs_mnt, opts, emu=emu)
            for name in [w for w in chosen if w in EMULATED]:
                w = emu_work[name]
                log(f"{name}: direct")
                d = measure(direct, [w.run], args.runs)
                log(f"{name}: fastfs")
                f = measure(fastfs, [w.run], args.runs)
                log(f"{name}: bound")
                main_bound = w.bound_shared or w.bound
                b = measure(direct, [main_bound], args.runs) if main_bound else Cell()
                b1 = measure(direct, [w.bound], args.runs) if args.bound_per_thread_fd and w.bound else None
                td, tf, tb = d.med(), f.med(), b.med()
                row = [name, human_bytes(w.nbytes), fmt_s(td), fmt_s(tf), fmt_s(tb)]
                if args.bound_per_thread_fd:
                    row.append(fmt_s(b1.med() if b1 else None))
                row += [
                    fmt_x(ratio(td, tf)),
                    fmt_x(ratio(tb, tf)),
                    fmt_mbps(w.nbytes, tf),
                    fmt_x(f.fetched_ratio()),
                    d.storage(),
                    f.storage(),
                    f.sizes(),
                ]
                rows.append(row)
                rss_row(name, f)
                for who, cell in (("direct", d), ("fastfs", f), ("bound", b), ("bound per-thread fd", b1)):
                    if cell is not None and cell.error:
                        notes.append(f"{name} {who}: {cell.error}")
            emu_stats = emu.stats()
        headers = ["workload", "bytes", "direct s", "fastfs s", "bound s"]
        if args.bound_per_thread_fd:
            headers.append("bound 16fd s")
        headers += [
            "speedup",
            "of bound",
            "fastfs MB/s",
            "fetched/deliv",
            "storage direct",
            "storage fastfs",
            "kernel request sizes (fastfs)",
        ]
        print_table(
            f"emulated storage ({args.latency_ms:g} ms, {args.mbps:g} MB/s per handle), cold, median seconds",
            headers,
            rows,
            [
                "speedup = direct / fastfs; of bound = bound / fastfs (bound: 16 threads x 8 MiB preadv, one fd)",
                "storage = emulator requests x mean size per run; fetched/deliv = fastfs source / requested bytes",
                f"emulator: parallel lookups {'on' if emu_stats.get('parallel_dirops') else 'OFF'}",
                *notes,
            ],
        )

    if local_work:
        local_mnt = mountpoint(LOCAL_MOUNT)
        native = Native(disk.dir)
        fastfs = Fastfs(disk.dir, local_mnt, opts)
        rows = []
        notes = []
        for name in [w for w in chosen if w in LOCAL]:
            w = local_work[name.removeprefix("local_")]
            for cold in (True, False):
                temp = "cold" if cold else "hot"
                log(f"{name} {temp}")
                n = measure(native, [w.run], args.runs, cold=cold)
                f = measure(fastfs, [w.run], args.runs, cold=cold)
                tn, tf = n.med(), f.med()
                rows.append(
                    [
                        f"{name} {temp}",
                        human_bytes(w.nbytes),
                        fmt_s(tn),
                        fmt_s(tf),
                        fmt_x(ratio(tn, tf)),
                        fmt_mbps(w.nbytes, tn),
                        fmt_mbps(w.nbytes, tf),
                        fmt_x(f.fetched_ratio()),
                        f.sizes(),
                    ]
                )
                rss_row(f"{name} {temp}", f)
                for who, cell in (("native", n), ("fastfs", f)):
                    if cell.error:
                        notes.append(f"{name} {temp} {who}: {cell.error}")
        print_table(
            "local disk: native vs fastfs, median seconds",
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
            ["speedup = native / fastfs (>1: fastfs faster)", *notes],
        )

    if rss_rows:
        print_table(
            "fastfs daemon peak RSS (VmHWM) vs cache budget", ["workload", "peak RSS", "budget", "RSS/budget"], rss_rows
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
