"""Generators of the data the matrix workloads read: a SQLite database, a git repository, tar shards,
a directory tree, a copy of numpy, a Hugging Face style safetensors checkpoint, sets of files.

Each ``make_*`` writes into a temporary name and renames it into place (an interrupted generation
never looks finished), and derives every byte from :data:`~.units.SEED`, so two runs on two
machines read the same data. :class:`~.datasets.Dataset` decides names and sizes from the scale.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import sqlite3
import subprocess
import tarfile

from .units import KIB, MIB, SEED

# Rows of the SQLite table per call of executemany (bounds generation memory).
SQLITE_BATCH = 50_000
# Bytes of one row's payload: a few rows per 4 KiB page, like a key-value or metadata table.
SQLITE_ROW_BYTES = 200
# Text lines appended to the repository's changelog per commit (gives `git log --stat` text diffs).
GIT_LINES_PER_COMMIT = 20
# Samples of one tar shard: an "image" of IMAGE_MIN..IMAGE_MAX bytes plus a label, WebDataset style.
TAR_IMAGE_MIN = 48 * KIB
TAR_IMAGE_MAX = 160 * KIB
# Tree walk files: sizes drawn uniformly from this range.
TREE_FILE_MIN = 4 * KIB
TREE_FILE_MAX = 64 * KIB
# Hidden size of the Hugging Face style checkpoint (a llama-like layer: 4 square attention matrices,
# 3 MLP matrices of HF_MLP_FACTOR x the hidden size, 2 norms).
HF_HIDDEN = 512
HF_MLP_FACTOR = 2
# Image folder (ImageFolder layout: one directory per class): file sizes drawn uniformly from this
# range (JPEGs of a 224-px crop data set), spread over this many classes.
IMAGE_MIN = 100 * KIB
IMAGE_MAX = 200 * KIB
IMAGE_CLASSES = 10
# Directory names copied for the numpy package: the package and the wheel's bundled libraries.
NUMPY_DIRS = ("numpy", "numpy.libs")
# What `import torch` loads from site-packages besides numpy (a virtual environment on the mount):
# torch's own packages and the dependencies it imports at once.
TORCH_DIRS = ("torch", "torchgen", "opt_einsum", "tqdm", "certifi", "filelock", "sympy", "mpmath", "networkx")
TORCH_FILES = ("typing_extensions.py",)


def _fresh(tmp: str) -> None:
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    elif os.path.exists(tmp):
        os.unlink(tmp)


def make_files(path: str, sizes: list[int], seed: int) -> None:
    """A directory of files ``000000.bin``... of the given sizes, random bytes."""
    rng = random.Random(seed)
    tmp = path + ".tmp"
    _fresh(tmp)
    os.makedirs(tmp)
    for i, size in enumerate(sizes):
        with open(os.path.join(tmp, f"{i:06d}.bin"), "wb") as f:
            f.write(rng.randbytes(size))
    os.replace(tmp, path)


def make_large_files(path: str, count: int, nbytes: int) -> None:
    """A directory of *count* files of *nbytes* random bytes each (written in 64 MiB pieces)."""
    import numpy as np

    tmp = path + ".tmp"
    _fresh(tmp)
    os.makedirs(tmp)
    for i in range(count):
        rng = np.random.default_rng(SEED + 100 + i)
        with open(os.path.join(tmp, f"part-{i}.bin"), "wb") as f:
            for start in range(0, nbytes, 64 * MIB):
                f.write(rng.bytes(min(64 * MIB, nbytes - start)))
    os.replace(tmp, path)


def make_tree(path: str, dirs: int, files_per_dir: int) -> None:
    """*dirs* directories of *files_per_dir* files of TREE_FILE_MIN..TREE_FILE_MAX bytes."""
    rng = random.Random(SEED + 10)
    tmp = path + ".tmp"
    _fresh(tmp)
    for d in range(dirs):
        sub = os.path.join(tmp, f"d{d:02d}")
        os.makedirs(sub)
        for i in range(files_per_dir):
            with open(os.path.join(sub, f"f{i:04d}.dat"), "wb") as f:
                f.write(rng.randbytes(rng.randint(TREE_FILE_MIN, TREE_FILE_MAX)))
    os.replace(tmp, path)


def make_image_folder(path: str, count: int, classes: int = IMAGE_CLASSES) -> None:
    """*count* "images" (random bytes, IMAGE_MIN..IMAGE_MAX, ``.jpg``) dealt round-robin into
    *classes* class directories ``class_NN/`` (torchvision's ImageFolder layout)."""
    rng = random.Random(SEED + 15)
    tmp = path + ".tmp"
    _fresh(tmp)
    for c in range(classes):
        os.makedirs(os.path.join(tmp, f"class_{c:02d}"))
    for i in range(count):
        name = os.path.join(tmp, f"class_{i % classes:02d}", f"img_{i:06d}.jpg")
        with open(name, "wb") as f:
            f.write(rng.randbytes(rng.randint(IMAGE_MIN, IMAGE_MAX)))
    os.replace(tmp, path)


def make_sqlite(path: str, rows: int) -> None:
    """A table ``kv(k INTEGER PRIMARY KEY, v BLOB)`` of *rows* rows of SQLITE_ROW_BYTES random bytes."""
    rng = random.Random(SEED + 11)
    tmp = path + ".tmp"
    _fresh(tmp)
    con = sqlite3.connect(tmp)
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        for start in range(0, rows, SQLITE_BATCH):
            batch = [(k, rng.randbytes(SQLITE_ROW_BYTES)) for k in range(start, min(rows, start + SQLITE_BATCH))]
            con.executemany("INSERT INTO kv VALUES (?, ?)", batch)
        con.commit()
    finally:
        con.close()
    os.replace(tmp, path)


def make_git_repo(path: str, commits: int, blob_bytes: int) -> None:
    """A bare repository of *commits* commits with ~*blob_bytes* of incompressible blobs in one pack.

    Every commit adds one binary file (random bytes: no delta, no compression, so the pack is about
    *blob_bytes*) and appends lines to a text changelog (small deltas, real ``--stat`` lines).
    Written with ``git fast-import``, which produces the pack directly.
    """
    rng = random.Random(SEED + 12)
    tmp = path + ".tmp"
    _fresh(tmp)
    env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", HOME=os.path.dirname(path))
    subprocess.run(["git", "init", "-q", "--bare", tmp], check=True, env=env, capture_output=True)
    per_blob = max(1, blob_bytes // commits)
    stream = io.BytesIO()
    changelog: list[str] = []
    for c in range(commits):
        changelog += [f"commit {c} line {i} {rng.getrandbits(64):016x}" for i in range(GIT_LINES_PER_COMMIT)]
        text = ("\n".join(changelog) + "\n").encode()
        blob = rng.randbytes(per_blob)
        msg = f"commit {c}\n".encode()
        stream.write(b"commit refs/heads/main\n")
        stream.write(f"committer Bench <bench@example.invalid> {1_700_000_000 + c * 60} +0000\n".encode())
        stream.write(b"data %d\n%s\n" % (len(msg), msg))
        stream.write(b"M 100644 inline CHANGES.txt\ndata %d\n%s\n" % (len(text), text))
        stream.write(b"M 100644 inline data/blob-%05d.bin\ndata %d\n%s\n" % (c, len(blob), blob))
    subprocess.run(
        ["git", "--git-dir", tmp, "fast-import", "--quiet"],
        input=stream.getvalue(),
        check=True,
        env=env,
        capture_output=True,
    )
    subprocess.run(["git", "--git-dir", tmp, "symbolic-ref", "HEAD", "refs/heads/main"], check=True, env=env)
    os.replace(tmp, path)


def make_tar_shards(path: str, shards: int, shard_bytes: int) -> None:
    """*shards* tar files ``shard-NNNN.tar`` of ~*shard_bytes* each: samples ``KEY.jpg`` + ``KEY.cls``."""
    rng = random.Random(SEED + 13)
    tmp = path + ".tmp"
    _fresh(tmp)
    os.makedirs(tmp)
    key = 0
    for s in range(shards):
        with tarfile.open(os.path.join(tmp, f"shard-{s:04d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tar:
            written = 0
            while written < shard_bytes:
                image = rng.randbytes(rng.randint(TAR_IMAGE_MIN, TAR_IMAGE_MAX))
                label = str(rng.randrange(1000)).encode()
                for suffix, data in ((".jpg", image), (".cls", label)):
                    info = tarfile.TarInfo(f"{key:08d}{suffix}")
                    info.size = len(data)
                    info.mtime = 1_700_000_000
                    tar.addfile(info, io.BytesIO(data))
                written += len(image) + len(label) + 3 * 512
                key += 1
    os.replace(tmp, path)


def numpy_origin() -> str:
    """The site-packages directory the running interpreter imports numpy from."""
    import numpy

    return os.path.dirname(os.path.dirname(numpy.__file__))


def make_numpy_copy(path: str) -> None:
    """A copy of the installed numpy (with its compiled bytecode and bundled libraries) under *path*."""
    _copy_packages(path, NUMPY_DIRS)


def make_torch_copy(path: str) -> None:
    """A copy of the installed torch and what ``import torch`` loads with it (numpy too) under *path*."""
    _copy_packages(path, NUMPY_DIRS + TORCH_DIRS, TORCH_FILES)


def _copy_packages(path: str, dirs: tuple[str, ...], files: tuple[str, ...] = ()) -> None:
    """Copies of the site-packages directories *dirs* and files *files* (those installed) under *path*."""
    origin = numpy_origin()
    tmp = path + ".tmp"
    _fresh(tmp)
    os.makedirs(tmp)
    for name in dirs:
        src = os.path.join(origin, name)
        if os.path.isdir(src):
            # copy2 keeps mtimes, so the copied __pycache__ stays valid for the copied sources
            shutil.copytree(src, os.path.join(tmp, name), symlinks=True, copy_function=shutil.copy2)
    for name in files:
        src = os.path.join(origin, name)
        if os.path.isfile(src):
            shutil.copy2(src, os.path.join(tmp, name))
    os.replace(tmp, path)


def hf_layer_shapes(nbytes: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of a llama-like float32 checkpoint of ~*nbytes*, in the model's order.

    Model order (embeddings, then per layer attention, MLP, norms; final norm, head) is what a
    model's ``state_dict()`` lists; the file stores tensors sorted by name, so ``layers.10`` comes
    before ``layers.2`` and ``lm_head`` first: reading in model order jumps back and forth.
    """
    h, m = HF_HIDDEN, HF_HIDDEN * HF_MLP_FACTOR
    vocab = 4 * h
    per_layer = (4 * h * h + 3 * h * m + 2 * h) * 4
    fixed = (2 * vocab * h + h) * 4
    layers = max(3, (nbytes - fixed) // per_layer)
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + f"self_attn.{x}_proj.weight", (h, h)) for x in "qkvo"]
        out += [(p + "mlp.gate_proj.weight", (m, h)), (p + "mlp.up_proj.weight", (m, h))]
        out += [(p + "mlp.down_proj.weight", (h, m))]
        out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return out


def make_hf_safetensors(path: str, nbytes: int) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(SEED + 14)
    state = {name: torch.rand(shape, generator=gen) for name, shape in hf_layer_shapes(nbytes)}
    save_file(state, path + ".tmp", metadata={"format": "pt"})
    os.replace(path + ".tmp", path)
