"""The pure change rules: file revalidation outcomes, growth, listing validity and vanished names."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastfs.fsio import changes
from fastfs.fsio.changes import Change

S = 1_000_000_000


def mkst(ino=5, size=100, mtime=10 * S, ctime=10 * S, mode=stat.S_IFREG | 0o644, dev=1) -> os.stat_result:
    # os.stat_result from a sequence: the first 10 fields, then the float times, then the ns times
    return os.stat_result(
        (mode, ino, dev, 1, 0, 0, size, mtime // S, mtime // S, ctime // S, mtime / S, mtime / S, ctime / S,
         mtime, mtime, ctime)
    )  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "want"),
    [
        (mkst(), mkst(), Change.SAME),
        (mkst(), None, Change.GONE),
        (mkst(), mkst(size=200, mtime=11 * S, ctime=11 * S), Change.GREW),  # appended to
        (mkst(), mkst(size=200), Change.GREW),  # grew within one timestamp tick
        (mkst(), mkst(size=50, mtime=11 * S, ctime=11 * S), Change.CHANGED),  # truncated
        (mkst(), mkst(size=100, mtime=11 * S, ctime=11 * S), Change.CHANGED),  # rewritten in place
        (mkst(), mkst(ino=6, size=200), Change.CHANGED),  # replaced by rename: another inode
        (mkst(), mkst(dev=2), Change.CHANGED),
        (mkst(), mkst(size=200, mtime=9 * S), Change.CHANGED),  # times went back: not an append
        (mkst(), mkst(ctime=11 * S), Change.CHANGED),  # chmod or a hard link: new ctime, same size
        (mkst(), mkst(mode=stat.S_IFDIR | 0o755), Change.CHANGED),
        (mkst(mode=stat.S_IFLNK | 0o777), mkst(mode=stat.S_IFLNK | 0o777, size=200), Change.CHANGED),
    ],
)
def test_classify_table(old, new, want):
    assert changes.classify(old, new) is want


@given(
    size=st.integers(0, 1 << 40),
    grow=st.integers(0, 1 << 20),
    dm=st.integers(-5 * S, 5 * S),
    dc=st.integers(-5 * S, 5 * S),
)
def test_growth_is_only_a_larger_same_file_whose_times_did_not_go_back(size, grow, dm, dc):
    old = mkst(size=size)
    new = mkst(size=size + grow, mtime=10 * S + dm, ctime=10 * S + dc)
    got = changes.classify(old, new)
    if grow == 0 and dm == 0 and dc == 0:
        assert got is Change.SAME
    elif grow > 0 and dm >= 0 and dc >= 0:
        assert got is Change.GREW
    else:
        assert got is Change.CHANGED


@pytest.mark.parametrize(("size", "want"), [(0, (0, 0)), (100, (0, 100)), (4096, (0, 4096)), (10_000, (5904, 4096))])
def test_tail_range_is_the_last_bytes_before_the_old_end(size, want):
    assert changes.tail_range(size) == want


@pytest.mark.parametrize(
    ("fetched", "now", "bound", "fresh"),
    [(10.0, 10.5, 1.0, True), (10.0, 11.0, 1.0, True), (10.0, 11.01, 1.0, False), (10.0, 10.0, 0.0, False)],
)
def test_is_fresh(fetched, now, bound, fresh):
    assert changes.is_fresh(fetched, now, bound) is fresh


def test_a_listing_is_valid_only_for_the_same_directory_state_and_not_when_racy():
    d = mkst(ino=2, mode=stat.S_IFDIR | 0o755, mtime=100 * S, ctime=100 * S)
    key = changes.dir_key(d)
    assert changes.listing_valid(key, 105 * S, d)  # listed well after the last change
    assert not changes.listing_valid(key, 101 * S, d)  # listed within the tick of the change: racy
    assert not changes.listing_valid(key, 105 * S, mkst(ino=2, mode=stat.S_IFDIR | 0o755, mtime=106 * S))
    assert not changes.listing_valid(key, 105 * S, mkst(ino=3, mode=stat.S_IFDIR | 0o755, mtime=100 * S))


@given(old=st.lists(st.text(min_size=1, max_size=4), unique=True), new=st.lists(st.text(min_size=1, max_size=4)))
def test_vanished_names_are_those_of_the_old_listing_missing_from_the_new(old, new):
    gone = changes.vanished(old, new)
    assert set(gone) == set(old) - set(new)
    assert gone == [n for n in old if n in set(gone)]  # in the old listing's order
