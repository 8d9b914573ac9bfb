"""A reference model of the engine, driven by hypothesis (no FUSE).

:class:`EngineMachine` runs random sequences of opens, reads, releases, open-less (``fuse.no_open``)
reads, source replacements and budget changes against a real :class:`~fastfs.fsio.engine.Engine`
over a temporary source directory, and checks every answer against a model that knows the bytes of
every version of every file:

* bytes read through a handle are those of the version the open returned (its file key), at the
  offset asked, cut at that version's end; reads past the end return nothing;
* an open with an ``expect`` key (the daemon passes the version its inode stands for) returns that
  version or fails with ESTALE when the source no longer is that version; an open without one
  returns the version the source holds now;
* the documented exceptions are allowed and nothing else: an open answered from fresh small-file
  scan metadata may name the version the scan saw (and its reads then fail with ESTALE for bytes
  not in RAM once the source changed); a file rewritten in place (same inode) gives handles of its
  earlier versions bytes of any of its versions (no snapshot exists to serve), never other bytes
  and never past the opened version's end;
* a released handle reads EBADF, a negative offset EINVAL;
* the cache's charged bytes never exceed the budget (after a budget cut, bytes still in flight may
  keep them above it until they settle, but they never grow while above), and its accounting
  adds up; when the pool is idle no block is pinned or pending;
* the engine's own ``check_invariants()`` holds after every step when the engine has one.

Files are up to a dozen cache blocks (1 MiB blocks, budgets of 16-24 MiB) in one directory, so three opens
start a small-file scan and prefetch windows (8 MiB) meet the budget.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import tempfile
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.cache import PENDING
from fastfs.fsio.engine import Engine
from fastfs.fsio.source import stat_key

MIB = 1024 * 1024
BLOCK = MIB
NAMES = ("a", "b", "c", "d")
BUDGETS = (16 * MIB, 20 * MIB, 24 * MIB)
SETTLE_SECONDS = 20.0
NO_HANDLE = -1  # what a failed open puts in the handles bundle

_blocks = st.builds(lambda blocks, tail: max(0, blocks * BLOCK + tail), st.integers(0, 12), st.integers(-4097, 4097))
sizes = st.one_of(st.integers(0, 3 * 4096), _blocks, _blocks)  # small files (scanned whole) and larger ones
offsets = st.one_of(st.integers(0, 6 * BLOCK), st.sampled_from([0, BLOCK - 1, BLOCK, 2 * BLOCK, 4096]))
lengths = st.one_of(st.integers(0, 3 * BLOCK), st.sampled_from([1, 4096, 131072, BLOCK]))


_ROOT: list[str] = []  # the module's scratch directory while pytest runs it (examples make theirs inside)


@pytest.fixture(autouse=True, scope="module")
def _scratch():
    """Every example's source tree lives under one directory, removed at the end even after a failure
    that skipped an example's teardown (an interrupted shrink)."""
    root = tempfile.mkdtemp(prefix="fastfs-model-")
    _ROOT.append(root)
    yield
    _ROOT.remove(root)
    shutil.rmtree(root, ignore_errors=True)


def make_config(tmp: str, budget: int, attr_timeout: float):
    return load_config(
        overrides={
            "cache.budget": f"{budget // MIB}M",
            "cache.block_size": f"{BLOCK // MIB}M",
            "cache.workers": "4",
            "fuse.attr_timeout": str(attr_timeout),
            "state.dir": os.path.join(tmp, "state"),
        },
        use_default_path=False,
    )


def _entry_of(engine: Engine, fh: int):
    """The engine's state of an open handle."""
    return engine.handles.get(fh)


def _scans_in_flight(engine: Engine) -> bool:
    with engine.scanner._dirs_lock:
        return any(d.inflight for d in engine.scanner._dirs.values())


def _check(engine: Engine) -> None:
    """The engine's own invariants (handle table, scanner, cache)."""
    engine.check_invariants()


class EngineMachine(RuleBasedStateMachine):
    """See the module docstring."""

    attr_timeout = 60.0

    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="example-" if _ROOT else "fastfs-model-", dir=_ROOT[-1] if _ROOT else None)
        self.src = os.path.join(self.tmp, "src")
        self.staging = os.path.join(self.tmp, "staging")
        os.makedirs(os.path.join(self.src, "d"))
        os.mkdir(self.staging)
        self.budget = BUDGETS[0]
        self.engine = Engine(self.src, make_config(self.tmp, self.budget, self.attr_timeout))
        self.ceiling = self.budget  # most bytes the cache may hold (see check_budget)
        self.versions: dict[tuple, bytes] = {}  # file key -> the bytes of that version
        self.later: dict[tuple, list[bytes]] = {}  # file key -> contents its inode got later, in place
        self.current: dict[str, tuple] = {}  # name -> key of the version the source holds now
        self.name_of: dict[tuple, str] = {}  # file key -> name of its file
        self.open_fhs: dict[int, tuple] = {}  # handle -> file key it opened
        self.closed_fhs: list[int] = []
        self.mtime = 1_600_000_000 * 10**9

    def teardown(self) -> None:
        try:
            self.engine.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
            # a failing example's traceback keeps the machine: drop the bytes it holds (shrinking runs many)
            self.versions.clear()
            self.later.clear()
            self.engine.cache = None

    # -- the source ------------------------------------------------------------------------------
    @staticmethod
    def path(name: str) -> str:
        return f"/d/{name}"

    def _stamp(self, real: str) -> None:
        self.mtime += 1_000_003  # every version gets its own mtime, so its own key
        os.utime(real, ns=(self.mtime, self.mtime))

    def _record(self, name: str, data: bytes) -> None:
        key = stat_key(os.stat(os.path.join(self.src, "d", name)))  # after the rename: it sets ctime
        assert key not in self.versions
        self.versions[key] = data
        self.name_of[key] = name
        self.current[name] = key

    @initialize(files=st.lists(st.tuples(sizes, st.integers(0, 2**32)), min_size=2, max_size=len(NAMES)))
    def first_files(self, files):
        for name, (size, seed) in zip(NAMES, files, strict=False):
            self.replace(name, size, seed)

    @rule(name=st.sampled_from(NAMES), size=sizes, seed=st.integers(0, 2**32))
    def replace(self, name, size, seed):
        """Atomic replace: new content written aside, renamed over the path (a new inode)."""
        data = random.Random(seed).randbytes(size)
        staged = os.path.join(self.staging, name)
        with open(staged, "wb") as f:
            f.write(data)
        self._stamp(staged)
        os.replace(staged, os.path.join(self.src, "d", name))
        self._record(name, data)

    @precondition(lambda self: bool(self.current))
    @rule(data=st.data(), size=sizes, seed=st.integers(0, 2**32))
    def rewrite_in_place(self, data, size, seed):
        """Rewrite in place (same inode, new size and mtime): earlier versions' handles see the new bytes."""
        name = data.draw(st.sampled_from(sorted(self.current)))
        self.settle()
        content = random.Random(seed).randbytes(size)
        real = os.path.join(self.src, "d", name)
        ino = os.stat(real).st_ino
        with open(real, "r+b") as f:
            f.truncate(0)
            f.write(content)
        for key in self.versions:
            if key[1] == ino and key[0] == os.stat(real).st_dev:
                self.later.setdefault(key, []).append(content)
        self._stamp(real)
        self._record(name, content)

    # -- opens -----------------------------------------------------------------------------------
    def _meta_key(self, name: str) -> tuple:
        """The version the engine's lookups report: the source's, or the one fresh scan metadata names."""
        return stat_key(self.engine.lstat(self.path(name)))

    @precondition(lambda self: bool(self.current))
    @rule(target=handles, data=st.data(), mode=st.sampled_from(["plain", "expect", "stale"]), cached=st.booleans())
    def open(self, data, mode, cached):
        name = data.draw(st.sampled_from(sorted(self.current)))
        path = self.path(name)
        now = self.current[name]
        expect = None
        if mode == "expect":  # what the daemon passes: the version its lookup (engine.lstat) saw
            expect = stat_key(self.engine.lstat(path))
        elif mode == "stale":
            older = [k for k in self.versions if k != now and self.name_of[k] == name]
            if older:
                expect = data.draw(st.sampled_from(older))
        meta_before = self._meta_key(name)
        try:
            result = self.engine.open(path, expect=expect, cached=cached)
        except OSError as e:
            assert e.errno == errno.ESTALE, e
            assert expect is not None
            event("open: ESTALE")
            # ESTALE only when the version asked for is not the one the open found
            assert expect != now or meta_before != expect or self._meta_key(name) != expect
            return NO_HANDLE  # (a value all the same: what is drawn must not depend on the engine)
        key = result.key
        assert key in self.versions, "open returned a key no version of the source ever had"
        if expect is not None:
            assert key == expect
        if key != now:  # only an open answered from a scan's (fresh) metadata may name an older version
            assert self.attr_timeout > 0
            event("open: an older version, from scan metadata")
            assert key in (meta_before, self._meta_key(name)), (key, now)
        assert self.name_of[key] == name
        assert result.st is not None and result.st.st_size == len(self.versions[key])
        self.open_fhs[result.fh] = key
        return result.fh

    # -- reads -----------------------------------------------------------------------------------
    def _verify(self, key: tuple, offset: int, size: int, got: bytes | OSError, may_be_stale: bool) -> None:
        """*got* (bytes, or the error raised) against the model for a read of version *key*."""
        data = self.versions[key]
        want = data[offset : offset + size]
        if isinstance(got, OSError):
            assert got.errno == errno.ESTALE and may_be_stale, (got, offset, size)
            event("read: ESTALE")
            return
        candidates = self.later.get(key)
        if not candidates:
            assert len(got) == len(want), (offset, size, len(got), len(want))
            assert got == want, f"wrong bytes at offset {offset} size {size}"
            return
        event("read: of a version rewritten in place")
        # rewritten in place: each byte is the byte of some content the inode had, never past the opened end
        assert len(got) <= len(want)
        if not got:
            return
        arr = np.frombuffer(got, dtype=np.uint8)
        ok = np.zeros(len(got), dtype=bool)
        for content in [data, *candidates]:
            piece = np.frombuffer(content[offset : offset + len(got)], dtype=np.uint8)
            ok[: len(piece)] |= arr[: len(piece)] == piece
        assert ok.all(), f"bytes of no version at offset {offset + int(np.argmin(ok))}"

    def _may_be_stale(self, fh: int, key: tuple) -> bool:
        """A handle opened from scan metadata has no source file yet: once the source changed, bytes
        not in RAM cannot be read (ESTALE, documented in Engine._get_source)."""
        entry = _entry_of(self.engine, fh)
        return entry is not None and entry.src is None and self.current.get(self.name_of[key]) != key

    def _read(self, fh: int, offset: int, size: int) -> None:
        key = self.open_fhs[fh]
        stale = self._may_be_stale(fh, key)
        try:
            got: bytes | OSError = self.engine.read(fh, offset, size)
        except OSError as e:
            got = e
        self._verify(key, offset, size, got, stale)

    @rule(fh=handles, offset=offsets, size=lengths)
    def read(self, fh, offset, size):
        if fh in self.open_fhs:
            self._read(fh, offset, size)

    @rule(
        fh=handles,
        start=offsets,
        chunk=st.sampled_from([4096, 65536, 131072, BLOCK, 3 * BLOCK + 7]),
        n=st.integers(2, 8),
    )
    def read_run(self, fh, start, chunk, n):
        """A sequential run (what starts a stream and its prefetch)."""
        if fh in self.open_fhs:
            for i in range(n):
                self._read(fh, start + i * chunk, chunk)

    @rule(fh=handles, chunk=st.sampled_from([131072, BLOCK]))
    def read_whole(self, fh, chunk):
        """The whole version front to back (a stream: the prefetch fills the cache up to its budget)."""
        if fh in self.open_fhs:
            size = len(self.versions[self.open_fhs[fh]])
            for offset in range(0, size + 1, chunk):
                self._read(fh, offset, chunk)

    @precondition(lambda self: bool(self.current))
    @rule(target=handles, data=st.data(), chunk=st.sampled_from([131072, BLOCK]))
    def open_and_stream(self, data, chunk):
        """Open the current version and read it whole (the common case; fills the cache)."""
        fh = self.open(data, "plain", False)
        if fh in self.open_fhs:
            self.read_whole(fh, chunk)
        return fh

    @rule(chunk=st.sampled_from([131072, BLOCK]))
    def stream_every_file(self, chunk):
        """Open, read whole and release every file: more bytes than the budget, so blocks are evicted."""
        for name in sorted(self.current):
            result = self.engine.open(self.path(name))
            self.open_fhs[result.fh] = result.key
            self.read_whole(result.fh, chunk)
            self.engine.release(result.fh)
            del self.open_fhs[result.fh]

    @rule(fh=handles, past=st.integers(0, 2 * BLOCK), size=lengths)
    def read_past_eof(self, fh, past, size):
        if fh in self.open_fhs:
            key = self.open_fhs[fh]
            self._read(fh, len(self.versions[key]) + past, size)

    @rule(fh=handles, offset=st.integers(-BLOCK, -1))
    def read_negative(self, fh, offset):
        if fh in self.open_fhs:
            try:
                self.engine.read(fh, offset, 100)
            except OSError as e:
                assert e.errno == errno.EINVAL
            else:
                raise AssertionError("a negative offset was read")

    @precondition(lambda self: bool(self.current))
    @rule(data=st.data(), offset=offsets, size=lengths)
    def read_no_open(self, data, offset, size):
        """fuse.no_open: an open-less read by path at the version the daemon's lookup saw."""
        name = data.draw(st.sampled_from(sorted(self.current)))
        path = self.path(name)
        expect = stat_key(self.engine.lstat(path))
        buf = bytearray(size)
        try:
            n = self.engine.read_into(0, offset, memoryview(buf), path=path, expect=expect)
            got: bytes | OSError = bytes(buf[:n])
        except OSError as e:
            got = e
        # ESTALE when the lookup's version (from scan metadata) is no longer the source's
        self._verify(expect, offset, size, got, may_be_stale=expect != self.current[name])

    # -- release -----------------------------------------------------------------------------------
    @rule(fh=consumes(handles))
    def release(self, fh):
        if fh in self.open_fhs:
            self.engine.release(fh)
            del self.open_fhs[fh]
            self.closed_fhs.append(fh)

    @precondition(lambda self: bool(self.closed_fhs))
    @rule(data=st.data())
    def read_released(self, data):
        fh = data.draw(st.sampled_from(self.closed_fhs))
        try:
            self.engine.read(fh, 0, 10)
        except OSError as e:
            assert e.errno == errno.EBADF
        else:
            raise AssertionError("a released handle was read")

    # -- budget --------------------------------------------------------------------------------------
    @rule(budget=st.sampled_from(BUDGETS))
    def change_budget(self, budget):
        restart = self.engine.reconfigure(make_config(self.tmp, budget, self.attr_timeout))
        assert restart == []
        assert self.engine.cache.budget == budget
        self.budget = budget
        # blocks being filled or pinned cannot be evicted: a cut may leave the cache above it for now
        self.ceiling = max(budget, self.engine.cache.reserved)
        if self.ceiling > budget:
            event("budget: cut below the bytes in flight")

    @rule()
    def settle(self):
        """Wait for the pool and scans to go idle: then no block is pending or pinned (no leaked pin)."""
        engine = self.engine
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            gauges = engine.snapshot()["gauges"]
            busy = gauges["queued_demand"] or gauges["queued_prefetch"] or gauges["inflight_blocks"]
            if not busy and not _scans_in_flight(engine):
                break
            assert time.monotonic() < deadline, "the engine did not go idle"
            time.sleep(0.005)
        with engine.cache._lock:
            blocks = list(engine.cache._blocks.values())
        assert all(b.state != PENDING for b in blocks)
        assert all(b.pins == 0 for b in blocks), "a block stayed pinned after its reads returned"

    # -- invariants ----------------------------------------------------------------------------------
    @invariant()
    def check_engine(self):
        _check(self.engine)

    @invariant()
    def check_budget(self):
        cache = self.engine.cache
        assert cache.budget == self.budget
        used = self.engine.snapshot()["gauges"]["cache_bytes"]
        if used >= self.budget - BLOCK:
            event("budget: cache full")
        assert used <= self.ceiling, (used, self.ceiling, self.budget)
        # above the budget the charge only falls (nothing new is reserved until it fits again)
        self.ceiling = max(self.budget, min(self.ceiling, used))

    @invariant()
    def check_handles(self):
        assert self.engine.snapshot()["gauges"]["open_files"] == len(self.open_fhs)


class TestEngineModel(EngineMachine.TestCase):
    settings = settings(max_examples=40, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))


class StrictOpenMachine(EngineMachine):
    """attr_timeout 0: no scan metadata is trusted, every open and open-less read revalidates."""

    attr_timeout = 0.0


class TestEngineModelStrictOpens(StrictOpenMachine.TestCase):
    settings = settings(max_examples=25, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))


def _scan_engine(tmp_path, size: int):
    """An engine with 256 KiB blocks over /d holding f0..f3 of *size* bytes; f0..f2 opened and read
    (a scan starts at the third); returns (engine, src, data)."""
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    rng = random.Random(7)
    data = {f"f{i}": rng.randbytes(size) for i in range(4)}
    for name, content in data.items():
        (src / "d" / name).write_bytes(content)
    config = load_config(
        overrides={"cache.budget": "16M", "cache.block_size": "256K", "state.dir": str(tmp_path / "state")},
        use_default_path=False,
    )
    engine = Engine(str(src), config)
    for name in ("f0", "f1", "f2"):
        r = engine.open(f"/d/{name}")
        assert engine.read(r.fh, 0, 4096) == data[name][:4096]
        engine.release(r.fh)
    return engine, src, data


def test_an_open_answered_from_scan_metadata_reads_its_version_or_estale(tmp_path):
    """The rare path of the model's documented exception, made deterministic: a scan fetched a small
    file whole (one block) with its metadata; an open answered from them has no source file; once the
    source is replaced, its bytes in RAM are still the opened version's, anything else is ESTALE
    (the new file is never read in their place)."""
    engine, src, data = _scan_engine(tmp_path, 200 * 1024)  # small files within one block
    try:
        deadline = time.monotonic() + 10
        while engine.snapshot()["counters"].get(m.SCAN_FILES, 0) < 1:
            assert time.monotonic() < deadline, "the scan did not fetch f3"
            time.sleep(0.01)
        r = engine.open("/d/f3")
        entry = _entry_of(engine, r.fh)
        assert entry is not None and entry.src is None  # answered from the scan's metadata
        new = random.Random(8).randbytes(len(data["f3"]))
        (tmp_path / "f3.new").write_bytes(new)
        os.replace(tmp_path / "f3.new", src / "d" / "f3")
        for offset in (0, 100 * 1024, len(new) - 4096):
            try:
                got = engine.read(r.fh, offset, 4096)
            except OSError as e:
                assert e.errno == errno.ESTALE
            else:
                assert got == data["f3"][offset : offset + 4096], "bytes of another version"
        engine.release(r.fh)
        # within attr_timeout, lookups and opens still name the version the scan saw (documented)
        assert stat_key(engine.lstat("/d/f3")) == r.key
        with pytest.raises(OSError) as info:
            engine.open("/d/f3", expect=stat_key(os.stat(src / "d" / "f3")))
        assert info.value.errno == errno.ESTALE
    finally:
        engine.close()


def test_a_scan_never_takes_a_file_larger_than_one_block(tmp_path):
    """Regression: with cache.block_size below readahead.small_file_max a scan fetched only block 0 of
    a 700 KiB file yet counted it fetched and answered its next open from the metadata: once the
    source was replaced, reads past the first block failed with ESTALE for up to attr_timeout. Files
    larger than a block are not the scan's: the open goes to the source and reads the file whole."""
    engine, src, data = _scan_engine(tmp_path, 700 * 1024)
    try:
        time.sleep(0.5)  # the scan's workers have run by now (they fetch in parallel)
        assert engine.snapshot()["counters"].get(m.SCAN_FILES, 0) == 0
        new = random.Random(8).randbytes(len(data["f3"]))
        (tmp_path / "f3.new").write_bytes(new)
        os.replace(tmp_path / "f3.new", src / "d" / "f3")
        r = engine.open("/d/f3")
        assert engine.read(r.fh, 0, len(new)) == new
        engine.release(r.fh)
    finally:
        engine.close()
