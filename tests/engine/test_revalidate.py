"""The close-to-open bound ``fuse.revalidate`` (issues 21 and 22), at the engine with a fake clock and
the source's own request counters: an open never trusts metadata older than the bound, revalidates a
version it holds with one stat (no reopen), trusts a scan's metadata while its directory is verified
unchanged (``fuse.trust_unchanged_dirs``), and the open that follows a lookup asks the source nothing."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine, EngineParts
from fastfs.fsio.stats import Stats

N = 12  # small files in the scanned directory
SIZE = 3000
BOUND = 1.0  # fuse.revalidate (the default)
EPS = 0.05
SOURCE = (m.SOURCE_OPENS, m.SOURCE_STATS, m.SOURCE_LISTINGS)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def body(i: int, version: int = 0) -> bytes:
    return bytes([(i * 7 + version * 31 + k) % 251 for k in range(SIZE)])


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "d").mkdir(parents=True)
    for i in range(N):
        (root / "d" / f"f{i:02d}").write_bytes(body(i))
    return root


OPTS = {
    "cache.budget": "32M",
    "cache.block_size": "256K",
    "fuse.passthrough": "off",
    "readahead.learn": "false",
    "readahead.scan_trigger": "2",
    "cache.check_invariants": "true",
}


def make(src: Path, tmp_path: Path, clock: Clock, **overrides: str) -> Engine:
    opts = {**OPTS, "state.dir": str(tmp_path / "state"), **overrides}
    config = load_config(overrides=opts, use_default_path=False)
    stats = Stats()
    built = EngineParts.build(str(src), config, stats)
    parts = EngineParts(built.source, built.cache, built.pool, built.disk, clock=clock)
    engine = Engine.from_parts(parts, config, stats)
    # the listings' wall clock 10 s ahead: a listing taken now is outside the racy tick of the
    # directory's last change (fsio/changes.py listing_valid), as it is a while after the writes
    engine.dirs.wall_ns = lambda: time.time_ns() + 10_000_000_000
    return engine


def counters(engine: Engine) -> dict[str, int]:
    c = engine.snapshot()["counters"]
    return {k: int(c.get(k, 0)) for k in (*SOURCE, m.OPENS_FROM_META, m.OPENS_REVALIDATED, m.OPENS_DIR_VERIFIED)}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def read_whole(engine: Engine, path: str, **kw) -> bytes:
    r = engine.open(path, **kw)
    try:
        return engine.read(r.fh, 0, 2 * SIZE)
    finally:
        engine.release(r.fh)


def scanned(engine: Engine) -> list[str]:
    """Open the first two files (a scan starts) and wait until the scan fetched the rest."""
    for i in range(2):
        assert read_whole(engine, f"/d/f{i:02d}") == body(i)
    deadline = time.monotonic() + 30
    while engine.snapshot()["counters"].get(m.SCAN_FILES, 0) < N - 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.snapshot()["counters"][m.SCAN_FILES] == N - 2
    return [f"/d/f{i:02d}" for i in range(2, N)]


def rewrite_in_place(path: Path, data: bytes) -> None:
    """Same inode, same size, new bytes and a new mtime (the directory does not change)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


def test_an_open_within_the_bound_asks_the_source_nothing(src: Path, tmp_path: Path) -> None:
    clock = Clock()
    engine = make(src, tmp_path, clock)
    try:
        paths = scanned(engine)
        clock.now += BOUND - EPS
        before = counters(engine)
        for i, path in enumerate(paths, start=2):
            assert read_whole(engine, path) == body(i)
        d = delta(counters(engine), before)
        assert (d[m.SOURCE_OPENS], d[m.SOURCE_STATS], d[m.SOURCE_LISTINGS]) == (0, 0, 0)
        assert d[m.OPENS_FROM_META] == len(paths)
        engine.check_invariants()
    finally:
        engine.close()


def test_a_bound_of_zero_trusts_nothing_as_it_is(src: Path, tmp_path: Path) -> None:
    """fuse.revalidate=0: every open asks the source, even at the instant the metadata was fetched (the
    fake clock does not move: an age of 0 was trusted before, ``age <= bound``)."""
    clock = Clock()
    engine = make(src, tmp_path, clock, **{"fuse.revalidate": "0", "fuse.trust_unchanged_dirs": "false"})
    try:
        paths = scanned(engine)
        rewrite_in_place(src / "d" / "f04", body(4, version=1))
        before = counters(engine)
        for i, path in enumerate(paths, start=2):
            assert read_whole(engine, path) == body(i, version=1 if i == 4 else 0)
        d = delta(counters(engine), before)
        assert d[m.OPENS_FROM_META] == 0 and d[m.SOURCE_STATS] + d[m.SOURCE_OPENS] >= len(paths)
        engine.check_invariants()
    finally:
        engine.close()


def test_after_the_bound_an_in_place_rewrite_is_seen_by_the_next_open(src: Path, tmp_path: Path) -> None:
    """attr_timeout is 60 s; with directory trust off, an open at revalidate + epsilon after the scan
    revalidates by one stat and reads the new version."""
    clock = Clock()
    engine = make(src, tmp_path, clock, **{"fuse.trust_unchanged_dirs": "false"})
    try:
        paths = scanned(engine)
        rewrite_in_place(src / "d" / "f05", body(5, version=1))
        clock.now += BOUND + EPS
        before = counters(engine)
        assert read_whole(engine, "/d/f05") == body(5, version=1)
        d = delta(counters(engine), before)
        assert d[m.SOURCE_STATS] == 1 and d[m.SOURCE_OPENS] == 1  # the stat saw it changed: opened
        assert d[m.OPENS_REVALIDATED] == 0
        # the unchanged ones: one stat each, no source open, the bytes held served
        before = counters(engine)
        others = [p for p in paths if p != "/d/f05"]
        for path in others:
            assert read_whole(engine, path) == body(int(path[-2:]))
        d = delta(counters(engine), before)
        assert d[m.SOURCE_STATS] == len(others) and d[m.SOURCE_OPENS] == 0 and d[m.SOURCE_LISTINGS] == 0
        assert d[m.OPENS_REVALIDATED] == len(others)
        engine.check_invariants()
    finally:
        engine.close()


def test_scan_metadata_is_trusted_while_its_directory_is_unchanged(src: Path, tmp_path: Path) -> None:
    """Directory trust (the default): one directory stat per bound period answers every open in it;
    a rewrite in place is the documented gap (seen once attr_timeout passed); a name created in the
    directory ends the trust at once."""
    clock = Clock()
    engine = make(src, tmp_path, clock, **{"fuse.attr_timeout": "10"})
    try:
        paths = scanned(engine)
        rewrite_in_place(src / "d" / "f03", body(3, version=1))
        clock.now += BOUND + EPS
        before = counters(engine)
        for path in paths[2:8]:
            assert read_whole(engine, path) == body(int(path[-2:]))
        d = delta(counters(engine), before)
        assert (d[m.SOURCE_OPENS], d[m.SOURCE_STATS], d[m.SOURCE_LISTINGS]) == (0, 1, 0)  # the directory's stat
        assert d[m.OPENS_DIR_VERIFIED] == 6
        assert read_whole(engine, "/d/f03") == body(3)  # the gap: the directory did not change
        # a new name changes the directory: the trust ends, each open stats its file
        (src / "d" / "new").write_bytes(b"n")
        clock.now += BOUND + EPS
        before = counters(engine)
        assert read_whole(engine, "/d/f10") == body(10)
        d = delta(counters(engine), before)
        assert d[m.OPENS_DIR_VERIFIED] == 0 and d[m.OPENS_REVALIDATED] == 1 and d[m.SOURCE_OPENS] == 0
        clock.now += 10  # past attr_timeout: never trusted, revalidated by the file's stat
        assert read_whole(engine, "/d/f03") == body(3, version=1)
        engine.check_invariants()
    finally:
        engine.close()


def test_the_open_after_a_lookup_asks_nothing_and_a_second_epoch_costs_one_stat_per_file(
    src: Path, tmp_path: Path
) -> None:
    """Second epoch after a pause longer than attr_timeout over versions held (RAM, the kernel's
    pages): the lookup of each file stats it once and its open asks the source nothing."""
    clock = Clock()
    engine = make(src, tmp_path, clock)
    try:
        paths = scanned(engine)
        for path in paths:  # the first epoch's reads: the kernel now holds their pages
            read_whole(engine, path)
        # (no scan in the second epoch: its stats ahead of the reader would race the lookups' own)
        engine.reconfigure(
            load_config(
                overrides={**OPTS, "state.dir": str(tmp_path / "state"), "readahead.scan_trigger": "1000"},
                use_default_path=False,
            )
        )
        clock.now += 65.0
        before = counters(engine)
        for i, path in enumerate(paths, start=2):
            assert engine.lstat(path).st_size == SIZE  # the kernel's LOOKUP
            assert read_whole(engine, path, cached=True) == body(i)  # its OPEN of the inode seen before
        d = delta(counters(engine), before)
        assert d[m.SOURCE_STATS] == len(paths) and d[m.SOURCE_OPENS] == 0
        assert d[m.OPENS_FROM_META] == len(paths)
        # a lookup's metadata answered its one open: the next open (no lookup before it) asks again
        before = counters(engine)
        assert read_whole(engine, paths[0], cached=True) == body(2)
        d = delta(counters(engine), before)
        assert d[m.SOURCE_STATS] == 1 and d[m.OPENS_REVALIDATED] == 1 and d[m.SOURCE_OPENS] == 0
        engine.check_invariants()
    finally:
        engine.close()


def test_revalidate_zero_asks_the_source_at_every_open(src: Path, tmp_path: Path) -> None:
    clock = Clock()
    engine = make(src, tmp_path, clock, **{"fuse.revalidate": "0", "fuse.trust_unchanged_dirs": "false"})
    try:
        paths = scanned(engine)
        clock.now += EPS
        before = counters(engine)
        assert read_whole(engine, paths[0]) == body(2)
        d = delta(counters(engine), before)
        assert d[m.SOURCE_STATS] == 1 and d[m.OPENS_FROM_META] == 0 and d[m.OPENS_REVALIDATED] == 1
    finally:
        engine.close()


def test_a_handle_answered_from_metadata_keeps_its_version_after_the_path_is_opened_new(
    src: Path, tmp_path: Path
) -> None:
    """Regression (a churn soak, served route): a handle whose open was answered from metadata holds no
    source file, only the version's blocks in RAM. A newer version of its path opened meanwhile freed
    those blocks at once, so the old handle's next read reopened the source, found the new file and
    failed with ESTALE (SIGBUS in a mapping), where a reader of the source itself keeps reading the
    file it opened. The blocks of a version with handles now go at its last release."""
    clock = Clock()
    engine = make(src, tmp_path, clock)
    path, i = "/d/f03", 3
    try:
        assert path in scanned(engine)  # fetched whole by the scan: its block in RAM, its metadata fresh
        before = counters(engine)
        old = engine.open(path)
        assert delta(counters(engine), before)[m.SOURCE_OPENS] == 0  # answered from metadata: no file held
        replaced = src / "d" / "f03.new"
        replaced.write_bytes(body(i, version=1))
        os.replace(replaced, src / "d" / "f03")
        clock.now += BOUND + EPS
        assert read_whole(engine, path) == body(i, version=1)  # the new version, opened
        assert engine.read(old.fh, 0, 2 * SIZE) == body(i)  # the old handle still reads its own
        engine.release(old.fh)
        engine.check_invariants()
        assert engine.cache.peek(old.key, 0) is None  # its last release freed its blocks
    finally:
        engine.close()


def test_an_open_that_finds_the_source_changed_leaves_the_next_lookup_to_the_source(src: Path, tmp_path: Path) -> None:
    """Regression (a churn soak): an open that reached the source found a new version there and
    answered ESTALE, but the scan's metadata of the old one stayed trusted, so the kernel's retry (a
    LOOKUP, then the OPEN) got the old version again and the reader's open failed with ESTALE. The
    metadata the source belied is dropped: the retry's lookup asks the source."""
    clock = Clock()
    engine = make(src, tmp_path, clock)
    path, i = "/d/f04", 4
    try:
        assert path in scanned(engine)  # its metadata fresh from the scan
        old_key = engine.scanner.meta(path).key
        engine.cache.invalidate_file(old_key)  # not in RAM: the open asks the source
        replaced = src / "d" / "f04.new"
        replaced.write_bytes(body(i, version=1) + b"longer")
        os.replace(replaced, src / "d" / "f04")
        with pytest.raises(OSError) as e:
            engine.open(path, expect=old_key)
        assert e.value.errno == errno.ESTALE
        assert engine.lstat(path).st_size == SIZE + 6  # the kernel's retry: the new version
        assert read_whole(engine, path) == body(i, version=1) + b"longer"
        engine.check_invariants()
    finally:
        engine.close()
