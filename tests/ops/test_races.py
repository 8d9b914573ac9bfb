"""Races of the kernel layer found by reading (issue 24, item 9), each forced into its bad interleaving
by a hook, so the test fails on the code that had the race instead of once in a thousand runs.

Each hook gives the other thread a bounded chance (:data:`SLIP_IN`) to slip in at the exact point of
the race: where a lock now forbids it, the hook's wait runs out and the steps happen in order."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from kernelclient import FakeKernel, entry_nodeid, init_body, lookup, parse_dirents, read_body

from fastfs.config.loader import load_config
from fastfs.daemon.controlfs import STATS_ID
from fastfs.daemon.kernel.abi import Op
from fastfs.daemon.kernel.negotiate import Wishes
from fastfs.daemon.kernel.session import Session, Worker
from fastfs.daemon.listings import Listings
from fastfs.daemon.ops import KernelOps
from fastfs.fsio.engine import Engine

pytestmark = pytest.mark.usefixtures("request_loop")  # every test on both request loops

# Seconds a hook waits for the other thread to reach the racy step (runs out when a lock forbids it).
SLIP_IN = 0.5
# Bytes of one read of the no_open stats file (it is NOFH_STATS_SIZE long: two reads cover it).
CHUNK = 128 * 1024


class Served:
    """A KernelOps over an engine, served by a real Session (3 workers) to a FakeKernel."""

    def __init__(self, tree: Path, no_open: bool = False) -> None:
        config = load_config(
            None,
            {"cache.budget": "64M", "readahead.learn": "false", "fuse.passthrough": "off"},
            use_default_path=False,
        )
        self.engine = Engine(str(tree), config)
        self.ops = KernelOps(self.engine, {"source": "SRC", "mountpoint": "/mnt/test"}, no_open=no_open)
        self.fk = FakeKernel()
        self.session = Session(self.fk.fd, self.ops.handlers(), Wishes(), threads=3)
        self.ops.session = self.session
        unique = self.fk.send(Op.INIT, init_body())
        self.session.start()
        assert self.fk.reply(unique)[0] == 0

    def close(self) -> None:
        self.fk.close()
        self.session.wait(5)
        self.session.close()
        self.engine.close()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "dir").mkdir(parents=True)
    for i in range(60):
        (root / "dir" / f"entry-{i:03d}").write_bytes(b"")
    return root


class HookedDict(dict):
    """The no_open snapshots per view; the first ``pop`` lets another reader's pass start (its first
    store) before the pop goes on, as a thread switch at that instant would."""

    def __init__(self, start_other) -> None:
        super().__init__()
        self.start_other = start_other
        self.stored = threading.Event()
        self.hooked = False

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        if self.hooked:
            self.stored.set()

    def pop(self, *args):
        if not self.hooked:
            self.hooked = True
            self.start_other()
            self.stored.wait(SLIP_IN)
        return super().pop(*args)


def test_a_no_open_stats_pass_starting_as_another_ends_is_one_snapshot(tree: Path, monkeypatch) -> None:
    """Regression: the read ending a pass over the no_open stats file forgot the pass's snapshot
    without the lock, so it could forget the snapshot a pass starting at that instant had just kept:
    that pass then read its tail from a third snapshot (two halves of two snapshots)."""
    s = Served(tree, no_open=True)
    try:
        made = []

        def stats_file(caller=None, redacted=False, limit=None) -> bytes:  # every snapshot its own digit
            made.append(None)
            return str(len(made) % 10).encode() * (200 * 1024)

        monkeypatch.setattr(s.ops.control, "stats_file", stats_file)
        other: dict[str, bytes] = {}

        def start_other() -> None:  # another reader starts its pass (offset 0) on another worker
            def first_read() -> None:
                other["head"] = s.fk.call(Op.READ, read_body(0, 0, CHUNK), STATS_ID)[1]

            thread = threading.Thread(target=first_read)
            thread.start()
            other["thread"] = thread  # type: ignore[assignment]

        s.ops.controlfs._open_less = HookedDict(start_other)
        assert s.fk.call(Op.READ, read_body(0, 0, CHUNK), STATS_ID)[0] == 0  # our pass
        err, tail = s.fk.call(Op.READ, read_body(0, CHUNK, CHUNK), STATS_ID)  # its end: the hook runs
        assert err == 0 and len(tail) == CHUNK
        other["thread"].join(10)  # type: ignore[attr-defined]
        err, rest = s.fk.call(Op.READ, read_body(0, CHUNK, CHUNK), STATS_ID)  # the other pass goes on
        assert err == 0
        body = (other["head"] + rest).rstrip(b" ")
        assert len(set(body)) == 1, f"one pass read {sorted(set(body.decode()))}: halves of two snapshots"
    finally:
        s.close()


def _readdir_pass(fk: FakeKernel, node: int, offset: int, size: int) -> tuple[list[str], int]:
    err, payload = fk.call(Op.READDIR, read_body(0, offset, size), node)
    assert err == 0
    entries = parse_dirents(payload)
    return [name for name, _, _ in entries], (entries[-1][1] if entries else offset)


def test_a_readdir_pass_keeps_its_listing_when_another_pass_starts(tree: Path) -> None:
    """Regression: a READDIR at offset 0 replaced the one listing kept per directory, so a pass in
    progress over a changing directory continued by index in another pass's listing (entries it never
    saw skipped, or seen ones repeated)."""
    s = Served(tree)
    try:
        err, payload = lookup(s.fk, 1, "dir")
        assert err == 0
        node = entry_nodeid(payload)
        seen, offset = _readdir_pass(s.fk, node, 0, 512)  # our pass: its first entries
        assert 3 < len(seen) < 40
        gone = [n for n in seen if n not in (".", "..")][:3]
        for name in gone:  # the directory changes: entries we saw go
            os.unlink(tree / "dir" / name)
        other, _ = _readdir_pass(s.fk, node, 0, 1 << 16)  # another reader's pass from offset 0
        assert not set(gone) & set(other)
        while True:  # our pass goes on where it was
            names, offset = _readdir_pass(s.fk, node, offset, 512)
            if not names:
                break
            seen += names
        assert len(seen) == len(set(seen)), "entries repeated"
        stayed = set(os.listdir(tree / "dir"))
        assert stayed <= set(seen), f"entries skipped: {sorted(stayed - set(seen))}"
        assert len(s.ops.listings) == 1  # our pass ended (forgotten), the other never read to its end
    finally:
        s.close()


def test_listings_are_bounded_and_a_forgotten_pass_goes_on_by_index(tree: Path) -> None:
    s = Served(tree)
    try:
        s.ops.listings = Listings(s.ops._fetch_listing, limit=4)
        node = entry_nodeid(lookup(s.fk, 1, "dir")[1])
        first, offset = _readdir_pass(s.fk, node, 0, 512)
        for _ in range(6):  # more passes start than are kept: ours is dropped
            _readdir_pass(s.fk, node, 0, 512)
        assert len(s.ops.listings) == 4
        seen = list(first)
        while True:
            names, offset = _readdir_pass(s.fk, node, offset, 512)
            if not names:
                break
            seen += names
        assert sorted(seen) == sorted([".", "..", *os.listdir(tree / "dir")])  # (the directory did not change)
    finally:
        s.close()


def test_interrupts_counted_by_two_workers_at_once_are_both_counted(monkeypatch) -> None:
    """Regression: ``Session.interrupt`` counted ``_interrupts += 1`` without the lock from any
    worker: two at once could count one."""
    value = {"n": 0}
    read_once = threading.Event()
    other_counted = threading.Event()
    threads: dict[str, threading.Thread] = {}

    def get(self) -> int:
        n = value["n"]
        if threading.current_thread() is threads.get("a") and not read_once.is_set():
            read_once.set()  # between this read and its write, let the other worker count
            other_counted.wait(SLIP_IN)
        return n

    def put(self, n: int) -> None:
        value["n"] = n
        if threading.current_thread() is threads.get("b"):
            other_counted.set()

    monkeypatch.setattr(Session, "_interrupts", property(get, put), raising=False)
    session = Session(-1, {}, Wishes())
    workers = []
    for unique in (11, 12):
        worker = Worker(-1, False, 64, 4096)
        worker.current = (unique, Op.READ, time.monotonic(), False, 0)
        workers.append(worker)
    session._workers.extend(workers)
    results: dict[str, bool] = {}
    threads["a"] = threading.Thread(target=lambda: results.update(a=session.interrupt(11)))
    threads["b"] = threading.Thread(target=lambda: (read_once.wait(10), results.update(b=session.interrupt(12))))
    for t in threads.values():
        t.start()
    for t in threads.values():
        t.join(10)
    assert results == {"a": True, "b": True}
    assert all(w.current[3] for w in workers)  # both requests marked interrupted
    assert session.counters()["interrupts"] == 2
