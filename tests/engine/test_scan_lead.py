"""A small-file scan fetches a whole large directory ahead of a shuffled reader (issue 21: at full
scale, 10,000 files, a lead of 4,096 files left most of a shuffled pass to the reader's own source
round trips; the bytes ahead are bounded by the budget share, not by a count of files)."""

from __future__ import annotations

import random
import time
from pathlib import Path

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.stats import Stats

FILES = 5000  # more than the old lead of 4,096
SIZE = 100


def body(i: int) -> bytes:
    return (f"{i:08d}|" * (SIZE // 9 + 1)).encode()[:SIZE]


def test_a_scan_fetches_a_directory_larger_than_4096_files_ahead(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for i in range(FILES):
        (src / "d" / f"f{i:05d}").write_bytes(body(i))
    opts = {
        "state.dir": str(tmp_path / "state"),
        "cache.budget": "256M",
        "fuse.passthrough": "off",
        "readahead.learn": "false",
        "readahead.scan_trigger": "2",
        # (fixed: fetches from tmpfs wait on each other for the interpreter, as on a source answering one at a
        # time, where a measured window stops a shuffled reader's scan: test_scan_window.py)
        "readahead.scan_window": "32",
    }
    engine = Engine(str(src), load_config(overrides=opts, use_default_path=False), Stats())
    try:
        order = list(range(FILES))
        random.Random(7).shuffle(order)
        order[:2] = sorted(
            order[:2], reverse=True
        )  # (out of name order: a reader in order is fetched only its next names)
        for i in order[:2]:  # two opens start the scan
            r = engine.open(f"/d/f{i:05d}")
            assert engine.read(r.fh, 0, SIZE) == body(i)
            engine.release(r.fh)
        deadline = time.monotonic() + 60
        while engine.snapshot()["counters"].get(m.SCAN_FILES, 0) < FILES - 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.snapshot()["counters"].get(m.SCAN_FILES, 0) == FILES - 2
        before = engine.snapshot()["counters"].get(m.SOURCE_OPENS, 0)
        for i in order[2:200]:  # the shuffled reader finds its files fetched: no source open
            r = engine.open(f"/d/f{i:05d}")
            assert engine.read(r.fh, 0, SIZE) == body(i)
            engine.release(r.fh)
        assert engine.snapshot()["counters"].get(m.SOURCE_OPENS, 0) == before
    finally:
        engine.close()
