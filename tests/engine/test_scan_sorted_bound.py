"""A scan in name order fetches only the names just past its reader (``ScanPolicy.may_fetch``): a
reader of the first files of a large directory, a rank's shard of it, or every other file of it is not
given the whole directory from the source (before: every small file of the directory was fetched,
up to half the RAM budget, for a reader that opened 100); a strided reader (every k-th name) gets the
next names on its stride, and nothing between them."""

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


def test_a_reader_skipping_names_irregularly_gets_no_scan_fetches(engine: Engine) -> None:
    for i in (i for i in range(600) if i % 3 != 1):  # two names of every three: no stride, 2/3 < 4/5 passed
        read(engine, i)
    assert settle(engine) == 0
    assert counter(engine, m.SCAN_HELD) == 1
    assert counter(engine, m.SCANS) == 1


def test_a_strided_reader_gets_only_the_names_on_its_stride(engine: Engine) -> None:
    """A rank reading every 4th name (before: nothing fetched, it read each file from the source)."""
    for i in range(1, 801, 4):  # rank 1 of 4
        read(engine, i)
    fetched = settle(engine)  # (held, perhaps, until its fifth open showed the stride: counted once)
    assert counter(engine, m.SCAN_HELD) <= 1
    assert 0 < fetched <= 200 + SORTED_LEAD_FILES
    ahead = [i for i in range(801, FILES) if engine.scanner.meta(f"/d/f{i:05d}") is not None]
    assert ahead == list(range(801, min(FILES, 801 + 4 * SORTED_LEAD_FILES), 4))[: len(ahead)]
    assert len(ahead) >= SORTED_LEAD_FILES - 8  # (the lead, less the last fetches' race with settle)
    served = counter(engine, m.BYTES_SERVED_CACHE)
    for i in range(801, 801 + 4 * 100, 4):  # its next reads come from RAM
        read(engine, i)
    assert counter(engine, m.BYTES_SERVED_CACHE) - served == 100 * SIZE


def test_a_shuffled_reader_still_gets_the_whole_directory(engine: Engine) -> None:
    for i in (17, 3, 2900):
        read(engine, i)
    assert settle(engine) >= FILES - 3 - SORTED_LEAD_FILES  # (the reader's own opens aside)
    deadline = time.monotonic() + 30
    while counter(engine, m.SCAN_FILES) < FILES - 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert counter(engine, m.SCAN_FILES) == FILES - 3
