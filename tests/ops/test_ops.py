"""The operations adapter and the session, driven by a fake kernel over a socket pair (no mount)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import select
import shutil
import stat
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernelclient import FakeKernel, entry_attr, entry_nodeid, init_body, lookup, parse_dirents, read_body

from fastfs.config.loader import load_config
from fastfs.daemon.kernel import abi
from fastfs.daemon.kernel import session as session_mod
from fastfs.daemon.kernel.abi import Op
from fastfs.daemon.kernel.negotiate import Wishes
from fastfs.daemon.kernel.session import SPARE_READERS, Session
from fastfs.daemon.ops import CONTROL_ID, STATS_ID, VIRTUAL_FH_BASE, KernelOps
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.warm import warm_now

pytestmark = pytest.mark.usefixtures("request_loop")  # every test on both request loops

CONTENT = bytes(range(256)) * 4096  # 1 MiB, every offset distinguishable modulo 256


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "dir").mkdir(parents=True)
    (root / "data.bin").write_bytes(CONTENT)
    (root / "dir" / "small.txt").write_bytes(b"hello\n")
    os.symlink("data.bin", root / "link")
    return root


def make_engine(tree: Path, **overrides: str) -> Engine:
    config = load_config(
        None,
        {
            "cache.budget": "64M",
            "readahead.learn": "false",
            "fuse.passthrough": "off",
            "cache.check_invariants": "true",  # cache and node table checked after every change
            **overrides,
        },
        use_default_path=False,
    )
    return Engine(str(tree), config)


class Served:
    """A KernelOps over an engine, served by a real Session to a FakeKernel."""

    def __init__(
        self,
        engine,
        request_timeout: float = 0.0,
        ops: KernelOps | None = None,
        no_open: bool = False,
        threads: int = 2,
        direct: bool = False,
        late: bool = False,
    ):
        self.engine = engine
        self.ops = ops or KernelOps(engine, {"source": "SRC", "mountpoint": "/mnt/test"}, no_open=no_open)
        self.fk = FakeKernel()
        self.session = Session(
            self.fk.fd,
            self.ops.handlers(),
            Wishes(),
            threads=threads,
            request_timeout=request_timeout,
            direct=self.ops.direct_table() if direct else None,
            late_release=late,
        )
        self.ops.session = self.session
        self.ops.attach_direct(self.session.direct)
        if direct:
            engine.inline_reads = True  # as the daemon sets it: the session's watchdog bounds a hung read
        unique = self.fk.send(Op.INIT, init_body())
        self.negotiated = self.session.start()
        err, self.init_reply = self.fk.reply(unique)
        assert err == 0

    def call(self, opcode: int, body: bytes = b"", nodeid: int = 1, **kw: int) -> tuple[int, bytes]:
        return self.fk.call(opcode, body, nodeid, **kw)

    def node(self, path: str) -> int:
        nodeid = 1
        for part in [p for p in path.split("/") if p]:
            err, payload = lookup(self.fk, nodeid, part)
            assert err == 0, (path, errno.errorcode.get(err))
            nodeid = entry_nodeid(payload)
        return nodeid

    def open(self, nodeid: int, flags: int = os.O_RDONLY) -> tuple[int, int]:
        err, payload = self.call(Op.OPEN, abi.OPEN_IN.pack(flags, 0), nodeid)
        assert err == 0, errno.errorcode.get(err)
        fh, open_flags, _backing = abi.OPEN_OUT.unpack(payload)
        return fh, open_flags

    def read(self, nodeid: int, fh: int, offset: int, size: int) -> tuple[int, bytes]:
        return self.call(Op.READ, read_body(fh, offset, size), nodeid)

    def release(self, nodeid: int, fh: int) -> None:
        assert self.call(Op.RELEASE, abi.RELEASE_IN.pack(fh, 0, 0, 0), nodeid)[0] == 0

    def close(self) -> None:
        self.fk.close()  # the session's reads end (the socket's peer is gone)
        self.session.wait(5)
        self.session.close()
        self.engine.close()


@pytest.fixture
def served(tree: Path) -> Iterator[Served]:
    s = Served(make_engine(tree))
    yield s
    s.close()


# -- INIT -------------------------------------------------------------------------------------------
def test_init_reply_names_what_fastfs_uses(served: Served) -> None:
    major, minor, _ra, flags, max_bg, _cong, _mw, _gran, max_pages, _align, flags2, depth, _to = struct.unpack_from(
        "<IIIIHHIIHHIIH", served.init_reply
    )
    both = flags | flags2 << 32
    assert (major, minor) == (7, 45)
    for flag in (abi.Init.ASYNC_READ, abi.Init.PARALLEL_DIROPS, abi.Init.MAX_PAGES, abi.Init.DO_READDIRPLUS):
        assert both & flag, flag.name
    assert not both & (abi.Init.WRITEBACK_CACHE | abi.Init.AUTO_INVAL_DATA | abi.Init.POSIX_LOCKS)
    assert not both & abi.Init.PASSTHROUGH and depth == 0  # not wished for here
    assert max_pages == 256 and max_bg == 64
    assert served.negotiated.max_read == 1 << 20


# -- read-only --------------------------------------------------------------------------------------
@pytest.mark.parametrize("opcode", sorted(abi.WRITE_OPS), ids=lambda o: Op(o).name)
def test_write_requests_answer_erofs(served: Served, tree: Path, opcode: int) -> None:
    before = sorted(os.listdir(tree))
    assert served.call(opcode, b"\0" * 64 + b"x\0", 1)[0] == errno.EROFS
    assert sorted(os.listdir(tree)) == before
    assert (tree / "data.bin").read_bytes() == CONTENT


@pytest.mark.parametrize("flags", [os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND])
def test_open_for_writing_is_erofs(served: Served, flags: int) -> None:
    node = served.node("/data.bin")
    assert served.call(Op.OPEN, abi.OPEN_IN.pack(flags, 0), node)[0] == errno.EROFS
    assert served.call(Op.ACCESS, abi.ACCESS_IN.pack(os.W_OK, 0), node)[0] == errno.EROFS


def test_unknown_and_unsupported_requests_are_enosys(served: Served) -> None:
    for opcode in (Op.FSYNC, Op.LSEEK, Op.STATX, Op.POLL, Op.IOCTL, Op.BMAP, 999):
        assert served.call(opcode, b"\0" * 64)[0] == errno.ENOSYS


# -- metadata ---------------------------------------------------------------------------------------
def test_lookup_and_getattr_mirror_lstat(served: Served, tree: Path) -> None:
    err, payload = lookup(served.fk, 1, "data.bin")
    assert err == 0
    attr = entry_attr(payload)
    st_ = os.lstat(tree / "data.bin")
    assert attr[0] == st_.st_ino and attr[1] == len(CONTENT) and attr[9] == st_.st_mode
    assert attr[4] * 10**9 + attr[7] == st_.st_mtime_ns
    nodeid = entry_nodeid(payload)
    err, out = served.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), nodeid)
    assert err == 0 and abi.ATTR_OUT.unpack(out)[3 + 1] == len(CONTENT)
    link = served.node("/link")
    assert served.call(Op.READLINK, b"", link) == (0, b"data.bin")
    assert lookup(served.fk, 1, "missing")[0] == 0  # a negative entry (node id 0) the kernel may cache
    assert entry_nodeid(lookup(served.fk, 1, "missing")[1]) == 0


def test_missing_name_without_negative_caching_is_enoent(tree: Path) -> None:
    s = Served(make_engine(tree, **{"fuse.negative_timeout": "0"}))
    try:
        assert lookup(s.fk, 1, "missing")[0] == errno.ENOENT
    finally:
        s.close()


def test_readdir_pages_through_every_entry_once(served: Served, tree: Path) -> None:
    for i in range(300):
        (tree / "dir" / f"f{i:03d}-{'x' * (i % 40)}").write_bytes(b"")
    node = served.node("/dir")
    seen, offset = [], 0
    while True:
        err, payload = served.call(Op.READDIR, read_body(0, offset, 4096), node)
        assert err == 0
        entries = parse_dirents(payload)
        if not entries:
            break
        seen += [name for name, _, _ in entries]
        offset = entries[-1][1]
    assert sorted(seen) == sorted([".", "..", *os.listdir(tree / "dir")])
    assert len(seen) == len(set(seen))


def test_readdirplus_counts_one_lookup_per_entry(served: Served) -> None:
    err, payload = served.call(Op.READDIRPLUS, read_body(0, 0, 1 << 16), 1)
    assert err == 0
    entries = {name: nodeid for name, _, nodeid in parse_dirents(payload, plus=True)}
    assert set(entries) == {".", "..", "data.bin", "dir", "link"}  # the control directory is hidden
    assert entries["."] == entries[".."] == 0  # the kernel links no dot entries
    data = served.ops.nodes.get(entries["data.bin"])
    assert data is not None and data.nlookup == 1
    served.fk.send(Op.FORGET, abi.FORGET_IN.pack(1), entries["data.bin"])
    assert served.fk.silent()  # FORGET takes no reply
    assert served.ops.nodes.get(entries["data.bin"]) is None
    served.ops.nodes.check_invariants()


def test_statfs_and_access(served: Served) -> None:
    err, out = served.call(Op.STATFS)
    blocks, *_rest = abi.STATFS_OUT.unpack(out)
    assert err == 0 and blocks > 0
    node = served.node("/data.bin")
    assert served.call(Op.ACCESS, abi.ACCESS_IN.pack(os.R_OK, 0), node)[0] == 0


# -- versions ---------------------------------------------------------------------------------------
def test_replaced_file_gets_a_new_node_and_old_opens_are_stale(served: Served, tree: Path) -> None:
    old = served.node("/data.bin")
    fh, _ = served.open(old)
    new_bytes = os.urandom(5000)
    (tree / "next").write_bytes(new_bytes)
    os.replace(tree / "next", tree / "data.bin")
    # the open handle keeps its version: bytes and (fstat) size
    assert served.read(old, fh, 4096, 100) == (0, CONTENT[4096:4196])
    err, out = served.call(Op.GETATTR, abi.GETATTR_IN.pack(abi.GETATTR_FH, 0, fh), old)
    assert err == 0 and abi.ATTR_OUT.unpack(out)[4] == len(CONTENT)
    # a GETATTR without a handle of the open inode (fstat sends it so): its own version, and the
    # kernel drops the name, so a path walk looks it up again (ESTALE here failed fstat)
    err, out = served.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), old)
    assert err == 0 and abi.ATTR_OUT.unpack(out)[4] == len(CONTENT)
    _notified(served, _entry_invalidation(1, "data.bin"))
    # a new open of the old inode makes the kernel look the name up again
    assert served.call(Op.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0), old)[0] == errno.ESTALE
    new = served.node("/data.bin")
    assert new != old
    fh2, flags = served.open(new)
    assert flags & abi.FOPEN_KEEP_CACHE  # a node's pages are always its own version's
    assert served.read(new, fh2, 0, 8192) == (0, new_bytes)
    served.release(old, fh)
    served.release(new, fh2)
    # without open handles, a path stat of the old inode is ESTALE: the kernel looks the name up again
    assert served.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), old)[0] == errno.ESTALE
    served.ops.nodes.check_invariants()


# -- small files handed to the kernel's page cache at open (fastfs.fsio.handover) -------------------
def _stores(served: Served) -> list[tuple[int, int, bytes]]:
    out = []
    for code, payload in served.fk.notifications:
        if code == abi.Notify.STORE:
            nodeid, offset, size, _pad = abi.NOTIFY_STORE_OUT.unpack_from(payload)
            data = payload[abi.NOTIFY_STORE_OUT.size :]
            assert len(data) == size
            out.append((nodeid, offset, data))
    return out


def test_an_open_of_a_small_file_whole_in_ram_hands_it_to_the_kernel_once(served: Served) -> None:
    warm_now(served.engine, "/dir/small.txt")  # the version whole in RAM
    node = served.node("/dir/small.txt")
    fh, flags = served.open(node)
    assert flags & abi.FOPEN_KEEP_CACHE  # the kernel keeps what it was handed
    assert _stores(served) == [(node, 0, b"hello\n")]  # before the reply
    c = served.engine.snapshot()["counters"]
    assert (c["opens_handed"], c["bytes_handed"]) == (1, 6)
    assert c["bytes_requested"] == 6 and c["bytes_served_from_cache"] == 6  # delivered, from the cache
    served.release(node, fh)
    fh, _ = served.open(node)  # opened before: the kernel holds the pages
    assert len(_stores(served)) == 1
    served.release(node, fh)
    big = served.node("/data.bin")  # not in RAM: nothing handed over
    fh, _ = served.open(big)
    assert len(_stores(served)) == 1
    served.release(big, fh)


def test_a_rebound_node_is_not_handed_over(served: Served, tree: Path) -> None:
    """A node looked up but never opened whose name was replaced: the open rebinds it to the new
    version, whole in RAM, and drops the kernel's attributes of it (the old version's size) instead
    of handing anything over; reads give the new version's bytes."""
    node = served.node("/dir/small.txt")
    new = b"another version, longer than the first\n"
    (tree / "dir" / "next").write_bytes(new)
    os.replace(tree / "dir" / "next", tree / "dir" / "small.txt")
    warm_now(served.engine, "/dir/small.txt")
    fh, _ = served.open(node)
    assert _stores(served) == []
    assert any(code == abi.Notify.INVAL_INODE for code, _ in served.fk.notifications)
    assert served.read(node, fh, 0, 4096) == (0, new)
    served.release(node, fh)
    assert served.engine.snapshot()["counters"]["opens_handed"] == 0


def test_same_version_keeps_its_node(served: Served) -> None:
    assert served.node("/data.bin") == served.node("/data.bin")
    assert served.ops.nodes.get(served.node("/data.bin")).nlookup == 3


# -- data -------------------------------------------------------------------------------------------
def test_open_read_release(served: Served) -> None:
    node = served.node("/data.bin")
    fh, flags = served.open(node)
    assert 0 < fh < VIRTUAL_FH_BASE and flags & abi.FOPEN_NOFLUSH and not flags & abi.FOPEN_DIRECT_IO
    assert served.read(node, fh, 0, 4096) == (0, CONTENT[:4096])
    assert served.read(node, fh, 12345, 1000) == (0, CONTENT[12345:13345])
    assert served.read(node, fh, len(CONTENT) - 10, 4096) == (0, CONTENT[-10:])
    assert served.read(node, fh, len(CONTENT) + 5, 4096) == (0, b"")
    assert served.read(node, fh, 0, 1 << 20) == (0, CONTENT)
    served.release(node, fh)
    assert served.read(node, fh, 0, 10)[0] == errno.EBADF


def test_random_reads_go_to_the_loop_and_the_engine_still_sees_streams(tree: Path, request_loop: str) -> None:
    """After one random read through the engine, the native loop answers a handle's random reads itself
    (one pread each, counted by the engine as its own); a read that continues one of them goes back to
    the engine, which then finds the stream those reads began and prefetches it. The Python loop
    answers every read through the engine."""
    big = tree / "big.bin"
    data = os.urandom(32 << 20)
    big.write_bytes(data)
    s = Served(make_engine(tree), direct=True)
    try:
        node = s.node("/big.bin")
        fh, _ = s.open(node)
        offsets = [((i * 7919) % 8000) * 4096 for i in range(1, 80)]  # 81 pages apart: no stream
        direct = s.ops.direct
        first = 0
        for off in offsets:  # through the engine until it hands the handle over (its format probe ends first)
            assert s.read(node, fh, off, 4096) == (0, data[off : off + 4096])
            first += 1
            if direct is None or (direct.state(fh) or (False,))[0] or first == 40:
                break
        for off in offsets[first:]:
            assert s.read(node, fh, off, 4096) == (0, data[off : off + 4096])
        counters = s.engine.snapshot()["counters"]
        if request_loop == "python":
            assert direct is None and counters[m.DIRECT_READS] == 0
        else:
            assert first < 40 and counters[m.DIRECT_READS] == len(offsets) - first and len(direct) == 1
        assert counters[m.READ_REQUESTS] == len(offsets) and counters[m.BYTES_REQUESTED] == 4096 * len(offsets)
        assert counters[m.RANDOM_STREAMS] == len(offsets) and counters[m.SEQ_STREAMS] == 0
        # a stream from the last random read: the engine sees it and prefetches (and the bytes are right)
        pos = offsets[-1] + 4096
        for _ in range(64):
            assert s.read(node, fh, pos, 128 * 1024) == (0, data[pos : pos + 128 * 1024])
            pos += 128 * 1024
        counters = s.engine.snapshot()["counters"]
        assert counters[m.SEQ_STREAMS] >= 1 and counters[m.BYTES_FETCHED_PREFETCH] > 0
        s.release(node, fh)
        if direct is not None:
            # a released handle is forgotten, on the engine's closer (its duplicate descriptor's close is
            # a round trip on a FUSE source: KernelOps._direct_end), which runs closes in batches
            assert s.engine.closer.drain(5.0)
            assert len(direct) == 0
    finally:
        s.close()


def open_handles(engine: Engine) -> int:
    return engine.handles.counts()[0]


def test_a_release_is_answered_at_once_and_served_late_in_batches(
    tree: Path, request_loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With late releases the native loop answers RELEASE at once and the handle is given back when
    the late thread runs the kept ones (or a snapshot, which runs them first, or the session's end);
    a full queue serves the next RELEASE at once. The Python loop serves every RELEASE at once."""
    monkeypatch.setattr(session_mod, "LATER_BATCH", 3600.0)  # the late thread never runs a batch here
    monkeypatch.setattr(session_mod, "LATER_CAP", 2)
    s = Served(make_engine(tree), late=True)
    ended = False
    try:
        node = s.node("/data.bin")
        handles = [s.open(node)[0] for _ in range(4)]
        assert open_handles(s.engine) == 4
        for fh in handles:
            s.release(node, fh)  # answered (0) either way
        if request_loop == "python":
            assert s.session.later is None and open_handles(s.engine) == 0
            return
        later = s.session.later
        assert later is not None and len(later) == 2  # the first two kept; the queue full, the rest served
        assert open_handles(s.engine) == 2 and s.read(node, handles[3], 0, 10)[0] == errno.EBADF
        assert s.read(node, handles[0], 0, 10) == (0, CONTENT[:10])  # (the kernel sends none: still open here)
        snap = s.ops.snapshot()  # runs the kept releases first
        assert snap["kernel"]["late_releases"] == 2 and snap["kernel"]["requests"]["release"] == 4
        assert open_handles(s.engine) == 0 and len(later) == 0
        assert s.read(node, handles[0], 0, 10)[0] == errno.EBADF
        fh, _ = s.open(node)  # kept again, and given back when the session ends
        s.release(node, fh)
        assert len(later) == 1 and open_handles(s.engine) == 1
        s.fk.close()
        s.session.wait(5)
        s.session.close()
        ended = True
        assert open_handles(s.engine) == 0 and len(later) == 0 and not later.keep(b"\0" * 64)
    finally:
        if ended:
            s.engine.close()
        else:
            s.close()


def test_the_late_thread_serves_kept_releases_soon(tree: Path, request_loop: str) -> None:
    if request_loop == "python":
        pytest.skip("the native loop keeps releases")
    s = Served(make_engine(tree), late=True)
    try:
        node = s.node("/data.bin")
        for _ in range(50):
            fh, _ = s.open(node)
            s.release(node, fh)
        deadline = time.monotonic() + 5
        while open_handles(s.engine) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert open_handles(s.engine) == 0
        assert s.session.counters()["late_releases"] == 50
    finally:
        s.close()


def test_no_open_mode_reads_by_node(tree: Path) -> None:
    s = Served(make_engine(tree), no_open=True)
    try:
        node = s.node("/data.bin")
        assert s.call(Op.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0), node)[0] == errno.ENOSYS
        assert s.read(node, 0, 100, 5000) == (0, CONTENT[100:5100])
        small = s.node("/dir/small.txt")
        assert s.read(small, 0, 0, 100) == (0, b"hello\n")
        err, data = s.read(STATS_ID, 0, 0, 1 << 20)  # the stats file works without open too
        assert err == 0 and json.loads(data)["mount"]["mountpoint"] == "/mnt/test"
    finally:
        s.close()


# -- the control directory --------------------------------------------------------------------------
def test_control_directory_is_hidden_but_reachable(served: Served) -> None:
    err, payload = lookup(served.fk, 1, ".fastfs")
    assert err == 0 and entry_nodeid(payload) == CONTROL_ID
    mode = entry_attr(payload)[9]
    assert stat.S_ISDIR(mode) and stat.S_IMODE(mode) == 0o555
    err, payload = lookup(served.fk, CONTROL_ID, "stats")
    assert err == 0 and entry_nodeid(payload) == STATS_ID
    assert stat.S_IMODE(entry_attr(payload)[9]) == 0o444
    assert lookup(served.fk, CONTROL_ID, "other")[0] == errno.ENOENT
    err, payload = served.call(Op.READDIR, read_body(0, 0, 4096), CONTROL_ID)
    assert [n for n, _, _ in parse_dirents(payload)] == [".", "..", "stats"]
    assert served.call(Op.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0), CONTROL_ID)[0] == errno.EISDIR
    assert served.call(Op.OPEN, abi.OPEN_IN.pack(os.O_WRONLY, 0), STATS_ID)[0] == errno.EROFS


def test_stats_file_serves_one_snapshot_and_is_not_counted(served: Served, engine_counter=None) -> None:
    node = served.node("/data.bin")
    fh, _ = served.open(node)
    served.read(node, fh, 0, 65536)
    requested = served.engine.snapshot()["counters"]["bytes_requested"]
    sfh, flags = served.open(STATS_ID)
    assert sfh >= VIRTUAL_FH_BASE and flags & abi.FOPEN_DIRECT_IO and not flags & abi.FOPEN_KEEP_CACHE
    first = served.read(STATS_ID, sfh, 0, 100)[1]
    served.read(node, fh, 65536, 65536)  # the open snapshot must not change under its reader
    rest = served.read(STATS_ID, sfh, 100, 1 << 20)[1]
    snap = json.loads(first + rest)
    assert snap["counters"]["bytes_requested"] == requested
    assert snap["mount"] == {"source": "SRC", "mountpoint": "/mnt/test", "pid": os.getpid()}
    assert snap["kernel"]["protocol"] == "7.45" and snap["kernel"]["requests"]["open"] >= 2
    served.release(STATS_ID, sfh)
    assert served.read(STATS_ID, sfh, 0, 100)[0] == errno.EBADF
    assert served.engine.snapshot()["counters"]["bytes_requested"] == requested + 65536


def _getxattr(served: Served, nodeid: int, name: str, size: int = 1 << 16, uid: int = 0) -> tuple[int, bytes]:
    return served.call(Op.GETXATTR, abi.GETXATTR_IN.pack(size, 0) + name.encode() + b"\0", nodeid, uid=uid)


def test_stats_xattr_on_root_only(served: Served) -> None:
    err, value = _getxattr(served, 1, "user.fastfs.stats")
    assert err == 0 and json.loads(value)["mount"]["mountpoint"] == "/mnt/test"
    err, out = _getxattr(served, 1, "user.fastfs.stats", 0)  # size query
    assert err == 0 and abi.GETXATTR_OUT.unpack(out)[0] > 100
    assert _getxattr(served, 1, "user.fastfs.stats", 10)[0] == errno.ERANGE
    assert _getxattr(served, served.node("/data.bin"), "user.fastfs.stats")[0] == errno.ENODATA
    assert _getxattr(served, STATS_ID, "user.nothing")[0] == errno.ENODATA
    assert served.call(Op.LISTXATTR, abi.GETXATTR_IN.pack(4096, 0), STATS_ID) == (0, b"")


def test_warm_xattr_starts_one_job_per_size_query_and_reports_it(served: Served) -> None:
    node = served.node("/dir")
    err, out = _getxattr(served, node, "user.fastfs.warm", 0)  # size query: the job starts, its id is kept
    assert err == 0
    size = abi.GETXATTR_OUT.unpack(out)[0]
    err, value = _getxattr(served, node, "user.fastfs.warm", size)  # the real read: the same job
    assert err == 0
    job = json.loads(value)["job"]
    assert len(served.ops.control.warms._jobs) == 1
    deadline = time.monotonic() + 10
    while True:
        err, report = _getxattr(served, node, f"user.fastfs.warm.{job}")
        assert err == 0
        progress = json.loads(report)
        if progress["done"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert progress["done"] and progress["files_done"] == 1 and progress["bytes_done"] == len(b"hello\n")
    # another caller does not see the job
    assert _getxattr(served, node, f"user.fastfs.warm.{job}", uid=65534)[0] == errno.ENODATA


# -- the session: errors, the watchdog, interrupts --------------------------------------------------
class Stub:
    """Engine stand-in for adapter error paths."""

    def __init__(self, tree: Path, exc: BaseException | None = None, delay: float = 0.0) -> None:
        self.config = load_config(None, {"fuse.passthrough": "off"}, use_default_path=False)
        self.tree, self.exc, self.delay = tree, exc, delay
        self.passthrough_available = False

    def lstat(self, path: str) -> os.stat_result:
        if path != "/":
            time.sleep(self.delay)
            if self.exc is not None:
                raise self.exc
        return os.lstat(self.tree)

    def snapshot(self, top: int = 10) -> dict:
        return {"counters": {}}

    def listen(self, listener: object) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (OSError(errno.ENOENT, "gone"), errno.ENOENT),
        (OSError(errno.ETIMEDOUT, "slow"), errno.ETIMEDOUT),
        (OSError("no errno"), errno.EIO),
        (RuntimeError("bug"), errno.EIO),
        (ValueError("embedded null byte"), errno.EIO),
    ],
)
def test_error_translation(tree: Path, exc: BaseException, code: int) -> None:
    s = Served(Stub(tree, exc, 0.0))
    try:
        if code == errno.ENOENT:  # a missing name is a negative entry
            assert entry_nodeid(lookup(s.fk, 1, "x")[1]) == 0
        else:
            assert lookup(s.fk, 1, "x")[0] == code
    finally:
        s.close()


def test_unexpected_errors_are_logged_rate_limited(tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = Served(Stub(tree, RuntimeError("bug")))
    try:
        with caplog.at_level("ERROR", logger="fastfs.kernel"):
            for _ in range(30):
                assert lookup(s.fk, 1, "x")[0] == errno.EIO
        lines = [r for r in caplog.records if "LOOKUP" in r.getMessage()]
        assert len(lines) == 1 and "RuntimeError" in lines[0].getMessage()
    finally:
        s.close()


def test_watchdog_answers_a_hung_request_and_the_rest_keep_working(tree: Path) -> None:
    stub = Stub(tree, delay=5.0)
    s = Served(stub, request_timeout=0.5)
    try:
        t0 = time.monotonic()
        hung = [s.fk.send(Op.LOOKUP, b"x\0", 1) for _ in range(3)]  # more than the 2 workers
        for unique in hung:
            assert s.fk.reply(unique, timeout=4)[0] == errno.EIO
        assert time.monotonic() - t0 < 3.0
        stub.delay = 0.0
        assert s.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), 1)[0] == 0  # replacement workers serve
        assert s.session.counters()["timeouts"] == 3
    finally:
        s.close()


def test_serial_requests_keep_to_the_spare_readers_and_busy_ones_wake_the_parked(tree: Path) -> None:
    """Of 8 workers only SPARE_READERS read the device while requests come one at a time (the rest
    park: requests do not go round to cold threads); requests that block wake parked workers, so the
    next request is still answered at once (both loops: the native one keeps its places in C).

    (A request that arrives while the worker that answered the last one is not back in the device
    read yet wakes a parked worker, which then keeps the place: a window of microseconds, which a
    loaded machine hits now and then, so the pair of readers changes over a run. Hence: the
    SPARE_READERS + 1 busiest workers serve most requests. Without parking the kernel hands each
    request to the reader that waited longest, and each of the 8 serves an eighth.)"""
    stub = Stub(tree)
    s = Served(stub, threads=8)
    try:
        for _ in range(200):
            assert s.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), 1)[0] == 0
        served = sorted((w.counts.get(Op.GETATTR, 0) for w in s.session._workers), reverse=True)
        assert sum(served[: SPARE_READERS + 1]) >= 0.6 * 200, served
        stub.delay = 2.0
        slow = [s.fk.send(Op.LOOKUP, b"x\0", 1) for _ in range(5)]  # more than the spare readers
        time.sleep(0.3)  # (each now sleeps in its handler)
        stub.delay = 0.0
        t0 = time.monotonic()
        assert s.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), 1)[0] == 0
        assert time.monotonic() - t0 < 1.0  # served by a woken worker, not after a slow one
        for unique in slow:
            assert s.fk.reply(unique, timeout=5)[0] == 0
    finally:
        s.close()


def test_interrupt_answers_eintr_and_unknown_interrupts_are_eagain(tree: Path) -> None:
    stub = Stub(tree, delay=3.0)
    s = Served(stub)
    try:
        unique = s.fk.send(Op.LOOKUP, b"x\0", 1)
        time.sleep(0.2)
        intr = s.fk.send(Op.INTERRUPT, abi.INTERRUPT_IN.pack(unique))
        t0 = time.monotonic()
        assert s.fk.reply(unique, timeout=3)[0] == errno.EINTR
        assert time.monotonic() - t0 < 2.5
        with pytest.raises(TimeoutError):  # an interrupt that found its request takes no reply
            s.fk.reply(intr, timeout=0.3)
        assert s.fk.call(Op.INTERRUPT, abi.INTERRUPT_IN.pack(12345))[0] == errno.EAGAIN
    finally:
        s.close()


def test_concurrent_requests_each_get_their_own_reply(served: Served) -> None:
    node = served.node("/data.bin")
    fh, _ = served.open(node)
    errors: list[str] = []

    def reader(seed: int) -> None:
        for i in range(50):
            offset = (seed * 7919 + i * 4099) % (len(CONTENT) - 4096)
            if served.read(node, fh, offset, 4096) != (0, CONTENT[offset : offset + 4096]):
                errors.append(f"{seed}/{i}")

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# -- properties over request arguments --------------------------------------------------------------
BIG = 2**64 - 1
u64 = st.one_of(st.integers(min_value=0, max_value=BIG), st.sampled_from([0, 1, 4095, 4096, 1 << 20, BIG]))
u32 = st.integers(min_value=0, max_value=2**32 - 1)
names = st.one_of(
    st.sampled_from(["data.bin", "dir", "link", "missing", ".fastfs", "..", ".", "a/b", "", "n" * 300]),
    st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape")),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fh=u64, offset=u64, size=u32, nodeid=st.sampled_from([1, 2, 3, 0, 999999]), opened=st.booleans())
def test_read_arguments_give_data_or_errno(served: Served, fh: int, offset: int, size: int, nodeid: int, opened):
    node = served.node("/data.bin")
    if opened:
        fh, _ = served.open(node)
        nodeid = node
    try:
        err, data = served.read(nodeid, fh, offset, size)
        assert err >= 0
        if err == 0:
            assert len(data) <= size
            if opened:
                assert data == CONTENT[offset : offset + min(size, 1 << 20)]
    finally:
        if opened:
            served.release(node, fh)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names, parent=st.sampled_from([1, 2, 3, 0, 999999]), body=st.binary(max_size=64))
def test_metadata_arguments_give_result_or_errno(served: Served, name: str, parent: int, body: bytes) -> None:
    raw = os.fsencode(name).replace(b"\0", b"") + b"\0"
    for opcode, payload in (
        (Op.LOOKUP, raw),
        (Op.GETATTR, body),
        (Op.READLINK, b""),
        (Op.READDIR, body),
        (Op.READDIRPLUS, read_body(0, 0, 4096)),
        (Op.LISTXATTR, abi.GETXATTR_IN.pack(4096, 0)),
        (Op.GETXATTR, abi.GETXATTR_IN.pack(4096, 0) + raw),
        (Op.ACCESS, abi.ACCESS_IN.pack(os.R_OK, 0)),
        (Op.OPEN, body),
    ):
        err, _ = served.call(opcode, payload, parent)
        assert err >= 0


def test_flush_is_enosys_so_the_kernel_stops_sending_it(served: Served) -> None:
    node = served.node("/data.bin")
    assert served.call(Op.FLUSH, abi.FLUSH_IN.pack(0, 0, 0, 0), node)[0] == errno.ENOSYS


def test_no_open_stats_file_larger_than_its_size_drops_top_files_and_stays_json() -> None:
    """Regression: a no_open stats snapshot beyond the file's fixed size was cut mid-JSON; it now drops
    top files until it fits, as the stats xattr does, and still parses."""
    from fastfs.daemon.controller import Controller
    from fastfs.daemon.ops import NOFH_STATS_SIZE

    class BigSnapshots:
        def snapshot(self, top: int = 10) -> dict:
            rows = [{"path": f"/{i:03d}/" + "x" * 8000, "fetched": 50 - i} for i in range(50)]
            return {"counters": {"opens": 1}, "top_files": rows}

    control = Controller(BigSnapshots(), {"source": "/src", "mountpoint": "/mnt"})  # type: ignore[arg-type]
    try:
        data = control.stats_file(None, limit=NOFH_STATS_SIZE)
        assert len(data) > NOFH_STATS_SIZE // 2  # as many rows as fit, not none
        assert len(data) <= NOFH_STATS_SIZE
        doc = json.loads(data)
        assert doc["top_files_dropped"] > 0 and doc["counters"] == {"opens": 1}
        assert len(control.stats_file(None)) > NOFH_STATS_SIZE  # without a limit: the whole table
    finally:
        control.close()


# -- directories and growing files (issue 22) -------------------------------------------------------
def test_an_open_directory_made_again_at_the_source_keeps_its_attributes(served: Served, tree: Path) -> None:
    """Regression (a directory removed and made again at the source, then listed through the mount):
    glibc's ``opendir`` opens the directory and then ``fstat``s it. The open reached the kernel's
    cached node of the old directory; when its attributes had expired meanwhile, the GETATTR of that
    node found another directory at the path and answered ESTALE, which no path walk retries:
    ``os.listdir`` failed with ESTALE (1 run in 12 of 20 rounds). An open directory's node answers its
    own attributes, as an open file's does, and the kernel drops the name for the next walk."""
    old = served.node("/dir")
    old_ino = (tree / "dir").stat().st_ino
    err, _ = served.call(Op.OPENDIR, abi.OPEN_IN.pack(os.O_RDONLY | os.O_DIRECTORY, 0), old)
    assert err == 0
    (tree / "dir.new").mkdir()  # (made before the old one goes: another inode number)
    (tree / "dir.new" / "new.txt").write_bytes(b"new\n")
    shutil.rmtree(tree / "dir")
    os.rename(tree / "dir.new", tree / "dir")
    err, out = served.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), old)  # the opendir's fstat
    assert err == 0, errno.errorcode.get(err)
    assert abi.ATTR_OUT.unpack(out)[3] == old_ino  # (its own attributes: attr_valid, nsec, dummy, ino)
    _notified(served, _entry_invalidation(1, "dir"))  # the next path walk looks "dir" up again
    assert served.call(Op.RELEASEDIR, abi.RELEASE_IN.pack(0, 0, 0, 0), old)[0] == 0
    # closed: a path stat of the old node is ESTALE (the kernel's path walk looks the name up again)
    assert served.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), old)[0] == errno.ESTALE
    new = served.node("/dir")
    assert new != old
    served.ops.nodes.check_invariants()


def _notified(served: Served, want, timeout: float = 5.0) -> list[tuple[int, bytes]]:
    """The notifications received until one satisfies *want* (each GETATTR of the root collects those
    written meanwhile), or AssertionError after *timeout*."""
    deadline = time.monotonic() + timeout
    while True:
        assert served.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), 1)[0] == 0
        if any(want(code, payload) for code, payload in served.fk.notifications):
            return served.fk.notifications
        assert time.monotonic() < deadline, served.fk.notifications
        time.sleep(0.02)


def _entry_invalidation(parent: int, name: str):
    def match(code: int, payload: bytes) -> bool:
        if code != abi.Notify.INVAL_ENTRY:
            return False
        nodeid, namelen, _flags = abi.NOTIFY_INVAL_ENTRY_OUT.unpack_from(payload)
        start = abi.NOTIFY_INVAL_ENTRY_OUT.size
        return nodeid == parent and payload[start : start + namelen] == name.encode()

    return match


def test_opendir_is_answered_without_caching_even_when_the_kernel_offers_open_less_directories(served: Served) -> None:
    assert served.negotiated.offers(abi.Init.NO_OPENDIR_SUPPORT)
    for node in (1, served.node("dir")):
        err, payload = served.call(Op.OPENDIR, abi.OPEN_IN.pack(os.O_RDONLY, 0), node)
        assert err == 0
        _fh, flags, _backing = abi.OPEN_OUT.unpack(payload)
        assert not flags & (abi.FOPEN_CACHE_DIR | abi.FOPEN_KEEP_CACHE)  # every listing reaches the daemon
        assert served.call(Op.RELEASEDIR, abi.RELEASE_IN.pack(0, 0, 0, 0), node)[0] == 0


def test_a_changed_directory_drops_vanished_names_and_absent_names_that_now_exist(tree: Path) -> None:
    served = Served(make_engine(tree, **{"fuse.negative_timeout": "60"}))
    try:
        d = served.node("dir")
        served.node("dir/small.txt")  # held by the kernel
        assert entry_nodeid(lookup(served.fk, d, "later")[1]) == 0  # answered absent, cached 60 s
        assert served.call(Op.READDIR, read_body(0, 0, 4096), d)[0] == 0
        os.unlink(tree / "dir" / "small.txt")
        (tree / "dir" / "later").write_bytes(b"now")
        err, payload = served.call(Op.READDIR, read_body(0, 0, 4096), d)  # listed anew: it changed
        assert err == 0 and {n for n, _, _ in parse_dirents(payload)} == {".", "..", "later"}
        _notified(served, _entry_invalidation(d, "small.txt"))
        _notified(served, _entry_invalidation(d, "later"))
    finally:
        served.close()


def test_a_grown_open_file_takes_its_new_size_and_the_kernel_is_told(served: Served, tree: Path) -> None:
    node = served.node("data.bin")
    fh, _ = served.open(node)
    with open(tree / "data.bin", "ab") as f:
        f.write(b"tail" * 1000)
    grown = len(CONTENT) + 4000

    def told(code: int, payload: bytes) -> bool:
        return code == abi.Notify.INVAL_INODE and abi.NOTIFY_INVAL_INODE_OUT.unpack(payload) == (
            node,
            len(CONTENT) & ~4095,
            -1,
        )

    _notified(served, told)  # the refresher's check, within its period (the served route: pages too)
    err, payload = served.call(Op.GETATTR, abi.GETATTR_IN.pack(abi.GETATTR_FH, 0, fh), node)
    assert err == 0 and abi.ATTR_OUT.unpack(payload)[3 + 1] == grown  # fstat: the grown size
    err, data = served.read(node, fh, len(CONTENT) - 4, 100)
    assert err == 0 and data == CONTENT[-4:] + (b"tail" * 24)
    served.release(node, fh)


@pytest.mark.parametrize("count", [0, 1, 64, 65, 2000])
def test_a_reply_of_many_buffers_arrives_whole_and_in_order(count: int) -> None:
    """A handler's list of buffers is sent as one reply in order: as it is up to 64 buffers, joined
    beyond (a writev takes at most IOV_MAX, and a read of many small blocks makes many)."""
    parts = [bytes([i % 251]) * (1 + i % 7) for i in range(count)]
    fk = FakeKernel()
    session = Session(fk.fd, {Op.GETATTR: lambda request, body: [memoryview(p) for p in parts]}, Wishes(), threads=2)
    unique = fk.send(Op.INIT, init_body())
    session.start()
    try:
        assert fk.reply(unique)[0] == 0
        for _ in range(3):
            assert fk.call(Op.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), 1) == (0, b"".join(parts))
    finally:
        fk.close()
        session.wait(5)
        session.close()


def test_answers_short_and_long_errors_and_none_arrive_exact_from_many_workers() -> None:
    """Every kind of answer, in requests sent back to back and many in flight at once: bytes up to the
    native loop's copy bound (written without the GIL, the worker going on to its next read without it)
    and just above it, None (success, no payload), an errno, and a reply after which the handler's
    ``after`` runs (always on the GIL's path). Each request's own answer arrives, whole."""
    bound = 4096  # REPLY_COPY_MAX in daemon/kernel/_loop.c
    sizes = [0, 1, 144, bound - 1, bound, bound + 1, 3 * bound]
    after_ran: list[int] = []

    def answer(request: Any, body: memoryview) -> Any:
        kind, value = struct.unpack("<II", bytes(body[:8]))
        if kind == 0:
            return bytes([value % 251]) * value
        if kind == 1:
            return None
        if kind == 2:
            raise OSError(value, "asked for")
        request.after = lambda: after_ran.append(value)
        return bytes([value % 251]) * value

    cases = [(0, n) for n in sizes] + [(1, 0), (2, errno.ENOENT), (2, errno.EACCES)] + [(3, n) for n in sizes]
    fk = FakeKernel()
    session = Session(fk.fd, {Op.GETATTR: answer}, Wishes(), threads=4)
    unique = fk.send(Op.INIT, init_body())
    session.start()
    try:
        assert fk.reply(unique)[0] == 0
        for _ in range(20):
            sent = [(fk.send(Op.GETATTR, struct.pack("<II", kind, value)), kind, value) for kind, value in cases]
            for u, kind, value in sent:
                err, payload = fk.reply(u)
                if kind == 2:
                    assert (err, payload) == (value, b"")
                elif kind == 1:
                    assert (err, payload) == (0, b"")
                else:
                    assert (err, payload) == (0, bytes([value % 251]) * value)
        deadline = time.monotonic() + 5
        while len(after_ran) < 20 * len(sizes) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(after_ran) == sorted(sizes * 20)
    finally:
        fk.close()
        session.wait(5)
        session.close()


def test_a_request_of_no_handler_is_answered_while_a_handler_holds_the_gil(request_loop: str) -> None:
    """The native loop answers a request no handler takes (Python's ``open()`` sends FUSE_IOCTL on every
    file it opens, to ask whether it is a terminal) with ENOSYS without taking the GIL: a GETATTR
    handler holds the GIL (C calls through ``ctypes.PyDLL`` keep it) while it sends an IOCTL and waits
    for its answer on the fake kernel's socket. The answer arrives meanwhile, and every such request is
    counted with the session's requests."""
    if request_loop == "python":
        pytest.skip("the Python loop answers every request holding the GIL")
    libc = ctypes.PyDLL(None, use_errno=True)  # (PyDLL: the GIL stays held across each call)
    fk = FakeKernel()
    kernel_fd = fk.kernel.fileno()
    seen: list[tuple[int, int]] = []

    def hold(request: Any, body: memoryview) -> bytes:
        header = abi.IN_HEADER.pack(abi.IN_HEADER.size, Op.IOCTL, 1001, 1, 0, 0, 1, 0, 0)
        assert libc.send(kernel_fd, header, len(header), 0) == len(header)
        reply = ctypes.create_string_buffer(4096)
        pfd = ctypes.create_string_buffer(struct.pack("ihh", kernel_fd, select.POLLIN, 0), 8)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if libc.poll(pfd, 1, 100) == 1:  # (milliseconds, with the GIL held)
                got = libc.recv(kernel_fd, reply, len(reply), 0)
                _, error, unique = abi.OUT_HEADER.unpack_from(reply.raw[:got])
                seen.append((unique, -error))
                break
        return b"held"

    session = Session(fk.fd, {Op.GETATTR: hold}, Wishes(), threads=4)
    unique = fk.send(Op.INIT, init_body())
    session.start()
    interval = sys.getswitchinterval()
    try:
        assert fk.reply(unique)[0] == 0
        sys.setswitchinterval(60)  # no thread waiting for the GIL gets it from the handler meanwhile
        try:
            assert fk.call(Op.GETATTR) == (0, b"held")
        finally:
            sys.setswitchinterval(interval)
        assert seen == [(1001, errno.ENOSYS)]  # answered while the handler held the GIL
        for _ in range(3):
            assert fk.call(Op.IOCTL, b"\0" * 32) == (errno.ENOSYS, b"")
        assert session.counters()["requests"]["ioctl"] == 4
    finally:
        fk.close()
        session.wait(5)
        session.close()
