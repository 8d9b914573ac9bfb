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


# Requests left out of per-operation counts: the GETXATTR that reads the counters themselves.
PROBE_REQUESTS = ("getxattr",)
# Order requests are listed in: a file's life (others after them, by name).
REQUEST_ORDER = ("lookup", "getattr", "open", "read", "flush", "release")


def request_order(name: str) -> tuple[int, str]:
    """Sort key of an opcode name: REQUEST_ORDER first, the rest by name."""
    return (REQUEST_ORDER.index(name) if name in REQUEST_ORDER else len(REQUEST_ORDER), name)


def requests_per_op(before: dict[str, int], after: dict[str, int], count: int) -> dict[str, float]:
    """Requests per operation by opcode between two ``kernel.requests`` snapshots around *count*
    operations (zero deltas and PROBE_REQUESTS left out), in request_order."""
    names = sorted((set(before) | set(after)) - set(PROBE_REQUESTS), key=request_order)
    deltas = {k: after.get(k, 0) - before.get(k, 0) for k in names}
    return {k: v / count for k, v in deltas.items() if v > 0}


def fmt_requests(per_op: dict[str, float] | None) -> str:
    """``open 1, release 1, read 0.5`` (to two decimals); ``-`` when unknown, ``none`` when no request."""
    if per_op is None:
        return "-"
    return ", ".join(f"{k} {_count(v)}" for k, v in per_op.items()) or "none"


def _count(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value >= 0.005 else "<0.01"
