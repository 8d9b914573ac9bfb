"""The disk cache tier store (fsio/disk/store.py) killed with SIGKILL while it writes, without FUSE.

A writer runs in a subprocess (this file run as a script: ``python tests/engine/test_diskcache_crash.py
child DIR SEED``) and is killed while it writes (a small budget: evictions; frequent maintenance:
compactions); the directory is reopened and read every way, and no wrong byte may ever be served.
Moved out of tests/unit (the pure tests, seconds) because it runs for many seconds with processes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from fastfs.fsio.disk import directory as diskdir
from fastfs.fsio.disk import index as diskindex
from fastfs.fsio.disk import space as diskspace
from fastfs.fsio.disk import store as diskcache
from fastfs.fsio.disk.index import CHUNK
from fastfs.fsio.disk.store import DiskStore

KIB = 1024
MIB = 1024 * KIB
BLOCK = 4 * MIB


def content(name: str, size: int) -> bytes:
    """Deterministic, position-dependent bytes of one file version (as tests/unit/test_diskcache.py)."""
    return random.Random(name).randbytes(size)


def make_key(i: int, size: int, version: int = 0) -> tuple:
    return (42, 1000 + i, size, 1_700_000_000_000_000_000 + version, 7)


# == crashes ===================================================================================================
CRASH_FILES = 24
CRASH_BUDGET = 20 * MIB


def crash_files(seed: int) -> list[tuple[tuple, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(CRASH_FILES):
        size = rng.choice([1, 3073, CHUNK, 200 * KIB, 1 * MIB + 7, 3 * MIB, 5 * MIB + 1])
        for version in range(2):
            out.append((make_key(i, size, version), content(f"crash{seed}:{i}:{version}", size)))
    return out


def child(directory: str, seed: int) -> None:
    """Write continuously (small budget: evictions; frequent maintenance: compactions) until killed."""
    diskspace.SPACE_CHECK_INTERVAL = 0.02
    diskindex.COMPACT_MIN = 16 * KIB
    store = DiskStore(directory, budget_bytes=CRASH_BUDGET, queue_bytes=16 * MIB)
    files = crash_files(seed)
    rng = random.Random(os.getpid())
    print("ready", flush=True)
    while True:
        key, data = rng.choice(files)
        block = rng.choice([CHUNK, 1 * MIB, BLOCK])
        view = memoryview(data)
        offsets = list(range(0, len(data), block))
        rng.shuffle(offsets)
        for off in offsets:
            while not store.put(key, len(data), off, view[off : off + block], lambda: None):
                if store.holds(key, off, block):
                    break
                time.sleep(0.0005)
        if rng.random() < 0.2:
            buf = bytearray(block)
            n = store.read_into(key, 0, memoryview(buf))
            assert n is None or bytes(buf[:n]) == data[:n]
            store.complete_fd(key)


def check_everything(directory: str, seed: int) -> int:
    """Open the directory and read every file every way: any byte served must be right. Returns bytes served."""
    served = 0
    store = DiskStore(directory, budget_bytes=CRASH_BUDGET)
    try:
        files = crash_files(seed)
        for key, data in files:
            for block in (CHUNK, BLOCK):
                for off in range(0, len(data), block):
                    buf = bytearray(block)
                    n = store.read_into(key, off, memoryview(buf))
                    if n is not None:
                        assert n == min(block, len(data) - off)
                        assert bytes(buf[:n]) == data[off : off + n], (key, off, block)
                        served += n
            store.complete_fd(key)
        assert store.flush(60)
        for key, data in files:
            fd = store.complete_fd(key)
            if fd is not None:
                try:
                    assert os.pread(fd, len(data) + 1, 0) == data, key
                    served += len(data)
                finally:
                    os.close(fd)
        assert store.stats()[diskcache.USE] <= CRASH_BUDGET
    finally:
        store.close()
    return served


def test_kill9_during_heavy_writes_never_serves_a_wrong_byte(tmp_path):
    directory = str(tmp_path / "c")
    env = dict(os.environ)
    rng = random.Random(11)
    served = 0
    for _ in range(6):
        proc = subprocess.Popen(
            [sys.executable, __file__, "child", directory, "5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        try:
            assert proc.stdout.readline().strip() == b"ready", proc.stderr.read().decode()
            time.sleep(rng.uniform(0.2, 1.2))
            assert proc.poll() is None, proc.stderr.read().decode()  # still writing when killed
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        served += check_everything(directory, 5)
        assert not os.path.exists(os.path.join(directory, diskdir.JOURNAL_NEW))
    assert served > 0


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "child":
    child(sys.argv[2], int(sys.argv[3]))
