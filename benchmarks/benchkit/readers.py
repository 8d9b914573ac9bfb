"""In-process workloads: functions of paths, so the same reader runs on every contender.

Each takes the path(s) it reads (under the contender's root) and returns something derived from
every byte it read, so nothing is optimised away. ``parallel_*`` are the in-process upper bounds.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from .units import KIB, MIB, SEED

# Chunk of the plain sequential reader: what a typical loader asks for.
READ_CHUNK = 1 * MIB
# The in-process upper bound reader: 16 threads ...
BOUND_THREADS = 16
# ... each reading 8 MiB chunks with os.preadv.
BOUND_CHUNK = 8 * MIB
# Random-read workload: this many preads ...
RANDOM_COUNT = 2000
# ... of this size, at aligned random offsets.
RANDOM_SIZE = 4 * KIB


def read_seq(path: str, chunk: int = READ_CHUNK) -> int:
    """Plain sequential reader: readinto a reused buffer until EOF; returns bytes read."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                return total
            total += n


def np_load(path: str) -> int:
    import numpy as np

    return np.load(path).nbytes


def np_mmap_sum(path: str) -> float:
    import numpy as np

    arr = np.load(path, mmap_mode="r")
    return float(arr.sum(dtype=np.float64))


def torch_load(path: str, mmap: bool = False) -> int:
    import torch

    state = torch.load(path, mmap=mmap, weights_only=True)
    return len(state)


def torch_load_touch(path: str) -> float:
    """torch.load(mmap=True), then touch every tensor (sum) so every byte is read."""
    import torch

    state = torch.load(path, mmap=True, weights_only=True)
    return float(sum(float(t.sum()) for t in state.values()))


def paddle_load(path: str) -> int:
    import paddle

    return len(paddle.load(path))


def safetensors_load(path: str) -> int:
    """safetensors.torch.load_file alone: its tensors are mmap-backed, so this reads little but the header."""
    from safetensors.torch import load_file

    return len(load_file(path))


def safetensors_load_touch(path: str) -> float:
    """safetensors.torch.load_file, then touch every tensor (sum) so every byte is read."""
    from safetensors.torch import load_file

    return float(sum(float(t.sum()) for t in load_file(path).values()))


def small_file_list(directory: str, shuffled: bool, seed: int = SEED) -> list[str]:
    names = sorted(os.listdir(directory))
    if shuffled:
        random.Random(seed).shuffle(names)
    return [os.path.join(directory, n) for n in names]


def read_files(paths: Sequence[str]) -> int:
    """open / read / close each file in order (what a map-style data set does)."""
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            total += len(f.read())
    return total


def random_offsets(size: int, count: int = RANDOM_COUNT, block: int = RANDOM_SIZE, seed: int = SEED) -> list[int]:
    rng = random.Random(seed)
    blocks = max(1, size // block)
    return [rng.randrange(blocks) * block for _ in range(count)]


def random_preads(path: str, offsets: Sequence[int], size: int = RANDOM_SIZE) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(size)
        return sum(os.preadv(fd, [buf], off) for off in offsets)
    finally:
        os.close(fd)


def parallel_read(
    paths: Sequence[str], threads: int = BOUND_THREADS, chunk: int = BOUND_CHUNK, fd_per_thread: bool = True
) -> int:
    """The upper bound reader: *threads* threads of os.preadv over *chunk*-sized pieces of *paths*.

    With *fd_per_thread* each thread opens its own descriptor per file (one stream each on the
    emulator); otherwise all threads share one descriptor per file.
    """
    pieces = [
        (p, off, min(chunk, size - off))
        for p in paths
        for size in [os.path.getsize(p)]
        for off in range(0, size, chunk)
    ]
    local = threading.local()
    shared = {} if fd_per_thread else {p: os.open(p, os.O_RDONLY) for p in paths}

    def work(piece: tuple[str, int, int]) -> int:
        path, off, n = piece
        if fd_per_thread:
            fd = local.fds.get(path)
            if fd is None:
                fd = local.fds[path] = os.open(path, os.O_RDONLY)
        else:
            fd = shared[path]
        buf = getattr(local, "buf", None)
        if buf is None or len(buf) < n:
            buf = local.buf = bytearray(chunk)
        return os.preadv(fd, [memoryview(buf)[:n]], off)

    opened: list[dict[str, int]] = []

    def init() -> None:
        local.fds = {}
        opened.append(local.fds)

    try:
        with ThreadPoolExecutor(threads, initializer=init) as ex:
            return sum(ex.map(work, pieces))
    finally:
        for fds in opened:
            for fd in fds.values():
                os.close(fd)
        for fd in shared.values():
            os.close(fd)


def parallel_files(paths: Sequence[str], threads: int = BOUND_THREADS) -> int:
    """The upper bound of a small-file scan: *threads* threads each doing open / read / close."""
    with ThreadPoolExecutor(threads) as ex:
        return sum(ex.map(lambda p: read_files([p]), paths, chunksize=16))


def parallel_preads(path: str, offsets: Sequence[int], threads: int = BOUND_THREADS, size: int = RANDOM_SIZE) -> int:
    """The same random preads issued from *threads* threads (one descriptor each)."""
    parts = [offsets[i::threads] for i in range(threads)]
    with ThreadPoolExecutor(threads) as ex:
        return sum(ex.map(lambda offs: random_preads(path, offs, size), parts))


def file_bytes(paths: Iterable[str]) -> int:
    total = 0
    for p in paths:
        if os.path.isdir(p):
            total += sum(os.path.getsize(os.path.join(p, n)) for n in os.listdir(p))
        else:
            total += os.path.getsize(p)
    return total


def random_readers(path: str, readers: int, count: int, size: int, seed: int = SEED) -> int:
    """*readers* threads, each on its own descriptor, each doing *count* preads of *size* at random aligned offsets."""
    total = os.path.getsize(path)

    def one(k: int) -> int:
        return random_preads(path, random_offsets(total, count, size, seed + k), size)

    with ThreadPoolExecutor(readers) as ex:
        return sum(ex.map(one, range(readers)))


def tree_walk(top: str) -> int:
    """``os.walk`` in listing order, reading every file whole (a backup, rsync or indexing pass)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        total += read_files([os.path.join(dirpath, n) for n in sorted(filenames)])
    return total


def safetensors_model_order(path: str, keys: Sequence[str]) -> int:
    """What transformers does: ``safe_open``, then ``get_tensor`` for each key in the model's order,
    each copied into the model's parameter (``load_state_dict``'s ``param.copy_``). ``get_tensor``
    alone returns a view of the file's mapping and reads almost nothing; the copy reads the tensor."""
    import torch
    from safetensors import safe_open

    nbytes = 0
    with safe_open(path, framework="pt") as f:
        for key in keys:
            t = f.get_tensor(key)
            param = torch.empty_like(t)
            param.copy_(t)
            nbytes += param.numel() * param.element_size()
    return nbytes


def safetensors_layers_half(path: str, keys: Sequence[str]) -> int:
    """transformers-style lazy load of half the model: ``safe_open``, then ``get_tensor`` + copy of
    the keys given (the caller passes the first half of the layers, in model order), as a pipeline
    stage or a partial load (``device_map``) reads them."""
    return safetensors_model_order(path, keys)
