"""The engine and its cache without FUSE: bytes, budget, backpressure, errors, scans, formats."""

from __future__ import annotations

import errno
import os
import random
import threading
import time

import numpy as np
import pytest
from conftest import wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.cache import READY, BlockCache
from fastfs.fsio.engine import Engine, ReplyParts
from fastfs.fsio.formats import ELF_MAGIC
from fastfs.fsio.policy import CODE_WINDOW
from fastfs.fsio.source import HeadKey
from fastfs.fsio.warm import warm_now

MIB = 1024 * 1024


def make_engine(src, tmp_path, **overrides) -> Engine:
    opts = {
        "cache.budget": "32M",
        "cache.block_size": "1M",
        "state.dir": str(tmp_path / "state"),
        "cache.check_invariants": "true",  # every cache change of every engine test is checked
    }
    opts.update(overrides)
    return Engine(str(src), load_config(overrides=opts, use_default_path=False))


@pytest.fixture
def data_dir(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    (src / "big").write_bytes(rng.bytes(20 * MIB + 4097))
    (src / "empty").write_bytes(b"")
    small = src / "small"
    small.mkdir()
    for i in range(40):
        (small / f"f{i:03d}").write_bytes(rng.bytes(3073))
    return src


def read_all(engine: Engine, fh: int, size: int, chunk: int) -> bytes:
    out = bytearray()
    buf = bytearray(chunk)
    while True:
        n = engine.read_into(fh, len(out), memoryview(buf))
        if n == 0:
            return bytes(out)
        out += buf[:n]
        assert len(out) <= size


@pytest.mark.parametrize("chunk", [4096, 131072, MIB, 3 * MIB + 7])
def test_sequential_read_is_byte_exact_and_prefetches(data_dir, tmp_path, chunk):
    engine = make_engine(data_dir, tmp_path)
    try:
        expected = (data_dir / "big").read_bytes()
        r = engine.open("/big")
        assert read_all(engine, r.fh, len(expected), chunk) == expected
        engine.release(r.fh)
        c = engine.snapshot()["counters"]
        assert c[m.BYTES_FETCHED_PREFETCH] > 0
        assert c[m.BYTES_FETCHED_DEMAND] + c[m.BYTES_FETCHED_PREFETCH] >= len(expected)
        assert c[m.BYTES_REQUESTED] >= len(expected)
        assert c[m.SEQ_STREAMS] >= 1
    finally:
        engine.close()


def test_random_4k_reads_have_low_amplification(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path, **{"readahead.formats": "false"})
    try:
        expected = (data_dir / "big").read_bytes()
        r = engine.open("/big")
        rng = random.Random(3)
        for _ in range(300):
            off = rng.randrange(1, len(expected) // 4096) * 4096
            assert engine.read(r.fh, off, 4096) == expected[off : off + 4096]
        c = engine.snapshot()["counters"]
        fetched = c[m.BYTES_FETCHED_DEMAND] + c[m.BYTES_FETCHED_PREFETCH]
        assert fetched / c[m.BYTES_REQUESTED] <= 1.5
        engine.release(r.fh)
    finally:
        engine.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(-10, 21 * MIB), st.integers(0, 3 * MIB)), min_size=1, max_size=40))
def test_random_traces_return_source_bytes_and_respect_budget(data_dir, tmp_path, trace):
    engine = make_engine(data_dir, tmp_path, **{"cache.budget": "16M"})
    expected = (data_dir / "big").read_bytes()
    try:
        r = engine.open("/big")
        for offset, size in trace:
            if offset < 0:
                with pytest.raises(OSError) as e:
                    engine.read(r.fh, offset, size)
                assert e.value.errno == errno.EINVAL
                continue
            assert engine.read(r.fh, offset, size) == expected[offset : offset + size]
            assert engine.cache.reserved <= engine.cache.budget
            engine.check_invariants()
        engine.release(r.fh)
        engine.check_invariants()
    finally:
        engine.close()


def test_concurrent_readers_threads(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path)
    expected = (data_dir / "big").read_bytes()
    errors = []

    def worker(seed):
        rng = random.Random(seed)
        r = engine.open("/big")
        try:
            if seed % 2:
                assert read_all(engine, r.fh, len(expected), MIB) == expected
            else:
                for _ in range(100):
                    off = rng.randrange(len(expected))
                    n = rng.randrange(1, 200000)
                    assert engine.read(r.fh, off, n) == expected[off : off + n]
        except Exception as e:  # collected and asserted below
            errors.append(e)
        finally:
            engine.release(r.fh)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert not errors
        engine.check_invariants()
        g = engine.snapshot()["gauges"]
        assert g["open_files"] == 0
        assert g["cache_bytes"] <= g["cache_budget"]
    finally:
        engine.close()


def test_budget_full_declines_prefetch_but_demand_reads_go(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path, **{"cache.budget": "16M"})
    try:
        # pin every buffer the budget allows so nothing can be evicted
        pinned = []
        for i in range(16):
            block, created = engine.cache.reserve(("x",), i, MIB, prefetched=True)
            assert block is not None and created
            pinned.append(block)
        assert engine.cache.reserve(("x",), 99, MIB, prefetched=True) == (None, False)
        expected = (data_dir / "big").read_bytes()
        r = engine.open("/big")
        assert read_all(engine, r.fh, len(expected), MIB) == expected
        c = engine.snapshot()["counters"]
        assert c[m.BACKPRESSURE] > 0
        assert engine.cache.reserved <= engine.cache.budget
        engine.release(r.fh)
        for b in pinned:
            engine.cache.complete(b, MIB)
            engine.cache.unpin(b)
    finally:
        engine.close()


def test_cache_eviction_prefers_consumed_blocks_and_counts_waste():
    stats = m.Stats()
    cache = BlockCache(4 * MIB, MIB, stats, check_invariants=True)
    blocks = []
    for i in range(4):
        b, _ = cache.reserve(("f",), i, MIB, prefetched=True)
        cache.complete(b, MIB)
        cache.unpin(b)
        blocks.append(b)
    cache.consumed(blocks[2])
    cache.use(blocks[2])
    nb, created = cache.reserve(("f",), 10, MIB, prefetched=True)
    assert created
    assert cache.peek(("f",), 2) is None and cache.peek(("f",), 0) is not None
    cache.complete(nb, MIB)
    cache.unpin(nb)
    nb, _ = cache.reserve(("f",), 11, MIB, prefetched=True)  # evicts LRU block 0, never used: waste
    assert cache.peek(("f",), 0) is None
    assert stats.counters()[m.BYTES_PREFETCH_WASTED] == MIB
    assert cache.reserved <= cache.budget


def test_pending_and_pinned_blocks_are_never_evicted():
    cache = BlockCache(2 * MIB, MIB, m.Stats(), check_invariants=True)
    a, _ = cache.reserve(("f",), 0, MIB, prefetched=False)  # pending, pinned
    b, _ = cache.reserve(("f",), 1, MIB, prefetched=False)
    cache.complete(b, MIB)  # ready but pinned
    assert cache.reserve(("f",), 2, MIB, prefetched=True) == (None, False)
    cache.unpin(b)
    c, created = cache.reserve(("f",), 2, MIB, prefetched=True)
    assert created and cache.peek(("f",), 1) is None and cache.peek(("f",), 0) is a


def test_in_flight_fetch_is_shared(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path, **{"readahead.formats": "false"})
    try:
        r = engine.open("/big")
        entry = engine.handles.get(r.fh)
        b1 = engine.fills.fetch_block(entry, 5, demand=True, keep_pin=True)
        b2 = engine.fills.fetch_block(entry, 5, demand=False, keep_pin=True)
        assert b1 is b2
        assert b1.done.wait(30) and b1.state == READY
        engine.cache.unpin(b1)
        engine.cache.unpin(b2)
        assert engine.snapshot()["counters"][m.PREADS] == 1
        engine.release(r.fh)
    finally:
        engine.close()


def test_changed_source_is_never_served_from_cache(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path)
    path = data_dir / "big"
    try:
        r = engine.open("/big")
        first = read_all(engine, r.fh, path.stat().st_size, MIB)
        engine.release(r.fh)
        new = os.urandom(3 * MIB)
        tmp = data_dir / "big.new"
        tmp.write_bytes(new)
        os.replace(tmp, path)
        with pytest.raises(OSError) as info:  # an inode of the old version: the kernel looks up anew
            engine.open("/big", expect=r.key)
        assert info.value.errno == errno.ESTALE
        r2 = engine.open("/big")
        assert r2.key != r.key
        assert read_all(engine, r2.fh, len(new), MIB) == new != first[: len(new)]
        engine.release(r2.fh)
        r3 = engine.open("/big", expect=r2.key)
        assert read_all(engine, r3.fh, len(new), MIB) == new
        engine.release(r3.fh)
    finally:
        engine.close()


def test_source_error_is_reported_and_not_cached(data_dir, tmp_path, monkeypatch):
    engine = make_engine(data_dir, tmp_path)
    try:
        r = engine.open("/big")
        src = engine.handles.get(r.fh).src
        real = type(src).read_into
        fail = {"on": True}

        def flaky(self, offset, view, aligned=False):
            if fail["on"]:
                raise OSError(errno.EIO, "injected")
            return real(self, offset, view, aligned)

        monkeypatch.setattr(type(src), "read_into", flaky)
        with pytest.raises(OSError) as e:
            engine.read(r.fh, 0, MIB)
        assert e.value.errno == errno.EIO
        assert engine.snapshot()["errors"].get("EIO", 0) >= 1
        fail["on"] = False
        expected = (data_dir / "big").read_bytes()
        assert engine.read(r.fh, 0, MIB) == expected[:MIB]
        engine.release(r.fh)
    finally:
        engine.close()


def test_hung_source_read_times_out(data_dir, tmp_path, monkeypatch):
    engine = make_engine(data_dir, tmp_path, **{"readahead.read_timeout": "1", "readahead.enabled": "false"})
    release = threading.Event()
    try:
        r = engine.open("/big")
        src = engine.handles.get(r.fh).src

        def hang(self, offset, view, aligned=False):
            release.wait(30)
            raise OSError(errno.EIO, "gone")

        monkeypatch.setattr(type(src), "read_into", hang)
        t0 = time.monotonic()
        with pytest.raises(OSError) as e:
            engine.read(r.fh, 4096, 4096)
        assert e.value.errno == errno.EIO
        assert time.monotonic() - t0 < 20
        assert engine.snapshot()["counters"][m.TIMEOUTS] == 1
    finally:
        release.set()
        engine.release(r.fh)
        engine.close()


def test_small_file_scan_prefetches_directory_and_serves_opens(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path)
    try:
        names = sorted(os.listdir(data_dir / "small"))
        for name in names[:3]:
            r = engine.open(f"/small/{name}")
            engine.release(r.fh)
        deadline = time.monotonic() + 30
        while engine.snapshot()["counters"][m.SCAN_FILES] < len(names) - 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        c = engine.snapshot()["counters"]
        assert c[m.SCANS] == 1 and c[m.SCAN_FILES] == len(names) - 3
        for name in names[3:]:
            expected = (data_dir / "small" / name).read_bytes()
            assert engine.lstat(f"/small/{name}").st_size == len(expected)
            r = engine.open(f"/small/{name}")
            assert engine.read(r.fh, 0, 65536) == expected
            engine.release(r.fh)
        c = engine.snapshot()["counters"]
        assert c[m.BYTES_SERVED_CACHE] >= (len(names) - 3) * 3073
    finally:
        engine.close()


def test_no_small_file_scan_when_no_file_is_small(data_dir, tmp_path):
    """readahead.small_file_max 0: no file is small, so no scan starts (one would open every file of
    the directory at the source only to find it too large to fetch)."""
    engine = make_engine(data_dir, tmp_path, **{"readahead.small_file_max": "0"})
    try:
        names = sorted(os.listdir(data_dir / "small"))[:10]
        for name in names:
            r = engine.open(f"/small/{name}")
            assert engine.read(r.fh, 0, 65536) == (data_dir / "small" / name).read_bytes()
            engine.release(r.fh)
        time.sleep(0.3)  # (a scan would have run by now)
        c = engine.snapshot()["counters"]
        assert c[m.SCANS] == 0 and c[m.SCAN_FILES] == 0 and c[m.SOURCE_OPENS] == len(names)
    finally:
        engine.close()


def test_npy_format_plan_prefetches_payload(data_dir, tmp_path):
    arr = np.arange(6 * MIB // 8, dtype=np.float64)
    np.save(data_dir / "a.npy", arr)
    engine = make_engine(data_dir, tmp_path)
    try:
        r = engine.open("/a.npy")
        deadline = time.monotonic() + 30
        while engine.snapshot()["counters"][m.FORMAT_PLANS] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.snapshot()["counters"][m.FORMAT_PLANS] == 1
        expected = (data_dir / "a.npy").read_bytes()
        assert read_all(engine, r.fh, len(expected), MIB) == expected
        engine.release(r.fh)
    finally:
        engine.close()


def test_a_shared_library_is_prefetched_one_block_ahead_of_the_loaders_runs(tmp_path):
    """The dynamic loader touches a library in short runs: a window bet of 8 MiB past each went unread."""
    src = tmp_path / "src"
    src.mkdir()
    body = np.random.default_rng(1).bytes(24 * MIB)
    (src / "lib.so").write_bytes(ELF_MAGIC + body[len(ELF_MAGIC) :])
    (src / "data.bin").write_bytes(b"DATA" + body[4:])
    engine = make_engine(src, tmp_path)
    try:
        ahead = {}
        for name in ("lib.so", "data.bin"):
            expected = (src / name).read_bytes()
            r = engine.open("/" + name)
            entry = engine.handles.get(r.fh)
            assert wait_for(lambda entry=entry: entry.format.probed and not entry.format.planning, timeout=10)
            buf = bytearray(MIB)
            for i in range(2, 10):  # one run: 8 reads of 1 MiB from 2 MiB on
                n = engine.read_into(r.fh, i * MIB, memoryview(buf))
                assert bytes(buf[:n]) == expected[i * MIB : (i + 1) * MIB]
            with entry.lock:
                policy = entry.reads.policy
                ahead[name] = (max(s.prefetched_to for s in policy.streams) - 10 * MIB, policy.max_window)
            engine.release(r.fh)
        assert engine.snapshot()["counters"][m.PROGRAMS] == 1
        assert ahead["lib.so"] == (CODE_WINDOW, CODE_WINDOW)
        assert ahead["data.bin"][0] >= 8 * MIB and ahead["data.bin"][1] == 64 * MIB  # the default bet
    finally:
        engine.close()


def test_torch_record_headers_are_fetched_at_open_and_served_from_ram(data_dir, tmp_path):
    import torch

    gen = torch.Generator().manual_seed(3)
    state = {f"w{i}": torch.rand(3 * MIB // 4, generator=gen) for i in range(4)}  # 3 MiB records
    torch.save(state, data_dir / "ckpt.pt")
    data = (data_dir / "ckpt.pt").read_bytes()
    engine = make_engine(data_dir, tmp_path)
    try:
        r = engine.open("/ckpt.pt")
        entry = engine.handles.get(r.fh)
        deadline = time.monotonic() + 30
        head_key = HeadKey(entry.key)  # head windows are a cache key kind of their own, not file blocks
        while not (entry.heads and all(engine.cache.peek(head_key, w.index).state == READY for w in entry.heads)):
            assert time.monotonic() < deadline, "head windows were not fetched"
            time.sleep(0.02)
        # one window per storage record, each holding that record's local header
        assert len(entry.heads) == len(state)
        headers = [i for i in range(len(data)) if data.startswith(b"PK\x03\x04", i) and b"/data/" in data[i : i + 64]]
        assert len(headers) == len(state)
        preads = engine.snapshot()["counters"][m.PREADS]
        for offset in headers:
            page = offset // 4096 * 4096
            buf = bytearray(8192)  # what the kernel asks when torch.load reads a header
            assert engine.read_into(r.fh, page, memoryview(buf)) == 8192
            assert bytes(buf) == data[page : page + 8192]
        assert engine.snapshot()["counters"][m.PREADS] == preads  # all from RAM
        assert read_all(engine, r.fh, len(data), MIB) == data  # payload reads unaffected
        engine.release(r.fh)
        engine.check_invariants()
        # a new version of the path frees the old version's head windows with its blocks
        old_key = entry.key
        torch.save({"w": torch.rand(MIB, generator=gen)}, data_dir / "ckpt.pt")
        r = engine.open("/ckpt.pt")
        assert all(engine.cache.peek(head_key, w.index) is None for w in entry.heads)
        assert engine.cache.peek(old_key, 0) is None
        assert engine.read(r.fh, 0, 64) == (data_dir / "ckpt.pt").read_bytes()[:64]
        engine.release(r.fh)
    finally:
        engine.close()


def test_file_read_whole_is_released_whole_at_open_next_time(data_dir, tmp_path):
    arr = np.arange(12 * MIB // 8, dtype=np.float64)
    np.save(data_dir / "a.npy", arr)
    np.save(data_dir / "lazy.npy", arr)
    expected = (data_dir / "a.npy").read_bytes()

    def planned(engine, fh):
        deadline = time.monotonic() + 30
        while engine.handles.get(fh).range_plan is None:
            assert time.monotonic() < deadline, "no format plan"
            time.sleep(0.02)

    first = make_engine(data_dir, tmp_path)
    try:
        whole, lazy = first.open("/a.npy"), first.open("/lazy.npy")
        planned(first, whole.fh)
        planned(first, lazy.fh)
        assert read_all(first, whole.fh, len(expected), MIB) == expected  # read whole
        assert first.read(lazy.fh, 6 * MIB, 4096) == expected[6 * MIB : 6 * MIB + 4096]  # one page
        first.release(whole.fh)
        first.release(lazy.fh)
        assert first.snapshot()["counters"][m.LEARNED_WHOLE] == 0
    finally:
        first.close()  # saves what it learned
    second = make_engine(data_dir, tmp_path)  # same state directory: a remount
    try:
        r = second.open("/a.npy")
        planned(second, r.fh)
        counters = second.snapshot()["counters"]
        assert counters[m.LEARNED_WHOLE] == 1
        # queued at open, no read yet: the fills complete on the pool (counted then), so wait for them
        deadline = time.monotonic() + 30
        while second.snapshot()["counters"][m.BYTES_FETCHED_PREFETCH] < len(expected) - 2 * MIB:
            assert time.monotonic() < deadline, second.snapshot()["counters"]
            time.sleep(0.02)
        assert read_all(second, r.fh, len(expected), MIB) == expected
        second.release(r.fh)
        r = second.open("/lazy.npy")  # read lazily last time: the cautious plan
        planned(second, r.fh)
        assert second.snapshot()["counters"][m.LEARNED_WHOLE] == 1
        second.release(r.fh)
    finally:
        second.close()


def test_reconfigure_changes_budget_and_reports_restart_keys(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path)
    try:
        new = load_config(
            overrides={
                "cache.budget": "20M",
                "cache.block_size": "1M",
                "cache.workers": "4",
                "state.dir": str(tmp_path / "state"),
                "cache.check_invariants": "true",
            },
            use_default_path=False,
        )
        restart = engine.reconfigure(new)
        assert engine.snapshot()["gauges"]["cache_budget"] == 20 * MIB
        assert restart == ["cache.workers"]
    finally:
        engine.close()


def test_no_open_reads_by_path(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path)
    try:
        expected = (data_dir / "big").read_bytes()
        buf = bytearray(MIB)
        n = engine.read_into(0, 5 * MIB, memoryview(buf), path="/big")
        assert n == MIB and bytes(buf) == expected[5 * MIB : 6 * MIB]
        with pytest.raises(OSError):
            engine.read_into(0, 0, memoryview(buf), path="/nope")
    finally:
        engine.close()


def test_write_flags_and_bad_handles(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path)
    try:
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_APPEND):
            with pytest.raises(OSError) as e:
                engine.open("/big", flags)
            assert e.value.errno == errno.EROFS
        with pytest.raises(OSError) as e:
            engine.read(12345, 0, 10)
        assert e.value.errno == errno.EBADF
        r = engine.open("/empty")
        assert engine.read(r.fh, 0, 100) == b""
        assert engine.read(r.fh, 10**15, 100) == b""
        engine.release(r.fh)
        with pytest.raises(OSError):
            engine.open("/../etc/passwd")
    finally:
        engine.close()


def test_warm_fetches_tree(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path, **{"cache.budget": "64M"})
    try:
        result = warm_now(engine, "/small")
        assert result["files_done"] == result["files_total"] == 40
        assert result["bytes_done"] == result["bytes_total"] == 40 * 3073
        assert result["done"] and result["failed"] == result["declined"] == result["skipped"] == 0
        r = engine.open("/small/f000")
        assert engine.read(r.fh, 0, 4096) == (data_dir / "small" / "f000").read_bytes()
        engine.release(r.fh)
        assert engine.snapshot()["counters"][m.BYTES_SERVED_CACHE] == 3073
    finally:
        engine.close()


def test_no_open_implicit_handles_are_bounded_and_spare_real_handles(data_dir, tmp_path, monkeypatch):
    from fastfs.fsio import handles as handles_module

    monkeypatch.setattr(handles_module, "MAX_IMPLICIT", 2)
    engine = make_engine(data_dir, tmp_path)
    try:
        expected = (data_dir / "big").read_bytes()
        real = engine.open("/big")
        buf = bytearray(4096)
        assert engine.read_into(0, 0, memoryview(buf), path="/big") == 4096
        for i in range(5):
            name = f"/small/f{i:03d}"
            n = engine.read_into(0, 0, memoryview(buf), path=name)
            assert bytes(buf[:n]) == (data_dir / name.lstrip("/")).read_bytes()
        assert len(engine.handles._implicit) == 2
        assert len(engine.handles._handles) == 3  # the real handle plus two implicit ones
        assert engine.read(real.fh, 123, 1000) == expected[123:1123]
        engine.release(real.fh)
    finally:
        engine.close()


def test_top_files_count_what_each_file_delivered_and_fetched(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path, **{"readahead.formats": "false"})
    try:
        expected = (data_dir / "big").read_bytes()
        r = engine.open("/big")
        assert read_all(engine, r.fh, len(expected), MIB) == expected
        engine.release(r.fh)
        rows = {row["path"]: row for row in engine.snapshot()["top_files"]}
        big = rows["/big"]
        assert big["delivered"] == len(expected)
        assert len(expected) <= big["fetched"] <= len(expected) + 8 * MIB
        assert 1.0 <= big["amplification"] <= 1.5
    finally:
        engine.close()


@pytest.mark.parametrize("timeout", ["0", "5"])
def test_large_exact_reads_are_split_over_streams_and_byte_exact(data_dir, tmp_path, monkeypatch, timeout):
    engine = make_engine(data_dir, tmp_path, **{"readahead.enabled": "false", "readahead.read_timeout": timeout})
    expected = (data_dir / "big").read_bytes()
    try:
        r = engine.open("/big")
        src = engine.handles.get(r.fh).src
        real = type(src).read_into
        pieces: list[tuple[int, int, bool]] = []

        def counting(self, offset, view, aligned=False):
            pieces.append((offset, len(view), aligned))
            return real(self, offset, view, aligned)

        monkeypatch.setattr(type(src), "read_into", counting)
        for offset, size in [(0, MIB), (4096, 3 * MIB + 7), (19 * MIB, 2 * MIB), (8192, 4096)]:
            pieces.clear()
            assert engine.read(r.fh, offset, size) == expected[offset : offset + size]
            if size >= MIB:  # split into page-aligned pieces read in parallel (a short tail goes as it is)
                big = [p for p in pieces if p[1] >= 64 * 1024]
                assert len(big) > 1 and all(aligned and off % 4096 == 0 for off, _, aligned in big)
            else:  # a small read goes as it is
                assert pieces == [(offset, size, False)]
        engine.release(r.fh)
    finally:
        engine.close()


def test_block_fills_are_split_over_streams_and_a_failed_piece_fails_the_block(data_dir, tmp_path, monkeypatch):
    engine = make_engine(data_dir, tmp_path, **{"cache.block_size": "4M", "readahead.source_streams": "4"})
    expected = (data_dir / "big").read_bytes()  # 20 MiB + 4097: the last block is 4097 bytes
    try:
        r = engine.open("/big")
        src = engine.handles.get(r.fh).src
        real = type(src).read_into
        pieces: list[tuple[int, int, bool]] = []
        fail_at: set[int] = set()

        def counting(self, offset, view, aligned=False):
            pieces.append((offset, len(view), aligned))
            if offset in fail_at:
                fail_at.discard(offset)  # once: the reader's direct read of the same bytes succeeds
                raise OSError(errno.EIO, "injected")
            return real(self, offset, view, aligned)

        monkeypatch.setattr(type(src), "read_into", counting)
        # one piece of the second block fails: its readers get the bytes from the source directly,
        # the failure is not cached, and a later fill of the block succeeds
        fail_at.add(4 * MIB + 2 * MIB)
        assert read_all(engine, r.fh, len(expected), MIB) == expected
        fills = [p for p in pieces if p[1] == MIB and p[2]]
        assert {off for off, _, _ in fills} >= {i * MIB for i in range(20)}  # 1 MiB pieces cover the blocks
        assert not fail_at and engine.snapshot()["errors"].get("EIO", 0) >= 1  # the failure happened
        block = engine.cache.peek(engine.handles.get(r.fh).key, 1)
        if block is not None:  # fetched again after the failure: whole and right
            assert block.done.wait(10) and block.state == READY
            assert bytes(block.view[: block.length]) == expected[4 * MIB : 8 * MIB]
        engine.release(r.fh)
    finally:
        engine.close()


def test_reads_from_ram_blocks_are_sent_without_a_copy(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path, **{"cache.budget": "64M"})
    data = (data_dir / "big").read_bytes()
    try:
        warm_now(engine, "/big")
        r = engine.open("/big")
        dest = memoryview(bytearray(3 * MIB))
        parts = ReplyParts()
        offset = MIB // 2  # spans block boundaries
        n = engine.read_into(r.fh, offset, dest, parts=parts)
        assert n == 3 * MIB
        assert b"".join(parts.views) == data[offset : offset + n]
        assert bytes(dest[:16]) == bytes(16)  # nothing was copied into the buffer
        assert len(parts.blocks) == 4 and all(b.pins >= 1 for b in parts.blocks)
        blocks = list(parts.blocks)
        engine.release_parts(parts)
        assert all(b.pins == 0 for b in blocks) and parts.views == []
        # bytes that are not in RAM come from the source into the buffer, in order with the rest
        engine.cache.invalidate_file(r.key)
        parts = ReplyParts()
        n = engine.read_into(r.fh, len(data) - 5000, dest, parts=parts)
        assert b"".join(parts.views) == data[-5000:] and n == 5000
        engine.release_parts(parts)
        engine.release(r.fh)
    finally:
        engine.close()


def test_lstat_many_overlaps_round_trips_on_remote_sources(data_dir, tmp_path, monkeypatch):
    engine = make_engine(data_dir, tmp_path)
    try:
        real = engine.source.lstat

        def slow(path):
            time.sleep(0.1)
            return real(path)

        monkeypatch.setattr(engine.source, "lstat", slow)
        names = sorted(os.listdir(data_dir / "small"))[:16]
        paths = [f"/small/{n}" for n in names] + ["/small/missing"]
        engine.source.local = True
        t0 = time.monotonic()
        serial = engine.lstat_many(paths)
        serial_s = time.monotonic() - t0
        engine.source.local = False
        t0 = time.monotonic()
        parallel = engine.lstat_many(paths)
        parallel_s = time.monotonic() - t0
        assert [st.st_ino for st in serial[:-1]] == [os.lstat(data_dir / "small" / n).st_ino for n in names]
        assert serial[-1] is None and parallel[-1] is None
        assert [st.st_ino for st in parallel[:-1]] == [st.st_ino for st in serial[:-1]]
        assert serial_s > 1.6 and parallel_s < 0.6, (serial_s, parallel_s)
    finally:
        engine.close()


def test_block_read_streams_stay_within_the_mount_descriptor_budget(tmp_path):
    """Issue 12 finding 8: extra block-read descriptors come from a per-mount budget; beyond it block
    reads use each file's own descriptor (right bytes, no EMFILE) and closing returns them."""
    from fastfs.fsio.source import Source, stream_fd_budget

    assert stream_fd_budget(1024) == 480 and stream_fd_budget(10) == 0
    root = tmp_path / "src"
    root.mkdir()
    data = {i: random.Random(i).randbytes(2 * MIB) for i in range(4)}
    for i, payload in data.items():
        (root / f"f{i}").write_bytes(payload)
    source = Source(str(root), direct=True, streams=4, stream_budget=3)
    files = [source.open_file(f"/f{i}") for i in range(4)]
    try:
        buf = mmap_buffer(MIB)
        for i, f in enumerate(files):
            for off in range(0, 2 * MIB, MIB):
                assert f.read_into(off, memoryview(buf), aligned=True) == MIB
                assert bytes(buf) == data[i][off : off + MIB]
            assert source.stream_fds <= 3
        assert source.stream_fds == 3
    finally:
        for f in files:
            f.close()
        source.close()
    assert source.stream_fds == 0


def mmap_buffer(size: int):
    import mmap

    return mmap.mmap(-1, size)


def test_pool_runs_at_most_file_workers_jobs_of_one_file():
    """Issue 12 finding 7: jobs of one file beyond its share are parked, not run, and other files'
    jobs get workers meanwhile; parked jobs run as the file's running ones finish."""
    from fastfs.fsio.pool import DEMAND, GENERAL, FileGroup, PreadPool

    pool = PreadPool(4, demand_workers=4, file_workers=2)
    hung, other = FileGroup(), FileGroup()
    release = threading.Event()
    lock = threading.Lock()
    running = {"now": 0, "max": 0}
    done: list[str] = []

    class Job:
        def __init__(self, group, name, block):
            self.group, self.name, self.block = group, name, block

        def __call__(self):
            if self.block:
                with lock:
                    running["now"] += 1
                    running["max"] = max(running["max"], running["now"])
                release.wait(30)
                with lock:
                    running["now"] -= 1
            with lock:
                done.append(self.name)

    try:
        for i in range(6):
            pool.submit_demand(Job(hung, f"hung{i}", True))
        assert pool.submit_prefetch_all([Job(hung, f"hungp{i}", True) for i in range(4)])
        assert wait_until(lambda: hung.running == [2, 2])
        pool.submit_demand(Job(other, "other-demand", False))
        assert pool.submit_prefetch(Job(other, "other-prefetch", False))
        assert wait_until(lambda: {"other-demand", "other-prefetch"} <= set(done))
        assert len(hung.parked[DEMAND]) == 4 and len(hung.parked[GENERAL]) == 2
        assert running["max"] == 4  # two per kind
        release.set()
        assert wait_until(lambda: len(done) == 12)
        assert hung.running == [0, 0] and not hung.parked[DEMAND] and not hung.parked[GENERAL]
    finally:
        release.set()
        pool.close()


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_reads_of_a_file_with_stuck_reads_fail_fast_until_they_return(data_dir, tmp_path, monkeypatch):
    """Issue 12 finding 7: after a read of a file timed out with its source read still stuck, later
    reads of it fail at once without queuing more source reads; once the stuck read returns, reads work."""
    from fastfs.fsio import fills as fills_module

    monkeypatch.setattr(fills_module, "UNSTUCK_WAIT", 0.05)
    engine = make_engine(data_dir, tmp_path, **{"readahead.read_timeout": "1", "readahead.enabled": "false"})
    expected = (data_dir / "big").read_bytes()
    release = threading.Event()
    calls: list[int] = []
    try:
        r = engine.open("/big")
        src = engine.handles.get(r.fh).src
        real = type(src).read_into

        def hang(self, offset, view, aligned=False):
            calls.append(offset)
            if not release.is_set():
                release.wait(30)
            return real(self, offset, view, aligned)

        monkeypatch.setattr(type(src), "read_into", hang)
        with pytest.raises(OSError):
            engine.read(r.fh, 4096, 4096)
        assert engine.handles.get(r.fh).stuck == 1
        before = len(calls)
        t0 = time.monotonic()
        for offset in (MIB, 2 * MIB, 3 * MIB):
            with pytest.raises(OSError) as e:
                engine.read(r.fh, offset, 4096)
            assert e.value.errno == errno.EIO
        assert time.monotonic() - t0 < 1.0  # no read waited for the timeout
        assert len(calls) == before  # and none reached the source
        assert engine.snapshot()["counters"][m.FAST_FAILS] == 3
        release.set()
        assert wait_until(lambda: engine.handles.get(r.fh).stuck == 0)
        assert engine.read(r.fh, MIB, 4096) == expected[MIB : MIB + 4096]
    finally:
        release.set()
        engine.release(r.fh)
        engine.close()


def test_small_reads_run_inline_and_an_abandoned_one_counts_as_stuck(data_dir, tmp_path, monkeypatch):
    """With the kernel layer's watchdog (inline_reads), an exact small read runs on the reader's own
    thread (no pool hand-off); when the watchdog gives up on it, the file counts a stuck read, so later
    reads fail fast without reaching the source until the hung read returns."""
    from fastfs.fsio import fills as fills_module

    monkeypatch.setattr(fills_module, "UNSTUCK_WAIT", 0.05)
    engine = make_engine(data_dir, tmp_path, **{"readahead.read_timeout": "1", "readahead.enabled": "false"})
    engine.inline_reads = True
    expected = (data_dir / "big").read_bytes()
    release = threading.Event()
    threads: list[int] = []
    try:
        r = engine.open("/big")
        src = engine.handles.get(r.fh).src
        real = type(src).read_into

        def hang(self, offset, view, aligned=False):
            threads.append(threading.get_ident())
            if offset == 4096 and not release.is_set():
                release.wait(30)
            return real(self, offset, view, aligned)

        monkeypatch.setattr(type(src), "read_into", hang)
        assert engine.read(r.fh, 0, 100) == expected[:100]
        assert threads == [threading.get_ident()]  # inline: the reader's own thread
        stuck_reader = threading.Thread(target=lambda: engine.read(r.fh, 4096, 100))
        stuck_reader.start()
        assert wait_until(lambda: len(threads) == 2)
        engine.abandoned_read(r.fh)  # what the watchdog does when it answers that request
        engine.abandoned_read(r.fh)  # a second report of the same read counts once
        assert engine.handles.get(r.fh).stuck == 1
        with pytest.raises(OSError) as e:
            engine.read(r.fh, 8192, 100)
        assert e.value.errno == errno.EIO and len(threads) == 2  # failed fast, no source read
        release.set()
        stuck_reader.join(10)
        assert engine.handles.get(r.fh).stuck == 0
        assert engine.read(r.fh, 8192, 100) == expected[8192:8292]
        engine.release(r.fh)
    finally:
        release.set()
        engine.close()


def test_shuffled_scan_of_a_directory_larger_than_the_budget_wastes_nothing(tmp_path):
    """A scan keeps at most half the budget fetched ahead, counted per file it fetched (opens of other
    files do not make room), so files fetched ahead are read before the cache could evict them."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    size = 256 * 1024
    data = {f"f{i:03d}": random.Random(i).randbytes(size) for i in range(256)}  # 64 MiB, 4x the budget
    for name, payload in data.items():
        (src / "d" / name).write_bytes(payload)
    engine = make_engine(src, tmp_path, **{"cache.budget": "16M", "readahead.learn": "false"})
    try:
        order = sorted(data)
        random.Random(7).shuffle(order)
        for name in order:
            r = engine.open(f"/d/{name}")
            assert engine.read(r.fh, 0, size) == data[name]
            engine.check_invariants()
            engine.release(r.fh)
            scan = engine.scanner._dirs["/d"]
            assert scan.ahead_bytes <= engine.cache.budget // 2
        counters = engine.snapshot()["counters"]
        assert counters["small_file_scan_files"] > 0
        assert counters["bytes_prefetch_wasted"] == 0
        fetched = counters["bytes_fetched_demand"] + counters["bytes_fetched_prefetch"]
        assert fetched <= len(data) * size * 1.01
    finally:
        engine.close()


@pytest.mark.parametrize("skipped_first", [False, True])
def test_a_new_epoch_over_files_the_kernel_holds_fetches_metadata_only(tmp_path, monkeypatch, skipped_first):
    """Second pass on the same mount: the kernel keeps the files' pages, so the scan fetches no data,
    only the metadata, and the opens (of inodes opened before) need no source round trip.
    *skipped_first*: epoch 1's scan left the first file epoch 2 opens to its reader (opened first: no
    metadata kept), as a race decides now and then; epoch 2's scan starts after that open and does not
    plan it, so the wait is for the files still to come, not for all of them (it timed out so)."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    data = {f"f{i:03d}": random.Random(i).randbytes(3000) for i in range(60)}
    for name, payload in data.items():
        (src / "d" / name).write_bytes(payload)
    engine = make_engine(src, tmp_path, **{"readahead.learn": "false"})
    try:
        for name in sorted(data):  # epoch 1: the reader reads every file through fastfs
            r = engine.open(f"/d/{name}")
            assert engine.read(r.fh, 0, 4096) == data[name]
            engine.release(r.fh)
        # epoch 1's scan done (a fetch still in flight would count its bytes after the snapshot below)
        assert wait_until(lambda: engine.scanner.active_scans() == 0)
        for key in list(engine.handles.versions.values()):  # fastfs's RAM has dropped them; the kernel has not
            engine.cache.invalidate_file(key)
        fetched = engine.snapshot()["counters"]["bytes_fetched_prefetch"]
        opens: list[str] = []
        real_open = engine.source.open_file
        monkeypatch.setattr(engine.source, "open_file", lambda p: opens.append(p) or real_open(p))
        order = sorted(data)
        random.Random(3).shuffle(order)
        if skipped_first:
            engine.scanner.forget([f"/d/{order[0]}"])
        for i, name in enumerate(order):  # epoch 2: the kernel serves the data (cached=True)
            r = engine.open(f"/d/{name}", cached=True)
            engine.release(r.fh)
            if i == 5:
                assert wait_until(lambda: all(engine.scanner.meta(f"/d/{n}") is not None for n in order[6:]))
        assert engine.snapshot()["counters"]["bytes_fetched_prefetch"] == fetched  # no data fetched again
        assert len(opens) <= 12, opens  # the first few opens before the scan's metadata came
    finally:
        engine.close()


# -- direct reads (the kernel layer's, see fsio/readpath.py) ------------------------------------------
def _tally(reads: int, nbytes: int, ring: tuple = (), seconds: float = 0.001):
    from fastfs.fsio.readpath import DirectTally

    latency = (0,) * 3 + (reads,) + (0,) * (len(m.LATENCY_BUCKETS) - 3)
    return DirectTally(reads, nbytes, seconds, latency, {12: reads} if reads else {}, ring)


def test_direct_reads_are_offered_only_for_exact_reads_that_join_no_sequential_stream(data_dir, tmp_path):
    engine = make_engine(data_dir, tmp_path, **{"readahead.formats": "false"})
    engine.inline_reads = True
    expected = (data_dir / "big").read_bytes()
    try:
        r = engine.open("/big")
        assert engine.direct_offer(r.fh) is None  # nothing read yet
        assert engine.read(r.fh, 5 * MIB, 4096) == expected[5 * MIB : 5 * MIB + 4096]
        offer = engine.direct_offer(r.fh)
        assert offer is not None and offer.size == len(expected)
        assert os.pread(offer.fd, 100, 5 * MIB) == expected[5 * MIB : 5 * MIB + 100]  # the version's descriptor
        (low, high), *_ = offer.windows
        assert low <= 5 * MIB + 4096 <= high and high - low <= 2 * 16 * 4096  # around where a stream would go on
        read_all(engine, r.fh, len(expected), MIB)  # a sequential stream from 0: served from blocks
        assert engine.direct_offer(r.fh) is None
        engine.release(r.fh)
        assert engine.direct_offer(r.fh) is None  # released
        engine.inline_reads = False  # exact reads on the pool under the read timeout: never handed over
        r = engine.open("/big")
        engine.read(r.fh, 7 * MIB, 4096)
        assert engine.direct_offer(r.fh) is None
        engine.release(r.fh)
    finally:
        engine.close()


def test_a_small_file_read_whole_is_not_offered_to_the_kernel_layer(tmp_path):
    """A read that took the whole file leaves the kernel every page: the loop would never answer one of
    its reads, and the descriptor it duplicates costs a close at the source of its own (a FLUSH; over
    s3fs a HEAD: 3 HEADs a small file through fastfs, against a direct reader's 2)."""
    src = tmp_path / "src"
    src.mkdir()
    data = random.Random(2).randbytes(3000)
    (src / "small").write_bytes(data)
    (src / "larger").write_bytes(data * 4)
    engine = make_engine(src, tmp_path, **{"readahead.formats": "false", "readahead.scan_trigger": "1000"})
    engine.inline_reads = True
    try:
        r = engine.open("/small")
        assert engine.read(r.fh, 0, 4096) == data  # (the kernel's first read: a page, the whole file)
        assert engine.direct_offer(r.fh) is None
        engine.release(r.fh)
        r = engine.open("/larger")
        assert engine.read(r.fh, 4096, 4096) == (data * 4)[4096:8192]  # part of it: later reads may come
        assert engine.direct_offer(r.fh) is not None
        engine.release(r.fh)
    finally:
        engine.close()


def test_no_direct_reads_for_a_file_with_a_format_plan_or_a_disk_tier(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.arange(4 * MIB, dtype=np.uint8))
    (src / "b.bin").write_bytes(random.Random(1).randbytes(8 * MIB))
    for overrides in ({}, {"cache.disk_dir": str(tmp_path / "disk"), "cache.disk_budget": "64M"}):
        engine = make_engine(src, tmp_path, **overrides)
        engine.inline_reads = True
        try:
            r = engine.open("/a.npy")  # a format plan: the plan decides what is fetched, it must see reads
            wait_until(lambda r=r, e=engine: not e.handles.get(r.fh).format.planning)
            engine.read(r.fh, 3 * MIB, 4096)
            assert engine.direct_offer(r.fh) is None
            engine.release(r.fh)
            r = engine.open("/b.bin")
            wait_until(lambda r=r, e=engine: not e.handles.get(r.fh).format.planning)
            engine.read(r.fh, 3 * MIB, 4096)
            assert (engine.direct_offer(r.fh) is None) == bool(overrides), overrides  # the tier may hold it
            engine.release(r.fh)
        finally:
            engine.close()


def test_what_the_kernel_layer_served_is_counted_and_fed_to_the_policy(data_dir, tmp_path):
    """The kernel layer's tally counts as the engine counts its own reads, and its last reads reach the
    stream policy: a read continuing them joins their stream, three make it sequential."""
    engine = make_engine(data_dir, tmp_path, **{"readahead.formats": "false"})
    engine.inline_reads = True
    expected = (data_dir / "big").read_bytes()
    try:
        r = engine.open("/big")
        engine.read(r.fh, 0, 4096)
        before = engine.snapshot()["counters"]
        ring = tuple((i * MIB, 4096) for i in (3, 9, 12))
        engine.direct_served(r.fh, _tally(5, 5 * 4096, ring))
        c = engine.snapshot()["counters"]
        for key, grew in (
            (m.READ_REQUESTS, 5),
            (m.DIRECT_READS, 5),
            (m.PREADS, 5),
            (m.BYTES_REQUESTED, 5 * 4096),
            (m.BYTES_FETCHED_DEMAND, 5 * 4096),
            (m.RANDOM_STREAMS, 5),
        ):
            assert c[key] - before[key] == grew, key
        snap = engine.snapshot()
        assert snap["request_sizes"]["4096"] == 1 + 5  # the engine's own read and the five
        latency = snap["pread_latency"]["buckets"]
        assert latency[str(m.LATENCY_BUCKETS[3])] >= 5 and snap["pread_latency"]["sum_seconds"] >= 0.001
        windows = engine.direct_offer(r.fh).windows
        assert all(any(low <= off + 4096 <= high for low, high in windows) for off, _ in ring)
        # the reads go on from the last one the kernel layer served: the policy knows its stream
        pos = 12 * MIB + 4096
        for _ in range(40):
            assert engine.read(r.fh, pos, 128 * 1024) == expected[pos : pos + 128 * 1024]
            pos += 128 * 1024
        assert engine.snapshot()["counters"][m.SEQ_STREAMS] == 1
        engine.release(r.fh)
    finally:
        engine.close()


def test_a_stuck_direct_read_makes_the_file_fail_fast_until_it_returns(data_dir, tmp_path, monkeypatch):
    """The kernel layer's watchdog answered a read the kernel layer preads itself: the file counts it as
    stuck (later reads fail fast, without reaching the source) until the pread returns, whenever that is."""
    from fastfs.fsio import fills as fills_module

    monkeypatch.setattr(fills_module, "UNSTUCK_WAIT", 0.05)
    engine = make_engine(data_dir, tmp_path, **{"readahead.read_timeout": "1", "readahead.formats": "false"})
    engine.inline_reads = True
    expected = (data_dir / "big").read_bytes()
    try:
        r = engine.open("/big")
        engine.read(r.fh, 0, 4096)
        engine.direct_stuck(r.fh, 1)
        assert engine.handles.get(r.fh).stuck == 1
        assert engine.snapshot()["counters"][m.TIMEOUTS] == 1
        with pytest.raises(OSError) as e:
            engine.read(r.fh, MIB, 4096)
        assert e.value.errno == errno.EIO
        assert engine.direct_offer(r.fh) is None
        engine.direct_unstuck(r.fh)
        assert engine.handles.get(r.fh).stuck == 0
        assert engine.read(r.fh, MIB, 4096) == expected[MIB : MIB + 4096]
        engine.direct_unstuck(r.fh)  # a read that returns before it is counted stuck is never counted
        engine.direct_stuck(r.fh, 1)
        assert engine.handles.get(r.fh).stuck == 0
        assert engine.read(r.fh, 2 * MIB, 4096) == expected[2 * MIB : 2 * MIB + 4096]
        engine.release(r.fh)
    finally:
        engine.close()


def test_a_block_whose_fill_failed_is_not_filled_again_for_every_read(tmp_path) -> None:
    """A block's fill fails (over rclone: a file replaced by a smaller one under a stale size, each fill
    failing after the client's retries) while exact reads of it work: the reads that follow go to the
    source exactly, and the fill is not tried again. Failed before: every read (the kernel asks page by
    page after a failed read-ahead) made a new fill of the block, one failure each (one read of the
    file waited 41-53 s over rclone)."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(3 * MIB)
    (src / "f.bin").write_bytes(data)
    engine = make_engine(src, tmp_path, **{"fuse.passthrough": "off", "readahead.formats": "false"})
    fills = engine.fills
    real = fills.timed_pread
    failed: list[tuple[int, int]] = []

    def failing(src_file, pos, view, path, *args, **kwargs):
        if len(view) >= MIB:  # a block's fill (whole 1 MiB blocks); the exact reads below are 4 KiB
            failed.append((pos, len(view)))
            raise OSError(errno.EIO, "the source failed", path)
        return real(src_file, pos, view, path, *args, **kwargs)

    fills.timed_pread = failing
    try:
        fh = engine.open("/f.bin").fh
        for offset in range(0, 64 * 1024, 4096):  # page by page through block 0
            assert engine.read(fh, offset, 4096) == data[offset : offset + 4096]
        assert engine.read(fh, MIB + 8192, 4096) == data[MIB + 8192 : MIB + 12288]  # block 1 too
        engine.release(fh)
    finally:
        fills.timed_pread = real
        engine.close()
    starts = [p for p, _ in failed]
    assert 0 in starts and MIB in starts, failed
    assert len(starts) == len(set(starts)), failed  # one failed fill per block, never again
