"""A job that read part of a directory last time gets that part fetched, not the whole directory: while
a learned set is replayed, only opens outside it start a scan (``ScanPolicy.learn``). Before, the
third open started a scan of the whole listing beside the replay: a rerun of a job reading a shuffled
tenth of 1,000 files had all of them fetched again."""

from __future__ import annotations

import random
from pathlib import Path

from scanfiles import body, make_files, read, scan_engine, settle

from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine

FILES = 1000
SUBSET = 100


def read_file(engine: Engine, i: int) -> None:
    read(engine, f"/d/f{i:05d}", body(i))


def test_a_rerun_of_a_job_reading_a_tenth_gets_only_that_tenth_fetched(tmp_path: Path) -> None:
    make_files(tmp_path / "src" / "d", FILES)
    rng = random.Random(5)
    subset = rng.sample(range(FILES), SUBSET)
    first = scan_engine(tmp_path, **{"readahead.learn": "true"})
    try:
        for _epoch in range(2):  # two shuffled epochs over the subset: the first becomes the learned set
            rng.shuffle(subset)
            for i in subset:
                read_file(first, i)
    finally:
        first.close()  # (saves the learned sets)
    rerun = scan_engine(tmp_path, **{"readahead.learn": "true"})
    try:
        rng.shuffle(subset)
        for i in subset:
            read_file(rerun, i)
        counters = rerun.snapshot()["counters"]
        assert counters.get(m.LEARNED_PLANS, 0) == 1
        assert settle(rerun) <= SUBSET  # (before: FILES - 3, the whole directory)
        assert counters.get(m.SCANS, 0) == 0
    finally:
        rerun.close()
