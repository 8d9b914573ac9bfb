"""Unit tests of the RAM block cache (fsio/cache.py): lock rules and invariants."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastfs.fsio import stats as m
from fastfs.fsio.cache import CHECK_ENV, PENDING, READY, BlockCache

MIB = 1024 * 1024


def test_complete_writes_the_outcome_under_the_lock():
    """complete() takes _lock (the documented guard of a block's state): while another thread holds
    the lock the block stays pending and nobody is woken."""
    cache = BlockCache(4 * MIB, MIB, m.Stats())
    block, created = cache.reserve(("f",), 0, MIB, prefetched=False)
    assert created
    cache._lock.acquire()
    t = threading.Thread(target=cache.complete, args=(block, MIB))
    try:
        t.start()
        assert not block.done.wait(0.2)
        assert block.state == PENDING and block.length == 0
    finally:
        cache._lock.release()
    t.join(5)
    assert block.done.is_set() and block.state == READY and block.length == MIB


def checked_cache(budget: int = 4 * MIB, block: int = MIB) -> BlockCache:
    return BlockCache(budget, block, m.Stats(), check_invariants=True)


def test_every_step_keeps_the_invariants():
    """A walk through every mutating operation, checked inside each (checking on) and after it."""
    cache = checked_cache()
    blocks = []
    for i in range(4):
        b, created = cache.reserve(("f",), i, MIB, prefetched=True)
        assert created
        cache.check_invariants()
        cache.complete(b, MIB)
        cache.unpin(b)
        cache.check_invariants()
        blocks.append(b)
    cache.consumed(blocks[1])  # full: the next reservation evicts the consumed block first
    small, created = cache.reserve(("g",), -1, 10_000, prefetched=False, start=8192)
    cache.check_invariants()
    assert created and small.capacity == 12_288 and cache.peek(("f",), 1) is None
    cache.fail(small, 5)
    cache.check_invariants()
    assert cache.peek(("g",), -1) is None
    got = cache.get(("f",), 2)
    cache.set_budget(MIB // 2)  # block 2 is pinned: the cut cannot be met at once
    cache.check_invariants()
    assert cache.reserved == MIB > cache.budget and cache.peek(("f",), 2) is got
    assert cache.reserve(("f",), 9, MIB, prefetched=True) == (None, False)
    cache.unpin(got)
    assert cache.invalidate_file(("f",)) >= 1
    cache.check_invariants()
    cache.set_budget(4 * MIB)
    b, created = cache.reserve(("f",), 9, MIB, prefetched=True)
    assert created and cache.reserved <= cache.budget
    cache.complete(b, 100)
    cache.unpin(b)
    cache.close()
    cache.check_invariants()
    assert cache.reserved == 0


class _Unwalkable(OrderedDict):
    """A block table that refuses to be walked (a gauge read must not walk it under the lock)."""

    def values(self):
        raise AssertionError("the block table was walked")

    items = values
    __iter__ = values


def test_gauges_are_kept_not_walked():
    """A stats snapshot reads the cache's gauges under its lock: with 100,000 scanned small files a
    walk of the table there stalled every read and fetch of the mount for each scrape. The gauges
    are kept as blocks change, and agree with a walk (the invariant check compares them)."""
    cache = checked_cache()
    done, _ = cache.reserve(("f",), 0, MIB, prefetched=True)
    cache.complete(done, 1000)
    cache.unpin(done)
    pending, _ = cache.reserve(("f",), 1, MIB, prefetched=True)
    failed, _ = cache.reserve(("g",), 0, 5000, prefetched=True)
    cache.fail(failed, 5)
    cache.checking = False  # (the check walks the table by design)
    cache._blocks = _Unwalkable(cache._blocks)
    assert cache.gauges() == {
        "cache_bytes": 2 * MIB,
        "cache_data_bytes": 1000,
        "cache_budget": 4 * MIB,
        "cache_blocks": 2,
        "inflight_blocks": 1,
        "free_buffers": 0,
        "cache_unused_prefetch_bytes": 2 * MIB,
    }
    cache.complete(pending, 7)
    assert cache.gauges()["cache_data_bytes"] == 1007 and cache.gauges()["inflight_blocks"] == 0
    cache._blocks = OrderedDict(dict.items(cache._blocks))
    cache.check_invariants()


def test_unused_prefetch_counts_prefetched_blocks_until_read_or_dropped():
    """The gauge the scans bound themselves by mount-wide: a prefetched block's capacity from its
    reservation until its first use, its eviction or its failure; a demand block never."""
    cache = checked_cache(budget=3 * MIB)
    a, _ = cache.reserve(("a",), 0, MIB, prefetched=True)
    b, _ = cache.reserve(("b",), 0, 5000, prefetched=True)
    c, _ = cache.reserve(("c",), 0, MIB, prefetched=False)
    assert cache.unused_prefetch == MIB + 8192
    for block in (a, b, c):
        cache.complete(block, block.capacity)
        cache.unpin(block)
    assert cache.use(a) and not cache.use(a)  # (the first use only)
    assert cache.unused_prefetch == 8192
    cache.use(c)
    assert cache.unused_prefetch == 8192
    d, _ = cache.reserve(("d",), 0, MIB, prefetched=True)  # evicts a (the oldest), already used
    e, _ = cache.reserve(("e",), 0, MIB, prefetched=True)  # evicts b, never used
    assert cache.peek(("b",), 0) is None and cache.unused_prefetch == 2 * MIB
    cache.fail(d, 5)
    assert cache.unused_prefetch == MIB
    cache.complete(e, 10)
    cache.unpin(e)
    cache.invalidate_file(("e",))
    assert cache.unused_prefetch == 0
    cache.check_invariants()


def test_check_names_the_broken_invariant():
    cache = checked_cache()
    b, _ = cache.reserve(("f",), 0, MIB, prefetched=False)
    cache.complete(b, MIB)
    cache.unpin(b)
    with pytest.raises(AssertionError, match="pins"):
        cache.unpin(b)  # one unpin too many: caught inside the operation, under the lock
    b.pins = 0
    cache.reserved += 1
    with pytest.raises(AssertionError, match="reserved"):
        cache.check_invariants()
    cache.reserved -= 1
    cache._by_file[("f",)].add(7)
    with pytest.raises(AssertionError, match="_by_file"):
        cache.check_invariants()
    cache._by_file[("f",)].discard(7)
    cache.check_invariants()
    cache._ready_bytes += 1
    with pytest.raises(AssertionError, match="ready bytes"):
        cache.check_invariants()
    cache._ready_bytes -= 1
    cache.check_invariants()


def test_checking_follows_the_environment(monkeypatch):
    monkeypatch.delenv(CHECK_ENV, raising=False)
    assert not BlockCache(MIB, MIB, m.Stats()).checking
    monkeypatch.setenv(CHECK_ENV, "1")
    assert BlockCache(MIB, MIB, m.Stats()).checking
    monkeypatch.setenv(CHECK_ENV, "0")
    assert not BlockCache(MIB, MIB, m.Stats()).checking


OPS = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "complete", "fail", "unpin", "get", "consumed", "invalidate", "budget"]),
        st.integers(0, 7),
        st.integers(1, MIB),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_random_operations_keep_the_invariants(ops):
    """Any sequence of well-formed calls (each pin released once, each fill finished once) keeps them."""
    cache = checked_cache(budget=4 * MIB, block=MIB)
    pinned: list = []  # blocks this test holds a pin of
    pending: list = []  # blocks it created and has not finished
    for op, n, size in ops:
        if op == "reserve":
            b, created = cache.reserve(("f", n % 3), n, size, prefetched=bool(n & 1))
            if b is not None:
                pinned.append(b)
                if created:
                    pending.append(b)
        elif op in ("complete", "fail") and pending:
            b = pending.pop(n % len(pending))
            if op == "complete":
                cache.complete(b, min(size, b.capacity))
            else:
                cache.fail(b, 5)
        elif op == "unpin" and pinned:
            b = pinned[n % len(pinned)]
            if b not in pending:
                pinned.remove(b)
                cache.unpin(b)
        elif op == "get":
            b = cache.get(("f", n % 3), n)
            if b is not None:
                pinned.append(b)
        elif op == "consumed" and pinned:
            cache.consumed(pinned[n % len(pinned)])
        elif op == "invalidate":
            cache.invalidate_file(("f", n % 3))
        elif op == "budget":
            cache.set_budget((2 + n) * MIB)
        cache.check_invariants()
    for b in pending:
        cache.complete(b, 1)
    for b in pinned:
        cache.unpin(b)
    cache.check_invariants()
    cache.close()


def test_engine_config_turns_the_check_on(tmp_path):
    from fastfs.config.loader import load_config
    from fastfs.fsio.engine import Engine

    opts = {"cache.budget": "32M", "state.dir": str(tmp_path / "state")}
    engine = Engine(str(tmp_path), load_config(overrides=opts, use_default_path=False))
    try:
        assert engine.cache.checking is bool(os.environ.get(CHECK_ENV, "") not in ("", "0"))
    finally:
        engine.close()
    opts["cache.check_invariants"] = "true"
    engine = Engine(str(tmp_path), load_config(overrides=opts, use_default_path=False))
    try:
        assert engine.cache.checking
    finally:
        engine.close()
