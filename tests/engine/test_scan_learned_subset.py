"""A job that read part of a directory last time gets that part fetched, not the whole directory: while
a learned set is replayed, only opens outside it start a scan (``ScanPolicy.learn``). Before, the
third open started a scan of the whole listing beside the replay: a rerun of a job reading a shuffled
tenth of 1,000 files had all of them fetched again."""

from __future__ import annotations

import random
import time
from pathlib import Path

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.stats import Stats

FILES = 1000
SUBSET = 100
SIZE = 100


def body(i: int) -> bytes:
    return (f"{i:08d}|" * (SIZE // 9 + 1)).encode()[:SIZE]


def engine_for(tmp_path: Path) -> Engine:
    opts = {
        "state.dir": str(tmp_path / "state"),
        "cache.budget": "64M",
        "fuse.passthrough": "off",
        "readahead.learn": "true",
    }
    return Engine(str(tmp_path / "src"), load_config(overrides=opts, use_default_path=False), Stats())


def read(engine: Engine, i: int) -> None:
    r = engine.open(f"/d/f{i:05d}")
    try:
        assert engine.read(r.fh, 0, SIZE) == body(i)
    finally:
        engine.release(r.fh)


def settled_scan_files(engine: Engine) -> int:
    last, since, deadline = -1, time.monotonic(), time.monotonic() + 30
    while time.monotonic() < deadline:
        now = int(engine.snapshot()["counters"].get(m.SCAN_FILES, 0))
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 0.5:
            return now
        time.sleep(0.02)
    raise AssertionError("the scan never settled")


def test_a_rerun_of_a_job_reading_a_tenth_gets_only_that_tenth_fetched(tmp_path: Path) -> None:
    (tmp_path / "src" / "d").mkdir(parents=True)
    for i in range(FILES):
        (tmp_path / "src" / "d" / f"f{i:05d}").write_bytes(body(i))
    rng = random.Random(5)
    subset = rng.sample(range(FILES), SUBSET)
    first = engine_for(tmp_path)
    try:
        for _epoch in range(2):  # two shuffled epochs over the subset: the first becomes the learned set
            rng.shuffle(subset)
            for i in subset:
                read(first, i)
    finally:
        first.close()  # (saves the learned sets)
    rerun = engine_for(tmp_path)
    try:
        rng.shuffle(subset)
        for i in subset:
            read(rerun, i)
        counters = rerun.snapshot()["counters"]
        assert counters.get(m.LEARNED_PLANS, 0) == 1
        assert settled_scan_files(rerun) <= SUBSET  # (before: FILES - 3, the whole directory)
        assert counters.get(m.SCANS, 0) == 0
    finally:
        rerun.close()
