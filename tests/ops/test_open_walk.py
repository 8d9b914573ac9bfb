"""The open walk from the kernel side (daemon/ops.py over fsio/opening.py), through a fake kernel:
the route is decided once by the engine, the node's handles share it, a route settled by another
open meanwhile is a second decision of the same handle, a refused backing file serves from then on."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
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

pytestmark = pytest.mark.usefixtures("request_loop")  # every test on both request loops

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


class Backing:
    """A kernel that takes backing files: ids handed out, the descriptor each was registered with, closes."""

    def __init__(self) -> None:
        self.ids: dict[int, os.stat_result] = {}
        self.closed: list[int] = []

    def open(self, fd: int) -> int:
        backing = 100 + len(self.ids)
        self.ids[backing] = os.fstat(fd)
        return backing

    def close(self, backing: int) -> None:
        self.closed.append(backing)


@pytest.fixture
def passing(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A Served mount whose kernel takes backing files (fuse.passthrough=on)."""
    s = Served(tree, tmp_path, "on")
    kernel = Backing()
    monkeypatch.setattr(s.session, "backing_open", kernel.open)
    monkeypatch.setattr(s.session, "backing_close", kernel.close)
    yield s, kernel
    s.close()


def kept_node(s: Served, kernel: Backing) -> int:
    """The node of "big" opened by passthrough and released: its backing id (100) kept registered."""
    node = s.node("big")
    err, fh, flags = s.open(node)
    assert err == 0 and flags & abi.FOPEN_PASSTHROUGH
    s.release(node, fh)
    assert list(kernel.ids) == [100] and kernel.closed == []  # kept registered
    return node


def test_a_passthrough_reopen_of_a_kept_backing_file_opens_no_source_file(passing, tree) -> None:
    """The node's backing id is kept registered after its last release: the next open passes it again
    after one stat of the source (the version revalidated), without opening the source file (an open,
    an fstat and a close, three requests to the source on every open + close before)."""
    s, kernel = passing
    node = kept_node(s, kernel)
    before = s.engine.snapshot()["counters"]
    for _ in range(3):
        err, payload = s.fk.call(Op.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0), node)
        assert err == 0
        fh, flags, backing = abi.OPEN_OUT.unpack(payload)
        assert flags & abi.FOPEN_PASSTHROUGH and backing == 100
        s.release(node, fh)
    after = s.engine.snapshot()["counters"]
    assert after[m.SOURCE_OPENS] == before[m.SOURCE_OPENS]  # no source file opened
    assert after[m.SOURCE_STATS] - before[m.SOURCE_STATS] == 3  # one stat per open: close-to-open
    assert after[m.OPENS_PASSTHROUGH] - before[m.OPENS_PASSTHROUGH] == 3
    assert list(kernel.ids) == [100]  # nothing registered again
    s.ops.nodes.check_invariants()


def test_a_passthrough_reopen_of_a_kept_backing_file_still_sees_a_changed_source(passing, tree) -> None:
    """Close-to-open holds without a source file opened: the stat finds the new version, the open is
    ESTALE (the kernel then looks the name up again and opens the new version's node)."""
    s, kernel = passing
    node = s.node("big")
    err, fh, _ = s.open(node)
    assert err == 0
    s.release(node, fh)
    (tree / "big").write_bytes(b"a new version")
    assert s.open(node)[0] == errno.ESTALE
    new = s.node("big")
    err, fh, flags = s.open(new)
    assert err == 0 and flags & abi.FOPEN_PASSTHROUGH
    assert kernel.ids[101].st_size == len(b"a new version")  # the new version's own backing file
    s.release(new, fh)


def test_a_kept_backing_id_gone_before_the_open_counts_registers_the_source_file(passing, tree, monkeypatch) -> None:
    """The engine decides a passthrough open without a descriptor (the node's id kept registered); when
    that id goes before the node table counts the open (evicted by other nodes' releases), the open
    registers the version's source file after all."""
    s, kernel = passing
    node = s.node("big")
    err, fh, _ = s.open(node)
    assert err == 0
    s.release(node, fh)
    held = s.ops.nodes.get(node)
    assert held.kept == 100
    real_open = s.engine.open

    def open_then_lose_the_kept_id(*args, **kwargs):
        result = real_open(*args, **kwargs)
        assert result.backing_fd == -1  # decided backed: no source file opened
        kernel.close(held.kept)  # the id is closed and the table forgets it, as an eviction does
        with s.ops.nodes._lock:
            s.ops.nodes._kept.pop(node, None)
            held.kept = 0
        return result

    monkeypatch.setattr(s.engine, "open", open_then_lose_the_kept_id)
    err, payload = s.fk.call(Op.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0), node)
    assert err == 0
    fh, flags, backing = abi.OPEN_OUT.unpack(payload)
    assert flags & abi.FOPEN_PASSTHROUGH and backing == 101 and kernel.closed == [100]
    assert kernel.ids[101].st_ino == (tree / "big").stat().st_ino  # the source file, opened now
    s.release(node, fh)
    s.ops.nodes.check_invariants()


def test_a_reopen_of_a_kept_backing_file_rewritten_in_place_is_stale(passing, tree) -> None:
    """Regression (a churn soak over tmpfs, default route): a passthrough re-open of a node whose
    backing id is kept was answered from the metadata of the lookup just before it. That id is the
    source file itself, so a rewrite in place between the lookup and the open (same inode) passed the
    new bytes through under the old version's attributes: a mapping of the old size mixed the two
    versions or faulted with SIGBUS past the new end. Such an open now revalidates by a stat: ESTALE,
    and the kernel's new lookup opens the new version."""
    s, kernel = passing
    node = kept_node(s, kernel)
    assert s.node("big") == node  # a lookup: the same version, its metadata fresh for the next open
    new = b"rewritten in place, shorter"
    with open(tree / "big", "r+b") as f:  # same inode: the kept backing file now holds these bytes
        f.truncate(0)
        f.write(new)
    err, _fh, _flags = s.open(node)
    assert err == errno.ESTALE
    fresh = s.node("big")
    assert fresh != node
    err, fh, flags = s.open(fresh)
    assert err == 0 and flags & abi.FOPEN_PASSTHROUGH
    assert kernel.ids[101].st_size == len(new)
    s.release(fresh, fh)
    s.ops.nodes.check_invariants()


def cached_hints(s: Served) -> list[bool]:
    """The ``cached`` hint (the kernel may hold the version's pages) of each engine open from now on."""
    seen: list[bool] = []
    real_open = s.engine.open

    def recording_open(path, flags=os.O_RDONLY, expect=None, cached=False, *args, **kwargs):
        seen.append(cached)
        return real_open(path, flags, expect, cached, *args, **kwargs)

    s.engine.open = recording_open  # type: ignore[method-assign]
    return seen


def wait_until(done: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll *done* (a request with no reply, such as FORGET, is handled on a worker) until it holds."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert done()


def test_a_second_open_while_the_first_is_under_way_is_not_taken_for_cached_pages(tree, tmp_path) -> None:
    """Regression (a churn soak, served route): two readers opening one node at once. The first open
    marks the node seen; the second took that for pages the kernel holds, was answered from metadata
    with nothing in RAM, and its READs went to a source the version had left meanwhile: ESTALE. The
    kernel's pages count only once no open of the node is under way."""
    s = Served(tree, tmp_path, "off")
    try:
        node = s.node("big")
        seen = cached_hints(s)
        err, first, _ = s.open(node)
        assert err == 0
        err, second, _ = s.open(node)  # the first still open, nothing read through it
        assert err == 0
        s.release(node, second)
        s.release(node, first)
        s.session.run_late()  # the RELEASEs answered at once are counted on the node in a batch
        err, third, _ = s.open(node)  # opened and released before: the kernel may hold its pages
        assert err == 0
        s.release(node, third)
        assert seen == [False, False, True]
    finally:
        s.close()


def test_an_open_after_the_kernel_evicted_the_nodes_inode_is_not_taken_for_cached_pages(tree, tmp_path) -> None:
    """Regression (a tree churn soak, served route): a node opened and released, its inode then evicted
    by the kernel (its pages with it) while a lookup reused the node id for a new inode; the FORGET of
    the evicted inode came after that lookup. The next open took the node for one whose pages the
    kernel holds, was answered from metadata with nothing in RAM, and its READs went to a source the
    version had left: ESTALE. A FORGET clears the node's pages, and the release of an open made before
    it (answered at once by the kernel loop, its handler run late, after the FORGET) sets none."""
    s = Served(tree, tmp_path, "off")
    try:
        node = s.node("big")
        held = s.ops.nodes.get(node)
        assert held is not None
        seen = cached_hints(s)

        def evict() -> None:
            """The kernel evicts the node's inode; a lookup made a new one first (one count left)."""
            assert s.node("big") == node  # the new inode's lookup: the same version, the same node id
            s.fk.send(Op.FORGET, abi.FORGET_IN.pack(held.nlookup - 1), node)  # (FORGET has no reply)
            wait_until(lambda: held.nlookup == 1)

        err, fh, _ = s.open(node)
        assert err == 0
        s.release(node, fh)
        s.session.run_late()  # the RELEASE answered at once is counted on the node in a batch
        evict()
        err, fh, _ = s.open(node)  # on the new inode: no page of it was read
        assert err == 0
        assert s.read(node, fh, 7, 100) == (tree / "big").read_bytes()[7:107]
        evict()  # this open's RELEASE answered, the inode evicted, before its release is counted
        s.release(node, fh)
        s.session.run_late()
        err, fh, _ = s.open(node)
        assert err == 0
        s.release(node, fh)
        s.session.run_late()
        err, fh, _ = s.open(node)  # opened and released on the inode the kernel holds: pages again
        assert err == 0
        s.release(node, fh)
        assert seen == [False, False, False, True]
    finally:
        s.close()


def test_a_getattr_racing_a_rebind_leaves_the_node_the_attributes_of_its_new_version(tree, tmp_path) -> None:
    """Regression (a tree churn soak, served route: a read cut short, the new version's bytes under the
    old version's size): a GETATTR of a node never opened compared the version it stat'ed with the
    node's, then an open rebound the node to the source's new version, then the GETATTR stored the
    old version's attributes on the node. Every later fstat of a handle of the node then told the
    kernel the old size, and its reads stopped there. The comparison and the store are one step."""
    old = os.urandom(3000)
    new = os.urandom(400_000)
    (tree / "f").write_bytes(old)
    s = Served(tree, tmp_path, "off")
    try:
        node = s.node("f")
        held = s.ops.nodes.get(node)
        assert held is not None and held.st.st_size == len(old)
        real_refresh = s.ops.nodes.refresh
        rebound: list[bool] = []

        def rebind_first(n, st):  # after the GETATTR's stat: the file replaced, an open rebinds the node
            if not rebound:
                (tree / "f.new").write_bytes(new)
                os.replace(tree / "f.new", tree / "f")
                rebound.append(s.ops.nodes.rebind(n, os.stat(tree / "f")))
            return real_refresh(n, st)

        s.ops.nodes.refresh = rebind_first  # type: ignore[method-assign]
        err, _ = s.fk.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), node)  # stat'ed the old version
        assert rebound == [True]
        assert err == errno.ESTALE  # (a reply the kernel drops: it was asked before the rebind's invalidation)
        assert held.st.st_size == len(new)
        err, fh, _ = s.open(node)
        assert err == 0
        err, out = s.fk.call(Op.GETATTR, abi.GETATTR_IN.pack(abi.GETATTR_FH, 0, fh), node)  # fstat
        assert err == 0 and abi.ATTR_OUT.unpack(out)[4] == len(new)
        assert s.read(node, fh, len(new) - 100, 100) == new[-100:]
        s.release(node, fh)
    finally:
        s.close()


def test_an_open_whose_node_was_rebound_meanwhile_is_stale(tree, tmp_path) -> None:
    """Regression (a tree churn soak, served route: reads cut short, SIGBUS in mappings): two first
    opens of one node. The first found the version the node stood for at the source; before it was
    counted on the node, the file was replaced and the second open rebound the (never opened) node to
    the new version. The first open was answered with a handle on the old version through the new
    version's inode: its short read set the inode's size to the old version's, and the second
    reader's reads of the new version stopped there. The first open is now ESTALE (the kernel looks
    the name up again) and the node's reads are the new version's."""
    old = os.urandom(3000)
    new = os.urandom(400_000)
    (tree / "f").write_bytes(old)
    s = Served(tree, tmp_path, "off")
    try:
        node = s.node("f")
        real_open = s.engine.open
        rebound: list[bool] = []

        def rebound_meanwhile(*args, **kwargs):
            result = real_open(*args, **kwargs)  # the old version, found at the source
            if not rebound:  # the file replaced, the other open rebinds the node
                (tree / "f.new").write_bytes(new)
                os.replace(tree / "f.new", tree / "f")
                rebound.append(s.ops.nodes.rebind(s.ops.nodes.get(node), os.stat(tree / "f")))
            return result

        s.engine.open = rebound_meanwhile  # type: ignore[method-assign]
        err, fh, _ = s.open(node)
        assert rebound == [True]
        assert err == errno.ESTALE
        assert s.ops.nodes.get(node).opens == 0
        assert s.node("f") == node  # the kernel's retry: the name is the node's version now
        err, fh, _ = s.open(node)
        assert err == 0
        err, out = s.fk.call(Op.GETATTR, abi.GETATTR_IN.pack(abi.GETATTR_FH, 0, fh), node)  # fstat
        assert err == 0 and abi.ATTR_OUT.unpack(out)[4] == len(new)
        assert s.read(node, fh, 0, 4096) == new[:4096]
        s.release(node, fh)
        s.ops.nodes.check_invariants()
    finally:
        s.close()


def test_an_open_while_a_forget_read_is_still_handled_is_not_taken_for_cached_pages(tree, tmp_path) -> None:
    """Regression (a tree churn soak, served route: 0-10 failed reads per run left after the FORGET
    clearing above): the kernel evicts a node's inode and queues the FORGET, a lookup makes the next
    inode, and its OPEN is read by one worker while another still handles the FORGET; the open took
    the pages for held. A FORGET is counted as soon as it is read, and an open meanwhile does not
    count on the kernel's pages."""
    (tree / "other").write_bytes(b"x" * 100)
    s = Served(tree, tmp_path, "off")
    try:
        node = s.node("big")
        other = s.node("other")
        seen = cached_hints(s)
        err, fh, _ = s.open(node)
        assert err == 0
        s.release(node, fh)
        s.session.run_late()  # the RELEASE answered at once is counted on the node in a batch
        handling = threading.Event()
        go_on = threading.Event()
        real_forget = s.ops.nodes.forget_many

        def slow_forget(items):  # the FORGET's handler, still running on another worker
            handling.set()
            assert go_on.wait(10)
            return real_forget(items)

        s.ops.nodes.forget_many = slow_forget  # type: ignore[method-assign]
        before = s.session.forgets_read()
        s.fk.send(Op.FORGET, abi.FORGET_IN.pack(1), other)  # (another node's: "big" keeps its pages)
        assert handling.wait(10)
        assert s.session.forgets_read() == before + 1 and s.ops.nodes.forgets == 0
        err, fh, _ = s.open(node)  # read after the FORGET, answered while it is handled
        assert err == 0
        s.release(node, fh)
        go_on.set()
        wait_until(lambda: s.ops.nodes.forgets == 1)
        s.session.run_late()
        err, fh, _ = s.open(node)  # no FORGET under way: the kernel's pages count again
        assert err == 0
        s.release(node, fh)
        assert seen == [False, False, True]
    finally:
        s.close()
