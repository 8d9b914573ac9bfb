"""Read-ahead, stats and learning through real mounts: counters match what was read."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from conftest import SERVED, evict_page_cache, mounted, wait_for

from fastfs.fsio.policy import SORTED_LEAD_FILES

MIB = 1024 * 1024
SMALL = 3073


def counters(m) -> dict:
    return m.stats()["counters"]


def read_file(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def big(src):
    data = np.random.default_rng(5).bytes(24 * MIB + 123)
    (src / "big.bin").write_bytes(data)
    return data


def test_counters_match_bytes_read_and_second_read_hits_cache(src, mnt, big):
    with mounted(src, mnt, options=[SERVED]) as m:
        before = counters(m)
        assert read_file(mnt / "big.bin") == big
        after = counters(m)
        assert after["bytes_requested"] - before["bytes_requested"] == len(big)
        fetched = (after["bytes_fetched_demand"] + after["bytes_fetched_prefetch"]) - (
            before["bytes_fetched_demand"] + before["bytes_fetched_prefetch"]
        )
        assert fetched >= len(big)
        assert after["sequential_streams"] >= 1
        # the kernel keeps its page cache: a second read makes no request at all
        assert read_file(mnt / "big.bin") == big
        assert counters(m)["bytes_requested"] == after["bytes_requested"]
        # without the kernel's copy, the second read is served from fastfs's RAM cache
        evict_page_cache(mnt / "big.bin")
        hits_before = counters(m)["bytes_served_from_cache"]
        assert read_file(mnt / "big.bin") == big
        final = counters(m)
        assert final["bytes_served_from_cache"] - hits_before == len(big)
        assert final["bytes_fetched_demand"] + final["bytes_fetched_prefetch"] == fetched + (
            before["bytes_fetched_demand"] + before["bytes_fetched_prefetch"]
        )
        snap = m.stats()
        assert snap["derived"]["hit_ratio"] > 0
        assert snap["gauges"]["cache_bytes"] <= snap["gauges"]["cache_budget"]


def test_a_reader_of_the_first_files_of_a_directory_is_not_given_all_of_it(src, mnt):
    """A quick run over the first 40 files of 1,200, in name order: the scan fetches the names just past
    the reader (SORTED_LEAD_FILES), not the directory (before: all 1,197 files fetched)."""
    d = src / "train"
    d.mkdir()
    rng = np.random.default_rng(2)
    files = {f"s{i:05d}.bin": rng.bytes(SMALL) for i in range(1200)}
    for name, data in files.items():
        (d / name).write_bytes(data)
    names = sorted(files)
    with mounted(src, mnt, options=[SERVED, "readahead.learn=false"]) as m:
        for name in names[:40]:
            assert read_file(mnt / "train" / name) == files[name]
        assert wait_for(lambda: counters(m)["small_file_scan_files"] >= SORTED_LEAD_FILES)
        # the scan stops at the bound: nothing more arrives while the reader does nothing
        fetched = counters(m)["small_file_scan_files"]
        assert not wait_for(lambda: counters(m)["small_file_scan_files"] > fetched, timeout=1.0)
        assert fetched <= 40 + SORTED_LEAD_FILES
        served = counters(m)["bytes_served_from_cache"]
        for name in names[40:60]:  # the next names come from RAM
            assert read_file(mnt / "train" / name) == files[name]
        assert counters(m)["bytes_served_from_cache"] - served == 20 * SMALL


def test_random_reads_through_mount_fetch_little(src, mnt, big):
    with mounted(src, mnt, options=["readahead.formats=false", SERVED]) as m:
        rng = random.Random(9)
        fd = os.open(mnt / "big.bin", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for _ in range(300):
                off = rng.randrange(1, len(big) // 4096) * 4096
                assert os.pread(fd, 4096, off) == big[off : off + 4096]
        finally:
            os.close(fd)
        c = counters(m)
        fetched = c["bytes_fetched_demand"] + c["bytes_fetched_prefetch"]
        assert fetched / c["bytes_requested"] <= 1.5


def test_small_file_scan_prefetches_the_directory(src, mnt):
    d = src / "images"
    d.mkdir()
    rng = np.random.default_rng(1)
    # (fewer files than a reader in name order is fetched ahead of it: SORTED_LEAD_FILES)
    files = {f"img{i:04d}.jpg": rng.bytes(SMALL) for i in range(200)}
    for name, data in files.items():
        (d / name).write_bytes(data)
    with mounted(src, mnt, options=[SERVED]) as m:
        names = sorted(files)
        for name in names[:3]:
            assert read_file(mnt / "images" / name) == files[name]
        assert wait_for(lambda: counters(m)["small_file_scan_files"] >= len(names) - 3)
        before = counters(m)
        for name in names[3:]:
            assert read_file(mnt / "images" / name) == files[name]
        after = counters(m)
        assert after["small_file_scans"] == 1
        assert after["bytes_served_from_cache"] - before["bytes_served_from_cache"] == SMALL * (len(names) - 3)
        assert after["preads"] == before["preads"]  # nothing more from the source


def test_npy_format_plan_through_mount(src, mnt):
    arr = np.random.default_rng(2).standard_normal(3 * MIB // 8)
    np.save(src / "w.npy", arr)
    renamed = src / "weights.bin"
    os.link(src / "w.npy", renamed)
    with mounted(src, mnt, options=[SERVED]) as m:
        with open(mnt / "weights.bin", "rb") as f:  # detected by content, not by name
            assert wait_for(lambda: counters(m)["format_plans"] == 1)
            assert np.array_equal(np.load(f), arr)
        c = counters(m)
        fetched = c["bytes_fetched_demand"] + c["bytes_fetched_prefetch"]
        assert os.path.getsize(renamed) <= fetched <= 1.2 * os.path.getsize(renamed)
        assert c["bytes_prefetch_used"] >= 0.5 * os.path.getsize(renamed)


def test_learned_set_is_replayed_after_remount(src, mnt, tmp_path):
    d = src / "shards"
    d.mkdir()
    files = {f"s{i:03d}": os.urandom(SMALL) for i in range(60)}
    for name, data in files.items():
        (d / name).write_bytes(data)
    state = tmp_path / "learned-state"
    state.mkdir()
    env = {"STATE_DIRECTORY": str(state)}
    order = list(files)
    random.Random(4).shuffle(order)
    with mounted(src, mnt, options=[SERVED], env=env):
        for name in order:
            assert read_file(mnt / "shards" / name) == files[name]
    assert any(p.name.startswith("learned-") for p in state.iterdir())
    random.Random(5).shuffle(order)
    with mounted(src, mnt, options=[SERVED], env=env) as m:
        assert read_file(mnt / "shards" / order[0]) == files[order[0]]
        assert wait_for(lambda: counters(m)["small_file_scan_files"] >= len(order) - 1)
        c = counters(m)
        assert c["learned_plans"] == 1
        for name in order[1:]:
            assert read_file(mnt / "shards" / name) == files[name]
        c2 = counters(m)
        assert c2["learned_files_used"] >= len(order) - 1
        assert c2["preads"] == c["preads"]


def test_checkpoint_read_whole_is_released_whole_after_remount(src, mnt, tmp_path):
    arr = np.random.default_rng(6).standard_normal(12 * MIB // 8)
    np.save(src / "ckpt.npy", arr)
    size = os.path.getsize(src / "ckpt.npy")
    state = tmp_path / "learned-state"
    state.mkdir()
    env = {"STATE_DIRECTORY": str(state)}
    with mounted(src, mnt, options=[SERVED], env=env) as m:
        with open(mnt / "ckpt.npy", "rb") as f:
            assert wait_for(lambda: counters(m)["format_plans"] == 1)
            assert np.array_equal(np.load(f), arr)
        assert counters(m)["learned_whole_plans"] == 0
    with mounted(src, mnt, options=[SERVED], env=env) as m, open(mnt / "ckpt.npy", "rb") as f:
        assert wait_for(lambda: counters(m)["learned_whole_plans"] == 1)
        # the whole payload is on its way before the loader reads past the header
        assert wait_for(lambda: counters(m)["bytes_fetched_prefetch"] >= size - 2 * MIB)
        assert np.array_equal(np.load(f), arr)
