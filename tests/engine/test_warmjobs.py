"""Warm jobs of the engine (fastfs.fsio.warm) without FUSE: bounds, fairness, permissions, hung files."""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from pathlib import Path

import pytest

from fastfs.config import load_config
from fastfs.fsio.access import Caller
from fastfs.fsio.engine import Engine
from fastfs.fsio.warm import WarmJobs, warm_now

MIB = 1 << 20
USER = Caller(1000, 1000)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "open").mkdir(parents=True)
    (src / "closed").mkdir(mode=0o700)
    (src / "open" / "a").write_bytes(random.Random(1).randbytes(3 * MIB + 5))
    (src / "open" / "b").write_bytes(b"b" * 100)
    (src / "open" / "private").write_bytes(b"p" * 50)
    (src / "open" / "private").chmod(0o600)
    (src / "open" / "link").symlink_to("a")
    (src / "closed" / "c").write_bytes(b"c" * 70)
    (src / "mine").write_bytes(b"m" * 30)
    (src / "mine").chmod(0o600)
    os.chown(src / "mine", USER.uid, USER.gid)
    src.chmod(0o755)
    (src / "open").chmod(0o755)
    return src


@pytest.fixture
def engine(tree: Path, tmp_path: Path):
    config = load_config(
        overrides={"cache.budget": "64M", "cache.block_size": "1M", "state.dir": str(tmp_path / "state")},
        use_default_path=False,
    )
    eng = Engine(str(tree), config)
    yield eng
    eng.close()


def test_a_user_warms_only_what_it_may_read(engine, tree: Path) -> None:
    report = warm_now(engine, "/", USER)
    assert report["files_total"] == report["files_done"] == 3  # open/a, open/b, mine
    assert report["bytes_done"] == 3 * MIB + 5 + 100 + 30
    assert report["skipped"] == 2  # open/private, closed/
    key = engine.version_key("/closed/c")
    assert engine.cache.cached_bytes(key) == 0
    assert engine.cache.cached_bytes(engine.version_key("/open/a")) == 3 * MIB + 5
    with pytest.raises(OSError) as info:
        warm_now(engine, "/closed", USER)
    assert info.value.errno == errno.EACCES
    with pytest.raises(OSError) as info:
        warm_now(engine, "/closed/c", USER)  # its directory may not be searched
    assert info.value.errno == errno.EACCES
    with pytest.raises(OSError) as info:
        warm_now(engine, "/open/link", USER)
    assert info.value.errno == errno.ENOTSUP
    assert warm_now(engine, "/")["files_done"] == 5  # root: everything


def test_hidden_names_are_left_out(engine, tree: Path) -> None:
    (tree / ".fastfs").mkdir()
    (tree / ".fastfs" / "x").write_bytes(b"x")
    report = warm_now(engine, "/", hidden=("/.fastfs",))
    assert report["files_done"] == 5
    with pytest.raises(OSError):
        warm_now(engine, "/.fastfs/x", hidden=("/.fastfs",))


def test_jobs_are_bounded_per_caller_and_in_total_and_taken_in_turn(engine) -> None:
    jobs = WarmJobs(engine, threads=0, per_caller=2, total=3)  # no runner: jobs stay queued
    a1, a2 = jobs.start("/open", Caller(1, 1)), jobs.start("/open", Caller(1, 1))
    with pytest.raises(OSError) as info:
        jobs.start("/open", Caller(1, 1))
    assert info.value.errno == errno.EAGAIN and "per user" in str(info.value)
    b1 = jobs.start("/open", Caller(2, 2))
    with pytest.raises(OSError) as info:
        jobs.start("/open", Caller(3, 3))
    assert info.value.errno == errno.EAGAIN and "in all" in str(info.value)
    with jobs._cond:
        order = [jobs._next_job() for _ in range(3)]
    assert order == [a1, b1, a2]  # callers in turn, not first come first served
    assert jobs.progress(a1.id, Caller(1, 1))["state"] == "queued"
    with pytest.raises(OSError) as info:
        jobs.progress(a1.id, Caller(2, 2))
    assert info.value.errno == errno.ENODATA
    assert jobs.progress(a1.id, Caller(0, 0))["job"] == a1.id
    jobs.close()


def test_jobs_run_in_the_background_and_report(engine) -> None:
    jobs = WarmJobs(engine)
    job = jobs.start("/open", Caller(0, 0))
    deadline = time.monotonic() + 30
    while not jobs.progress(job.id, Caller(0, 0))["done"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    report = jobs.progress(job.id, Caller(0, 0))
    assert report["files_done"] == 3 and report["listed"] and report["failed"] == 0
    assert jobs.cached("/open/a", USER) == {"size": 3 * MIB + 5, "cached": 3 * MIB + 5}
    with pytest.raises(OSError) as info:
        jobs.cached("/open/private", USER)
    assert info.value.errno == errno.EACCES
    assert jobs.evict("/open/a", USER) == {"size": 3 * MIB + 5, "evicted": 3 * MIB + 5}
    assert jobs.cached("/open/a", USER)["cached"] == 0
    jobs.close()


def test_a_hung_file_is_given_up_once_with_one_deadline(engine, monkeypatch) -> None:
    big = Path(engine.source.root) / "open" / "a"
    big.write_bytes(random.Random(2).randbytes(20 * MIB))  # 20 blocks
    engine.config = load_config(
        overrides={"cache.budget": "64M", "cache.block_size": "1M", "readahead.read_timeout": "1"},
        use_default_path=False,
    )
    release = threading.Event()
    from fastfs.fsio.source import SourceFile

    real = SourceFile.read_into

    def hang(self, offset, view, aligned=False):
        if self.size == 20 * MIB:
            release.wait(30)
        return real(self, offset, view, aligned)

    monkeypatch.setattr(SourceFile, "read_into", hang)
    try:
        t0 = time.monotonic()
        report = warm_now(engine, "/open")
        took = time.monotonic() - t0
        assert report["failed"] == 1 and "timed out" in report["errors"][0], report
        assert report["files_done"] == 3 and report["bytes_done"] == 100 + 50
        assert took < 5, took  # one deadline for the file, not one per block
        again = warm_now(engine, "/open/a")  # the file is stuck: given up at once
        assert again["failed"] == 1 and again["seconds"] < 1
    finally:
        release.set()
