"""The changing-storage benchmark's own helpers (benchmarks/bench_changing.py), without a mount."""

from __future__ import annotations

import os
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import bench_changing  # noqa: E402


def test_a_file_a_lagging_listing_never_shows_is_reported_not_raised(tmp_path) -> None:
    """The append scenario's file, created at the source, may not show through a client whose listing
    lags (rclone's dir cache): the wait ends at the limit with None, and the scenario prints a row."""
    t0 = time.monotonic()
    assert bench_changing._visible_after(str(tmp_path / "never"), 0.3) is None
    assert 0.3 <= time.monotonic() - t0 < 5


def test_a_file_that_shows_late_is_waited_for(tmp_path) -> None:
    path = tmp_path / "late"
    timer = threading.Timer(0.2, path.write_bytes, (b"x",))
    timer.start()
    try:
        seconds = bench_changing._visible_after(str(path), 5)
    finally:
        timer.cancel()
    assert seconds is not None and 0.1 <= seconds < 5
