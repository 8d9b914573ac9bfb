"""Benchmark data sets: generated once per scale (deterministic, seeded) and reused.

A :class:`Dataset` lives under ``ROOT/scale-F/``; a manifest records what was made with which
parameters, so a later run reuses a file only when its spec matches. ``mirror_of`` makes a data set
that copies its files from another (the RAM copy of a disk data set) instead of generating them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import datagen
from .report import log
from .units import GIB, KIB, MIB, SEED

# Size of the large-file workloads at --scale 1: a typical checkpoint / array shard.
BIG_BYTES = 1 * GIB
# Small-file scan at --scale 1: 10,000 files like an image / token shard data set.
SMALL_COUNT = 10_000
# Size of each small file: just over 3 KiB (not page aligned, like real samples).
SMALL_SIZE = 3073
# Fewest small files whatever the scale (a scan needs enough files to detect and amortise).
SMALL_MIN_COUNT = 200
# Bytes of one large tensor in generated state dicts (a 4096x1024 float32 weight).
TENSOR_BYTES = 16 * MIB
# Bytes of one small tensor in generated state dicts (a bias vector).
SMALL_TENSOR_BYTES = 16 * KIB
# Generation chunk: bounds the memory used while writing large files.
GEN_CHUNK = 64 * MIB


@dataclass
class Dataset:
    """Benchmark files under *root*/scale-*scale*, generated once and reused (manifest-checked)."""

    root: str
    scale: float
    mirror_of: Dataset | None = None
    """When set, files are copied from this data set (generating them there first) instead of generated."""
    made: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dir = os.path.join(self.root, f"scale-{self.scale:g}")
        os.makedirs(self.dir, exist_ok=True)
        self._manifest = os.path.join(self.dir, ".manifest.json")
        try:
            with open(self._manifest) as f:
                self.made = json.load(f)
        except (OSError, ValueError):
            self.made = {}

    # sizes
    @property
    def big_bytes(self) -> int:
        return max(MIB, int(BIG_BYTES * self.scale) // MIB * MIB)

    @property
    def small_count(self) -> int:
        return max(SMALL_MIN_COUNT, int(SMALL_COUNT * self.scale))

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _ready(self, name: str, spec: dict[str, Any]) -> bool:
        return self.made.get(name) == spec and os.path.exists(self.path(name))

    def _record(self, name: str, spec: dict[str, Any]) -> None:
        self.made[name] = spec
        tmp = self._manifest + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.made, f, indent=1)
        os.replace(tmp, self._manifest)

    def _make(self, name: str, spec: dict[str, Any], build: Callable[[str], None]) -> str:
        path = self.path(name)
        if self.mirror_of is not None and spec["kind"] in _MAKERS and not self._ready(name, spec):
            origin = getattr(self.mirror_of, _MAKERS[spec["kind"]])(name)

            def build(p: str, origin: str = origin) -> None:
                copy_tree(origin, p)

        if not self._ready(name, spec):
            log(f"generating {path} ({spec})")
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.unlink(path)
            self.made.pop(name, None)
            build(path)
            os.sync()
            self._record(name, spec)
        return path

    # files
    def npy(self, name: str = "big.npy", nbytes: int | None = None) -> str:
        """A float32 .npy of ~*nbytes* (default big_bytes)."""
        n = (self.big_bytes if nbytes is None else nbytes) // 4
        return self._make(name, {"kind": "npy", "elements": n}, lambda p: make_npy(p, n))

    def raw(self, name: str = "big.bin", nbytes: int | None = None) -> str:
        """A file of *nbytes* (default big_bytes) random bytes."""
        n = self.big_bytes if nbytes is None else nbytes
        return self._make(name, {"kind": "raw", "bytes": n}, lambda p: make_raw(p, n))

    def small_dir(self, name: str = "small", count: int | None = None) -> str:
        """A directory of *count* (default small_count) files of SMALL_SIZE bytes."""
        n = self.small_count if count is None else count
        return self._make(
            name, {"kind": "small", "count": n, "size": SMALL_SIZE}, lambda p: make_small_files(p, n, SMALL_SIZE)
        )

    def torch_state(self, name: str = "state.pt", nbytes: int | None = None) -> str:
        n = self.big_bytes if nbytes is None else nbytes
        return self._make(name, {"kind": "torch", "bytes": n}, lambda p: make_torch_state(p, n))

    def paddle_state(self, name: str = "state.pdparams") -> str:
        n = self.big_bytes
        return self._make(name, {"kind": "paddle", "bytes": n}, lambda p: make_paddle_state(p, n))

    def safetensors(self, name: str = "model.safetensors") -> str:
        n = self.big_bytes
        return self._make(name, {"kind": "safetensors", "bytes": n}, lambda p: make_safetensors(p, n))

    # data of the matrix workloads (generated in place, never mirrored)
    def scaled(self, value: int, least: int) -> int:
        """*value* x scale, at least *least*."""
        return max(least, int(value * self.scale))

    def large_files(self, name: str, count: int, nbytes: int) -> str:
        """A directory of *count* files of *nbytes* random bytes (``part-N.bin``)."""
        spec = {"kind": "large_files", "count": count, "bytes": nbytes}
        return self._make(name, spec, lambda p: datagen.make_large_files(p, count, nbytes))

    def sized_files(self, name: str, count: int, size: int) -> str:
        """A directory of *count* files of *size* random bytes (``NNNNNN.bin``)."""
        spec = {"kind": "sized_files", "count": count, "size": size}
        return self._make(name, spec, lambda p: datagen.make_files(p, [size] * count, SEED + 20))

    def image_folder(self, name: str, count: int) -> str:
        """An ImageFolder tree of *count* files of 100-200 KiB in class directories."""
        spec = {"kind": "images", "count": count, "classes": datagen.IMAGE_CLASSES, "max": datagen.IMAGE_MAX}
        return self._make(name, spec, lambda p: datagen.make_image_folder(p, count))

    def safetensors_sized(self, name: str, nbytes: int) -> str:
        """A safetensors file of ~*nbytes* (the state dict layout of :meth:`safetensors`)."""
        spec = {"kind": "safetensors_sized", "bytes": nbytes}
        return self._make(name, spec, lambda p: make_safetensors(p, nbytes))

    def tree(self, name: str, dirs: int, files_per_dir: int) -> str:
        spec = {"kind": "tree", "dirs": dirs, "files": files_per_dir}
        return self._make(name, spec, lambda p: datagen.make_tree(p, dirs, files_per_dir))

    def sqlite(self, name: str, rows: int) -> str:
        spec = {"kind": "sqlite", "rows": rows, "row_bytes": datagen.SQLITE_ROW_BYTES}
        return self._make(name, spec, lambda p: datagen.make_sqlite(p, rows))

    def git_repo(self, name: str, commits: int, blob_bytes: int) -> str:
        spec = {"kind": "git", "commits": commits, "bytes": blob_bytes}
        return self._make(name, spec, lambda p: datagen.make_git_repo(p, commits, blob_bytes))

    def tar_shards(self, name: str, shards: int, shard_bytes: int) -> str:
        spec = {"kind": "tar", "shards": shards, "bytes": shard_bytes}
        return self._make(name, spec, lambda p: datagen.make_tar_shards(p, shards, shard_bytes))

    def numpy_copy(self, name: str = "pylib") -> str:
        import numpy

        spec = {"kind": "numpy", "version": numpy.__version__, "origin": datagen.numpy_origin()}
        return self._make(name, spec, datagen.make_numpy_copy)

    def torch_copy(self, name: str = "pylib-torch") -> str:
        import torch

        spec = {"kind": "torch_lib", "version": torch.__version__, "origin": datagen.numpy_origin()}
        return self._make(name, spec, datagen.make_torch_copy)

    def hf_safetensors(self, name: str = "hf-model.safetensors") -> str:
        n = self.big_bytes
        spec = {"kind": "hf_safetensors", "bytes": n, "hidden": datagen.HF_HIDDEN}
        return self._make(name, spec, lambda p: datagen.make_hf_safetensors(p, n))


# Dataset method that makes each kind of file (used to mirror a data set).
_MAKERS = {
    "npy": "npy",
    "raw": "raw",
    "small": "small_dir",
    "torch": "torch_state",
    "paddle": "paddle_state",
    "safetensors": "safetensors",
}


def make_npy(path: str, elements: int) -> None:
    import numpy as np

    rng = np.random.default_rng(SEED)
    arr = np.lib.format.open_memmap(path + ".tmp", mode="w+", dtype=np.float32, shape=(elements,))
    step = GEN_CHUNK // 4
    for start in range(0, elements, step):
        stop = min(elements, start + step)
        arr[start:stop] = rng.random(stop - start, dtype=np.float32)
    arr.flush()
    del arr
    os.replace(path + ".tmp", path)


def make_raw(path: str, nbytes: int) -> None:
    import numpy as np

    rng = np.random.default_rng(SEED + 1)
    with open(path + ".tmp", "wb") as f:
        for start in range(0, nbytes, GEN_CHUNK):
            f.write(rng.bytes(min(GEN_CHUNK, nbytes - start)))
    os.replace(path + ".tmp", path)


def make_small_files(path: str, count: int, size: int) -> None:
    import numpy as np

    rng = np.random.default_rng(SEED + 2)
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    blob = rng.bytes(count * size)
    for i in range(count):
        with open(os.path.join(tmp, f"{i:06d}.bin"), "wb") as f:
            f.write(blob[i * size : (i + 1) * size])
    os.replace(tmp, path)


def _layer_shapes(nbytes: int) -> list[tuple[str, int]]:
    """(name, float32 elements) of a state dict of ~nbytes: big weights each followed by a small bias."""
    out = []
    layers = max(1, nbytes // (TENSOR_BYTES + SMALL_TENSOR_BYTES))
    weight = min(TENSOR_BYTES, nbytes) // 4
    for i in range(layers):
        out.append((f"layers.{i}.weight", weight))
        out.append((f"layers.{i}.bias", SMALL_TENSOR_BYTES // 4))
    return out


def make_torch_state(path: str, nbytes: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(SEED)
    state = {name: torch.rand(n, generator=gen) for name, n in _layer_shapes(nbytes)}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def make_safetensors(path: str, nbytes: int) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(SEED + 3)
    state = {name: torch.rand(n, generator=gen) for name, n in _layer_shapes(nbytes)}
    save_file(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def make_paddle_state(path: str, nbytes: int) -> None:
    # paddle is imported in a child process: its import is slow and leaves threads behind.
    code = (
        "import sys, numpy as np, paddle\n"
        "rng = np.random.default_rng(int(sys.argv[3]))\n"
        "shapes = [(n, int(k)) for n, k in (s.split('=') for s in sys.argv[2].split(','))]\n"
        "state = {n: paddle.to_tensor(rng.random(k, dtype=np.float32)) for n, k in shapes}\n"
        "paddle.save(state, sys.argv[1])\n"
    )
    shapes = ",".join(f"{n}={k}" for n, k in _layer_shapes(nbytes))
    subprocess.run(
        [sys.executable, "-c", code, path + ".tmp", shapes, str(SEED + 4)],
        check=True,
        timeout=3600,
        capture_output=True,
    )
    os.replace(path + ".tmp", path)


def copy_tree(src: str, dst: str) -> None:
    """Copy a file or directory (used to place disk data sets next to RAM ones)."""
    if os.path.isdir(src):
        shutil.copytree(src, dst + ".tmp", dirs_exist_ok=True)
    else:
        shutil.copyfile(src, dst + ".tmp")
    os.replace(dst + ".tmp", dst)
