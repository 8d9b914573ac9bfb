"""A scan in name order fetches only the names just past its reader (``ScanPolicy.may_fetch``): a
reader of the first files of a large directory, a rank's shard of it, or every other file of it is not
given the whole directory from the source (before: every small file of the directory was fetched,
up to half the RAM budget, for a reader that opened 100)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scanfiles import SIZE, body, counter, make_files, scan_engine, settle
from scanfiles import read as read_path

from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.policy import SORTED_LEAD_FILES

FILES = 3000


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    make_files(tmp_path / "src" / "d", FILES)
    engine = scan_engine(tmp_path, **{"readahead.scan_trigger": "2"})
    try:
        yield engine
    finally:
        engine.close()


def read(engine: Engine, i: int) -> None:
    read_path(engine, f"/d/f{i:05d}", body(i))


def test_a_reader_of_the_first_files_gets_only_the_next_names_fetched(engine: Engine) -> None:
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


def test_a_reader_of_every_other_file_gets_no_scan_fetches(engine: Engine) -> None:
    for i in range(0, 400, 2):
        read(engine, i)
    assert settle(engine) == 0
    assert counter(engine, m.SCAN_HELD) == 1
    assert counter(engine, m.SCANS) == 1


def test_a_shuffled_reader_still_gets_the_whole_directory(engine: Engine) -> None:
    for i in (17, 3, 2900):
        read(engine, i)
    assert settle(engine) >= FILES - 3 - SORTED_LEAD_FILES  # (the reader's own opens aside)
    deadline = time.monotonic() + 30
    while counter(engine, m.SCAN_FILES) < FILES - 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert counter(engine, m.SCAN_FILES) == FILES - 3
