"""The open walk from the kernel side (daemon/ops.py over fsio/opening.py), through a fake kernel:
the route is decided once by the engine, the node's handles share it, a route settled by another
open meanwhile is a second decision of the same handle, a refused backing file serves from then on."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest
from kernelclient import FakeKernel, entry_nodeid, init_body, lookup, read_body

from fastfs.config.loader import load_config
from fastfs.daemon.kernel import abi
from fastfs.daemon.kernel.abi import Op
from fastfs.daemon.kernel.negotiate import Wishes
from fastfs.daemon.kernel.session import Session
from fastfs.daemon.ops import KernelOps
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.policy import ROUTE_PASSTHROUGH, ROUTE_SERVED

MIB = 1024 * 1024


class Served:
    """KernelOps over an engine with a disk tier, served to a FakeKernel (whose device refuses the
    backing-file ioctl, as a kernel without passthrough rights does)."""

    def __init__(self, tree: Path, tmp_path: Path, passthrough: str) -> None:
        config = load_config(
            None,
            {
                "cache.budget": "64M",
                "cache.block_size": "1M",
                "readahead.learn": "false",
                "fuse.passthrough": passthrough,
                "state.dir": str(tmp_path / "state"),
                "cache.disk_dir": str(tmp_path / "disk"),
                "cache.check_invariants": "true",
            },
            use_default_path=False,
        )
        self.engine = Engine(str(tree), config)
        self.engine.source.local = False  # a network source: served, except what the disk tier holds
        self.ops = KernelOps(self.engine, {"source": "SRC", "mountpoint": "/mnt/test"})
        self.fk = FakeKernel()
        self.session = Session(self.fk.fd, self.ops.handlers(), Wishes(), threads=2)
        self.ops.session = self.session
        unique = self.fk.send(Op.INIT, init_body())
        self.session.start()
        assert self.fk.reply(unique)[0] == 0
        self.engine.passthrough_available = True  # what the daemon sets when the kernel offers passthrough

    def node(self, name: str) -> int:
        err, payload = lookup(self.fk, 1, name)
        assert err == 0
        return entry_nodeid(payload)

    def open(self, nodeid: int) -> tuple[int, int, int]:
        """(errno, handle, open flags)."""
        err, payload = self.fk.call(Op.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0), nodeid)
        if err:
            return err, 0, 0
        fh, flags, _backing = abi.OPEN_OUT.unpack(payload)
        return 0, fh, flags

    def read(self, nodeid: int, fh: int, offset: int, size: int) -> bytes:
        err, data = self.fk.call(Op.READ, read_body(fh, offset, size), nodeid)
        assert err == 0
        return data

    def release(self, nodeid: int, fh: int) -> None:
        assert self.fk.call(Op.RELEASE, abi.RELEASE_IN.pack(fh, 0, 0, 0), nodeid)[0] == 0

    def close(self) -> None:
        self.fk.close()
        self.session.wait(5)
        self.session.close()
        self.engine.close()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    (root / "big").write_bytes(os.urandom(3 * MIB))
    return root


def test_a_second_open_of_a_served_node_is_served_when_its_disk_copy_is_complete(tree, tmp_path) -> None:
    """Regression: with the node's first handle served and the disk tier's copy complete and verified
    meanwhile, the engine decided the next open as passthrough to disk, the node table refused the
    other route, and after three attempts the open failed with EIO."""
    data = (tree / "big").read_bytes()
    s = Served(tree, tmp_path, "auto")
    try:
        node = s.node("big")
        err, first, flags = s.open(node)
        assert err == 0 and not flags & abi.FOPEN_PASSTHROUGH
        for _ in range(2):  # read whole: the disk tier completes the file, the next open verifies it
            assert b"".join(s.read(node, first, off, MIB) for off in range(0, len(data), MIB)) == data
            assert s.engine.disk.store.flush(30)
            err, fh, _ = s.open(node)
            assert err == 0
            s.release(node, fh)
        err, second, flags = s.open(node)
        assert err == 0, errno.errorcode.get(err)
        assert flags & abi.FOPEN_KEEP_CACHE and not flags & abi.FOPEN_PASSTHROUGH
        assert s.read(node, second, 5, 100) == data[5:105]
        s.release(node, second)
        s.release(node, first)
        s.ops.nodes.check_invariants()
    finally:
        s.close()


def test_an_open_whose_node_settled_the_other_route_meanwhile_is_decided_again(tree, tmp_path, monkeypatch) -> None:
    """The engine decides passthrough to disk; before the node table counts it, another open of the
    node is counted served: the open joins the served route, as the same handle."""
    data = (tree / "big").read_bytes()
    s = Served(tree, tmp_path, "auto")
    try:
        for _ in range(2):  # a complete, verified copy on disk (the engine's own opens: no node)
            r = s.engine.open("/big")
            assert b"".join(s.engine.read(r.fh, off, MIB) for off in range(0, len(data), MIB)) == data
            s.engine.release(r.fh)
            assert s.engine.disk.store.flush(30)
        node = s.node("big")
        real_open = s.engine.open
        decided: list[str] = []

        def open_then_lose_the_race(*args, **kwargs):
            result = real_open(*args, **kwargs)
            decided.append(result.route)
            s.ops.nodes.acquire(s.ops.nodes.get(node), ROUTE_SERVED)  # another open, counted first
            return result

        monkeypatch.setattr(s.engine, "open", open_then_lose_the_race)
        err, fh, flags = s.open(node)
        assert decided == [ROUTE_PASSTHROUGH]  # the engine's first decision: the disk copy
        assert err == 0 and flags & abi.FOPEN_KEEP_CACHE and not flags & abi.FOPEN_PASSTHROUGH
        assert s.read(node, fh, MIB, 100) == data[MIB : MIB + 100]  # served by the engine, same handle
        held = s.ops.nodes.get(node)
        assert held.opens == 2 and held.route == ROUTE_SERVED
        s.release(node, fh)
        s.ops.nodes.released(held)  # the other open's release
        s.ops.nodes.check_invariants()
    finally:
        s.close()


def test_a_refused_backing_file_serves_this_open_and_every_later_one(tree, tmp_path, caplog) -> None:
    data = (tree / "big").read_bytes()
    s = Served(tree, tmp_path, "on")
    try:
        node = s.node("big")
        with caplog.at_level(logging.WARNING, logger="fastfs"):
            handles = []
            for _ in range(3):
                err, fh, flags = s.open(node)
                assert err == 0 and flags & abi.FOPEN_KEEP_CACHE and not flags & abi.FOPEN_PASSTHROUGH
                assert s.read(node, fh, 7, 10) == data[7:17]
                handles.append(fh)
        assert [r.getMessage() for r in caplog.records if "passthrough unavailable" in r.getMessage()] != []
        assert len([r for r in caplog.records if "passthrough unavailable" in r.getMessage()]) == 1
        assert not s.engine.passthrough_available
        counters = s.engine.snapshot()["counters"]
        assert counters[m.OPENS_PASSTHROUGH] == 1 and counters[m.OPENS] == 3  # decided, refused, served
        held = s.ops.nodes.get(node)
        assert held.route == ROUTE_SERVED and held.opens == 3 and held.backing == 0
        for fh in handles:
            s.release(node, fh)
        s.ops.nodes.check_invariants()
    finally:
        s.close()
