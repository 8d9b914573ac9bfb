"""Workloads driven through real clients and child processes: fio, SQLite, git, a torch DataLoader,
a fresh interpreter importing numpy, WebDataset-style tar readers, parallel reader processes.

These are the programs nobody on the project wrote, run as a user would run them, so a benchmark
sees their real request pattern (SQLite's 4 KiB page reads, git's mmap of a pack, Python's stat
and open storm of an import, fio's exact offsets, DataLoader workers as separate processes).
Each function takes paths under a contender's root and raises when the client fails, so a failed
client shows up as a failed cell instead of a fast one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import urllib.parse
import warnings
from collections.abc import Sequence
from typing import Any

from .readers import READ_CHUNK
from .units import SEED

# Seconds allowed for one client child (fio, git, an interpreter, a reader process).
CHILD_TIMEOUT = 3600.0

# A reader child for the multi-process workloads: no heavy imports, one sequential pass.
READER_CODE = (
    "import sys\n"
    "buf = bytearray(int(sys.argv[2])); view = memoryview(buf)\n"
    "with open(sys.argv[1], 'rb', buffering=0) as f:\n"
    "    while f.readinto(view):\n"
    "        pass\n"
)


def _run(cmd: Sequence[str], **kw: Any) -> subprocess.CompletedProcess:
    """Run a client; a non-zero exit raises with the tail of its stderr."""
    res = subprocess.run(list(cmd), capture_output=True, timeout=CHILD_TIMEOUT, check=False, **kw)
    if res.returncode != 0:
        err = res.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"{os.path.basename(cmd[0])} exited {res.returncode}: {' | '.join(err[-3:])}")
    return res


def processes_read(paths: Sequence[str], chunk: int = READ_CHUNK) -> None:
    """One reader process per path, all started at once; returns when every one has finished."""
    procs = [subprocess.Popen([sys.executable, "-c", READER_CODE, p, str(chunk)]) for p in paths]
    failed = [p for p in procs if p.wait(timeout=CHILD_TIMEOUT) != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} reader process(es) failed")


# -- fio ----------------------------------------------------------------------------------------
def fio(path: str, rw: str, bs: str, jobs: int, number_ios: int | None = None, split: bool = False) -> int:
    """One fio run over *path* (read-only, psync, page cache used as a program would); returns bytes read.

    *split*: each job gets its own quarter of the file (``offset_increment``), else every job
    ranges over the whole file. *number_ios* bounds each job's requests (random jobs).
    """
    size = os.path.getsize(path)
    span = size // jobs if split else size
    cmd = [
        "fio",
        "--name=bench",
        f"--filename={path}",
        "--readonly",
        f"--rw={rw}",
        f"--bs={bs}",
        "--ioengine=psync",
        f"--numjobs={jobs}",
        f"--size={span}",
        "--invalidate=0",  # the harness dropped the page cache; fio must not fadvise on its own
        "--randrepeat=1",
        f"--randseed={SEED}",
        "--group_reporting",
        "--output-format=json",
    ]
    if split:
        cmd.append(f"--offset_increment={span}")
    if number_ios:
        cmd.append(f"--number_ios={number_ios}")
    out = json.loads(_run(cmd).stdout)
    job = out["jobs"][0]
    if job.get("error"):
        raise RuntimeError(f"fio job error {job['error']}")
    return int(job["read"]["io_bytes"])


# -- SQLite ---------------------------------------------------------------------------------------
def sqlite_keys(rows: int, count: int, seed: int = SEED) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(rows) for _ in range(count)]


def sqlite_lookups(path: str, keys: Sequence[int]) -> int:
    """Point lookups ``SELECT v FROM kv WHERE k=?`` on a read-only, immutable connection."""
    uri = f"file:{urllib.parse.quote(path)}?mode=ro&immutable=1"
    con = sqlite3.connect(uri, uri=True)
    try:
        total = 0
        for k in keys:
            row = con.execute("SELECT v FROM kv WHERE k = ?", (k,)).fetchone()
            if row is None:
                raise RuntimeError(f"key {k} missing")
            total += len(row[0])
        return total
    finally:
        con.close()


def sqlite_cli(path: str, keys: Sequence[int]) -> int:
    """The same lookups through Debian's ``sqlite3`` shell (its own SQLite build), one process."""
    script = "".join(f"SELECT length(v) FROM kv WHERE k = {int(k)};\n" for k in keys)
    uri = f"file:{urllib.parse.quote(path)}?mode=ro&immutable=1"
    out = _run(["sqlite3", "-batch", "-readonly", uri], input=script.encode()).stdout.split()
    if len(out) != len(keys):
        raise RuntimeError(f"sqlite3 answered {len(out)} of {len(keys)} lookups")
    return sum(int(v) for v in out)


# -- git ------------------------------------------------------------------------------------------
def git_fsck_log(git_dir: str) -> int:
    """``git fsck --full`` then ``git log --stat`` of a bare repository; returns the log's length."""
    home = tempfile.mkdtemp(prefix="bench-git-home.")
    env = dict(
        os.environ,
        HOME=home,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_OPTIONAL_LOCKS="0",
    )
    base = ["git", "-c", "safe.directory=*", "--git-dir", git_dir]
    try:
        _run([*base, "fsck", "--full", "--no-progress", "--no-dangling"], env=env)
        return len(_run([*base, "log", "--stat", "--no-color"], env=env).stdout)
    finally:
        shutil.rmtree(home, ignore_errors=True)


# -- a Python package imported from the mount ---------------------------------------------------------
IMPORT_CODE = (
    "import sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "import numpy, numpy.linalg, numpy.fft, numpy.random\n"
    "assert numpy.__file__.startswith(sys.argv[1]), numpy.__file__\n"
    "numpy.linalg.inv(numpy.eye(4)); numpy.fft.fft(numpy.ones(8)); numpy.random.default_rng(0).random(4)\n"
)


IMPORT_TORCH_CODE = (
    "import sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "import torch\n"
    "assert torch.__file__.startswith(sys.argv[1]), torch.__file__\n"
    "torch.ones(3).sum()\n"
)


def import_torch(lib_dir: str) -> None:
    """A fresh interpreter (isolated, no site-packages, no bytecode writes) importing torch from *lib_dir*:
    its shared libraries (libtorch_cpu.so: 434 MB in torch 2.13) are mapped and touched in short runs."""
    _run([sys.executable, "-I", "-S", "-B", "-c", IMPORT_TORCH_CODE, lib_dir])


def import_numpy(lib_dir: str) -> None:
    """A fresh interpreter (isolated, no site-packages, no bytecode writes) importing numpy from *lib_dir*."""
    _run([sys.executable, "-I", "-S", "-B", "-c", IMPORT_CODE, lib_dir])


# -- torch DataLoader -------------------------------------------------------------------------------
class FileSamples:
    """A map-style data set: item i is the bytes of file i (what an image data set's __getitem__ reads)."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        with open(self.paths[i], "rb") as f:
            return len(f.read())


class ImageFolderSamples:
    """What torchvision's ImageFolder does, without torchvision: classes are the sorted directories
    of *root*, samples the files below each (scanned once, in ``__init__``, as ImageFolder does);
    item i opens file i and reads it whole (the decode is left out: this measures the storage).
    Returns (bytes read, class index)."""

    def __init__(self, root: str) -> None:
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = [
            (os.path.join(root, c, n), i)
            for i, c in enumerate(self.classes)
            for n in sorted(os.listdir(os.path.join(root, c)))
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[int, int]:
        path, label = self.samples[i]
        with open(path, "rb") as f:
            return len(f.read()), label


def _sum_batch(batch: list[Any]) -> int:
    return sum(b[0] if isinstance(b, tuple) else b for b in batch)


def image_folder_epoch(root: str, workers: int = 4, batch_size: int = 32, seed: int = SEED) -> int:
    """One shuffled epoch of a torch DataLoader with *workers* processes over an ImageFolder tree."""
    import torch
    from torch.utils.data import DataLoader

    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    loader = DataLoader(
        ImageFolderSamples(root),
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=_sum_batch,
    )
    return sum(loader)


def dataloader_epoch(paths: Sequence[str], workers: int = 4, batch_size: int = 16, seed: int = SEED) -> int:
    """One shuffled epoch of a torch DataLoader with *workers* worker processes over *paths*."""
    import torch
    from torch.utils.data import DataLoader

    warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
    loader = DataLoader(
        FileSamples(paths),
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=_sum_batch,
    )
    return sum(loader)


# -- WebDataset-style tar shards ----------------------------------------------------------------------
TAR_CODE = (
    "import sys, tarfile\n"
    "total = 0\n"
    "for p in sys.argv[1:]:\n"
    "    with open(p, 'rb') as f, tarfile.open(fileobj=f, mode='r|*') as tar:\n"
    "        for m in tar:\n"
    "            if m.isfile():\n"
    "                total += len(tar.extractfile(m).read())\n"
    "print(total)\n"
)


def tar_readers(shards: Sequence[str], procs: int = 2) -> int:
    """*procs* processes, each streaming its share of the shards (``shards[i::procs]``) as WebDataset does."""
    children = [
        subprocess.Popen([sys.executable, "-c", TAR_CODE, *shards[i::procs]], stdout=subprocess.PIPE)
        for i in range(procs)
    ]
    total = 0
    for child in children:
        out, _ = child.communicate(timeout=CHILD_TIMEOUT)
        if child.returncode != 0:
            raise RuntimeError(f"tar reader exited {child.returncode}")
        total += int(out)
    return total
