"""The workloads of the benchmark matrix: what each reads, how, and how big it is at a scale.

A :class:`Workload` is a name, a one-line description and a ``build`` function that makes (or
reuses) its data in a :class:`~.datasets.Dataset` and returns a :class:`Plan`: the timed phases
as functions of a contender's root directory (so the same plan runs on the emulator mount and on
fastfs), the loader libraries to import before timing, and extra fastfs options (the budget of
the larger-than-cache workload). Paths inside a plan are relative to the data set's directory.

Sizes follow ``--scale`` (1: the figures of issue 14: 1 GiB files, 10,000 small files, a 40 MiB
git pack, 20 x 500 tree files, ...) with floors so a smoke run at ``--scale 0.05`` still exercises
every pattern; counts of random requests are fixed (2,000 4 KiB preads, 3,000 SQLite lookups).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import clients, datagen, readers
from .datasets import Dataset
from .readers import RANDOM_COUNT, RANDOM_SIZE
from .units import KIB, MIB, SEED

# SQLite: rows at --scale 1 (~230 MB of 4 KiB pages) and point lookups per run.
SQLITE_ROWS = 1_000_000
SQLITE_LOOKUPS = 3000
# DataLoader: small files at --scale 1, worker processes, batch size.
LOADER_FILES = 2000
LOADER_WORKERS = 4
LOADER_BATCH = 16
# Image folder (issue 21): images at --scale 1 (100-200 KiB each, in class folders), DataLoader
# workers and batch size (a ResNet-style training loader).
IMAGE_COUNT = 3000
IMAGE_BATCH = 32
# The checkpoint loads of the network-client rows of issue 21: 256 MiB at --scale 1.
MID_BYTES = 256 * MIB
# Threads of the many-threads small-file reader.
SMALL_THREADS = 16
# Readers of part of the small-file directory: the files of a quick test run (the first tenth, name
# order), the ranks of a strided split (each reads every RANKS-th name), a Subset sampler's share.
HEAD_SHARE = 10
RANKS = 4
SUBSET_SHARE = 10
# Random large reads: readers, request size, most requests per reader.
LARGE_RANDOM_READERS = 4
LARGE_RANDOM_SIZE = 256 * KIB
LARGE_RANDOM_COUNT = 256
# fio: jobs of the parallel workloads and requests per random 256 KiB job.
FIO_JOBS = 4
# Processes of the multi-process large-file reader (one file each).
LARGE_PROCS = 4
# git: commits and blob bytes at --scale 1 (one pack of ~40 MiB).
GIT_COMMITS = 200
GIT_BYTES = 40 * MIB
# Tree walk: directories and files per directory at --scale 1.
TREE_DIRS = 20
TREE_FILES = 500
# WebDataset-style shards and reader processes.
TAR_SHARDS = 8
TAR_PROCS = 2
# Larger-than-cache data set: fastfs budget at --scale 1, data set / budget, file size.
OVER_BUDGET = 128 * MIB
OVER_FACTOR = 10
OVER_FILE = 256 * KIB
# Smallest budget fastfs accepts (config/schema.py MIN_BUDGET).
MIN_BUDGET = 16 * MIB


@dataclass
class Plan:
    """A workload made concrete: timed phases (functions of a root), data size, imports, fastfs options."""

    phases: list[Callable[[str], Any]]
    nbytes: int
    imports: tuple[str, ...] = ()
    fastfs_options: list[str] = field(default_factory=list)
    note: str = ""
    paths: list[str] = field(default_factory=list)
    """What the phases read, relative to the data set (files or directories): what a storage that
    holds copies (the S3 server of ``s3fs``) must be given."""


@dataclass(frozen=True)
class Workload:
    name: str
    about: str
    build: Callable[[Dataset], Plan]


def _rel(ds: Dataset, path: str) -> str:
    return os.path.relpath(path, ds.dir)


def _size(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)
    return os.path.getsize(path)


def _file(ds: Dataset, path: str, fn: Callable[..., Any], *args: Any, imports: tuple[str, ...] = ()) -> Plan:
    """A plan of one phase calling ``fn(root/path, *args)``."""
    rel = _rel(ds, path)
    return Plan([lambda root: fn(os.path.join(root, rel), *args)], _size(path), imports, paths=[rel])


def _files(ds: Dataset, paths: list[str], fn: Callable[..., Any], *args: Any, imports: tuple[str, ...] = ()) -> Plan:
    """A plan of one phase calling ``fn([root/p for p in paths], *args)``."""
    rels = [_rel(ds, p) for p in paths]
    phase = [lambda root: fn([os.path.join(root, r) for r in rels], *args)]
    return Plan(phase, sum(map(_size, paths)), imports, paths=_parents(rels))


def _parents(rels: list[str]) -> list[str]:
    """The directories holding *rels* when they hold nothing else the plan skips, else the files."""
    dirs = {os.path.dirname(r) for r in rels}
    return sorted(dirs) if "" not in dirs and len(dirs) < len(rels) else list(rels)


# -- builders -----------------------------------------------------------------------------------------
def _small(shuffled: bool) -> Callable[[Dataset], Plan]:
    def build(ds: Dataset) -> Plan:
        return _files(ds, readers.small_file_list(ds.small_dir(), shuffled), readers.read_files)

    return build


def _small_part(part: str) -> Callable[[Dataset], Plan]:
    """A reader of part of the small-file directory (*part*: head, strided or subset)."""

    def build(ds: Dataset) -> Plan:
        names = readers.small_file_list(ds.small_dir(), False)
        if part == "head":
            paths = names[: max(1, len(names) // HEAD_SHARE)]
        elif part == "strided":
            paths = names[::RANKS]
        else:
            paths = readers.small_file_list(ds.small_dir(), True)[: max(1, len(names) // SUBSET_SHARE)]
        plan = _files(ds, paths, readers.read_files)
        plan.paths = [_rel(ds, ds.small_dir())]  # (the reader's directory holds every file)
        return plan

    return build


def _threads_small(ds: Dataset) -> Plan:
    return _files(ds, readers.small_file_list(ds.small_dir(), False), readers.parallel_files, SMALL_THREADS)


def _dataloader(ds: Dataset) -> Plan:
    small = ds.small_dir("small-loader", ds.scaled(LOADER_FILES, 200))
    paths = readers.small_file_list(small, False)
    return _files(ds, paths, clients.dataloader_epoch, LOADER_WORKERS, LOADER_BATCH, imports=("torch",))


def _images(ds: Dataset) -> Plan:
    top = ds.image_folder("images", ds.scaled(IMAGE_COUNT, 200))
    return _file(ds, top, clients.image_folder_epoch, LOADER_WORKERS, IMAGE_BATCH, imports=("torch",))


def _mid_bytes(ds: Dataset) -> int:
    return max(MIB, int(MID_BYTES * ds.scale) // MIB * MIB)


def _npy256(ds: Dataset) -> Plan:
    return _file(ds, ds.npy("mid.npy", _mid_bytes(ds)), readers.np_load, imports=("numpy",))


def _torch256(ds: Dataset) -> Plan:
    return _file(ds, ds.torch_state("mid.pt", _mid_bytes(ds)), readers.torch_load, imports=("torch",))


def _safetensors256(ds: Dataset) -> Plan:
    path = ds.safetensors_sized("model-256m.safetensors", _mid_bytes(ds))
    return _file(ds, path, readers.safetensors_load_touch, imports=("safetensors.torch",))


def _hf_half(ds: Dataset) -> Plan:
    """The first half of the layers (with the embeddings before them), in model order."""
    shapes = datagen.hf_layer_shapes(ds.big_bytes)
    layers = sum(1 for name, _ in shapes if name.endswith("input_layernorm.weight"))
    half = [n for n, _ in shapes if not n.startswith("model.layers.") or int(n.split(".")[2]) < layers // 2]
    half = [n for n in half if n not in ("model.norm.weight", "lm_head.weight")]
    plan = _file(ds, ds.hf_safetensors(), readers.safetensors_layers_half, half, imports=("safetensors.torch",))
    plan.nbytes = sum(4 * _numel(shape) for name, shape in shapes if name in set(half))
    plan.note = f"{len(half)} of {len(shapes)} tensors (layers 0-{layers // 2 - 1} of {layers})"
    return plan


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _random4k(ds: Dataset) -> Plan:
    raw = ds.raw()
    offsets = readers.random_offsets(os.path.getsize(raw))
    plan = _file(ds, raw, readers.random_preads, offsets)
    plan.nbytes = len(offsets) * RANDOM_SIZE
    return plan


def _large_random_count(ds: Dataset) -> int:
    return max(16, min(LARGE_RANDOM_COUNT, ds.big_bytes // LARGE_RANDOM_SIZE // 8))


def _random256k(ds: Dataset) -> Plan:
    count = _large_random_count(ds)
    plan = _file(ds, ds.raw(), readers.random_readers, LARGE_RANDOM_READERS, count, LARGE_RANDOM_SIZE)
    plan.nbytes = LARGE_RANDOM_READERS * count * LARGE_RANDOM_SIZE
    return plan


def _fio(rw: str, bs: str, jobs: int, random_count: Callable[[Dataset], int] | None, split: bool):
    def build(ds: Dataset) -> Plan:
        n = random_count(ds) if random_count else None
        plan = _file(ds, ds.raw(), clients.fio, rw, bs, jobs, n, split)
        if n:
            plan.nbytes = jobs * n * (4 * KIB if bs == "4k" else 256 * KIB)
        return plan

    return build


def _sqlite(ds: Dataset) -> Plan:
    rows = ds.scaled(SQLITE_ROWS, 20_000)
    keys = clients.sqlite_keys(rows, SQLITE_LOOKUPS)
    return _file(ds, ds.sqlite("kv.sqlite", rows), clients.sqlite_lookups, keys)


def _sqlite_cli(ds: Dataset) -> Plan:
    rows = ds.scaled(SQLITE_ROWS, 20_000)
    keys = clients.sqlite_keys(rows, SQLITE_LOOKUPS)
    return _file(ds, ds.sqlite("kv.sqlite", rows), clients.sqlite_cli, keys)


def _two_procs(ds: Dataset) -> Plan:
    return _files(ds, [ds.npy(), ds.raw()], clients.processes_read)


def _procs4(ds: Dataset) -> Plan:
    top = ds.large_files("large4", LARGE_PROCS, max(MIB, ds.big_bytes // LARGE_PROCS // MIB * MIB))
    return _files(ds, sorted(os.path.join(top, n) for n in os.listdir(top)), clients.processes_read)


def _hf_safetensors(ds: Dataset) -> Plan:
    keys = [name for name, _ in datagen.hf_layer_shapes(ds.big_bytes)]
    return _file(ds, ds.hf_safetensors(), readers.safetensors_model_order, keys, imports=("safetensors.torch",))


def _git(ds: Dataset) -> Plan:
    repo = ds.git_repo("repo.git", ds.scaled(GIT_COMMITS, 20), ds.scaled(GIT_BYTES, 2 * MIB))
    return _file(ds, repo, clients.git_fsck_log)


def _import_numpy(ds: Dataset) -> Plan:
    return _file(ds, ds.numpy_copy(), clients.import_numpy)


def _import_torch(ds: Dataset) -> Plan:
    return _file(ds, ds.torch_copy(), clients.import_torch, imports=("torch",))


def _tree(ds: Dataset) -> Plan:
    return _file(ds, ds.tree("tree", TREE_DIRS, ds.scaled(TREE_FILES, 25)), readers.tree_walk)


def _tar(ds: Dataset) -> Plan:
    top = ds.tar_shards("shards", TAR_SHARDS, max(MIB, ds.big_bytes // 2 // TAR_SHARDS))
    shards = sorted(os.path.join(top, n) for n in os.listdir(top))
    return _files(ds, shards, clients.tar_readers, TAR_PROCS)


def over_budget_bytes(ds: Dataset) -> int:
    """fastfs budget of the larger-than-cache workload at this scale."""
    return max(MIN_BUDGET, int(OVER_BUDGET * ds.scale) // MIB * MIB)


def _over_budget(ds: Dataset) -> Plan:
    budget = over_budget_bytes(ds)
    top = ds.sized_files("over-budget", OVER_FACTOR * budget // OVER_FILE, OVER_FILE)
    phases = []
    for seed in (SEED, SEED + 1):  # two epochs, each reshuffled
        rels = [_rel(ds, p) for p in readers.small_file_list(top, True, seed)]
        phases.append(lambda root, rels=rels: readers.read_files([os.path.join(root, r) for r in rels]))
    return Plan(
        phases,
        2 * _size(top),
        fastfs_options=[f"cache.budget={budget}"],
        note=f"fastfs budget {budget // MIB} MiB, data {OVER_FACTOR}x it, read twice",
        paths=[_rel(ds, top)],
    )


def _loader(fn: Callable[[str], Any], module: str, path_of: Callable[[Dataset], str]) -> Callable[[Dataset], Plan]:
    def build(ds: Dataset) -> Plan:
        return _file(ds, path_of(ds), fn, imports=(module,))

    return build


WORKLOADS: tuple[Workload, ...] = (
    # the loaders and scans of bench_latency / bench_formats
    Workload("npy", "np.load of a 1 GiB .npy", _loader(readers.np_load, "numpy", Dataset.npy)),
    Workload("torch", "torch.load of a ~1 GiB state dict", _loader(readers.torch_load, "torch", Dataset.torch_state)),
    Workload(
        "paddle", "paddle.load of a ~1 GiB state dict", _loader(readers.paddle_load, "paddle", Dataset.paddle_state)
    ),
    Workload(
        "safetensors",
        "safetensors load_file + every tensor touched",
        _loader(readers.safetensors_load_touch, "safetensors.torch", Dataset.safetensors),
    ),
    Workload("safetensors_hf", "safe_open + get_tensor per key in model order (transformers)", _hf_safetensors),
    Workload("npy256", "np.load of a 256 MiB .npy (issue 21's network-client size)", _npy256),
    Workload("torch256", "torch.load of a 256 MiB state dict", _torch256),
    Workload("safetensors256", "safetensors load_file + every tensor touched, 256 MiB", _safetensors256),
    Workload("safetensors_hf_half", "safe_open + get_tensor of the first half of the layers, model order", _hf_half),
    Workload("small_sorted", "one reader, 10,000 files of 3 KiB, name order", _small(False)),
    Workload("small_shuffled", "one reader, 10,000 files of 3 KiB, shuffled", _small(True)),
    Workload("small_head", "one reader, the first tenth of the 10,000 small files, name order", _small_part("head")),
    Workload("small_strided", "one reader, every 4th of the 10,000 small files, name order", _small_part("strided")),
    Workload("small_subset", "one reader, a shuffled tenth of the 10,000 small files", _small_part("subset")),
    Workload("threads16_small", "16 threads reading the 10,000 small files", _threads_small),
    Workload("dataloader", "torch DataLoader, 4 workers, shuffled epoch over 2,000 small files", _dataloader),
    Workload(
        "images", "ImageFolder-like DataLoader, 4 workers, shuffled: 3,000 images of 100-200 KiB, 10 classes", _images
    ),
    Workload("random4k", "2,000 random 4 KiB preads in a 1 GiB file", _random4k),
    Workload("random256k_4", "4 threads of random 256 KiB preads in a 1 GiB file", _random256k),
    Workload(
        "fio_rand4k",
        "fio, 1 job, rw=randread bs=4k, 2,000 reads",
        _fio("randread", "4k", 1, lambda ds: RANDOM_COUNT, False),
    ),
    Workload(
        "fio_rand256k_4",
        "fio, 4 jobs, rw=randread bs=256k",
        _fio("randread", "256k", FIO_JOBS, _large_random_count, False),
    ),
    Workload(
        "fio_seq256k_4", "fio, 4 jobs, rw=read bs=256k, a quarter of the file each", _fio("read", "256k", 4, None, True)
    ),
    Workload("sqlite", "3,000 point lookups, SQLite opened ?immutable=1", _sqlite),
    Workload("sqlite_cli", "the same lookups through the sqlite3 shell (Debian's build)", _sqlite_cli),
    Workload("two_procs", "2 processes, each reading a different 1 GiB file", _two_procs),
    Workload("procs4", "4 processes, each reading a different 256 MiB file", _procs4),
    Workload("git", "git fsck --full + git log --stat, one ~40 MiB pack", _git),
    Workload("import_numpy", "fresh interpreter: import numpy (+linalg, fft, random) from the mount", _import_numpy),
    Workload("import_torch", "fresh interpreter: import torch (and what it loads) from the mount", _import_torch),
    Workload("tree_walk", "os.walk + read of 20 x 500 files of 4-64 KiB", _tree),
    Workload("tar_shards", "8 tar shards read by 2 processes (WebDataset style)", _tar),
    Workload("over_budget", "data set 10x the fastfs budget, 256 KiB files, two shuffled epochs", _over_budget),
)
BY_NAME = {w.name: w for w in WORKLOADS}

# Named sets of workloads (``--workloads @NAME``): the rows of issue 21's tables.
GROUPS: dict[str, tuple[str, ...]] = {
    # over the stream-oriented network clients (rclone, s3fs, sshfs)
    "net": ("npy256", "torch256", "safetensors256", "safetensors_hf_half", "small_shuffled", "random4k"),
    # storage that answers metadata one request at a time (emu:issue14)
    "small": (
        "small_sorted",
        "small_shuffled",
        "tree_walk",
        "threads16_small",
        "dataloader",
        "images",
        "random4k",
    ),
    # large loads that must not regress
    "large": ("npy", "torch", "safetensors", "safetensors_hf", "two_procs"),
    # readers of part of a directory: what the source is asked for beyond what they read
    "part": ("small_head", "small_strided", "small_subset"),
}
