"""Unit tests of the RAM block cache (fsio/cache.py): lock rules and invariants."""

from __future__ import annotations

import threading

from fastfs.fsio import stats as m
from fastfs.fsio.cache import PENDING, READY, BlockCache

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
