"""What the engine finds changed at the source: directory listings checked by one stat (fsio/dirs.py)
and open files that grew (fsio/refresh.py), on a real source directory with counted source calls."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fastfs.config import load_config
from fastfs.fsio.cache import READY
from fastfs.fsio.changes import GROWTH_CHECK, Change, DirChange, Growth
from fastfs.fsio.dirs import DirListings
from fastfs.fsio.engine import Engine
from fastfs.fsio.refresh import FileWatch, Refresher
from fastfs.fsio.source import Source

S = 1_000_000_000
KIB = 1024


class CountingSource(Source):
    """A source that counts its directory stats and listings."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.lstats = 0
        self.scandirs = 0

    def lstat(self, path: str) -> os.stat_result:
        self.lstats += 1
        return super().lstat(path)

    def scandir(self, path: str) -> list[tuple[str, int, int]]:
        self.scandirs += 1
        return super().scandir(path)


class Clocks:
    """A monotonic clock and a wall clock the test moves (the wall clock starts well after every
    mtime of the tree, so listings are not racy unless a test says so)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.wall = time.time_ns() + 10 * S

    def mono(self) -> float:
        return self.now

    def wall_ns(self) -> int:
        return self.wall


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "d").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (root / "d" / name).write_bytes(name.encode())
    return root


def names(entries) -> set[str]:
    return {e[0] for e in entries}


def test_an_unchanged_directory_is_listed_once_and_checked_by_one_stat_per_listing(tree: Path) -> None:
    source, clocks = CountingSource(str(tree)), Clocks()
    dirs = DirListings(source, clocks.mono, clocks.wall_ns)
    seen: list[DirChange] = []
    dirs.listeners.append(seen.append)
    try:
        first = dirs.listing("/d")
        assert names(first) == {"a", "b", "c"}
        assert dirs.listing("/d") is first and dirs.listing("/d") is first
        assert (source.lstats, source.scandirs) == (3, 1)
        assert seen == [DirChange("/d", frozenset({"a", "b", "c"}), ())]  # the first listing is told too
    finally:
        source.close()


def test_a_changed_directory_is_listed_again_and_the_vanished_names_told(tree: Path) -> None:
    source, clocks = CountingSource(str(tree)), Clocks()
    dirs = DirListings(source, clocks.mono, clocks.wall_ns)
    seen: list[DirChange] = []
    dirs.listeners.append(seen.append)
    try:
        dirs.listing("/d")
        os.unlink(tree / "d" / "b")
        (tree / "d" / "new").write_bytes(b"n")
        assert names(dirs.listing("/d")) == {"a", "c", "new"}
        assert seen[-1] == DirChange("/d", frozenset({"a", "c", "new"}), ("b",))
        assert source.scandirs == 2
    finally:
        source.close()


def test_a_listing_taken_in_the_tick_of_the_last_change_is_not_trusted(tree: Path) -> None:
    """The racy-tick rule: a listing taken within RACY_SECONDS of the directory's mtime is taken again
    (a second change in the same timestamp tick would not move mtime)."""
    source, clocks = CountingSource(str(tree)), Clocks()
    clocks.wall = os.stat(tree / "d").st_mtime_ns + S // 2
    dirs = DirListings(source, clocks.mono, clocks.wall_ns)
    try:
        dirs.listing("/d")
        dirs.listing("/d")
        assert source.scandirs == 2
        clocks.wall += 5 * S  # later: the listing taken now is trusted
        dirs.listing("/d")
        dirs.listing("/d")
        assert source.scandirs == 3
    finally:
        source.close()


def test_check_lists_a_used_directory_once_then_only_when_it_changes(tree: Path) -> None:
    source, clocks = CountingSource(str(tree)), Clocks()
    dirs = DirListings(source, clocks.mono, clocks.wall_ns)
    failing: list[int] = []

    def broken(change: DirChange) -> None:
        failing.append(1)
        raise RuntimeError("listener bug")

    dirs.listeners.append(broken)
    try:
        dirs.used("/d")
        assert [(p, u) for p, u, _ in dirs.watched()] == [("/d", 100.0)]
        assert not dirs.check("/d")  # used, never listed: its stat is the basis of the next checks
        assert not dirs.check("/d") and (source.lstats, source.scandirs) == (2, 0)
        (tree / "d" / "x").write_bytes(b"")
        assert dirs.check("/d")  # changed: listed (a broken listener does not fail it)
        assert names(dirs.kept("/d") or []) == {"a", "b", "c", "x"}
        assert not dirs.check("/d") and source.scandirs == 1
        os.unlink(tree / "d" / "x")
        assert dirs.check("/d") and failing == [1, 1]
        os.rename(tree / "d", tree / "e")
        assert not dirs.check("/d") and len(dirs) == 0  # gone: forgotten
    finally:
        source.close()


def test_a_first_check_in_the_tick_of_a_change_lists_the_directory(tree: Path) -> None:
    """A change between the kernel's lookups and the first check falls within the racy tick before it."""
    source, clocks = CountingSource(str(tree)), Clocks()
    clocks.wall = os.stat(tree / "d").st_mtime_ns + S // 2
    dirs = DirListings(source, clocks.mono, clocks.wall_ns)
    try:
        dirs.used("/d")
        assert dirs.check("/d") and dirs.check("/d")  # racy: listed each time
        clocks.wall += 5 * S
        assert dirs.check("/d") and not dirs.check("/d")  # listed once more outside the tick, then trusted
    finally:
        source.close()


def test_the_listings_kept_are_bounded(tree: Path) -> None:
    for i in range(4):
        (tree / f"x{i}").mkdir()
        for j in range(3):
            (tree / f"x{i}" / f"f{j}").write_bytes(b"")
    (tree / "big").mkdir()
    for j in range(8):
        (tree / "big" / f"f{j}").write_bytes(b"")
    source, clocks = CountingSource(str(tree)), Clocks()
    dirs = DirListings(source, clocks.mono, clocks.wall_ns, max_dirs=3, max_entries=7)
    try:
        for i in range(4):
            dirs.listing(f"/x{i}")
        assert len(dirs) == 2  # 3 entries each: at most 7 entries kept, the least recently listed dropped
        assert dirs.kept("/x3") is not None and dirs.kept("/x0") is None
        assert len(dirs.listing("/big")) == 8 and dirs.kept("/big") is None  # alone over the bound: not kept
        assert dirs.kept("/x3") is not None
        for i in range(5):
            dirs.used(f"/u{i}")
        assert len(dirs) == 3
    finally:
        source.close()


# -- growth of open files -------------------------------------------------------------------------
def make_engine(src: Path, tmp_path: Path, **overrides: str) -> Engine:
    opts = {
        "cache.budget": "32M",
        "cache.block_size": "256K",
        "state.dir": str(tmp_path / "state"),
        "fuse.passthrough": "off",
        "readahead.learn": "false",
        "cache.check_invariants": "true",
        **overrides,
    }
    return Engine(str(src), load_config(overrides=opts, use_default_path=False))


class Heard:
    """A ChangeListener recording what it hears."""

    def __init__(self) -> None:
        self.dirs: list[DirChange] = []
        self.growths: list[Growth] = []

    def dir_changed(self, change: DirChange) -> None:
        self.dirs.append(change)

    def file_grew(self, growth: Growth) -> None:
        self.growths.append(growth)


def _read_all(engine: Engine, fh: int, size: int) -> bytes:
    out = b""
    while len(out) < size + 1:
        chunk = engine.read(fh, len(out), 64 * KIB)
        if not chunk:
            break
        out += chunk
    return out


@pytest.fixture
def grow_engine(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    engine = make_engine(src, tmp_path)
    heard = Heard()
    engine.refresher.listeners.append(heard.file_grew)  # (listen() would start the thread)
    yield engine, src, heard
    engine.close()


def test_an_appended_file_grows_for_its_open_handles(grow_engine) -> None:
    engine, src, heard = grow_engine
    head, tail = os.urandom(300 * KIB + 123), os.urandom(40 * KIB)
    (src / "g").write_bytes(head)
    fh = engine.open("/g").fh
    entry = engine.handles.get(fh)
    watch = FileWatch()
    try:
        assert _read_all(engine, fh, len(head)) == head
        assert engine.refresher.check_file(entry, watch) is Change.SAME and watch.sample is not None
        with open(src / "g", "ab") as f:
            f.write(tail)
        assert engine.refresher.check_file(entry, watch) is Change.GREW
        assert entry.size == len(head) + len(tail) and entry.st.st_size == entry.size
        assert entry.dkey == () and entry.reads.policy.file_size == entry.size
        assert _read_all(engine, fh, entry.size) == head + tail  # past the old end: the new bytes
        (growth,) = heard.growths
        assert (growth.path, growth.old.st_size, growth.new.st_size) == ("/g", len(head), entry.size)
        assert watch.sample is not None and watch.sample[0] == entry.size  # the next growth's reference
        engine.check_invariants()
    finally:
        engine.release(fh)


def test_the_block_holding_the_old_end_is_dropped_once_it_is_no_longer_pinned(grow_engine) -> None:
    engine, src, heard = grow_engine
    bs = engine.cache.block_size
    head, tail = os.urandom(bs + 1000), os.urandom(3000)
    (src / "g").write_bytes(head)
    fh = engine.open("/g").fh
    entry = engine.handles.get(fh)
    watch = FileWatch()
    try:
        engine.check_invariants()
        block, created = engine.cache.reserve(entry.key, 1, 1000, prefetched=False)
        assert created and block is not None  # the last block, as a read would have cached it
        block.view[:1000] = head[bs:]
        engine.cache.complete(block, 1000)  # (pinned: a reader copying out of it)
        with open(src / "g", "ab") as f:
            f.write(tail)
        assert engine.refresher.check_file(entry, watch) is Change.GREW
        assert watch.partial == 1 and len(heard.growths) == 1  # pinned: dropped at the next check
        engine.cache.unpin(block)
        assert engine.refresher.check_file(entry, watch) is Change.SAME
        assert watch.partial == -1 and engine.cache.peek(entry.key, 1) is None
        assert len(heard.growths) == 2 and heard.growths[1].old.st_size == len(head)  # told again
        assert engine.read(fh, bs, 10_000) == head[bs:] + tail
        full = engine.cache.peek(entry.key, 1)
        assert full is None or full.state != READY or full.length == 1000 + len(tail)
    finally:
        engine.release(fh)


def test_a_rewritten_or_replaced_file_is_not_growth(grow_engine) -> None:
    engine, src, heard = grow_engine
    head = os.urandom(100 * KIB)
    (src / "r").write_bytes(head)
    (src / "p").write_bytes(head)
    fr, fp = engine.open("/r").fh, engine.open("/p").fh
    er, ep = engine.handles.get(fr), engine.handles.get(fp)
    wr, wp = FileWatch(), FileWatch()
    try:
        assert engine.refresher.check_file(er, wr) is Change.SAME
        assert engine.refresher.check_file(ep, wp) is Change.SAME
        with open(src / "r", "r+b") as f:  # same inode, larger, other bytes before the old end
            f.write(os.urandom(len(head) + 500))
        (src / "p.tmp").write_bytes(head + b"more")
        os.replace(src / "p.tmp", src / "p")  # the name replaced: another inode
        assert engine.refresher.check_file(er, wr) is Change.CHANGED and wr.done
        assert engine.refresher.check_file(ep, wp) is Change.CHANGED  # its own inode, unlinked (ctime)
        assert (er.size, ep.size) == (len(head), len(head)) and heard.growths == []
        assert engine.refresher.check_file(er, wr) is None  # not checked again
    finally:
        engine.release(fr)
        engine.release(fp)


def test_a_stream_source_is_not_read_at_the_end_for_the_growth_sample(tmp_path: Path, monkeypatch) -> None:
    """In the sequential shape (a stream-oriented client) the sample of an open file's end comes from
    RAM once the stream has brought it in, never from a read at the end of the source file: on rclone
    that read restarted the handle's download (the server read 1.30x the file for one np.load)."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(700 * KIB + 77)
    (src / "s").write_bytes(data)
    reads: list[tuple[int, int]] = []
    real_read = Refresher._read

    def counted(file, offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return real_read(file, offset, length)

    monkeypatch.setattr(Refresher, "_read", staticmethod(counted))
    for shape, source_reads in (("sequential", 0), ("parallel", 1)):
        engine = make_engine(src, tmp_path / shape, **{"readahead.source_shape": shape})
        reads.clear()
        fh = engine.open("/s").fh
        entry = engine.handles.get(fh)
        watch = FileWatch()
        try:
            assert engine.refresher.check_file(entry, watch) is Change.SAME  # nothing read yet
            assert len(reads) == source_reads
            assert (watch.sample is None) == (source_reads == 0)
            assert _read_all(engine, fh, len(data)) == data  # the end is in RAM now
            assert engine.refresher.check_file(entry, watch) is Change.SAME
            assert len(reads) == source_reads  # from RAM
            assert watch.sample is not None and watch.sample == (len(data), data[-GROWTH_CHECK:])
        finally:
            engine.release(fh)
            engine.close()


def test_the_refresher_checks_nothing_when_nothing_is_used_or_open(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    source = CountingSource(str(src))
    engine = make_engine(src, tmp_path)
    try:
        engine.refresher.source = source  # (counts what a tick asks the source)
        engine.dirs.source = source
        assert engine.refresher.tick() > 0
        assert (source.lstats, source.scandirs, engine.refresher.ticks) == (0, 0, 0)
        (src / "f").write_bytes(b"x")
        engine.lstat("/f")  # a lookup in "/": the refresher re-checks it
        engine.refresher.tick()
        # its first check: a stat, and a listing as "/" changed within the racy tick before it
        assert (source.lstats, source.scandirs, engine.refresher.ticks) == (1, 1, 1)
    finally:
        engine.close()
        source.close()


def test_an_open_file_is_first_checked_for_growth_a_period_after_its_open(tmp_path: Path) -> None:
    """The open was the version's close-to-open check. Checked at the first tick as well, every small
    file a tick caught open (or not yet released) cost one more source stat: over s3fs a HEAD, for a
    third of 2,000 files read by 4 processes."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("old", "new"):
        (src / name).write_bytes(os.urandom(5000))
    engine = make_engine(src, tmp_path)
    checked: list[str] = []
    real_check = engine.refresher.check_file

    def check_file(entry, watch):
        checked.append(entry.path)
        return real_check(entry, watch)

    engine.refresher.check_file = check_file  # type: ignore[method-assign]
    fhs = []
    try:
        fhs.append(engine.open("/old").fh)
        engine.handles.get(fhs[0]).opened_at -= engine.refresher.file_period  # opened a period ago
        fhs.append(engine.open("/new").fh)
        engine.refresher.tick()
        assert checked == ["/old"]
        engine.refresher.tick()  # (checked again a period later, not at the next tick)
        assert checked == ["/old"]
    finally:
        for fh in fhs:
            engine.release(fh)
        engine.close()


class FrozenDirSource(CountingSource):
    """An object-store client's directories: a directory's stat never changes (its first one stays)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.frozen: dict[str, os.stat_result] = {}

    def lstat(self, path: str) -> os.stat_result:
        st = super().lstat(path)
        if not os.path.isdir(self.root + path):
            return st
        return self.frozen.setdefault(path, st)


def test_a_source_without_directory_times_is_listed_anew_after_the_bound(tree: Path) -> None:
    """Failed before (fastfs over rclone): a file made at the source never showed in a listing, since
    the directory's times did not move and each listing was validated by them."""
    source, clocks = FrozenDirSource(str(tree)), Clocks()
    dirs = DirListings(source, clocks.mono, clocks.wall_ns, times_kept=False, bound=1.0)
    seen: list[DirChange] = []
    dirs.listeners.append(seen.append)
    try:
        first = dirs.listing("/d")
        assert names(first) == {"a", "b", "c"}
        (tree / "d" / "new").write_bytes(b"n")
        os.unlink(tree / "d" / "a")
        clocks.now += 0.5
        assert dirs.listing("/d") is first  # within the bound: handed out again, no source request
        assert (source.lstats, source.scandirs) == (1, 1)
        clocks.now += 0.6
        assert names(dirs.listing("/d")) == {"b", "c", "new"}  # past it: listed anew
        assert seen[-1] == DirChange("/d", frozenset({"b", "c", "new"}), ("a",))
        assert dirs.verified("/d", 10.0) is None  # no basis is verified by times that do not move
        (tree / "d" / "x").write_bytes(b"")
        requests = (source.lstats, source.scandirs)
        assert not dirs.check("/d") and (source.lstats, source.scandirs) == requests  # the refresher asks nothing
        clocks.now += 1.1
        assert names(dirs.listing("/d")) == {"b", "c", "new", "x"}
    finally:
        source.close()


def test_the_same_source_with_times_kept_is_not_listed_anew(tree: Path) -> None:
    """The control: with its times taken as kept, the frozen directory's listing is never made again
    (the gap the test above closes)."""
    source, clocks = FrozenDirSource(str(tree)), Clocks()
    dirs = DirListings(source, clocks.mono, clocks.wall_ns)
    try:
        dirs.listing("/d")
        (tree / "d" / "new").write_bytes(b"n")
        clocks.now += 5.0
        assert "new" not in names(dirs.listing("/d"))
    finally:
        source.close()
