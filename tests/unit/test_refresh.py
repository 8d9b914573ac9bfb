"""The refresher's pure policy (fsio/refresh.py: what is due, when to wake) and the daemon's record of
names answered absent (daemon/negatives.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastfs.daemon.negatives import Negatives
from fastfs.fsio.refresh import Due, due

NEVER = float("-inf")


@pytest.mark.parametrize(
    ("items", "now", "period", "window", "limit", "want"),
    [
        ([], 10.0, 1.0, 300.0, 8, Due([], None)),  # nothing watched: idle
        ([("a", 10.0, NEVER)], 10.0, 1.0, 300.0, 8, Due(["a"], 1.0)),  # never checked: at once
        ([("a", 9.0, 9.5)], 10.0, 1.0, 300.0, 8, Due([], 0.5)),  # checked 0.5 s ago: due in 0.5 s
        ([("a", 9.0, 9.0)], 10.0, 1.0, 300.0, 8, Due(["a"], 1.0)),  # exactly one period: due
        ([("a", -400.0, NEVER)], 10.0, 1.0, 300.0, 8, Due([], None)),  # used too long ago: not watched
        ([("a", 10.0, NEVER)], 10.0, 1.0, None, 8, Due(["a"], 1.0)),  # no window: always watched
        # the one checked longest ago first, at most the limit; the rest wait for the next period
        ([("a", 10.0, 5.0), ("b", 10.0, 2.0), ("c", 10.0, 8.0)], 10.0, 1.0, 300.0, 2, Due(["b", "a"], 1.0)),
        # picked ones are due again a period later, others when their period ends
        ([("a", 10.0, 5.0), ("b", 10.0, 9.8)], 10.0, 1.0, 300.0, 8, Due(["a"], pytest.approx(0.8))),
        ([("a", 10.0, 5.0), ("b", 10.0, 9.1)], 10.0, 1.0, 300.0, 8, Due(["a"], pytest.approx(0.1))),
    ],
)
def test_due_table(items, now, period, window, limit, want):
    assert due(items, now, period, window, limit) == want


@given(
    items=st.lists(st.tuples(st.floats(-1000, 100), st.one_of(st.just(NEVER), st.floats(-1000, 100))), max_size=30),
    period=st.floats(0.1, 60),
    window=st.one_of(st.none(), st.floats(0, 600)),
    limit=st.integers(1, 10),
)
def test_due_picks_only_watched_due_items_oldest_first(items, period, window, limit):
    now = 100.0
    keyed = [(i, used, checked) for i, (used, checked) in enumerate(items)]
    got = due(keyed, now, period, window, limit)
    watched = [k for k in keyed if window is None or now - k[1] <= window]
    ready = [k for k in watched if now - k[2] >= period]
    assert len(got.keys) == min(limit, len(ready))
    assert set(got.keys) <= {k[0] for k in ready}
    checks = [keyed[i][2] for i in got.keys]
    assert checks == sorted(checks)
    left = [k for k in ready if k[0] not in got.keys]
    assert all(keyed[i][2] <= k[2] for i in got.keys for k in left)  # none left older than one picked
    if not watched:
        assert got.wake is None
    else:
        assert got.wake is not None and 0 < got.wake <= period


def test_negatives_are_kept_per_directory_bounded_and_taken_once_they_exist():
    neg = Negatives(max_dirs=2, max_names=3)
    for name in ("a", "b", "c", "d"):
        neg.add(10, name)
    assert len(neg) == 3  # the oldest name of the directory forgotten
    assert neg.existing(10, {"a", "b", "x"}) == ["b"]
    assert neg.existing(10, {"b"}) == []  # taken: told once
    neg.add(11, "y")
    neg.add(12, "z")  # a third directory: the least recently added one (10) is forgotten
    assert neg.existing(10, {"c", "d"}) == []
    assert neg.existing(11, {"y"}) == ["y"] and neg.existing(12, {"z"}) == ["z"]
    assert len(neg) == 0
