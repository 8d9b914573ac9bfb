"""Disk cache tier store (fsio/disk/store.py) vs the disk's own speed, in process, no FUSE.

What it answers: how fast does the store write what the engine hands it, and serve it back,
compared with plain reads and writes of a file on the same filesystem? Workloads:

* ``large``: one file of ``--size`` MiB as 4 MiB blocks (an engine's block size).
  - write: ``put`` of every block + ``flush`` (CRCs, ``pwritev`` of the view, journal) vs plain
    4 MiB ``pwrite`` of the same bytes; "synced" adds ``fdatasync`` of the written file(s) to both.
  - read hot, CRC-checked: ``read_into`` of every 4 MiB block before the file was verified whole
    (every chunk's CRC-32 compared) vs plain 1 MiB ``preadv`` of the plain file, both in the page cache.
  - read cold: the files' pages dropped (``POSIX_FADV_DONTNEED`` after ``fdatasync``, so only these
    files leave the page cache, not the shared machine's): ``read_into`` of every 4 MiB block of the
    verified file (trusted while its identity is unchanged) vs the plain reads; and ``complete_fd``
    then 1 MiB reads of that descriptor (what FUSE passthrough would read).
  - read hot: the same with the pages in the page cache.
* ``small``: ``--files`` files of 3,073 bytes: ``put`` + ``flush`` vs open/write/close of plain
  files; ``read_into`` of each vs open/read/close, hot.

Medians of ``--runs`` runs. ``ratio = plain time / store time``: 1.00x = as fast as the disk itself.
Small sizes by default (the machine is shared): ``python benchmarks/bench_diskcache.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.report import fmt_mbps, fmt_s, fmt_x, median, print_table, ratio  # noqa: E402

from fastfs.fsio.disk.directory import DATA  # noqa: E402
from fastfs.fsio.disk.store import DiskStore  # noqa: E402

MIB = 1024 * 1024
# Engine block size: the unit the engine hands the store.
BLOCK = 4 * MIB
# Plain reader's request size: what a typical loader (and the kernel with read_ahead_kb=1024) asks for.
READ = 1 * MIB
# Size of each small file: just over 3 KiB, like benchmarks/common.py SMALL_SIZE.
SMALL_SIZE = 3073


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _data_files(store: DiskStore) -> list[str]:
    root = os.path.join(store.path, DATA)
    return [os.path.join(d, f) for d, _s, fs in os.walk(root) for f in fs]


def _plain_write(path: str, data: bytes, sync: bool) -> None:
    if os.path.exists(path):
        os.unlink(path)  # a fresh file, like the store's (truncating an old one frees blocks on the clock)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        for off in range(0, len(data), BLOCK):
            os.pwrite(fd, view[off : off + BLOCK], off)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _plain_read(fd: int, size: int) -> None:
    buf = memoryview(bytearray(READ))
    for off in range(0, size, READ):
        os.preadv(fd, [buf], off)


def _plain_read_path(path: str, size: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _plain_read(fd, size)
    finally:
        os.close(fd)


def _store_write(store: DiskStore, key: tuple, data: bytes, sync: bool) -> None:
    view = memoryview(data)
    for off in range(0, len(data), BLOCK):
        while not store.put(key, len(data), off, view[off : off + BLOCK], lambda: None):
            time.sleep(0.0005)  # queue full: a real engine would drop it; here every block must land
    store.flush()
    if sync:
        for path in _data_files(store):
            fd = os.open(path, os.O_RDONLY)
            os.fdatasync(fd)
            os.close(fd)


def _store_read(store: DiskStore, key: tuple, size: int) -> None:
    buf = memoryview(bytearray(BLOCK))
    for off in range(0, size, BLOCK):
        if store.read_into(key, off, buf) is None:
            raise RuntimeError(f"block at {off} not served")


def large(root: str, size: int, runs: int) -> None:
    data = os.urandom(size)
    key = (1, 2, size, 3, 4)
    plain = os.path.join(root, "plain.bin")
    rows = []
    for sync in (False, True):
        t_plain, t_store = [], []
        for _ in range(runs):
            t_plain.append(_timed(lambda s=sync: _plain_write(plain, data, s)))
            cdir = os.path.join(root, "cache-w")
            store = DiskStore(cdir, budget_bytes=4 * size, floor_bytes=0)
            try:
                t_store.append(_timed(lambda st=store, s=sync: _store_write(st, key, data, s)))
            finally:
                store.close()
                shutil.rmtree(cdir)
        tp, ts = median(t_plain), median(t_store)
        rows.append(
            [
                f"write {'synced' if sync else 'to page cache'}",
                fmt_s(tp),
                fmt_s(ts),
                fmt_mbps(size, tp),
                fmt_mbps(size, ts),
                fmt_x(ratio(tp, ts)),
            ]
        )
    cdir = os.path.join(root, "cache-r")
    store = DiskStore(cdir, budget_bytes=4 * size, floor_bytes=0)
    try:
        _store_write(store, key, data, True)
        _plain_write(plain, data, True)
        t_plain = [_timed(lambda: _plain_read_path(plain, size)) for _ in range(runs)]
        t_store = [_timed(lambda: _store_read(store, key, size)) for _ in range(runs)]
        tp, ts = median(t_plain), median(t_store)
        rows.append(
            [
                "read hot: read_into 4M, CRC-checked",
                fmt_s(tp),
                fmt_s(ts),
                fmt_mbps(size, tp),
                fmt_mbps(size, ts),
                fmt_x(ratio(tp, ts)),
            ]
        )
        store.complete_fd(key)  # queue the whole-file verification: later reads are trusted
        store.flush()
        cfd = store.complete_fd(key)
        assert cfd is not None
        pfd = os.open(plain, os.O_RDONLY)
        try:
            for cold in (True, False):
                t_plain, t_store, t_fd = [], [], []
                for _ in range(runs):
                    for fn, out in (
                        (lambda: _plain_read(pfd, size), t_plain),
                        (lambda: _store_read(store, key, size), t_store),
                        (lambda: _plain_read(cfd, size), t_fd),
                    ):
                        for path in [plain, *_data_files(store)] if cold else ():
                            _drop(path)
                        out.append(_timed(fn))
                tp, ts, tf = median(t_plain), median(t_store), median(t_fd)
                label = "cold" if cold else "hot"
                rows.append(
                    [
                        f"read {label}: read_into 4M, verified",
                        fmt_s(tp),
                        fmt_s(ts),
                        fmt_mbps(size, tp),
                        fmt_mbps(size, ts),
                        fmt_x(ratio(tp, ts)),
                    ]
                )
                rows.append(
                    [
                        f"read {label}: complete_fd 1M",
                        fmt_s(tp),
                        fmt_s(tf),
                        fmt_mbps(size, tp),
                        fmt_mbps(size, tf),
                        fmt_x(ratio(tp, tf)),
                    ]
                )
        finally:
            os.close(pfd)
            os.close(cfd)
    finally:
        store.close()
        shutil.rmtree(cdir)
        os.unlink(plain)
    print_table(
        f"large file: {size // MIB} MiB, 4 MiB blocks (medians of {runs})",
        ["workload", "plain s", "store s", "plain MB/s", "store MB/s", "ratio"],
        rows,
        ["ratio = plain time / store time (1.00x = the disk's own speed)"],
    )


def small(root: str, count: int, runs: int) -> None:
    files = [os.urandom(SMALL_SIZE) for _ in range(count)]
    keys = [(1, 100 + i, SMALL_SIZE, 3, 4) for i in range(count)]
    pdir = os.path.join(root, "plain-small")
    rows = []
    t_plain, t_store = [], []
    for _ in range(runs):
        os.makedirs(pdir, exist_ok=True)

        def plain_write() -> None:
            for i, data in enumerate(files):
                fd = os.open(os.path.join(pdir, f"{i:06d}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.write(fd, data)
                os.close(fd)

        t_plain.append(_timed(plain_write))
        cdir = os.path.join(root, "cache-s")
        store = DiskStore(cdir, budget_bytes=1 << 30, floor_bytes=0)

        def store_write(st=store) -> None:
            for key, data in zip(keys, files, strict=True):
                while not st.put(key, SMALL_SIZE, 0, memoryview(data), lambda: None):
                    time.sleep(0.0005)
            st.flush()

        try:
            t_store.append(_timed(store_write))
        finally:
            store.close()
            shutil.rmtree(cdir)
        shutil.rmtree(pdir)
    tp, ts = median(t_plain), median(t_store)
    rows.append(["write", fmt_s(tp), fmt_s(ts), f"{count / tp:.0f}", f"{count / ts:.0f}", fmt_x(ratio(tp, ts))])
    os.makedirs(pdir, exist_ok=True)
    cdir = os.path.join(root, "cache-s")
    store = DiskStore(cdir, budget_bytes=1 << 30, floor_bytes=0)
    try:
        for i, (key, data) in enumerate(zip(keys, files, strict=True)):
            with open(os.path.join(pdir, f"{i:06d}"), "wb") as f:
                f.write(data)
            while not store.put(key, SMALL_SIZE, 0, memoryview(data), lambda: None):
                time.sleep(0.0005)
        store.flush()
        buf = memoryview(bytearray(64 * 1024))

        def plain_read() -> None:
            for i in range(count):
                fd = os.open(os.path.join(pdir, f"{i:06d}"), os.O_RDONLY)
                os.readv(fd, [buf])
                os.close(fd)

        def store_read() -> None:
            for key in keys:
                if store.read_into(key, 0, buf) is None:
                    raise RuntimeError("small file not served")

        t_plain = [_timed(plain_read) for _ in range(runs)]
        t_store = [_timed(store_read) for _ in range(runs)]
        tp, ts = median(t_plain), median(t_store)
        rows.append(["read hot", fmt_s(tp), fmt_s(ts), f"{count / tp:.0f}", f"{count / ts:.0f}", fmt_x(ratio(tp, ts))])
    finally:
        store.close()
        shutil.rmtree(cdir)
        shutil.rmtree(pdir)
    print_table(
        f"small files: {count} x {SMALL_SIZE} bytes (medians of {runs})",
        ["workload", "plain s", "store s", "plain files/s", "store files/s", "ratio"],
        rows,
        ["ratio = plain time / store time"],
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="/var/tmp", help="filesystem to measure (a temporary directory is made in it)")
    p.add_argument("--size", type=int, default=256, help="MiB of the large file")
    p.add_argument("--files", type=int, default=2000, help="number of small files")
    p.add_argument("--runs", type=int, default=3, help="timed runs per cell (median reported)")
    p.add_argument("--only", default="large,small", help="comma-separated workloads: large, small")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="fastfs-bench-disk-", dir=args.dir)
    try:
        only = set(args.only.split(","))
        if "large" in only:
            large(root, args.size * MIB, args.runs)
        if "small" in only:
            small(root, args.files, args.runs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
