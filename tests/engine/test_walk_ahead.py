"""A walk of sibling directories (os.walk, rsync, a backup) has the next directory's small files
fetched before the reader gets there (readahead.walk_ahead): the reader entering it opens nothing at
the source. A jump between siblings is no walk; walk_ahead=0 turns it off."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.stats import Stats

DIRS = ("a", "b", "c", "d")
FILES = 30
SIZE = 200


def body(d: str, i: int) -> bytes:
    return (f"{d}{i:04d}." * (SIZE // 6 + 1)).encode()[:SIZE]


def make(tmp_path: Path, walk_ahead: str = "1") -> Engine:
    src = tmp_path / "src"
    for d in DIRS:
        (src / "top" / d).mkdir(parents=True)
        for i in range(FILES):
            (src / "top" / d / f"f{i:03d}").write_bytes(body(d, i))
    (src / "top" / "z-file").write_bytes(b"not a directory")
    opts = {
        "state.dir": str(tmp_path / "state"),
        "fuse.passthrough": "off",
        "readahead.learn": "false",
        "readahead.scan_trigger": "1000",  # no scan of a directory from its reader's own opens
        "readahead.walk_ahead": walk_ahead,
    }
    return Engine(str(src), load_config(overrides=opts, use_default_path=False), Stats())


def read_dir(engine: Engine, d: str, count: int = FILES) -> None:
    for i in range(count):
        r = engine.open(f"/top/{d}/f{i:03d}")
        assert engine.read(r.fh, 0, SIZE) == body(d, i)
        engine.release(r.fh)


def counter(engine: Engine, name: str) -> int:
    return int(engine.snapshot()["counters"].get(name, 0))


def settle(engine: Engine, name: str, value: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while counter(engine, name) < value and time.monotonic() < deadline:
        time.sleep(0.02)


def test_the_next_sibling_of_a_walk_is_fetched_before_the_reader_enters_it(tmp_path: Path) -> None:
    engine = make(tmp_path)
    try:
        read_dir(engine, "a")
        read_dir(engine, "b", 1)  # a -> b: a walk in name order; c is scanned ahead
        settle(engine, m.SCAN_FILES, FILES)
        assert counter(engine, m.WALK_AHEAD) == 1
        assert counter(engine, m.SCAN_FILES) == FILES
        before = counter(engine, m.SOURCE_OPENS)
        read_dir(engine, "c")  # every file of c fetched: no source open
        assert counter(engine, m.SOURCE_OPENS) == before
    finally:
        engine.close()


def test_a_jump_between_siblings_is_no_walk(tmp_path: Path) -> None:
    engine = make(tmp_path)
    try:
        read_dir(engine, "a", 2)
        read_dir(engine, "c", 2)  # a -> c skips b
        read_dir(engine, "b", 2)  # c -> b goes back
        time.sleep(0.3)
        assert counter(engine, m.WALK_AHEAD) == 0 and counter(engine, m.SCAN_FILES) == 0
    finally:
        engine.close()


@pytest.mark.parametrize("walk_ahead", ["0"])
def test_walk_ahead_off_fetches_nothing_ahead(tmp_path: Path, walk_ahead: str) -> None:
    engine = make(tmp_path, walk_ahead)
    try:
        read_dir(engine, "a", 2)
        read_dir(engine, "b", 2)
        time.sleep(0.3)
        assert counter(engine, m.WALK_AHEAD) == 0 and counter(engine, m.SCAN_FILES) == 0
    finally:
        engine.close()


def test_a_walk_over_a_source_that_gives_no_entry_types_is_scanned_ahead(tmp_path: Path) -> None:
    # FUSE sources such as the benchmarks' emulator list DT_UNKNOWN: every entry has type 0, and the
    # walk's siblings are those entries (the walk of issue 21's tree found none: 0 scans ahead)
    engine = make(tmp_path)
    dirs = engine.scanner.dirs
    assert dirs is not None
    real_listing = dirs.listing
    dirs.listing = lambda path: [(name, 0, ino) for name, _kind, ino in real_listing(path)]  # type: ignore[method-assign]
    try:
        read_dir(engine, "a", 2)
        read_dir(engine, "b", 1)
        settle(engine, m.SCAN_FILES, FILES)
        assert counter(engine, m.WALK_AHEAD) == 1 and counter(engine, m.SCAN_FILES) == FILES
    finally:
        engine.close()
