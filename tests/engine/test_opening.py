"""The route of an open, decided by the Opener alone (fsio/opening.py): held routes, the disk tier's
copy, a second decision for a route settled meanwhile, and a backing file the kernel refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.policy import ROUTE_PASSTHROUGH, ROUTE_SERVED

MIB = 1024 * 1024


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    (root / "big").write_bytes(os.urandom(3 * MIB))
    return root


def make_engine(src: Path, tmp_path: Path, **overrides: str) -> Engine:
    opts = {
        "cache.budget": "64M",
        "cache.block_size": "1M",
        "state.dir": str(tmp_path / "state"),
        "cache.disk_dir": str(tmp_path / "disk"),
        "readahead.learn": "false",
        "fuse.passthrough": "auto",
        "cache.check_invariants": "true",
    }
    opts.update(overrides)
    engine = Engine(str(src), load_config(overrides=opts, use_default_path=False))
    engine.source.local = False  # a network source: served, except what the disk tier holds
    engine.passthrough_available = True
    return engine


def on_disk_now(engine: Engine, path: str, data: bytes) -> None:
    """Read *path* whole, wait for the disk tier to hold and verify it (a served open queues that)."""
    for _ in range(2):
        r = engine.open(path)
        out = bytearray()
        while chunk := engine.read(r.fh, len(out), MIB):
            out += chunk
        assert bytes(out) == data
        engine.release(r.fh)
        assert engine.disk.store.flush(30)


def test_an_inode_held_served_stays_served_when_its_disk_copy_becomes_complete(src, tmp_path) -> None:
    """Regression: an open of an inode whose other handles are served was decided as passthrough to
    the disk tier's copy once it became complete (the kernel route then conflicted with the held one,
    and the adapter's retries ended in EIO)."""
    data = (src / "big").read_bytes()
    engine = make_engine(src, tmp_path)
    try:
        held = engine.open("/big")
        assert held.route == ROUTE_SERVED
        on_disk_now(engine, "/big", data)
        assert engine.open("/big").route == ROUTE_PASSTHROUGH  # a new inode: to the disk copy
        second = engine.open("/big", held_route=ROUTE_SERVED)
        assert second.route == ROUTE_SERVED and second.backing_fd == -1 and not second.on_disk
        assert engine.read(second.fh, 0, 4096) == data[:4096]
    finally:
        engine.close()


def test_reroute_decides_the_same_handle_again_for_the_held_route(src, tmp_path) -> None:
    data = (src / "big").read_bytes()
    engine = make_engine(src, tmp_path)
    try:
        on_disk_now(engine, "/big", data)
        first = engine.open("/big")
        assert first.route == ROUTE_PASSTHROUGH and first.on_disk
        served = engine.reroute(first.fh, ROUTE_SERVED)  # the inode's handles were served meanwhile
        assert served.fh == first.fh and served.route == ROUTE_SERVED and served.backing_fd == -1
        assert engine.read(first.fh, MIB, 100) == data[MIB : MIB + 100]
        again = engine.reroute(first.fh, ROUTE_PASSTHROUGH)
        assert again.route == ROUTE_PASSTHROUGH and again.on_disk
        assert os.pread(again.backing_fd, 100, 5) == data[5:105]  # the version's one disk backing file
        engine.release(first.fh)
        with pytest.raises(OSError):
            engine.reroute(first.fh, ROUTE_SERVED)  # released: no such handle
    finally:
        engine.close()


def test_a_refused_backing_is_recorded_and_serves_every_later_open(src, tmp_path) -> None:
    engine = make_engine(src, tmp_path, **{"fuse.passthrough": "on"})
    try:
        first = engine.open("/big")
        assert first.route == ROUTE_PASSTHROUGH and first.backing_fd >= 0 and not first.on_disk
        served = engine.refused(first.fh, "Operation not permitted")
        assert served.fh == first.fh and served.route == ROUTE_SERVED
        assert not engine.passthrough_available and not engine.passes_through()
        later = engine.open("/big")
        assert later.route == ROUTE_SERVED
        engine.passthrough_available = True  # the daemon's capability switch does not undo the refusal
        assert engine.open("/big").route == ROUTE_SERVED
        c = engine.snapshot()["counters"]
        assert c[m.OPENS_PASSTHROUGH] == 1 and c[m.OPENS] == 3
    finally:
        engine.close()


def test_a_passthrough_open_answered_from_metadata_gets_a_source_backing(src, tmp_path) -> None:
    """A second decision for passthrough of a handle whose open was answered without opening the
    source (served from a scan's metadata) opens the source then; the handles keep it."""
    engine = make_engine(src, tmp_path, **{"fuse.passthrough": "off", "cache.disk_dir": ""})
    try:
        engine.opener.kernel_route = True
        r = engine.open("/big")
        entry = engine.handles.get(r.fh)
        dropped = entry.source.drop()  # stand for an entry made from metadata: no file held
        entry.source.put(dropped)
        entry.source.held = True
        assert entry.src is None
        again = engine.reroute(r.fh, ROUTE_PASSTHROUGH)
        assert again.route == ROUTE_PASSTHROUGH and entry.src is not None and again.backing_fd == entry.src.fd
        assert os.pread(again.backing_fd, 10, 0) == (src / "big").read_bytes()[:10]
        engine.release(r.fh)
        assert entry.src is None
    finally:
        engine.close()


def test_an_entry_nothing_was_read_through_waits_for_the_next_open_of_its_version(src, tmp_path, monkeypatch) -> None:
    """A version's entry whose last handle closed with nothing read or planned through it (passthrough
    opens, files the kernel's cache served) is reused by the next open of that version; one that
    was read through, or of another version, is not (a load's read state is its own)."""
    from fastfs.fsio import handles as handles_module

    engine = make_engine(src, tmp_path, **{"cache.disk_dir": ""})
    try:
        probed = engine.open("/big")  # a first open: the format probe plans the load
        engine.release(probed.fh)
        assert not engine.handles._idle  # a probed entry is not kept
        first = engine.open("/big", cached=True)  # re-opens of an inode: the kernel's pages serve them
        entry = engine.handles.get(first.fh)
        engine.release(first.fh)
        again = engine.open("/big", cached=True)
        assert engine.handles.get(again.fh) is entry  # reused: nothing built again
        assert engine.read(again.fh, 0, 4096) == (src / "big").read_bytes()[:4096]
        engine.release(again.fh)
        third = engine.open("/big", cached=True)
        assert engine.handles.get(third.fh) is not entry  # it was read through: a fresh one
        assert not engine.handles.get(third.fh).reads.policy.streams
        engine.release(third.fh)
        engine.check_invariants()
        (src / "big").write_bytes(b"another version")
        fourth = engine.open("/big")
        assert engine.handles.get(fourth.fh).size == len(b"another version")
        engine.release(fourth.fh)
        monkeypatch.setattr(handles_module, "MAX_IDLE", 1)  # bounded: the least recently released goes
        (src / "other").write_bytes(b"x")
        for path in ("/big", "/other"):
            engine.release(engine.open(path).fh)
        assert list(engine.handles._idle) == [engine.version_key("/other")]
        engine.check_invariants()
        assert engine.handles.counts()[0] == 0 and engine.handles.entries() == []  # idle is no open file
    finally:
        engine.close()
