"""Reading a fastfs stats snapshot: bytes fetched vs delivered, waste, request sizes, budget."""

from __future__ import annotations

from typing import Any

from .report import human_bytes


def fetched_delivered(stats: dict[str, Any]) -> tuple[int, int]:
    """(bytes fetched from the source, bytes requested by readers) of a stats snapshot."""
    counters = stats.get("counters", {})
    fetched = stats.get("derived", {}).get("bytes_fetched")
    if fetched is None:
        fetched = counters.get("bytes_fetched_demand", 0) + counters.get("bytes_fetched_prefetch", 0)
    return int(fetched), int(counters.get("bytes_requested", 0))


def request_sizes(stats: dict[str, Any]) -> str:
    """Compact histogram of kernel request sizes: ``<=4K:12 <=128K:3 <=1M:1020`` (empty buckets left out)."""
    parts = []
    for bound, n in stats.get("request_sizes", {}).items():
        if n:
            parts.append(f"{'>1M' if bound == '+Inf' else '<=' + human_bytes(int(bound))}:{n}")
    return " ".join(parts) or "-"


def budget(stats: dict[str, Any]) -> int | None:
    value = stats.get("gauges", {}).get("cache_budget")
    return int(value) if value else None


def wasted_fetched(stats: dict[str, Any]) -> tuple[int, int]:
    """(prefetched bytes evicted or invalidated before any reader used them, bytes fetched from the source)."""
    wasted = int(stats.get("counters", {}).get("bytes_prefetch_wasted", 0))
    return wasted, fetched_delivered(stats)[0]
