"""The disk cache tier store (fsio/disk/store.py) without FUSE: bytes, restarts, damage, crashes, budgets.

Every test compares bytes served with the bytes that were put. The kill -9 test (a writer process
killed while it writes, seconds long) is in tests/engine/test_diskcache_crash.py.
"""

from __future__ import annotations

import os
import random
import shutil
import stat
import threading
import time
from array import array
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastfs.fsio.disk import directory as diskdir
from fastfs.fsio.disk import index as diskindex
from fastfs.fsio.disk import space as diskspace
from fastfs.fsio.disk import store as diskcache
from fastfs.fsio.disk.directory import DiskCacheError
from fastfs.fsio.disk.index import CHUNK
from fastfs.fsio.disk.reads import VERIFY_AT_OPEN_MIN
from fastfs.fsio.disk.store import DiskStore

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
BLOCK = 4 * MIB


def content(name: str, size: int) -> bytes:
    """Deterministic, position-dependent bytes of one file version (no two chunks alike)."""
    return random.Random(name).randbytes(size)


def make_key(i: int, size: int, version: int = 0) -> tuple:
    return (42, 1000 + i, size, 1_700_000_000_000_000_000 + version, 7)


def open_store(path, **kw) -> DiskStore:
    kw.setdefault("budget_bytes", 1 * GIB)
    return DiskStore(str(path), **kw)


def put_all(store: DiskStore, key: tuple, data: bytes, block: int = BLOCK, releases: list | None = None) -> int:
    """Put a whole file block by block; returns how many puts were taken."""
    taken = 0
    view = memoryview(data)
    for off in range(0, len(data), block):
        rel = releases.append if releases is not None else (lambda _o: None)
        if store.put(key, len(data), off, view[off : off + block], lambda o=off, r=rel: r(o)):
            taken += 1
    return taken


def read_all(store: DiskStore, key: tuple, size: int, block: int = BLOCK) -> bytes | None:
    out = bytearray()
    for off in range(0, size, block):
        buf = bytearray(block)
        n = store.read_into(key, off, memoryview(buf))
        if n is None:
            return None
        out += buf[:n]
    return bytes(out)


def data_path(store: DiskStore, key: tuple) -> str:
    entry = store.catalog.entries[key]
    return os.path.join(store.path, diskdir.DATA, diskdir.fanout_name(entry.id), diskdir.data_name(entry.id))


def tree_bytes(root: str) -> int:
    """Disk blocks the directory really uses (files and directories), like du."""
    total = os.lstat(root).st_blocks * 512
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


class FakeDisk:
    """An injectable statvfs: a filesystem of ``total`` bytes holding the cache directory's real
    blocks plus ``other`` bytes another program wrote."""

    def __init__(self, root: str, total: int, other: int = 0) -> None:
        self.root = root
        self.total = total
        self.other = other
        self.calls = 0

    def avail(self) -> int:
        used = tree_bytes(self.root) if os.path.isdir(self.root) else 0
        return max(0, self.total - self.other - used)

    def __call__(self, fd: int) -> SimpleNamespace:
        self.calls += 1
        return SimpleNamespace(f_bavail=self.avail(), f_frsize=1, f_blocks=self.total, f_bsize=4096)


# == bytes ==================================================================================================
SIZES = [1, 3073, CHUNK - 1, CHUNK, CHUNK + 1, 1 * MIB, 5 * MIB + 123, 9 * MIB]


@pytest.mark.parametrize("block", [CHUNK, 1 * MIB, BLOCK])
def test_reads_back_byte_exact(tmp_path, block):
    store = open_store(tmp_path / "c")
    try:
        files = {make_key(i, n): content(f"f{i}", n) for i, n in enumerate(SIZES)}
        for key, data in files.items():
            put_all(store, key, data, block)
        assert store.flush(30)
        for key, data in files.items():
            assert read_all(store, key, len(data), block) == data
            assert read_all(store, key, len(data), BLOCK) == data
        rng = random.Random(1)
        for key, data in files.items():
            for _ in range(20):  # unaligned ranges go through a scratch buffer
                off = rng.randrange(len(data))
                buf = bytearray(rng.randrange(1, 300 * KIB))
                n = store.read_into(key, off, memoryview(buf))
                assert n == min(len(buf), len(data) - off)
                assert bytes(buf[:n]) == data[off : off + n]
        stats = store.stats()
        assert stats[diskcache.WRITES] == sum(-(-len(d) // block) for d in files.values())
        assert stats[diskcache.BYTES_WRITTEN] == sum(len(d) for d in files.values())
        assert stats[diskcache.CORRUPT] == 0 and stats[diskcache.FILES] == len(files)
    finally:
        store.close()


def test_partly_cached_file_serves_only_what_it_holds(tmp_path):
    store = open_store(tmp_path / "c")
    try:
        data = content("big", 20 * MIB)
        key = make_key(1, len(data))
        view = memoryview(data)
        for off in (0, 8 * MIB, 16 * MIB):
            assert store.put(key, len(data), off, view[off : off + BLOCK], lambda: None)
        assert store.flush(30)
        for off in range(0, len(data), BLOCK):
            buf = bytearray(BLOCK)
            n = store.read_into(key, off, memoryview(buf))
            if off in (0, 8 * MIB, 16 * MIB):
                assert n == BLOCK and bytes(buf) == data[off : off + BLOCK]
            else:
                assert n is None
            assert store.holds(key, off, BLOCK) == (off in (0, 8 * MIB, 16 * MIB))
        buf = bytearray(2 * MIB)  # straddles a held and a missing block
        assert store.read_into(key, 3 * MIB, memoryview(buf)) is None
        assert store.complete_fd(key) is None
        store.close()
        store = open_store(tmp_path / "c")  # the record of which ranges are held survives a restart
        assert [store.holds(key, off, BLOCK) for off in range(0, len(data), BLOCK)] == [
            True,
            False,
            True,
            False,
            True,
        ]
        buf = bytearray(BLOCK)
        assert store.read_into(key, 16 * MIB, memoryview(buf)) == BLOCK and bytes(buf) == data[16 * MIB : 20 * MIB]
    finally:
        store.close()


def test_restart_serves_the_same_bytes_and_complete_fd(tmp_path):
    store = open_store(tmp_path / "c")
    files = {make_key(i, n): content(f"r{i}", n) for i, n in enumerate(SIZES)}
    for key, data in files.items():
        put_all(store, key, data)
    assert store.flush(30)
    store.close()
    store = open_store(tmp_path / "c")
    try:
        assert store.stats()[diskcache.FILES] == len(files)
        for key in files:
            assert store.complete_fd(key) is None  # not verified in this process yet: queued (large ones)
        assert store.flush(30)
        small = [key for key, data in files.items() if len(data) < VERIFY_AT_OPEN_MIN]
        assert small and len(small) < len(files) and store.stats()[diskcache.VERIFIED] == len(files) - len(small)
        for key in small:  # an open alone does not read a small file back ...
            assert store.complete_fd(key) is None
        for key, data in files.items():  # ... a checked read of all of it verifies it
            assert read_all(store, key, len(data)) == data
        assert store.flush(30)
        for key, data in files.items():
            fd = store.complete_fd(key)
            assert fd is not None
            try:
                assert os.fstat(fd).st_size == len(data)
                assert os.pread(fd, len(data) + 10, 0) == data
                with pytest.raises(OSError):
                    os.write(fd, b"x")  # read-only
            finally:
                os.close(fd)
        assert store.stats()[diskcache.VERIFIED] == len(files)
    finally:
        store.close()


@pytest.mark.parametrize("fault", ["none", "write_back_error", "changed"])
def test_a_checked_whole_read_verifies_the_file_once_written_back(tmp_path, monkeypatch, fault):
    """After a restart a checked read of a whole small file verifies it (no second read) once its
    write-back returns and the file is unchanged; a failed write-back or a change drops the entry:
    the read returns None (the engine goes to the source), and no descriptor is ever handed out."""
    from fastfs.fsio.disk import reads

    store = open_store(tmp_path / "c")
    data = content("a", 3073)
    key = make_key(1, len(data))
    put_all(store, key, data)
    assert store.flush(30)
    store.close()
    store = open_store(tmp_path / "c")
    try:
        (victim,) = [p for p in (tmp_path / "c" / "data").rglob("*") if p.is_file()]

        def written_back(fd: int) -> None:
            if fault == "write_back_error":
                raise OSError(5, "Input/output error")
            if fault == "changed":
                os.utime(victim, ns=(1, 1))  # (as a write behind the store's back would)

        monkeypatch.setattr(reads, "written_back", written_back)
        got = read_all(store, key, len(data))
        if fault == "none":
            assert got == data and store.stats()[diskcache.VERIFIED] == 1
            fd = store.complete_fd(key)
            assert fd is not None
            os.close(fd)
        else:
            assert got is None and store.stats()[diskcache.VERIFIED] == 0
            assert store.complete_fd(key) is None and not store.reader.holds(key, 0, len(data))
    finally:
        store.close()


def test_verify_min_verifies_large_files_as_soon_as_complete(tmp_path):
    store = open_store(tmp_path / "c", verify_min=2 * MIB)
    try:
        large, small = content("large", 5 * MIB + 3), content("small", MIB)
        lkey, skey = make_key(1, len(large)), make_key(2, len(small))
        assert store.put(lkey, len(large), 0, memoryview(large)[: 4 * MIB], lambda: None)
        assert store.flush(30) and store.stats()[diskcache.VERIFIED] == 0  # not complete yet
        assert store.put(lkey, len(large), 4 * MIB, memoryview(large)[4 * MIB :], lambda: None)
        put_all(store, skey, small)
        assert store.flush(30)
        assert store.stats()[diskcache.VERIFIED] == 1  # the large one, without being asked
        fd = store.complete_fd(lkey)
        assert fd is not None
        try:
            assert os.pread(fd, len(large), 0) == large
        finally:
            os.close(fd)
        assert store.complete_fd(skey) is None  # below verify_min: verified on first demand
    finally:
        store.close()


def test_files_completed_counts_entries_journalled_whole_not_bytes_written(tmp_path):
    store = open_store(tmp_path / "c")
    try:
        a, b = content("head-a", BLOCK + 11), content("whole-b", 3073)
        akey, bkey = make_key(1, len(a)), make_key(2, len(b))
        assert store.put(akey, len(a), 0, memoryview(a)[:BLOCK], lambda: None)
        assert store.flush(30)
        s = store.stats()
        assert s[diskcache.BYTES_WRITTEN] == BLOCK and s[diskcache.COMPLETED] == 0  # a head alone: no file whole
        assert store.put(bkey, len(b), 0, memoryview(b), lambda: None)
        assert store.put(akey, len(a), BLOCK, memoryview(a)[BLOCK:], lambda: None)
        assert store.flush(30) and store.stats()[diskcache.COMPLETED] == 2
        assert not store.put(akey, len(a), BLOCK, memoryview(a)[BLOCK:], lambda: None)  # held: not counted again
        assert store.flush(30) and store.stats()[diskcache.COMPLETED] == 2
        # counted means journalled whole: the journal as a kill -9 would leave it (no close) holds both whole
        with open(os.path.join(store.path, diskdir.JOURNAL), "rb") as f:
            rep = diskindex.replay(f.read())
        assert sorted(e.key for e in rep.entries.values() if e.complete) == sorted([akey, bkey])
    finally:
        store.close()


def test_advise_asks_a_held_file_into_the_page_cache(tmp_path):
    store = open_store(tmp_path / "c")
    try:
        data = content("adv", 3 * MIB)
        key = make_key(1, len(data))
        assert not store.advise(key)
        put_all(store, key, data)
        assert store.flush(30)
        path = data_path(store, key)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        assert store.advise(key)
        from fastfs.fsio.source import cached_share

        fd = os.open(path, os.O_RDONLY)
        try:
            deadline = time.monotonic() + 10
            while (cached_share(fd, len(data)) or 0) < 0.9 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert (cached_share(fd, len(data)) or 0) >= 0.9
        finally:
            os.close(fd)
        assert read_all(store, key, len(data)) == data
    finally:
        store.close()


def test_changed_key_misses(tmp_path):
    store = open_store(tmp_path / "c")
    try:
        data = content("v0", 3 * MIB)
        key = make_key(5, len(data), version=0)
        put_all(store, key, data)
        assert store.flush(30)
        for changed in (make_key(5, len(data), version=1), (42, 1005, len(data) + 1) + key[3:], (43,) + key[1:]):
            assert store.read_into(changed, 0, memoryview(bytearray(BLOCK))) is None
            assert not store.holds(changed, 0, BLOCK)
            assert store.complete_fd(changed) is None
        # the new version is cached beside the old, each serving its own bytes
        new = content("v1", 3 * MIB)
        key1 = make_key(5, len(new), version=1)
        put_all(store, key1, new)
        assert store.flush(30)
        assert read_all(store, key1, len(new)) == new and read_all(store, key, len(data)) == data
        assert store.discard(key) and read_all(store, key, len(data)) is None
        assert store.flush(30) and store.stats()[diskcache.MISSES] >= 4
    finally:
        store.close()


# == damage behind the store's back ============================================================================
def _cached_file(tmp_path, size=6 * MIB):
    store = open_store(tmp_path / "c")
    data = content("victim", size)
    key = make_key(9, size)
    put_all(store, key, data)
    assert store.flush(30)
    return store, key, data


@pytest.mark.parametrize("restart", [False, True])
def test_truncated_data_file_is_not_served(tmp_path, restart):
    store, key, data = _cached_file(tmp_path)
    path = data_path(store, key)
    try:
        if restart:
            store.close()
        os.truncate(path, 5 * MIB)  # the first block is intact, but the file is not what was cached
        if restart:
            store = open_store(tmp_path / "c")
        assert store.read_into(key, 0, memoryview(bytearray(BLOCK))) is None
        assert store.stats()[diskcache.CORRUPT] == 1
        assert store.read_into(key, 4 * MIB, memoryview(bytearray(BLOCK))) is None  # dropped whole
        assert store.flush(30) and not os.path.exists(path)
        assert store.stats()[diskcache.FILES] == 0
        put_all(store, key, data)  # fetched anew
        assert store.flush(30) and read_all(store, key, len(data)) == data
    finally:
        store.close()


@pytest.mark.parametrize("verified", [False, True])
@pytest.mark.parametrize("where", [0, CHUNK - 1, 3 * MIB + 12345, 6 * MIB - 1])
def test_altered_data_file_is_not_served(tmp_path, where, verified):
    store, key, data = _cached_file(tmp_path)
    path = data_path(store, key)
    try:
        if verified:  # read back whole in this process: reads then skip CRCs while the file is unchanged
            assert store.complete_fd(key) is None and store.flush(30)
            os.close(store.complete_fd(key))
            assert read_all(store, key, len(data)) == data
        with open(path, "r+b") as f:
            f.seek(where)
            f.write(bytes([data[where] ^ 0x01]))
        buf = bytearray(BLOCK)
        assert store.read_into(key, where // BLOCK * BLOCK, memoryview(buf)) is None
        assert store.stats()[diskcache.CORRUPT] == 1
        assert read_all(store, key, len(data)) is None
    finally:
        store.close()


def test_altered_complete_file_gets_no_descriptor(tmp_path):
    store, key, data = _cached_file(tmp_path)
    try:
        assert store.complete_fd(key) is None and store.flush(30)
        fd = store.complete_fd(key)
        assert fd is not None
        os.close(fd)
        with open(data_path(store, key), "r+b") as f:  # same length, one byte changed after verification
            f.seek(100)
            f.write(bytes([data[100] ^ 0xFF]))
        assert store.complete_fd(key) is None
        assert store.stats()[diskcache.CORRUPT] == 1 and store.read_into(key, 0, memoryview(bytearray(10))) is None
    finally:
        store.close()


def test_altered_file_fails_verification_after_restart(tmp_path):
    store, key, data = _cached_file(tmp_path)
    path = data_path(store, key)
    store.close()
    with open(path, "r+b") as f:
        f.seek(5 * MIB)
        f.write(b"\0" * 10)
    store = open_store(tmp_path / "c")
    try:
        assert store.complete_fd(key) is None and store.flush(30)
        assert store.complete_fd(key) is None
        assert store.stats()[diskcache.CORRUPT] == 1 and store.stats()[diskcache.VERIFIED] == 0
    finally:
        store.close()


def test_data_file_replaced_by_symlink_is_not_followed(tmp_path):
    store, key, data = _cached_file(tmp_path)
    path = data_path(store, key)
    try:
        copy = tmp_path / "copy"
        copy.write_bytes(data)  # the right bytes, but reached through a symlink: refused
        os.unlink(path)
        os.symlink(copy, path)
        assert store.read_into(key, 0, memoryview(bytearray(BLOCK))) is None
        assert store.stats()[diskcache.CORRUPT] == 1
        assert copy.read_bytes() == data
    finally:
        store.close()


def test_journal_torn_or_damaged_anywhere_serves_no_wrong_byte(tmp_path):
    """Cut the journal at every byte of its records (and flip bytes in it): the store opens, and
    whatever it still serves is exact."""
    src = tmp_path / "src"
    store = open_store(src)
    files = {make_key(i, n): content(f"j{i}", n) for i, n in enumerate([3073, CHUNK + 1, 300 * KIB, 1 * MIB + 5])}
    for key, data in files.items():
        put_all(store, key, data, block=CHUNK * 2)
    assert store.flush(30)
    store.discard(next(iter(files)))
    assert store.flush(30)
    journal = (src / diskdir.JOURNAL).read_bytes()  # appended records, before the compaction at close
    store.close()
    cuts = sorted(set(range(diskindex.HEADER.size, len(journal) + 1, 7)) | {len(journal) - 1, len(journal)})
    rng = random.Random(3)
    variants = [journal[:cut] for cut in cuts]
    for _ in range(20):
        pos = rng.randrange(diskindex.HEADER.size, len(journal))
        variants.append(journal[:pos] + bytes([journal[pos] ^ (1 << rng.randrange(8))]) + journal[pos + 1 :])
    served = 0
    for i, variant in enumerate(variants):
        work = tmp_path / f"w{i}"
        shutil.copytree(src, work)
        (work / diskdir.JOURNAL).write_bytes(variant)
        s = open_store(work)
        try:
            for key, data in files.items():
                for off in range(0, len(data), CHUNK):
                    buf = bytearray(CHUNK)
                    n = s.read_into(key, off, memoryview(buf))
                    if n is not None:
                        assert bytes(buf[:n]) == data[off : off + n]
                        served += n
        finally:
            s.close()
        shutil.rmtree(work)
    assert served > 0


# == budget and free space =====================================================================================
def test_budget_holds_with_lru_eviction(tmp_path):
    budget = 4 * MIB
    store = open_store(tmp_path / "c", budget_bytes=budget)
    try:
        files = [(make_key(i, 256 * KIB), content(f"b{i}", 256 * KIB)) for i in range(40)]
        for n, (key, data) in enumerate(files):
            put_all(store, key, data)
            assert store.flush(30)
            if n >= 4:  # keep file 0 recently used: LRU must spare it
                assert read_all(store, files[0][0], len(files[0][1])) == files[0][1]
            stats = store.stats()
            assert stats[diskcache.USE] <= budget
            assert tree_bytes(store.path) <= budget
        stats = store.stats()
        assert stats[diskcache.EVICTIONS] > 20 and stats[diskcache.EVICTED_BYTES] >= 20 * 256 * KIB
        held = [i for i, (key, _d) in enumerate(files) if store.holds(key, 0, 256 * KIB)]
        assert 0 in held and held[-3:] == [37, 38, 39] and 1 not in held and len(held) < 20
        for i in held:
            assert read_all(store, files[i][0], 256 * KIB) == files[i][1]
        # a file larger than the whole budget keeps what fits and declines the rest
        big = content("big", 8 * MIB)
        put_all(store, make_key(99, len(big)), big, block=1 * MIB)
        assert store.flush(30)
        assert store.stats()[diskcache.WRITES_NO_ROOM] > 0 and store.stats()[diskcache.USE] <= budget
        assert tree_bytes(store.path) <= budget
    finally:
        store.close()


def test_reopen_with_more_than_fits_evicts_at_once(tmp_path):
    """A journal can describe more than the budget allows (a crash between an eviction and its DROP
    record, or a lowered budget): the store is within its limits as soon as it is open."""
    store = open_store(tmp_path / "c", budget_bytes=64 * MIB)
    files = [(make_key(i, 1 * MIB), content(f"o{i}", 1 * MIB)) for i in range(30)]
    for key, data in files:
        put_all(store, key, data)
        assert store.flush(30)  # one at a time: LRU order is write order
    store.close()
    store = open_store(tmp_path / "c", budget_bytes=8 * MIB, max_entries=6)
    try:
        stats = store.stats()
        assert stats[diskcache.USE] <= 8 * MIB and stats[diskcache.FILES] <= 6
        assert store.flush(30) and tree_bytes(store.path) <= 8 * MIB
        held = [i for i, (key, _d) in enumerate(files) if store.holds(key, 0, MIB)]
        assert held == list(range(24, 30))  # the most recently written ones
        for i in held:
            assert read_all(store, files[i][0], MIB) == files[i][1]
    finally:
        store.close()


def test_entry_cap_bounds_metadata(tmp_path):
    store = open_store(tmp_path / "c", max_entries=5)
    try:
        for i in range(12):
            put_all(store, make_key(i, 3073), content(f"e{i}", 3073))
            assert store.flush(30)
        assert store.stats()[diskcache.FILES] == 5
        assert [i for i in range(12) if store.holds(make_key(i, 3073), 0, 3073)] == [7, 8, 9, 10, 11]
    finally:
        store.close()


def test_free_space_floor_holds_while_another_program_fills_the_disk(tmp_path):
    root = str(tmp_path / "c")
    disk = FakeDisk(root, total=64 * MIB)
    floor = 16 * MIB
    store = DiskStore(root, budget_share=1.0, floor_bytes=floor, statvfs=disk)
    try:
        files = [(make_key(i, 1 * MIB), content(f"s{i}", 1 * MIB)) for i in range(80)]
        for key, data in files[:60]:
            put_all(store, key, data, block=256 * KIB)
            assert store.flush(30)
            assert disk.avail() >= floor
        stats = store.stats()
        assert stats[diskcache.EVICTIONS] > 0 and stats[diskcache.FILES] >= 40  # ~48 MiB usable, all used
        before = stats[diskcache.FILES]
        for _ in range(12):  # another program writes 8 MiB at a time, as much as the disk takes
            disk.other += min(8 * MIB, disk.avail())
            store.maintain()
            assert store.flush(30)
            assert disk.avail() >= floor or store.stats()[diskcache.FILES] == 0
            for key, data in files[60:62]:  # writes while nearly full keep the floor too
                put_all(store, key, data, block=256 * KIB)
                assert store.flush(30)
                assert disk.avail() >= floor or store.stats()[diskcache.FILES] == 0
        stats = store.stats()
        assert stats[diskcache.FILES] == 0 < before and stats[diskcache.WRITES_NO_ROOM] > 0
        disk.other = 0  # space comes back: the tier fills again
        store.maintain()
        put_all(store, files[70][0], files[70][1])
        assert store.flush(30) and read_all(store, files[70][0], MIB) == files[70][1]
    finally:
        store.close()


def test_floor_is_checked_periodically_while_idle(tmp_path, monkeypatch):
    monkeypatch.setattr(diskspace, "SPACE_CHECK_INTERVAL", 0.05)
    root = str(tmp_path / "c")
    disk = FakeDisk(root, total=64 * MIB)
    store = DiskStore(root, budget_bytes=32 * MIB, floor_bytes=8 * MIB, statvfs=disk)
    try:
        for i in range(20):
            put_all(store, make_key(i, 1 * MIB), content(f"i{i}", 1 * MIB))
        assert store.flush(30) and store.stats()[diskcache.FILES] == 20
        disk.other = 50 * MIB  # nothing is written now; the writer's periodic check must react
        deadline = time.monotonic() + 10
        while disk.avail() < 8 * MIB and time.monotonic() < deadline:
            time.sleep(0.05)
        assert disk.avail() >= 8 * MIB and 0 < store.stats()[diskcache.FILES] < 20
    finally:
        store.close()


def test_budget_share_follows_free_space(tmp_path):
    root = str(tmp_path / "c")
    disk = FakeDisk(root, total=100 * MIB, other=60 * MIB)
    store = DiskStore(root, budget_share=0.5, floor_bytes=0, statvfs=disk)
    try:
        budget = store.stats()[diskcache.BUDGET]
        assert abs(budget - 20 * MIB) < 64 * KIB  # half of the 40 MiB free
        for i in range(40):
            put_all(store, make_key(i, 1 * MIB), content(f"p{i}", 1 * MIB))
            assert store.flush(30)
        assert store.stats()[diskcache.USE] <= store.stats()[diskcache.BUDGET] <= 20 * MIB + 64 * KIB
        assert tree_bytes(root) <= 20 * MIB + 64 * KIB
    finally:
        store.close()


# == the write queue ===========================================================================================
def test_write_queue_full_drops_and_never_blocks(tmp_path):
    store = open_store(tmp_path / "c", queue_bytes=4 * MIB, writers=1)
    gate = threading.Event()
    released: list[int] = []
    try:
        held = content("held", 1 * MIB)
        hkey = make_key(0, len(held))
        put_all(store, hkey, held)
        assert store.flush(30)

        entered = threading.Event()

        def blocking_release() -> None:
            entered.set()
            gate.wait(30)
            released.append(-1)

        data = content("q", 16 * MIB)
        key = make_key(1, len(data))
        view = memoryview(data)
        assert store.put(key, len(data), 0, view[:MIB], blocking_release)  # the writer now hangs in release
        assert entered.wait(10)  # the writer wrote it and is stuck in release(): its 1 MiB stays queued (pinned)
        results = []
        t0 = time.perf_counter()
        for off in range(MIB, 16 * MIB, MIB):
            results.append(store.put(key, len(data), off, view[off : off + MIB], lambda o=off: released.append(o)))
        elapsed = time.perf_counter() - t0
        buf = bytearray(MIB)
        assert store.read_into(hkey, 0, memoryview(buf)) == MIB and bytes(buf) == held  # readers don't wait
        elapsed_read = time.perf_counter() - t0
        assert results == [True] * 3 + [False] * 12  # 4 MiB pinned by the store, the rest dropped
        assert elapsed < 1.0 and elapsed_read < 1.0
        stats = store.stats()
        assert stats[diskcache.WRITES_DROPPED] == 12 and stats[diskcache.QUEUED] == 4 * MIB
        gate.set()
        assert store.flush(30)
        assert sorted(released) == [-1] + [
            off for off, ok in zip(range(MIB, 16 * MIB, MIB), results, strict=True) if ok
        ]
        for off in range(0, 16 * MIB, MIB):
            buf = bytearray(MIB)
            n = store.read_into(key, off, memoryview(buf))
            assert (n is not None) == (off < 4 * MIB)
            if n is not None:
                assert bytes(buf) == data[off : off + MIB]
    finally:
        gate.set()
        store.close()


def test_puts_not_taken_are_not_released(tmp_path):
    store = open_store(tmp_path / "c")
    released = []
    try:
        data = content("u", 2 * MIB)
        key = make_key(1, len(data))
        view = memoryview(data)
        assert not store.put(key, len(data), 4096, view[4096 : 4096 + CHUNK], lambda: released.append(1))  # unaligned
        assert not store.put(key, len(data), 0, view[: CHUNK + 5], lambda: released.append(2))  # ragged end
        assert not store.put(key, len(data) + 5, 0, view[:0], lambda: released.append(3))  # empty
        assert not store.put(("x",), len(data), 0, view[:CHUNK], lambda: released.append(4))  # bad key
        assert store.put(key, len(data), 0, view[:MIB], lambda: released.append(5))
        assert store.flush(30)
        assert not store.put(key, len(data), 0, view[:MIB], lambda: released.append(6))  # already held
        assert released == [5] and store.stats()[diskcache.WRITES_SKIPPED] == 5
    finally:
        store.close()
    assert not store.put(key, len(data), MIB, view[MIB:], lambda: released.append(7))  # closed
    assert released == [5]


def test_concurrent_readers_writers_and_evictions_serve_exact_bytes(tmp_path):
    store = open_store(tmp_path / "c", budget_bytes=8 * MIB)
    files = [(make_key(i, n), content(f"c{i}", n)) for i, n in enumerate([3073, 200 * KIB, 1 * MIB, 3 * MIB] * 5)]
    stop = threading.Event()
    errors: list[str] = []
    served = [0]

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            key, data = rng.choice(files)
            off = rng.randrange(0, len(data), CHUNK)
            buf = bytearray(rng.choice([CHUNK, MIB]))
            n = store.read_into(key, off, memoryview(buf))
            if n is not None:
                if bytes(buf[:n]) != data[off : off + n]:
                    errors.append(f"{key} {off}")
                served[0] += n

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    try:
        rng = random.Random(9)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            key, data = rng.choice(files)
            put_all(store, key, data, block=rng.choice([CHUNK, MIB]))
            time.sleep(0.001)
    finally:
        stop.set()
        for t in threads:
            t.join()
        store.close()
    assert not errors and served[0] > 0


# == the directory =============================================================================================
def test_new_directory_is_private_and_files_are_0600(tmp_path):
    old = os.umask(0)
    try:
        store = open_store(tmp_path / "a" / "c")
    finally:
        os.umask(old)
    try:
        put_all(store, make_key(1, 3073), content("m", 3073))
        assert store.flush(30)
        assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o700
        for dirpath, dirnames, filenames in os.walk(store.path):
            for name in dirnames:
                assert stat.S_IMODE(os.lstat(os.path.join(dirpath, name)).st_mode) == 0o700, name
            for name in filenames:
                assert stat.S_IMODE(os.lstat(os.path.join(dirpath, name)).st_mode) == 0o600, name
    finally:
        store.close()


@pytest.mark.parametrize(
    ("mode", "uid", "needle"),
    [(0o770, None, "writable by group"), (0o707, None, "writable"), (0o700, 12345, "owned by uid 12345")],
)
def test_unsafe_directory_is_refused(tmp_path, mode, uid, needle):
    d = tmp_path / "c"
    d.mkdir()
    os.chmod(d, mode)
    if uid is not None:
        if os.geteuid() != 0:
            pytest.skip("chown needs root")
        os.chown(d, uid, -1)
    with pytest.raises(DiskCacheError) as e:
        open_store(d)
    assert needle in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith(str(d))
    assert os.listdir(d) == []


def test_symlinked_or_file_paths(tmp_path):
    target = tmp_path / "real"
    link = tmp_path / "link"
    os.symlink(target, link)
    store = open_store(link)  # a configured symlink is resolved once, then used by descriptor
    assert store.path == str(target)
    store.close()
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(DiskCacheError, match="not a directory"):
        open_store(f)


def test_foreign_directory_is_refused_and_left_alone(tmp_path):
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    (d / "thesis.tex").write_text("precious")
    (d / "data").mkdir()
    with pytest.raises(DiskCacheError) as e:
        open_store(d)
    assert "not a fastfs disk cache" in str(e.value) and "\n" not in str(e.value)
    assert sorted(os.listdir(d)) == ["data", "thesis.tex"] and (d / "thesis.tex").read_text() == "precious"
    e2 = tmp_path / "fresh"
    e2.mkdir(mode=0o700)
    (e2 / "lost+found").mkdir()  # the root of a fresh ext4 filesystem counts as empty
    open_store(e2).close()


@pytest.mark.parametrize("damage", ["other format", "garbage marker", "bad journal header", "no journal"])
def test_corrupt_or_other_format_directory_is_cleared_keeping_foreign_files(tmp_path, damage):
    d = tmp_path / "c"
    store = open_store(d)
    data = content("k", 2 * MIB)
    key = make_key(1, len(data))
    put_all(store, key, data)
    assert store.flush(30)
    path = data_path(store, key)
    store.close()
    (d / "notes.txt").write_text("mine")  # foreign files beside ours, and inside data/
    (d / "data" / "README").write_text("also mine")
    if damage == "other format":
        (d / diskdir.MARKER).write_text("fastfs disk cache: ...\nformat 99\n")
    elif damage == "garbage marker":
        (d / diskdir.MARKER).write_bytes(b"\0\0\0")
    elif damage == "bad journal header":
        (d / diskdir.JOURNAL).write_bytes(b"NOTAJOURNAL" + bytes(100))
    else:
        os.unlink(d / diskdir.JOURNAL)
    store = open_store(d)
    try:
        assert store.stats()[diskcache.CLEARED] == 1 and store.stats()[diskcache.FILES] == 0
        assert not os.path.exists(path)
        assert store.read_into(key, 0, memoryview(bytearray(BLOCK))) is None
        assert (d / "notes.txt").read_text() == "mine" and (d / "data" / "README").read_text() == "also mine"
        assert diskdir.read_marker(store._root) == diskdir.FORMAT
        put_all(store, key, data)
        assert store.flush(30) and read_all(store, key, len(data)) == data
    finally:
        store.close()


def test_second_process_on_the_same_directory_is_refused(tmp_path):
    store = open_store(tmp_path / "c")
    try:
        with pytest.raises(DiskCacheError, match="in use by another fastfs process"):
            open_store(tmp_path / "c")
    finally:
        store.close()
    open_store(tmp_path / "c").close()


def test_orphan_data_files_are_swept_at_start(tmp_path):
    store = open_store(tmp_path / "c")
    put_all(store, make_key(1, 3073), content("o", 3073))
    assert store.flush(30)
    store.close()
    sub = tmp_path / "c" / "data" / "05"
    sub.mkdir(exist_ok=True)
    orphan = sub / diskdir.data_name(5)  # an id below NEXT that no entry names (its ENTRY record was lost)
    orphan.write_bytes(b"x" * 100)
    other = sub / "keep-me"
    other.write_bytes(b"y")
    store = open_store(tmp_path / "c")
    try:
        assert store.flush(30)
        deadline = time.monotonic() + 10
        while orphan.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not orphan.exists() and other.exists()
        assert read_all(store, make_key(1, 3073), 3073) == content("o", 3073)
    finally:
        store.close()


def test_placement_outside_source_and_mountpoint(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    diskdir.check_placement(str(tmp_path / "cache"), str(src), str(mnt))
    for bad in (src / "cache", mnt / "x" / "cache", src, tmp_path):
        with pytest.raises(DiskCacheError, match="must be outside"):
            diskdir.check_placement(str(bad), str(src), str(mnt))


def test_from_config(tmp_path):
    from fastfs.config import load_config

    assert DiskStore.from_config(load_config(use_default_path=False).cache) is None
    config = load_config(
        overrides={"cache.disk_dir": str(tmp_path / "c"), "cache.disk_budget": "100M", "cache.disk_free_floor": "0"},
        use_default_path=False,
    )
    store = DiskStore.from_config(config.cache)
    try:
        assert store.stats()[diskcache.BUDGET] == 100 * MIB and store.stats()[diskcache.FLOOR] == 0
    finally:
        store.close()
    config = load_config(overrides={"cache.disk_dir": str(tmp_path / "c")}, use_default_path=False)
    store = DiskStore.from_config(config.cache)
    try:
        vfs = os.statvfs(store.path)
        assert store.stats()[diskcache.FLOOR] == int(0.1 * vfs.f_blocks * vfs.f_frsize)
        assert 0 < store.stats()[diskcache.BUDGET] <= vfs.f_bavail * vfs.f_frsize
    finally:
        store.close()


def test_stats_names_counters_and_gauges(tmp_path):
    store = open_store(tmp_path / "c")
    try:
        assert set(store.stats()) == set(diskcache.COUNTERS) | set(diskcache.GAUGES)
        assert all(isinstance(v, int) for v in store.stats().values())
    finally:
        store.close()


# == the journal format ========================================================================================
@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ecd"), st.integers(0, 5), st.integers(0, 40), st.integers(1, 8)), max_size=40),
    st.data(),
)
def test_journal_replay_matches_a_model_and_a_torn_log_gives_an_earlier_state(ops, data):
    sizes = {i: (i + 1) * 7 * CHUNK + i for i in range(6)}
    model: dict[int, dict[int, int]] = {}
    blob = diskindex.header()
    states = [(len(blob), {})]  # (end of the log, index state it describes)
    next_id = 1
    ids: dict[int, int] = {}
    for op, f, first, count in ops:
        if op == "e" and f not in ids:
            ids[f] = next_id
            blob += diskindex.rec_entry(next_id, sizes[f], make_key(f, sizes[f]))
            model[next_id] = {}
            next_id += 1
        elif op == "c" and f in ids:
            n = diskindex.nchunks(sizes[f])
            first = min(first, n - 1)
            count = min(count, n - first)
            crcs = array("I", [random.Random(f * 1000 + first + i).getrandbits(32) for i in range(count)])
            blob += diskindex.rec_chunks(ids[f], first, crcs)
            model[ids[f]].update({first + i: crcs[i] for i in range(count)})
        elif op == "d" and f in ids:
            entry_id = ids.pop(f)
            blob += diskindex.rec_drop(entry_id)
            del model[entry_id]
        else:
            continue
        states.append((len(blob), {k: dict(v) for k, v in model.items()}))

    def index_of(rep: diskindex.Replay) -> dict:
        return {e.id: {i: e.crcs[i] for i in range(len(e.held)) if e.held[i]} for e in rep.entries.values()}

    rep = diskindex.replay(blob)
    assert rep.good_end == len(blob) and index_of(rep) == model
    cut = data.draw(st.integers(diskindex.HEADER.size, len(blob)))
    torn = diskindex.replay(blob[:cut])
    end, state = max((s for s in states if s[0] <= cut), key=lambda s: s[0])
    assert torn.good_end == end and index_of(torn) == state
