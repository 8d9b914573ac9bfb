"""Unit tests of the learned access sets (fastfs.fsio.learn): no FUSE, no threads but one stress test."""

from __future__ import annotations

import json
import logging
import os
import random
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastfs.config.schema import Config, StateConfig
from fastfs.fsio import learn
from fastfs.fsio.learn import MIN_FILES, AccessLog, looks_shuffled
from fastfs.fsio.stats import LEARNED_FILES_USED, LEARNED_PLANS, Stats


class Clock:
    """A manual clock: each call returns the current value, tick() advances it."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float = 1.0) -> float:
        self.now += seconds
        return self.now


def make_log(state: Path, source: str = "/data/src", max_bytes: int = 1 << 20, **kw) -> AccessLog:
    config = Config(state=StateConfig(dir=str(state), max_bytes=max_bytes))
    return AccessLog(source, config, **kw)


def names(n: int, prefix: str = "f") -> list[str]:
    return [f"{prefix}{i:05d}" for i in range(n)]


# -- recording, plan, threshold ------------------------------------------------------------------


def test_plan_needs_min_files(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    for name in names(MIN_FILES - 1):
        log.record_open("/d", name, 10)
    assert log.plan("/d") is None
    assert log.plan("/unknown") is None
    log.record_open("/d", "zzz", 20)
    plan = log.plan("/d")
    assert plan is not None
    assert plan.dir_path == "/d"
    assert list(plan.names) == names(MIN_FILES - 1) + ["zzz"]
    assert plan.sizes == (10,) * (MIN_FILES - 1) + (20,)
    assert plan.total_bytes == 10 * (MIN_FILES - 1) + 20
    assert len(plan) == MIN_FILES
    assert plan.shuffled is False


def test_directories_are_independent(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    for name in names(10):
        log.record_open("/a", name, 1)
        log.record_open("/b", "b" + name, 2)
    assert log.plan("/a").names == tuple(names(10))
    assert log.plan("/b").names == tuple("b" + n for n in names(10))
    assert len(log) == 2


def test_sorted_access_keeps_recorded_order(tmp_path: Path) -> None:
    # Natural order img1, img2, ..., img30 is mostly ascending as strings too: recorded order is kept.
    order = [f"img{i}" for i in range(1, 31)]
    log = make_log(tmp_path)
    for name in order:
        log.record_open("/d", name, 5)
    plan = log.plan("/d")
    assert plan.shuffled is False
    assert list(plan.names) == order
    assert list(plan.names) != sorted(order)


def test_shuffled_access_plans_the_sorted_set(tmp_path: Path) -> None:
    order = names(200)
    random.Random(7).shuffle(order)
    log = make_log(tmp_path)
    for i, name in enumerate(order):
        log.record_open("/d", name, i)
    plan = log.plan("/d")
    assert plan.shuffled is True
    assert list(plan.names) == sorted(order)
    sizes = dict(zip(order, range(len(order)), strict=True))
    assert plan.sizes == tuple(sizes[n] for n in plan.names)


def test_looks_shuffled() -> None:
    assert looks_shuffled([]) is False
    assert looks_shuffled(["a"]) is False
    assert looks_shuffled(names(50)) is False
    assert looks_shuffled(list(reversed(names(50)))) is True
    rng = random.Random(1)
    for _ in range(20):
        order = names(50)
        rng.shuffle(order)
        assert looks_shuffled(order) is True


def test_epoch_rollover_and_replay_due(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    first = names(20)
    # First epoch: nothing learned yet, so no replay is ever due.
    assert not any(log.record_open("/d", n, 100) for n in first)
    # Second epoch (shuffled): the rollover happens after EPOCH_REPEATS known files in a row.
    second = list(first)
    random.Random(3).shuffle(second)
    due = [log.record_open("/d", n, 100) for n in second[: learn.EPOCH_REPEATS]]
    assert due == [False] * (learn.EPOCH_REPEATS - 1) + [True]
    plan = log.plan("/d")
    assert set(plan.names) == set(first)
    assert plan.shuffled is False  # decided by the completed first epoch until this one has MIN_FILES
    # Once replayed, no further replay is due in this epoch.
    assert log.record_open("/d", second[learn.EPOCH_REPEATS], 100) is False
    for n in second[learn.EPOCH_REPEATS + 1 :]:
        log.record_open("/d", n, 100)
    assert log.plan("/d").shuffled is True  # this epoch's order now decides
    # Third epoch: due again after the rollover.
    due = [log.record_open("/d", n, 100) for n in first[: learn.EPOCH_REPEATS]]
    assert due[-1] is True


def test_shared_file_reopened_per_sample_does_not_end_the_epoch(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    for n in names(30):
        log.record_open("/d", "labels.csv", 1)
        log.record_open("/d", n, 100)
        log.record_open("/d", n, 100)  # a loader opening each sample twice
    plan = log.plan("/d")
    assert plan.names == ("labels.csv", *names(30))


def test_new_files_in_the_next_epoch_join_the_plan(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    for n in names(10):
        log.record_open("/d", n, 1)
    for n in names(10)[: learn.EPOCH_REPEATS]:
        log.record_open("/d", n, 1)
    log.record_open("/d", "new", 2)
    assert log.plan("/d").names == (*names(10), "new")


def test_size_change_is_recorded(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    for n in names(10):
        log.record_open("/d", n, 1)
    log.record_open("/d", names(10)[-1], 99)
    assert log.plan("/d").sizes[-1] == 99


def test_names_per_directory_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(learn, "MAX_NAMES_PER_DIR", 12)
    log = make_log(tmp_path)
    for n in names(50):
        log.record_open("/d", n, 1)
    assert log.plan("/d").names == tuple(names(12))
    log.save()
    fresh = make_log(tmp_path)
    fresh.load()
    assert fresh.plan("/d").names == tuple(names(12))


def test_directories_in_memory_capped_lru(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(learn, "MAX_DIRS", 3)
    log = make_log(tmp_path)
    for d in ("/a", "/b", "/c"):
        for n in names(MIN_FILES):
            log.record_open(d, n, 1)
    log.record_open("/a", "again", 1)  # /a is now the most recent, /b the least
    log.record_open("/e", "x", 1)
    assert len(log) == 3
    assert log.plan("/b") is None
    assert log.plan("/a") is not None and log.plan("/c") is not None


# -- accuracy ------------------------------------------------------------------------------------


def test_accuracy_bookkeeping(tmp_path: Path) -> None:
    stats = Stats()
    log = make_log(tmp_path, stats=stats)
    for n in names(10):
        log.record_open("/d", n, 1)
    assert log.accuracy() == {"planned": 0, "hits": 0, "ratio": 0.0}
    assert log.note_plan_used("/d", names(10)[0]) is False  # nothing replayed yet
    plan = log.plan("/d")
    assert log.plan("/d") == plan  # idempotent within the epoch: counted once
    assert log.note_plan_used("/d", plan.names[0]) is True
    assert log.note_plan_used("/d", plan.names[0]) is False  # a second read is no second hit
    assert log.note_plan_used("/d", plan.names[1]) is True
    assert log.note_plan_used("/d", "not-planned") is False
    assert log.note_plan_used("/other", plan.names[2]) is False
    assert log.accuracy() == {"planned": 10, "hits": 2, "ratio": 0.2}
    counters = stats.snapshot()["counters"]
    assert counters[LEARNED_PLANS] == 1
    assert counters[LEARNED_FILES_USED] == 2


def test_accuracy_counts_a_new_replay_per_epoch(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    for n in names(10):
        log.record_open("/d", n, 1)
    log.plan("/d")
    for n in names(10)[: learn.EPOCH_REPEATS]:
        log.record_open("/d", n, 1)
    log.plan("/d")
    assert log.accuracy()["planned"] == 20


# -- persistence ---------------------------------------------------------------------------------


def test_state_file_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    assert learn.state_dir(Config()) == learn.DEFAULT_STATE_DIR
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/env:/other")
    assert learn.state_dir(Config()) == f"{tmp_path}/env"
    config = Config(state=StateConfig(dir=str(tmp_path / "cfg")))
    assert learn.state_dir(config) == str(tmp_path / "cfg")
    a = learn.state_file("/data/a", config)
    assert os.path.dirname(a) == str(tmp_path / "cfg")
    assert a == learn.state_file("/data/a/", config)
    assert a != learn.state_file("/data/b", config)
    assert AccessLog("/data/a", config).path == a


def test_round_trip(tmp_path: Path) -> None:
    clock = Clock()
    log = make_log(tmp_path, clock=clock)
    shuffled = names(40, "s")
    random.Random(5).shuffle(shuffled)
    for i, n in enumerate(shuffled):
        clock.tick()
        log.record_open("/train/shuffled", n, i)
    for i, n in enumerate(names(30, "o")):
        clock.tick()
        log.record_open("/train/ordered", n, 1000 + i)
    for n in names(MIN_FILES - 1):
        log.record_open("/small", n, 1)
    assert log.dirty
    assert log.save() is True
    assert not log.dirty
    assert os.listdir(tmp_path) == [os.path.basename(log.path)]  # no temporary file left behind
    doc = json.loads(Path(log.path).read_text())
    assert set(doc["dirs"]) == {"/train/shuffled", "/train/ordered"}  # small directories are not kept

    fresh = make_log(tmp_path)
    assert fresh.load() == 2
    assert not fresh.dirty
    for d in ("/train/shuffled", "/train/ordered"):
        assert fresh.plan(d) == log.plan(d)
    assert fresh.plan("/train/shuffled").shuffled is True
    assert fresh.plan("/train/ordered").names == tuple(names(30, "o"))
    assert fresh.plan("/small") is None
    # A loaded set makes the first open of its directory a replay.
    assert fresh.record_open("/train/ordered", "o00003", 1003) is False  # already replayed above
    other = make_log(tmp_path)
    other.load()
    assert other.record_open("/train/ordered", "o00003", 1003) is True


def test_undecodable_names_round_trip(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    odd = [os.fsdecode(b"caf\xe9-%d" % i) for i in range(5)] + ["ü名前", 'q"uote', "back\\slash", "tab\tnl\n"]
    for n in odd:
        log.record_open("/d\udcff", n, 3)
    assert log.save()
    fresh = make_log(tmp_path)
    assert fresh.load() == 1
    assert fresh.plan("/d\udcff") == log.plan("/d\udcff")


def test_load_missing_file_is_empty(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = make_log(tmp_path / "none")
    with caplog.at_level(logging.WARNING):
        assert log.load() == 0
    assert len(log) == 0
    assert not caplog.records  # a first start is not a problem


# -- whole-file loads ------------------------------------------------------------------------------


def test_file_share_round_trip_and_version_match(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    assert log.file_share("/m/model.safetensors", 100, 5) is None
    log.record_file("/m/model.safetensors", 100, 5, 0.97)
    log.record_file("/m/lazy.pt", 300, 7, 0.05)
    log.record_file("/m/odd.pt", 10, 1, 3.0)  # clamped
    assert log.file_share("/m/model.safetensors", 100, 5) == 0.97
    assert log.file_share("/m/model.safetensors", 101, 5) is None  # another version: unknown
    assert log.file_share("/m/model.safetensors", 100, 6) is None
    assert log.file_share("/m/odd.pt", 10, 1) == 1.0
    assert log.dirty and log.save()
    fresh = make_log(tmp_path)
    fresh.load()
    assert fresh.file_share("/m/model.safetensors", 100, 5) == 0.97
    assert fresh.file_share("/m/lazy.pt", 300, 7) == 0.05
    log.record_file("/m/model.safetensors", 100, 5, 0.2)  # the latest load wins
    assert log.file_share("/m/model.safetensors", 100, 5) == 0.2


def test_files_remembered_are_capped_lru(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(learn, "MAX_FILES", 3)
    log = make_log(tmp_path)
    for i in range(4):
        log.record_file(f"/f{i}", 1, 1, 1.0)
    assert log.file_share("/f0", 1, 1) is None and log.file_share("/f3", 1, 1) == 1.0
    log.file_share("/f1", 1, 1)  # used: now the most recent
    log.record_file("/f4", 1, 1, 1.0)
    assert log.file_share("/f1", 1, 1) == 1.0 and log.file_share("/f2", 1, 1) is None


def test_file_entries_fit_the_byte_bound_first(tmp_path: Path) -> None:
    log = make_log(tmp_path, max_bytes=400)
    for n in names(10):
        log.record_open("/d", n, 1)
    for i in range(20):
        log.record_file(f"/big{i:02d}", 1 << 30, i, 1.0)
    assert log.save()
    assert os.path.getsize(log.path) <= 400
    fresh = make_log(tmp_path, max_bytes=400)
    fresh.load()
    kept = [i for i in range(20) if fresh.file_share(f"/big{i:02d}", 1 << 30, i) is not None]
    assert kept and kept == list(range(20 - len(kept), 20))  # the most recent ones


CORRUPT = [
    b"",
    b"\x00\xff garbage \x80",
    b'{"version":1,"source":"/x","dirs":{"/d":{"t":1,"s":false,"f":[["a",1],',  # truncated
    b'{"version":99,"source":"/x","dirs":{}}',
    b"[1,2,3]",
    b'{"version":1,"dirs":[]}',
    b'{"version":1,"dirs":{"/d":[]}}',
    b'{"version":1,"dirs":{"/d":{"t":"x","s":false,"f":[]}}}',
    b'{"version":1,"dirs":{"/d":{"t":1,"s":false,"f":[["a",-1]]}}}',
    b'{"version":1,"dirs":{"/d":{"t":1,"s":false,"f":[["a",1.5]]}}}',
    b'{"version":1,"dirs":{"/d":{"t":1,"s":false,"f":[[1,1]]}}}',
    b'{"version":1,"dirs":{"/d":{"t":1,"s":false,"f":[["a",1,2]]}}}',
    b'{"version":1,"dirs":{"/d":{"t":1,"s":false,"f":[5]}}}',
    b'{"version":1,"dirs":{"/d":{"t":1,"s":0,"f":[]}}}',
    b"[" * 100_000,
    '{"version":1,"dirs":{"/d":{"t":1,"s":false,"f":[["\u00e9",1]]}}}'.encode(),  # not ASCII
    b'{"version":1,"files":[],"dirs":{}}',
    b'{"version":1,"files":{"/m":[1,2,0.5]},"dirs":{}}',
    b'{"version":1,"files":{"/m":[1,2,1.5,3]},"dirs":{}}',
    b'{"version":1,"files":{"/m":[-1,2,0.5,3]},"dirs":{}}',
    b'{"version":1,"files":{"/m":["1",2,0.5,3]},"dirs":{}}',
]


@pytest.mark.parametrize("content", CORRUPT, ids=range(len(CORRUPT)))
def test_corrupt_state_file_starts_empty(tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture) -> None:
    log = make_log(tmp_path)
    os.makedirs(os.path.dirname(log.path), exist_ok=True)
    Path(log.path).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="fastfs.fsio.learn"):
        assert log.load() == 0
    assert len(log) == 0
    assert log.plan("/d") is None
    assert any("learned access sets" in r.getMessage() for r in caplog.records)
    # The log keeps working and the next save replaces the corrupt file.
    for n in names(10):
        log.record_open("/d", n, 1)
    assert log.save()
    fresh = make_log(tmp_path)
    assert fresh.load() == 1


def test_oversized_state_file_is_ignored(tmp_path: Path) -> None:
    log = make_log(tmp_path, max_bytes=4096)
    for n in names(20):
        log.record_open("/d", n, 1)
    big = make_log(tmp_path, max_bytes=1 << 20)
    for n in names(2000):
        big.record_open("/d", n, 1)
    assert big.save()
    assert os.path.getsize(big.path) > 4096
    assert log.load() == 0


def test_unreadable_state_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = make_log(tmp_path)
    os.makedirs(log.path)  # a directory where the file should be: open() fails with EISDIR
    with caplog.at_level(logging.WARNING, logger="fastfs.fsio.learn"):
        assert log.load() == 0
    assert caplog.records


def test_save_failure_is_reported_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    log = make_log(blocker / "state")  # parent is a regular file: cannot create the directory
    for n in names(10):
        log.record_open("/d", n, 1)
    with caplog.at_level(logging.WARNING, logger="fastfs.fsio.learn"):
        assert log.save() is False
    assert log.dirty  # still to be saved
    assert caplog.records
    assert blocker.read_bytes() == b"x"


def test_save_creates_state_dir_and_replaces_atomically(tmp_path: Path) -> None:
    state = tmp_path / "a" / "b"
    log = make_log(state)
    for n in names(10):
        log.record_open("/d", n, 1)
    assert log.save()
    first = Path(log.path).read_bytes()
    log.record_open("/d", "more", 1)
    assert log.save()
    assert Path(log.path).read_bytes() != first
    assert sorted(os.listdir(state)) == [os.path.basename(log.path)]


def test_dirty_tells_the_engine_when_to_save(tmp_path: Path) -> None:
    """The engine's save thread saves while ``dirty`` (learn.py keeps no timer of its own)."""
    log = make_log(tmp_path)
    assert log.dirty is False
    for n in names(10):
        log.record_open("/d", n, 1)
    assert log.dirty is True
    assert log.save() is True and os.path.exists(log.path)
    assert log.dirty is False  # saved, nothing new
    log.record_open("/d", "new", 1)
    assert log.dirty is True


def test_bound_keeps_most_recent_directories(tmp_path: Path) -> None:
    clock = Clock()
    log = make_log(tmp_path, max_bytes=2000, clock=clock)
    order = [f"/dir{i:03d}" for i in range(40)]
    for d in order:
        clock.tick()
        for n in names(MIN_FILES):
            log.record_open(d, n, 123456)
    assert log.save()
    size = os.path.getsize(log.path)
    assert size <= 2000
    kept = list(json.loads(Path(log.path).read_text())["dirs"])
    assert 0 < len(kept) < len(order)
    assert kept == list(reversed(order))[: len(kept)]  # most recently used first, none skipped


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dirs=st.dictionaries(
        st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=12).map(lambda s: "/" + s),
        st.lists(
            st.tuples(
                st.text(st.characters(blacklist_characters="/\x00"), min_size=1, max_size=16),
                st.integers(min_value=0, max_value=2**40),
            ),
            min_size=0,
            max_size=30,
        ),
        max_size=8,
    ),
    max_bytes=st.integers(min_value=64, max_value=8000),
)
def test_property_round_trip_and_bound(dirs: dict[str, list[tuple[str, int]]], max_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as state:
        clock = Clock()
        log = make_log(Path(state), max_bytes=max_bytes, clock=clock)
        for d, files in dirs.items():
            for name, size in files:
                clock.tick()
                log.record_open(d, name, size)
        assert log.save()
        assert os.path.getsize(log.path) <= max_bytes
        saved = list(json.loads(Path(log.path).read_text())["dirs"])
        fresh = make_log(Path(state), max_bytes=max_bytes)
        assert fresh.load() == len(saved)
        eligible = sorted((d for d in dirs if log.plan(d) is not None), key=lambda d: -log._dirs[d].last_used)
        assert saved == eligible[: len(saved)]  # most recent first, no gap
        for d in dirs:
            if d in saved:
                assert fresh.plan(d) == log.plan(d)
            else:
                assert fresh.plan(d) is None


def test_concurrent_recording_and_saving(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(500):
                log.record_open(f"/d{k % 3}", f"t{k}-{i:04d}", i)
                if i % 100 == 0:
                    log.plan(f"/d{k % 3}")
                    log.note_plan_used(f"/d{k % 3}", f"t{k}-{i:04d}")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def saver() -> None:
        try:
            for _ in range(20):
                log.save()
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)] + [threading.Thread(target=saver)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert log.save()
    fresh = make_log(tmp_path)
    assert fresh.load() == 3
    for j in range(3):
        expected = {f"t{k}-{i:04d}" for k in range(6) if k % 3 == j for i in range(500)}
        assert set(fresh.plan(f"/d{j}").names) == expected


def test_directories_and_whole_file_loads_survive_two_reloads(tmp_path: Path) -> None:
    """Issue 12 finding 1: a state file holding both directories and whole-file loads reloads both, and
    saves again after the reload (the decoder once reused one name for both lists)."""
    log = make_log(tmp_path)
    for i, n in enumerate(names(12)):
        log.record_open("/train", n, 100 + i)
    log.record_file("/ckpt/model.safetensors", 1 << 30, 1234, 0.99)
    assert log.save()
    for _ in range(2):
        fresh = make_log(tmp_path)
        assert fresh.load() == 1
        assert fresh.file_share("/ckpt/model.safetensors", 1 << 30, 1234) == 0.99
        assert fresh.plan("/train").names == tuple(names(12))
        fresh.record_file("/ckpt/other.pt", 10, 1, 0.5)
        assert fresh.save() is True
    last = make_log(tmp_path)
    last.load()
    assert last.file_share("/ckpt/other.pt", 10, 1) == 0.5
    assert last.file_share("/ckpt/model.safetensors", 1 << 30, 1234) == 0.99
