"""The daemon's garbage-collector tuning (fastfs.daemon.mount.tune_gc)."""

from __future__ import annotations

import gc

from fastfs.daemon import mount


def test_the_daemon_collects_cycles_rarely_and_leaves_its_startup_objects_out() -> None:
    """tune_gc freezes what is alive and raises the youngest generation's threshold to
    GC_YOUNG_THRESHOLD; the test puts the interpreter back as it was."""
    before = gc.get_threshold()
    try:
        mount.tune_gc()
        assert gc.get_threshold() == (mount.GC_YOUNG_THRESHOLD, before[1], before[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
