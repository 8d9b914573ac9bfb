"""Per-operation loops: the cost of one open, one small-file read, one 4 KiB READ, one stream.

These are the client side of the request-cost benchmarks (``bench_floor.py``, ``bench_requests.py``,
``bench_served.py``). They call ``os`` directly (no buffered file objects) so the client's own Python
cost stays small and identical for every contender; the same loop on tmpfs directly is the floor.
Each returns the seconds it took (or GB/s for a stream); the caller divides by its count.
"""

from __future__ import annotations

import mmap
import os
import random
import time
from collections.abc import Sequence

from .units import KIB, MIB, SEED

# Bytes asked by one read of a small file: one page, so a file of up to 4 KiB is read in one call.
SMALL_READ = 4 * KIB
# Size of a point read (one page).
PAGE = 4 * KIB
# Read size of the stream: what a typical loader asks for.
STREAM_CHUNK = 1 * MIB


def open_close(path: str, count: int) -> float:
    """Seconds of *count* ``os.open`` + ``os.close`` of *path*."""
    t0 = time.perf_counter()
    for _ in range(count):
        os.close(os.open(path, os.O_RDONLY))
    return time.perf_counter() - t0


def open_read_close(paths: Sequence[str]) -> float:
    """Seconds of one pass over *paths*: open, one read of SMALL_READ bytes, close, each in order."""
    t0 = time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, SMALL_READ)
        os.close(fd)
    return time.perf_counter() - t0


def page_offsets(size: int, count: int, seed: int = SEED) -> list[int]:
    """*count* distinct page-aligned offsets in a file of *size* bytes, in random order."""
    pages = size // PAGE
    if count > pages:
        raise ValueError(f"{count} distinct pages asked of a file of {pages}")
    return [p * PAGE for p in random.Random(seed).sample(range(pages), count)]


def preads(path: str, offsets: Sequence[int], direct: bool = False, advice_random: bool = False) -> float:
    """Seconds of one PAGE-sized ``preadv`` at each offset of *path*.

    direct: through an ``O_DIRECT`` descriptor (each read reaches the filesystem, cached or not);
    advice_random: ``POSIX_FADV_RANDOM`` first, so a read of a page not in the page cache asks the
    filesystem for that page only (no kernel read-ahead around it).
    """
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    buf = mmap.mmap(-1, PAGE)  # page-aligned, as O_DIRECT needs
    try:
        if advice_random:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        t0 = time.perf_counter()
        for offset in offsets:
            os.preadv(fd, [buf], offset)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        buf.close()


def forget_pages(path: str) -> None:
    """Drop *path*'s clean pages from the page cache (``POSIX_FADV_DONTNEED``): its next read reaches the
    filesystem again, without ``drop_caches`` (which empties every other process's cache too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def stream_gbps(path: str, view: memoryview) -> float:
    """GB/s (10**9 B) of one pass of ``readv(len(view))`` over *path* from its start to EOF."""
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter()
        total = 0
        while n := os.readv(fd, [view]):
            total += n
        return total / (time.perf_counter() - t0) / 1e9
    finally:
        os.close(fd)
