"""A replay of a learned set lists its directory before it fetches the set (``Scanner._start_replay``).

The listing tells the source's client every name at once: over GlusterFS (2 ms one-way delay,
10,000 small files) a rerun's replay without it opened each file with a lookup the client answered
one at a time per directory, 49.8 s against 6.6 s with it. It also drops the learned names whose
files are gone since, which the replay opened before (each a failed source open). Over a client whose
listing asks about every entry (s3fs: a HEAD per object) the replay fetches the set as learned.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from scanfiles import body, counter, make_files, read, scan_engine, settle

from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine

FILES = 200
GONE = range(150, 170)  # files deleted between the two runs
WANTED = FILES - len(GONE) - 1  # what the replay fetches: the set left but the file its first open read


def learn_the_set(tmp_path: Path) -> None:
    """A first run: two epochs in name order over the directory (the first becomes the learned set)."""
    first = scan_engine(tmp_path, **{"readahead.learn": "true"})
    try:
        for _epoch in range(2):
            for i in range(FILES):
                read(first, f"/d/f{i:05d}", body(i))
    finally:
        first.close()  # (saves the learned sets)


def opened_paths(engine: Engine) -> list[str]:
    """Record every path the engine's source opens from now on."""
    source = engine.source
    opened: list[str] = []
    original = source.open_file

    def recording(path: str):  # type: ignore[no-untyped-def]
        opened.append(path)
        return original(path)

    source.open_file = recording  # type: ignore[method-assign]
    return opened


@pytest.mark.parametrize("mount_type", ["", "fuse.glusterfs", "fuse.s3fs"])
def test_a_replay_lists_its_directory_first_and_skips_files_gone(tmp_path: Path, mount_type: str) -> None:
    make_files(tmp_path / "src" / "d", FILES)
    learn_the_set(tmp_path)
    for i in GONE:
        (tmp_path / "src" / "d" / f"f{i:05d}").unlink()
    rerun = scan_engine(tmp_path, **{"readahead.learn": "true"})
    try:
        rerun.source.mount_type = mount_type
        opened = opened_paths(rerun)
        read(rerun, "/d/f00000", body(0))  # the first open replays the set
        deadline = time.monotonic() + 30
        while counter(rerun, m.SCAN_FILES) < WANTED and time.monotonic() < deadline:
            time.sleep(0.02)  # (the replay runs on the pool: every file of the set left is fetched)
        assert settle(rerun) == WANTED
        counters = rerun.snapshot()["counters"]
        assert counters.get(m.LEARNED_PLANS, 0) == 1
        gone = {f"/d/f{i:05d}" for i in GONE}
        if mount_type == "fuse.s3fs":
            assert counters.get(m.SOURCE_LISTINGS, 0) == 0  # (its listing would HEAD every object)
            assert gone <= set(opened)  # the set as learned (what the replay did everywhere before)
        else:
            assert counters.get(m.SOURCE_LISTINGS, 0) == 1
            assert not gone & set(opened)  # (before: all 20 opened, each failing)
        for i in range(1, FILES):  # the rest of the set, fetched ahead and served whole
            if i not in GONE:
                read(rerun, f"/d/f{i:05d}", body(i))
        assert counter(rerun, m.SCAN_FILES) == WANTED  # (the reader's opens were answered from them)
    finally:
        rerun.close()
