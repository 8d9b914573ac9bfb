"""Counters without FUSE: buckets, shards from many threads, derived ratios."""

from __future__ import annotations

import bisect
import threading

from hypothesis import given
from hypothesis import strategies as st

from fastfs.fsio import stats as m


@given(st.integers(0, 1 << 30))
def test_request_size_bucket_matches_bounds(size):
    s = m.Stats()
    s.request(size, 0)
    counts = s.snapshot()["request_sizes"]
    index = bisect.bisect_left(m.REQUEST_SIZE_BUCKETS, size)
    key = str(m.REQUEST_SIZE_BUCKETS[index]) if index < len(m.REQUEST_SIZE_BUCKETS) else "+Inf"
    assert counts[key] == 1 and sum(counts.values()) == 1


def test_counts_from_many_threads_add_up():
    s = m.Stats()

    def work():
        for _ in range(1000):
            s.request(4096, 1024)
            s.add(m.PREADS)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = s.counters()
    assert c[m.READ_REQUESTS] == 8000 and c[m.BYTES_REQUESTED] == 8000 * 4096
    assert c[m.BYTES_SERVED_CACHE] == 8000 * 1024 and c[m.PREADS] == 8000


def test_snapshot_derived_and_latency_quantiles():
    s = m.Stats()
    s.request(1000, 500)
    s.add(m.BYTES_FETCHED_DEMAND, 600)
    s.add(m.BYTES_FETCHED_PREFETCH, 900)
    s.add(m.BYTES_PREFETCH_USED, 450)
    for seconds in [0.001] * 90 + [0.02] * 10:
        s.pread(seconds)
    s.error("EIO")
    s.file_bytes("/a", fetched=10, delivered=5)
    snap = s.snapshot()
    assert snap["derived"]["hit_ratio"] == 0.5
    assert snap["derived"]["amplification"] == 1.5
    assert snap["derived"]["prefetch_accuracy"] == 0.5
    assert snap["pread_latency"]["p50"] == 0.001 and snap["pread_latency"]["p99"] == 0.025
    assert snap["errors"] == {"EIO": 1} and snap["counters"][m.PREAD_ERRORS] == 1
    assert snap["top_files"] == [{"path": "/a", "fetched": 10, "delivered": 5, "amplification": 2.0}]


def test_disabled_stats_count_nothing():
    s = m.Stats()
    s.enabled = False
    s.request(4096, 4096)
    s.add(m.PREADS)
    assert s.counters()[m.READ_REQUESTS] == 0 and s.counters()[m.PREADS] == 0
