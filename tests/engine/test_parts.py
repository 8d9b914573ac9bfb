"""The engine's parts on their own: the retry-wait rule, the handle table and its invariants, an
engine built from parts it receives (a fake clock), the scanner's constant name."""

from __future__ import annotations

import os
import threading

import pytest

from fastfs.config import load_config
from fastfs.fsio import fills, learn, scanner
from fastfs.fsio.engine import Engine, EngineParts
from fastfs.fsio.source import FileKey, stat_key
from fastfs.fsio.stats import Stats


def make_config(tmp_path, **overrides):
    opts = {"cache.budget": "32M", "cache.block_size": "1M", "state.dir": str(tmp_path / "state")}
    opts.update(overrides)
    return load_config(overrides=opts, use_default_path=False)


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(3):
        (root / f"f{i}").write_bytes(os.urandom(5000 + i))
    return root


@pytest.mark.parametrize(
    ("timeout", "retry", "wait"),
    [
        (None, False, None),  # no bound
        (None, True, None),
        (0, True, 0),  # 0 means no bound too (the caller maps it)
        (30.0, False, 30.0),
        (30.0, True, fills.RETRY_WAIT),  # a retry after a timeout waits briefly
        (0.5, True, 0.5),  # never longer than the timeout itself
    ],
)
def test_the_one_retry_wait_rule(timeout, retry, wait):
    assert fills.retry_wait(timeout, retry) == wait


def test_file_key_is_a_named_tuple_equal_to_the_plain_tuple(src):
    st = os.lstat(src / "f0")
    key = stat_key(st)
    assert isinstance(key, FileKey)
    assert key == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    assert key.mtime_ns == st.st_mtime_ns and key.size == 5000


def test_handle_table_invariants_hold_through_opens_holds_implicit_reads_and_releases(src, tmp_path):
    engine = Engine(str(src), make_config(tmp_path))
    try:
        data = (src / "f0").read_bytes()
        a = engine.open("/f0")
        b = engine.open("/f0")
        engine.check_invariants()
        assert a.fh != b.fh and 0 not in (a.fh, b.fh)
        assert engine.handles.get(a.fh) is engine.handles.get(b.fh)  # one entry per version
        assert engine.handles.get(a.fh).handles == 2
        fh, entry = engine.hold("/f1")
        assert engine.read_into(0, 0, memoryview(bytearray(10)), path="/f2") == 10  # an implicit handle
        engine.check_invariants()
        assert engine.read(a.fh, 0, len(data)) == data
        engine.release(a.fh)
        engine.check_invariants()
        assert engine.handles.get(b.fh).handles == 1
        engine.release(b.fh)
        engine.release(fh)
        engine.release(fh)  # twice: ignored
        engine.check_invariants()
        assert engine.handles.get(b.fh) is None
        # a broken count is caught
        c = engine.open("/f0")
        engine.handles.get(c.fh).handles += 1
        with pytest.raises(AssertionError, match="counts 2 handles, 1 name it"):
            engine.check_invariants()
        engine.handles.get(c.fh).handles -= 1
        engine.release(c.fh)
        engine.check_invariants()
    finally:
        engine.close()


def test_engine_built_from_parts_it_receives_uses_their_clock(src, tmp_path):
    """Engine.from_parts takes the parts built elsewhere; its clock decides when an open-less reader's
    implicit handle is revalidated (after fuse.revalidate, the close-to-open bound)."""
    config = make_config(tmp_path, **{"fuse.revalidate": "5"})
    stats = Stats()
    now = [1000.0]
    built = EngineParts.build(str(src), config, stats)
    parts = EngineParts(built.source, built.cache, built.pool, built.disk, clock=lambda: now[0])
    engine = Engine.from_parts(parts, config, stats)
    try:
        assert engine.cache is built.cache and engine.pool is built.pool and engine.source is built.source
        buf = memoryview(bytearray(4))
        engine.read_into(0, 0, buf, path="/f1")
        first = engine.handles._implicit["/f1"][2]
        now[0] += 4.0  # within the bound: the same implicit handle
        engine.read_into(0, 0, buf, path="/f1")
        assert engine.handles._implicit["/f1"][2] == first
        now[0] += 2.0  # past it: revalidated like an open, a new handle replaces the old one
        engine.read_into(0, 0, buf, path="/f1")
        assert engine.handles._implicit["/f1"][2] != first
        assert engine.handles.get(first) is None
        assert bytes(buf) == (src / "f1").read_bytes()[:4]
        engine.check_invariants()
    finally:
        engine.close()


def test_scan_state_bound_is_not_named_like_learned_directories():
    assert scanner.MAX_SCAN_DIRS == 1024
    assert not hasattr(scanner, "MAX_DIRS")
    assert learn.MAX_DIRS != scanner.MAX_SCAN_DIRS


def test_debug_switch_checks_the_handle_table_at_open_and_release(src, tmp_path):
    """cache.check_invariants makes every open and release check the handle table (a broken count fails
    the next open loudly); off, nothing is checked."""
    for on in (False, True):
        engine = Engine(str(src), make_config(tmp_path, **{"cache.check_invariants": str(on).lower()}))
        try:
            a = engine.open("/f0")
            engine.handles.get(a.fh).handles += 1  # corrupt the count
            if on:
                with pytest.raises(AssertionError, match="handles"):
                    engine.open("/f1")
            else:
                engine.release(engine.open("/f1").fh)
            engine.handles.get(a.fh).handles -= 1
        finally:
            engine.close()


def test_the_handle_table_check_never_sees_a_handle_counted_but_not_named(src, tmp_path):
    """Opens and releases of one version on several threads while another thread checks the table
    all the time: counting a handle on its entry and naming it in the table are one locked step (they
    were two, and the check run by another thread's open between them failed one CI run in three)."""
    engine = Engine(str(src), make_config(tmp_path))
    stop = threading.Event()
    failures: list[BaseException] = []

    def opener() -> None:
        while not stop.is_set():
            fh = engine.open("/f0").fh
            engine.release(fh)

    def checker() -> None:
        while not stop.is_set():
            try:
                engine.handles.check_invariants()
            except AssertionError as e:
                failures.append(e)
                stop.set()

    threads = [threading.Thread(target=opener) for _ in range(4)] + [threading.Thread(target=checker)]
    try:
        for t in threads:
            t.start()
        stop.wait(3.0)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        engine.close()
    assert not failures, failures[0]
