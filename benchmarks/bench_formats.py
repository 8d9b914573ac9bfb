"""Format-aware prefetch and learned access sets on latency-bound storage: direct vs fastfs.

Same method as ``bench_latency.py``: the data set in RAM behind the latency emulator, ``direct``
reads the emulator mount, ``fastfs`` reads a fastfs mount of the emulator mount, ``bound`` is the
16-thread in-process reader (where it applies); every cold run remounts fastfs and drops the page
cache; medians of ``--runs``. For every workload ``fetched/deliv`` (bytes fastfs read from the source
/ bytes the kernel asked of it) shows whether format-aware prefetch read only what the loader used.

Workloads (``--only``):

* ``safetensors``: ``safetensors.torch.load_file`` (mmap inside) of a ~1 GiB file, then every tensor
  touched (``sum``): load_file returns mmap-backed tensors, so without the touch little is read;
* ``safetensors_open``: ``load_file`` alone (header and index only): shows what prefetch costs when
  the loader reads almost nothing (``fetched/deliv`` far above 1 is over-fetch);
* ``npy_mmap``: ``np.load(mmap_mode='r')`` of a 1 GiB .npy, then a full pass (``sum``);
* ``torch_mmap``: ``torch.load(mmap=True)``, then every tensor touched (``sum``);
* ``ttft_torch``: time to the first tensor with ``torch.load`` - torch.load returns only after every
  tensor is read, so this is the whole load;
* ``ttft_torch_mmap``: ``torch.load(mmap=True)`` plus the first tensor's ``sum``: the real time to a
  first usable tensor (later tensors are read on first touch);
* ``ttft_paddle``: ``paddle.load`` - like torch.load, it returns the whole state dict at once, so
  this too is the whole load;
* ``epoch2``: the second epoch of a shuffled 10,000-small-file scan. fastfs: mount with a state
  directory, run epoch 1 (shuffle seed A), unmount, drop caches, remount with the SAME state
  directory (the learned access set is replayed), time epoch 2 (shuffle seed B). direct: a cold
  scan in the epoch-2 order. Epoch 1's fastfs time is printed below the table;
* ``safetensors_reload``, ``torch_mmap_reload``: the ``safetensors`` / ``torch_mmap`` load once more
  after a remount with the state directory of a first load (fastfs remembers the file was read whole
  and releases its plan whole at open), vs the same direct cold load.

Run: ``python benchmarks/bench_formats.py [--scale 0.25] [--runs 3] [--only npy_mmap,epoch2]``
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import add_emulator_options, base_parser, extra_options, selected  # noqa: E402
from benchkit.datasets import Dataset  # noqa: E402
from benchkit.measure import Cell, Fastfs, Native, Rerun, measure, preimport  # noqa: E402
from benchkit.readers import (
    file_bytes,
    np_mmap_sum,
    paddle_load,
    parallel_files,
    parallel_read,
    read_files,
    safetensors_load,
    safetensors_load_touch,
    small_file_list,
    torch_load,
    torch_load_touch,
)  # noqa: E402
from benchkit.report import fmt_mbps, fmt_s, fmt_x, human_bytes, log, median, print_table, ratio  # noqa: E402
from benchkit.system import mountpoint, require_root  # noqa: E402
from benchkit.units import SEED  # noqa: E402
from latency_fs import DEFAULT_LATENCY_MS, DEFAULT_MBPS, emulated  # noqa: E402

WORKLOADS = (
    "safetensors",
    "safetensors_open",
    "npy_mmap",
    "torch_mmap",
    "ttft_torch",
    "ttft_torch_mmap",
    "ttft_paddle",
    "epoch2",
    "safetensors_reload",
    "torch_mmap_reload",
)
# Loader libraries each workload needs imported before timing.
IMPORTS = {
    "safetensors": "safetensors.torch",
    "safetensors_open": "safetensors.torch",
    "npy_mmap": "numpy",
    "torch_mmap": "torch",
    "ttft_torch": "torch",
    "ttft_torch_mmap": "torch",
    "ttft_paddle": "paddle",
    "safetensors_reload": "safetensors.torch",
    "torch_mmap_reload": "torch",
}
# Shuffle seeds of the two epochs (different orders, as a training loop reshuffles every epoch).
EPOCH1_SEED = SEED
EPOCH2_SEED = SEED + 1
# Mount point names (under benchkit.system.MOUNT_ROOT).
EMU_MOUNT = "formats-emu"
FASTFS_MOUNT = "formats-fastfs"


def torch_first_tensor(path: str) -> float:
    """torch.load(mmap=True), then read the first tensor: the time until a tensor is usable."""
    import torch

    state = torch.load(path, mmap=True, weights_only=True)
    return float(next(iter(state.values())).sum())


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.split("\n\n")[0], WORKLOADS)
    add_emulator_options(parser, DEFAULT_LATENCY_MS, DEFAULT_MBPS)
    args = parser.parse_args(argv)
    require_root()
    chosen = selected(args, WORKLOADS)
    disk = Dataset(args.disk_dir, args.scale)
    ram = Dataset(args.ram_dir, args.scale, mirror_of=disk)

    # (reader, bound reader or None, file or directory it reads) per workload, all relative to a root
    plans: dict[str, tuple[Callable[[str], Any], Callable[[str], Any] | None, str]] = {}

    def large(name: str, path: str, reader: Callable[[str], Any], with_bound: bool = True) -> None:
        rel = os.path.basename(path)
        bound = (lambda root: parallel_read([os.path.join(root, rel)])) if with_bound else None
        plans[name] = (lambda root: reader(os.path.join(root, rel)), bound, path)

    for name in chosen:
        if name == "safetensors":
            large(name, ram.safetensors(), safetensors_load_touch)
        elif name == "safetensors_open":
            large(name, ram.safetensors(), safetensors_load, with_bound=False)
        elif name == "npy_mmap":
            large(name, ram.npy(), np_mmap_sum)
        elif name == "torch_mmap":
            large(name, ram.torch_state(), torch_load_touch)
        elif name == "ttft_torch":
            large(name, ram.torch_state(), torch_load, with_bound=False)
        elif name == "ttft_torch_mmap":
            large(name, ram.torch_state(), torch_first_tensor, with_bound=False)
        elif name == "ttft_paddle":
            large(name, ram.paddle_state(), paddle_load, with_bound=False)
        elif name == "safetensors_reload":
            large(name, ram.safetensors(), safetensors_load_touch)
        elif name == "torch_mmap_reload":
            large(name, ram.torch_state(), torch_load_touch)
    epoch_scans: dict[int, Callable[[str], Any]] = {}
    if "epoch2" in chosen:
        small = ram.small_dir()
        for seed in (EPOCH1_SEED, EPOCH2_SEED):
            rel = [os.path.relpath(p, ram.dir) for p in small_file_list(small, shuffled=True, seed=seed)]
            epoch_scans[seed] = lambda root, rel=rel: read_files([os.path.join(root, r) for r in rel])
        rel2 = [os.path.relpath(p, ram.dir) for p in small_file_list(small, shuffled=True, seed=EPOCH2_SEED)]
        plans["epoch2"] = (
            epoch_scans[EPOCH2_SEED],
            lambda root: parallel_files([os.path.join(root, r) for r in rel2]),
            small,
        )
    preimport(sorted({IMPORTS[w] for w in chosen if w in IMPORTS}))
    opts = extra_options(args)
    emu_mnt = mountpoint(EMU_MOUNT)
    fastfs_mnt = mountpoint(FASTFS_MOUNT)
    print(
        f"format-aware prefetch on emulated storage: {args.latency_ms:g} ms + size / {args.mbps:g} MB/s per "
        f"handle; scale {args.scale:g}, runs {args.runs}"
    )
    rows: list[list[str]] = []
    notes: list[str] = []
    with emulated(ram.dir, emu_mnt, args.latency_ms, args.mbps) as emu:
        direct = Native(emu.mnt, emu)
        fastfs = Fastfs(emu.mnt, fastfs_mnt, opts, emu=emu)
        for name in chosen:
            reader, bound, path = plans[name]
            nbytes = file_bytes([path])
            contender: Fastfs = fastfs
            if name == "epoch2":
                contender = Rerun(emu.mnt, fastfs_mnt, [epoch_scans[EPOCH1_SEED]], opts, emu)
            elif name.endswith("_reload"):
                contender = Rerun(emu.mnt, fastfs_mnt, [reader], opts, emu)
            log(f"{name}: direct")
            d = measure(direct, [reader], args.runs)
            log(f"{name}: fastfs")
            f = measure(contender, [reader], args.runs)
            b = Cell()
            if bound is not None:
                log(f"{name}: bound")
                b = measure(direct, [bound], args.runs)
            td, tf, tb = d.med(), f.med(), b.med()
            rows.append(
                [
                    name,
                    human_bytes(nbytes),
                    fmt_s(td),
                    fmt_s(tf),
                    fmt_s(tb),
                    fmt_x(ratio(td, tf)),
                    fmt_x(ratio(tb, tf)),
                    fmt_mbps(nbytes, tf),
                    fmt_x(f.fetched_ratio()),
                    d.storage(),
                    f.storage(),
                    f.sizes(),
                ]
            )
            if name == "epoch2" and isinstance(contender, Rerun):
                notes.append(
                    f"epoch2: fastfs epoch 1 (fresh state) took {fmt_s(median(contender.first_times))} s; "
                    f"learned plans replayed: {_counter(f, 'learned_plans')}, files used: "
                    f"{_counter(f, 'learned_files_used')}"
                )
            elif isinstance(contender, Rerun):
                notes.append(
                    f"{name}: fastfs first load (fresh state) took {fmt_s(median(contender.first_times))} s; "
                    f"plans released whole as learned: {_counter(f, 'learned_whole_plans')}"
                )
            for who, cell in (("direct", d), ("fastfs", f), ("bound", b)):
                if cell.error:
                    notes.append(f"{name} {who}: {cell.error}")
    print_table(
        f"format-aware workloads on emulated storage ({args.latency_ms:g} ms, {args.mbps:g} MB/s per handle), "
        "cold, median seconds",
        [
            "workload",
            "bytes",
            "direct s",
            "fastfs s",
            "bound s",
            "speedup",
            "of bound",
            "fastfs MB/s",
            "fetched/deliv",
            "storage direct",
            "storage fastfs",
            "kernel request sizes (fastfs)",
        ],
        rows,
        [
            "speedup = direct / fastfs; of bound = bound / fastfs (bound = 16-thread reader of the file, I/O only)",
            "ttft_torch and ttft_paddle: the loaders return every tensor at once, so time to first tensor = whole load",
            "safetensors_open, ttft_torch_mmap: the loader reads a fraction of the file; bytes = file size",
            "fetched/deliv = bytes fastfs read from the source / bytes the kernel requested from fastfs",
            *notes,
        ],
    )
    return 0


def _counter(cell: Cell, name: str) -> str:
    if not cell.snaps:
        return "-"
    return str(cell.snaps[-1].get("counters", {}).get(name, "-"))


if __name__ == "__main__":
    sys.exit(main())
