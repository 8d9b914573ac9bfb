"""A scan in name order fetches only the names just past its reader (``ScanPolicy.may_fetch``): a
reader of the first files of a large directory, a rank's shard of it, or every other file of it is not
given the whole directory from the source (before: every small file of the directory was fetched,
up to half the RAM budget, for a reader that opened 100)."""

from __future__ import annotations

import time
from pathlib import Path

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.policy import SORTED_LEAD_FILES
from fastfs.fsio.stats import Stats

FILES = 3000
SIZE = 100


def body(i: int) -> bytes:
    return (f"{i:08d}|" * (SIZE // 9 + 1)).encode()[:SIZE]


def make_engine(tmp_path: Path) -> Engine:
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
    }
    return Engine(str(src), load_config(overrides=opts, use_default_path=False), Stats())


def read(engine: Engine, i: int) -> None:
    r = engine.open(f"/d/f{i:05d}")
    try:
        assert engine.read(r.fh, 0, SIZE) == body(i)
    finally:
        engine.release(r.fh)


def counter(engine: Engine, name: str) -> int:
    return int(engine.snapshot()["counters"].get(name, 0))


def settle(engine: Engine, seconds: float = 0.5) -> int:
    """The scan's fetch count once it stopped moving for *seconds*."""
    last, since = -1, time.monotonic()
    deadline = since + 30
    while time.monotonic() < deadline:
        now = counter(engine, m.SCAN_FILES)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return now
        time.sleep(0.02)
    raise AssertionError("the scan never settled")


def test_a_reader_of_the_first_files_gets_only_the_next_names_fetched(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    try:
        for i in range(100):
            read(engine, i)
        fetched = settle(engine)
        assert fetched <= 100 + SORTED_LEAD_FILES  # (before: FILES - 2, the whole directory)
        served = counter(engine, m.BYTES_SERVED_CACHE)
        for i in range(100, 100 + SORTED_LEAD_FILES):  # the names just past the reader were fetched:
            read(engine, i)  # each read is served from RAM
        assert counter(engine, m.BYTES_SERVED_CACHE) - served == SORTED_LEAD_FILES * SIZE
        # and the bound moved on with the reader
        assert settle(engine) <= 100 + 2 * SORTED_LEAD_FILES
        assert counter(engine, m.SCAN_HELD) == 0
    finally:
        engine.close()


def test_a_reader_of_every_other_file_gets_no_scan_fetches(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    try:
        for i in range(0, 400, 2):
            read(engine, i)
        assert settle(engine) == 0
        assert counter(engine, m.SCAN_HELD) == 1
        assert counter(engine, m.SCANS) == 1
    finally:
        engine.close()


def test_a_shuffled_reader_still_gets_the_whole_directory(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    try:
        for i in (17, 3, 2900):
            read(engine, i)
        assert settle(engine) >= FILES - 3 - SORTED_LEAD_FILES  # (the reader's own opens aside)
        deadline = time.monotonic() + 30
        while counter(engine, m.SCAN_FILES) < FILES - 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counter(engine, m.SCAN_FILES) == FILES - 3
    finally:
        engine.close()
