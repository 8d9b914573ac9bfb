"""Scans of many directories at once keep to one share of the budget (``Scanner._mount_share_full``):
an image folder larger than the budget, read shuffled across its classes, is not fetched ahead by
every class's scan at once, each evicting the others' files before their turn (before: 1.78x the
bytes read fetched from the source, a third of them evicted unread)."""

from __future__ import annotations

import random
from pathlib import Path

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.stats import Stats

DIRS = 8
FILES = 100
SIZE = 64 * 1024  # 8 x 100 x 64 KiB = 50 MiB read through a 16 MiB budget


def body(d: int, i: int) -> bytes:
    return (f"{d:02d}{i:06d}|" * (SIZE // 9 + 1)).encode()[:SIZE]


def test_shuffled_reads_of_many_directories_over_the_budget_fetch_each_file_about_once(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for d in range(DIRS):
        (src / f"c{d}").mkdir(parents=True)
        for i in range(FILES):
            (src / f"c{d}" / f"f{i:04d}").write_bytes(body(d, i))
    opts = {
        "state.dir": str(tmp_path / "state"),
        "cache.budget": "16M",
        "fuse.passthrough": "off",
        "readahead.learn": "false",
        "cache.check_invariants": "true",
    }
    engine = Engine(str(src), load_config(overrides=opts, use_default_path=False), Stats())
    try:
        order = [(d, i) for d in range(DIRS) for i in range(FILES)]
        random.Random(3).shuffle(order)
        for d, i in order:
            r = engine.open(f"/c{d}/f{i:04d}")
            try:
                assert engine.read(r.fh, 0, SIZE) == body(d, i)
            finally:
                engine.release(r.fh)
        c = engine.snapshot()["counters"]
        fetched = c.get(m.BYTES_FETCHED_PREFETCH, 0) + c.get(m.BYTES_FETCHED_DEMAND, 0)
        assert c.get(m.SCAN_FILES, 0) > 0  # (the scans ran)
        assert fetched <= 1.1 * DIRS * FILES * SIZE, c
        assert c.get(m.BYTES_PREFETCH_WASTED, 0) <= 0.05 * DIRS * FILES * SIZE, c
        engine.cache.check_invariants()
    finally:
        engine.close()
