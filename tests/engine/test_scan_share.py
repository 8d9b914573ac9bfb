"""Scans of many directories at once keep to one share of the budget (``Scanner._mount_share_full``):
an image folder larger than the budget, read shuffled across its classes, is not fetched ahead by
every class's scan at once, each evicting the others' files before their turn (before: 1.78x the
bytes read fetched from the source, a third of them evicted unread)."""

from __future__ import annotations

import random
from pathlib import Path

from scanfiles import body, make_files, read, scan_engine

from fastfs.fsio import stats as m

DIRS = 8
FILES = 100
SIZE = 64 * 1024  # 8 x 100 x 64 KiB = 50 MiB read through a 16 MiB budget


def test_shuffled_reads_of_many_directories_over_the_budget_fetch_each_file_about_once(tmp_path: Path) -> None:
    for d in range(DIRS):
        make_files(tmp_path / "src" / f"c{d}", FILES, SIZE, tag=f"{d:02d}")
    engine = scan_engine(tmp_path, **{"cache.budget": "16M", "cache.check_invariants": "true"})
    try:
        order = [(d, i) for d in range(DIRS) for i in range(FILES)]
        random.Random(3).shuffle(order)
        for d, i in order:
            read(engine, f"/c{d}/f{i:05d}", body(i, SIZE, tag=f"{d:02d}"))
        c = engine.snapshot()["counters"]
        fetched = c.get(m.BYTES_FETCHED_PREFETCH, 0) + c.get(m.BYTES_FETCHED_DEMAND, 0)
        assert c.get(m.SCAN_FILES, 0) > 0  # (the scans ran)
        # (before the share: 1.66x fetched, two thirds of the prefetch evicted unread. Now, over 34 runs
        # on this 2-core VM: 1.001-1.093x and 0-4.9 MB wasted, the tail when the pool's timing lets a
        # demand read evict files fetched for another class; 1.1x and 5 % failed one full run in three)
        assert fetched <= 1.25 * DIRS * FILES * SIZE, c
        assert c.get(m.BYTES_PREFETCH_WASTED, 0) <= 0.15 * DIRS * FILES * SIZE, c
        engine.cache.check_invariants()
    finally:
        engine.close()
