"""The disk cache tier wired into the engine, without FUSE: keys, fills from disk, writes, opens, warms.

The source is made unreadable by patching :meth:`SourceFile.read_into` (what every source read of the
engine goes through), so a byte that is not served from the disk tier fails the read.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from pathlib import Path

import pytest

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.disk import index as diskindex
from fastfs.fsio.disk import store as diskcache
from fastfs.fsio.disk.directory import DATA, DiskCacheError
from fastfs.fsio.disk.tier import KEY_FORMAT, DiskTier
from fastfs.fsio.engine import Engine
from fastfs.fsio.policy import ROUTE_PASSTHROUGH, ROUTE_SERVED
from fastfs.fsio.source import LOCAL_FS_TYPES, SourceFile
from fastfs.fsio.warm import warm_now

MIB = 1024 * 1024
FUSE_SUPER_MAGIC = 0x65735546


def make_engine(src: Path, tmp_path: Path, **overrides: str) -> Engine:
    opts = {
        "cache.budget": "64M",  # (the write queue pins up to a quarter of it: 16 MiB)
        "cache.block_size": "1M",
        "state.dir": str(tmp_path / "state"),
        "cache.disk_dir": str(tmp_path / "disk"),
        "readahead.learn": "false",
    }
    opts.update(overrides)
    return Engine(str(src), load_config(overrides=opts, use_default_path=False))


def read_file(engine: Engine, path: str, chunk: int = MIB) -> bytes:
    r = engine.open(path)
    try:
        out = bytearray()
        while data := engine.read(r.fh, len(out), chunk):
            out += data
        return bytes(out)
    finally:
        engine.release(r.fh)


def settle(engine: Engine) -> None:
    assert engine.disk.store.flush(30)


@pytest.fixture
def data(tmp_path: Path) -> dict[str, bytes]:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    files = {"/big": os.urandom(9 * MIB + 4097), "/mid": os.urandom(MIB)}
    files.update({f"/d/s{i:02d}": os.urandom(3000 + i) for i in range(12)})
    for name, content in files.items():
        (src / name.lstrip("/")).write_bytes(content)
    return files


@pytest.fixture
def no_source(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every source read fails with EIO from now on; returns the list of reads tried."""
    tried: list[str] = []

    def fail(self: SourceFile, offset: int, view: memoryview, aligned: bool = False) -> int:
        tried.append(f"{offset}+{len(view)}")
        raise OSError(errno.EIO, "source unreachable")

    def arm() -> list[str]:
        monkeypatch.setattr(SourceFile, "read_into", fail)
        return tried

    return arm  # type: ignore[return-value]


# -- keys --------------------------------------------------------------------------------------------
def test_disk_key_is_stable_across_devices_and_changes_with_the_version(tmp_path: Path) -> None:
    store = diskcache.DiskStore(str(tmp_path / "c"), budget_share=0.5)
    try:
        local = DiskTier(store, "/data", next(iter(LOCAL_FS_TYPES)))
        fuse = DiskTier(store, "/data", FUSE_SUPER_MAGIC)
        version = (10, 555, 4096, 1_000_000_007, 1_000_000_009)
        remounted = (99, 555, 4096, 1_000_000_007, 1_000_000_009)  # a new st_dev after a remount
        assert local.key("/a", version) == local.key("/a", remounted)
        assert local.key("/a", version)[0] == KEY_FORMAT and diskindex.valid_key(local.key("/a", version))
        # inode numbers count on local filesystems (stable there), not on FUSE sources (per-mount numbering)
        renumbered = (99, 777, 4096, 1_000_000_007, 1_000_000_009)
        assert local.key("/a", renumbered) != local.key("/a", version)
        assert fuse.key("/a", renumbered) == fuse.key("/a", version)
        for changed in (
            (10, 555, 4097, 1_000_000_007, 1_000_000_009),  # size
            (10, 555, 4096, 1_000_000_008, 1_000_000_009),  # mtime
            (10, 555, 4096, 1_000_000_007, 1_000_000_010),  # ctime
        ):
            assert local.key("/a", changed) != local.key("/a", version)
            assert fuse.key("/a", changed) != fuse.key("/a", version)
        assert local.key("/b", version) != local.key("/a", version)  # another path
        assert DiskTier(store, "/other", FUSE_SUPER_MAGIC).key("/a", version) != fuse.key("/a", version)  # tree
    finally:
        store.close()


# -- reads and writes --------------------------------------------------------------------------------
def test_second_engine_reads_everything_from_disk_with_the_source_failing(data, tmp_path, no_source) -> None:
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path)
    try:
        for name, content in data.items():
            assert read_file(engine, name) == content
        settle(engine)
        c = engine.snapshot()["counters"]
        assert c[diskcache.BYTES_WRITTEN] == sum(len(v) for v in data.values())
        assert c[diskcache.HITS] == 0
    finally:
        engine.close()
    tried = no_source()
    engine = make_engine(src, tmp_path)
    try:
        for chunk in (MIB, 4096, 3 * MIB + 7):
            for name, content in data.items():
                assert read_file(engine, name, chunk) == content, (name, chunk)
                engine.cache.invalidate_file(engine.version_key(name))  # the next pass reads disk again
        snap = engine.snapshot()
        c = snap["counters"]
        assert tried == [] and snap["errors"] == {}
        assert c[m.BYTES_FETCHED_DEMAND] == c[m.BYTES_FETCHED_PREFETCH] == 0
        assert c[diskcache.HIT_BYTES] >= 3 * sum(len(v) for v in data.values())
        assert c[diskcache.CORRUPT] == 0
    finally:
        engine.close()


def test_fill_reads_disk_before_the_source_and_falls_back_for_what_it_lacks(data, tmp_path, no_source) -> None:
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path)
    try:
        r = engine.open("/big")
        assert engine.read(r.fh, 0, MIB) == data["/big"][:MIB]  # block 0 (and the prefetch window)
        engine.release(r.fh)
        settle(engine)
    finally:
        engine.close()
    engine = make_engine(src, tmp_path, **{"readahead.enabled": "false"})
    try:
        tier = engine.disk
        key = engine.version_key("/big")
        dkey = tier.key("/big", key)
        assert tier.holds(dkey, 0, MIB)
        held = tier.store.held_bytes(dkey)
        assert MIB <= held < len(data["/big"])
        tried = no_source()
        block = engine.warm_block(engine.hold("/big")[1], 0)
        assert block.done.wait(10) and bytes(block.view[: block.length]) == data["/big"][:MIB]
        engine.cache.unpin(block)
        fh, entry = engine.hold("/big")
        last = len(data["/big"]) // MIB  # the tail block was never fetched: the source is asked, and fails
        block = engine.warm_block(entry, last)
        assert block.done.wait(10) and block.errno == errno.EIO and tried
        engine.cache.unpin(block)
        engine.release(fh)
    finally:
        engine.close()


def test_exact_reads_outside_blocks_use_the_tier(data, tmp_path, no_source) -> None:
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path, **{"readahead.enabled": "false"})  # every read exact: no blocks
    try:
        assert read_file(engine, "/d/s00") == data["/d/s00"]  # a small file read whole: a copy to the tier
        r = engine.open("/big")
        assert engine.read(r.fh, 0, len(data["/big"])) == data["/big"]  # (not a small file: not written)
        engine.release(r.fh)
        settle(engine)
        assert engine.snapshot()["counters"][diskcache.BYTES_WRITTEN] == len(data["/d/s00"])
    finally:
        engine.close()
    engine = make_engine(src, tmp_path)
    try:
        assert read_file(engine, "/big") == data["/big"]  # through blocks: written to the tier
        settle(engine)
    finally:
        engine.close()
    tried = no_source()
    engine = make_engine(src, tmp_path, **{"readahead.enabled": "false"})
    try:
        assert read_file(engine, "/d/s00") == data["/d/s00"]
        r = engine.open("/big")
        rng = random.Random(5)
        for _ in range(200):  # random reads, served exactly, from the tier
            off = rng.randrange(1, len(data["/big"]) - 5000)
            n = rng.choice((1, 4096, 5000))
            assert engine.read(r.fh, off, n) == data["/big"][off : off + n]
        engine.release(r.fh)
        assert tried == [] and engine.snapshot()["counters"][m.BYTES_FETCHED_DEMAND] == 0
    finally:
        engine.close()


def test_changed_source_file_is_fetched_anew(data, tmp_path) -> None:
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path)
    try:
        assert read_file(engine, "/mid") == data["/mid"]
        settle(engine)
        new = os.urandom(len(data["/mid"]))  # same size, new bytes and times
        (src / "mid").write_bytes(new)
        st = os.stat(src / "mid")
        os.utime(src / "mid", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        assert read_file(engine, "/mid") == new
        settle(engine)
    finally:
        engine.close()
    engine = make_engine(src, tmp_path)
    try:
        assert read_file(engine, "/mid") == new
        c = engine.snapshot()["counters"]
        assert c[diskcache.HIT_BYTES] >= len(new) and c[m.BYTES_FETCHED_DEMAND] == 0  # the new version, from disk
    finally:
        engine.close()


def _data_files(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "disk" / DATA).rglob("*") if p.is_file())


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_cache_file_altered_behind_our_back_is_detected_and_refetched(tmp_path, damage) -> None:
    src = tmp_path / "src"
    src.mkdir()
    content = os.urandom(3 * MIB + 5)
    (src / "f").write_bytes(content)
    engine = make_engine(src, tmp_path)
    try:
        assert read_file(engine, "/f") == content
        settle(engine)
    finally:
        engine.close()
    (victim,) = _data_files(tmp_path)
    with open(victim, "r+b") as f:
        if damage == "flip":
            f.seek(2 * MIB + 100)
            byte = f.read(1)
            f.seek(2 * MIB + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        else:
            f.truncate(MIB)
    engine = make_engine(src, tmp_path)
    try:
        assert read_file(engine, "/f") == content
        c = engine.snapshot()["counters"]
        assert c[diskcache.CORRUPT] == 1
        assert c[m.BYTES_FETCHED_DEMAND] + c[m.BYTES_FETCHED_PREFETCH] > 0  # refetched from the source
        settle(engine)
        assert engine.snapshot()["counters"][diskcache.BYTES_WRITTEN] > 0  # and written anew
    finally:
        engine.close()
    for _ in range(2):  # (blocks that start read from the dropped entry come from the source next time)
        engine = make_engine(src, tmp_path)
        try:
            assert read_file(engine, "/f") == content
            settle(engine)
            c = engine.snapshot()["counters"]
            assert c[diskcache.CORRUPT] == 0 and c[diskcache.HIT_BYTES] > 0
        finally:
            engine.close()
    engine = make_engine(src, tmp_path)
    try:
        assert read_file(engine, "/f") == content
        c = engine.snapshot()["counters"]
        assert c[diskcache.HIT_BYTES] >= len(content) and c[m.BYTES_FETCHED_DEMAND] + c[m.BYTES_FETCHED_PREFETCH] == 0
    finally:
        engine.close()


def test_a_full_write_queue_drops_writes_and_never_holds_a_reader(data, tmp_path) -> None:
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path)
    try:
        gate = threading.Event()
        store = engine.disk.store
        real_write = store.writers.write

        def slow_write(*args):  # the disk hangs: a reader must not notice
            gate.wait(30)
            return real_write(*args)

        store.writers.write = slow_write
        store.queue_bytes = 2 * MIB
        t0 = time.monotonic()
        assert read_file(engine, "/big") == data["/big"]
        assert time.monotonic() - t0 < 10
        c = engine.snapshot()["counters"]
        assert c[diskcache.WRITES_DROPPED] > 0
        assert engine.snapshot()["gauges"][diskcache.QUEUED] <= 2 * MIB
        gate.set()
        settle(engine)
        cache = engine.cache.gauges()
        assert cache["cache_bytes"] <= engine.cache.budget
    finally:
        gate.set()
        engine.close()


# -- opens ---------------------------------------------------------------------------------------------
def test_complete_verified_file_opens_by_passthrough_to_the_disk_file(data, tmp_path) -> None:
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path, **{"fuse.passthrough": "auto"})
    try:
        engine.source.local = False  # stand for a network source, which auto serves
        engine.passthrough_available = True
        r = engine.open("/mid")  # not on disk yet: served
        assert r.route == ROUTE_SERVED and r.backing_fd == -1
        engine.release(r.fh)
        assert read_file(engine, "/mid") == data["/mid"]
        settle(engine)
        # a file is verified as soon as it is complete (its pages are hot): its next open passes through
        assert engine.snapshot()["counters"][diskcache.VERIFIED] == 1
        r = engine.open("/mid")
        assert r.route == ROUTE_PASSTHROUGH and os.pread(r.backing_fd, MIB + 1, 0) == data["/mid"]
        engine.release(r.fh)
        assert read_file(engine, "/big") == data["/big"]
        settle(engine)
        assert engine.snapshot()["counters"][diskcache.VERIFIED] == 2
        r = engine.open("/big")
        r2 = engine.open("/big", held_route=ROUTE_PASSTHROUGH)  # a second open of the node shares the backing
        assert r.route == ROUTE_PASSTHROUGH and r.backing_fd >= 0 and r2.backing_fd == r.backing_fd
        st = os.fstat(r.backing_fd)
        assert st.st_size == len(data["/big"]) and os.pread(r.backing_fd, len(data["/big"]), 0) == data["/big"]
        assert str(tmp_path / "disk") in os.readlink(f"/proc/self/fd/{r.backing_fd}")
        assert r.st.st_mode == os.stat(src / "big").st_mode  # the node shows the source's attributes
        fd = r.backing_fd
        engine.release(r2.fh)
        os.fstat(fd)  # still open for the other handle
        engine.release(r.fh)
        with pytest.raises(OSError):
            os.fstat(fd)  # closed with the last handle
        # the adapter may still count an open of the node on the passthrough route when the engine has
        # released its last handle: such an open passes through to the disk file, never to the source
        r = engine.open("/big", held_route=ROUTE_PASSTHROUGH)
        assert r.route == ROUTE_PASSTHROUGH and str(tmp_path / "disk") in os.readlink(f"/proc/self/fd/{r.backing_fd}")
        engine.release(r.fh)
        c = engine.snapshot()["counters"]
        assert c[m.OPENS_DISK] == 4 and c[m.BYTES_DISK_OPENED] == 3 * len(data["/big"]) + len(data["/mid"])
        assert c[m.OPENS_PASSTHROUGH] == 0

        (victim,) = [p for p in _data_files(tmp_path) if p.stat().st_size == len(data["/big"])]
        with open(victim, "r+b") as f:  # altered while the daemon runs: the next open notices
            f.write(b"\0" * 10)
        r = engine.open("/big")
        assert r.route == ROUTE_SERVED
        engine.release(r.fh)
        assert read_file(engine, "/big") == data["/big"]
        assert engine.snapshot()["counters"][diskcache.CORRUPT] == 1
    finally:
        engine.close()


@pytest.mark.parametrize("setting", ["off", "no kernel route"])
def test_disk_route_needs_the_kernel_route_and_passthrough_not_off(data, tmp_path, setting) -> None:
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path, **{"fuse.passthrough": "off" if setting == "off" else "auto"})
    try:
        engine.source.local = False
        engine.passthrough_available = setting == "off"
        for _ in range(3):
            assert read_file(engine, "/mid") == data["/mid"]
            settle(engine)
        r = engine.open("/mid")
        assert r.route == ROUTE_SERVED and r.backing_fd == -1
        engine.release(r.fh)
        assert engine.snapshot()["counters"][m.OPENS_DISK] == 0
    finally:
        engine.close()


def test_small_files_pass_through_to_the_disk_file_once_the_tier_holds_them(data, tmp_path) -> None:
    """Served, each small file of a later epoch cost a READ and a checked read of its tier file in the
    daemon; once the tier holds it whole (verified then), its opens pass through to the disk file."""
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path, **{"fuse.passthrough": "auto"})
    try:
        engine.source.local = False
        engine.passthrough_available = True
        assert read_file(engine, "/d/s00") == data["/d/s00"]
        settle(engine)
        for _ in range(3):
            r = engine.open("/d/s00")
            assert r.route == ROUTE_PASSTHROUGH and os.pread(r.backing_fd, 1 << 20, 0) == data["/d/s00"]
            engine.release(r.fh)
        c = engine.snapshot()["counters"]
        assert c[m.OPENS_DISK] == 3 and c[diskcache.VERIFIED] == 1
    finally:
        engine.close()


def test_open_of_a_scanned_file_held_on_disk_needs_no_source_round_trip(data, tmp_path, monkeypatch) -> None:
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path, **{"readahead.scan_trigger": "2"})
    try:
        for name in ("/d/s00", "/d/s01"):
            read_file(engine, name)
        scanned = [n for n in data if n.startswith("/d/") and n not in ("/d/s00", "/d/s01")]
        assert _wait(lambda: engine.snapshot()["counters"][m.SCAN_FILES] >= len(scanned))
        settle(engine)
        for name in scanned:  # RAM no longer holds them; the disk tier does, the scan's metadata is fresh
            engine.cache.invalidate_file(engine.version_key(name))
        opened: list[str] = []
        real = engine.source.open_file
        monkeypatch.setattr(engine.source, "open_file", lambda path: opened.append(path) or real(path))
        for name in scanned:
            assert read_file(engine, name) == data[name]
        assert opened == []
    finally:
        engine.close()


# -- scans, warms, stats, configuration ------------------------------------------------------------
def test_scans_write_what_they_fetch_and_keep_only_metadata_of_what_the_tier_holds(data, tmp_path, no_source) -> None:
    src = tmp_path / "src"
    opts = {"readahead.scan_trigger": "2"}
    engine = make_engine(src, tmp_path, **opts)
    try:
        for name in ("/d/s00", "/d/s01"):
            assert read_file(engine, name) == data[name]
        scanned = [n for n in data if n.startswith("/d/")]
        assert _wait(lambda: engine.snapshot()["counters"][m.SCAN_FILES] >= len(scanned) - 2)
        settle(engine)
        assert engine.snapshot()["counters"][diskcache.BYTES_WRITTEN] == sum(len(data[n]) for n in scanned)
    finally:
        engine.close()
    tried = no_source()
    engine = make_engine(src, tmp_path, **opts)
    try:
        for name in ("/d/s00", "/d/s01"):
            assert read_file(engine, name) == data[name]
        assert _wait(lambda: engine.snapshot()["counters"][m.SCAN_FILES] >= len(scanned) - 2)
        ahead = [n for n in scanned if n not in ("/d/s00", "/d/s01")]
        assert all(engine.cache.cached_bytes(engine.version_key(n)) == 0 for n in ahead)  # no RAM taken
        assert all(engine.scanner.fresh_meta(n) is not None for n in ahead)
        for name in scanned:
            assert read_file(engine, name) == data[name]
        c = engine.snapshot()["counters"]
        assert tried == [] and c[diskcache.HIT_BYTES] >= sum(len(data[n]) for n in scanned)
    finally:
        engine.close()


def test_learned_set_replays_from_disk_after_a_restart(data, tmp_path, no_source) -> None:
    src = tmp_path / "src"
    opts = {"readahead.learn": "true", "readahead.scan_trigger": "1000"}  # no scan: only the learned set
    names = sorted(n for n in data if n.startswith("/d/"))
    engine = make_engine(src, tmp_path, **opts)
    try:
        for name in names:  # epoch 1 teaches the set (and fills the disk tier)
            assert read_file(engine, name) == data[name]
        settle(engine)
    finally:
        engine.close()  # saves the learned sets
    tried = no_source()
    engine = make_engine(src, tmp_path, **opts)
    try:
        assert read_file(engine, names[0]) == data[names[0]]  # the first open replays the learned set
        assert _wait(lambda: engine.snapshot()["counters"][m.SCAN_FILES] >= len(names) - 1)
        assert engine.snapshot()["counters"][m.LEARNED_PLANS] == 1
        assert all(engine.scanner.fresh_meta(n) is not None for n in names[1:])
        for name in names:
            assert read_file(engine, name) == data[name]
        assert tried == [] and engine.snapshot()["counters"][diskcache.HIT_BYTES] >= sum(len(data[n]) for n in names)
    finally:
        engine.close()


def test_warm_disk_fills_the_tier_ahead(data, tmp_path, no_source) -> None:
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path, **{"cache.budget": "16M"})
    try:
        report = warm_now(engine, "/", disk=True)
        total = sum(len(v) for v in data.values())
        assert report["done"] and report["disk"] and report["failed"] == report["declined"] == 0
        assert report["bytes_done"] == total and report["files_done"] == len(data)
        again = warm_now(engine, "/", disk=True)  # all on disk: nothing fetched
        assert again["bytes_done"] == total
        assert engine.snapshot()["counters"][m.BYTES_FETCHED_WARM] == total  # a warm: not a read-ahead guess
    finally:
        engine.close()
    tried = no_source()
    engine = make_engine(src, tmp_path)
    try:
        for name, content in data.items():
            assert read_file(engine, name) == content
        assert tried == []
    finally:
        engine.close()


def test_warm_disk_without_a_tier_is_refused(data, tmp_path) -> None:
    engine = make_engine(tmp_path / "src", tmp_path, **{"cache.disk_dir": ""})
    try:
        assert engine.disk is None
        with pytest.raises(OSError) as e:
            warm_now(engine, "/", disk=True)
        assert e.value.errno == errno.ENOTSUP
    finally:
        engine.close()


def test_snapshot_reports_the_tier_and_reload_needs_a_restart(data, tmp_path) -> None:
    src = tmp_path / "src"
    engine = make_engine(src, tmp_path)
    try:
        read_file(engine, "/mid")
        settle(engine)
        snap = engine.snapshot()
        for name in diskcache.COUNTERS:
            assert name in snap["counters"]
        g = snap["gauges"]
        assert g[diskcache.FILES] == 1 and 0 < g[diskcache.USE] <= g[diskcache.BUDGET] and g[diskcache.FREE] > 0
        changed = load_config(
            overrides={
                "cache.budget": "64M",
                "cache.block_size": "1M",
                "state.dir": str(tmp_path / "state"),
                "cache.disk_dir": str(tmp_path / "disk2"),
                "cache.disk_budget": "1G",
                "cache.disk_free_floor": "1G",
            },
            use_default_path=False,
        )
        restart = engine.reconfigure(changed)
        assert {"cache.disk_dir", "cache.disk_budget", "cache.disk_free_floor"} <= set(restart)
        assert engine.config.cache.disk_dir == str(tmp_path / "disk") and engine.cache.budget == 64 * MIB
    finally:
        engine.close()
    snap_off = make_engine(src, tmp_path, **{"cache.disk_dir": ""})
    try:
        assert diskcache.HITS not in snap_off.snapshot()["counters"]
    finally:
        snap_off.close()


@pytest.mark.parametrize("where", ["inside the source", "around the source", "foreign"])
def test_bad_disk_dir_is_refused_at_start(data, tmp_path, where) -> None:
    src = tmp_path / "src"
    if where == "inside the source":
        disk = src / "cache"
    elif where == "around the source":
        disk = tmp_path
    else:
        disk = tmp_path / "mine"
        disk.mkdir()
        (disk / "notes.txt").write_text("mine")
    with pytest.raises(DiskCacheError):
        make_engine(src, tmp_path, **{"cache.disk_dir": str(disk)})
    if where == "foreign":
        assert (disk / "notes.txt").read_text() == "mine"


def _wait(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())
