"""Human units and the one-line stats summary, shared by the daemon and the client commands.

The daemon writes :func:`summary_line` into systemd ``STATUS=`` lines and its log (SIGUSR1, unmount);
``fastfs stats``, ``status``, ``warm`` and ``bench`` format sizes, shares and durations with the same
helpers, so every command speaks one unit system (binary: KiB, MiB, GiB). Pure functions of numbers
and snapshot dicts; nothing here imports the daemon or the commands.
"""

from __future__ import annotations

from typing import Any

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    n = float(n)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} {_UNITS[-1]}"  # pragma: no cover


def pct(x: float | None) -> str:
    """0.123 -> '12.3%'; None (a ratio of nothing) -> '-'."""
    return "-" if x is None else f"{100 * x:.1f}%"


def ms(seconds: float | None) -> str:
    """0.0001 -> '0.10 ms', 0.1 -> '100 ms', 10 -> '10.0 s' (never exponent notation)."""
    if seconds is None:
        return "-"
    millis = seconds * 1000
    if millis >= 1000:
        return f"{seconds:.1f} s"
    if millis >= 100:
        return f"{millis:.0f} ms"
    return f"{millis:.1f} ms" if millis >= 10 else f"{millis:.2f} ms"


def ratio(x: float | None) -> str:
    """1.234 -> '1.23'; None -> '-'."""
    return "-" if x is None else f"{x:.2f}"


def duration(seconds: float) -> str:
    """3725 -> '1h02m05s', 65 -> '1m05s', 5 -> '5s'."""
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def fetched(c: dict[str, Any]) -> int:
    """Bytes read from the source (demand plus prefetch) of a snapshot's counters."""
    return int(c.get("bytes_fetched_demand", 0)) + int(c.get("bytes_fetched_prefetch", 0))


def summary_line(snap: dict[str, Any]) -> str:
    """One line for systemd STATUS= and log messages."""
    c = snap.get("counters", {})
    d = snap.get("derived", {})
    g = snap.get("gauges", {})
    errors = sum(snap.get("errors", {}).values())
    requested = c.get("bytes_requested", 0)
    hit = d.get("hit_ratio") if requested else None
    amplification = d.get("amplification", 0) if requested else None
    disk = ""
    if "disk_cache_budget" in g:
        disk = (
            f", disk {human_bytes(g.get('disk_cache_bytes', 0))}/{human_bytes(g.get('disk_cache_budget', 0))}"
            f" (hits {human_bytes(c.get('disk_hit_bytes', 0))})"
        )
    return (
        f"requested {human_bytes(requested)}, hit {pct(hit)}, "
        f"fetched {human_bytes(fetched(c))} (amplification {ratio(amplification)}), "
        f"cache {human_bytes(g.get('cache_bytes', 0))}/{human_bytes(g.get('cache_budget', 0))}{disk}, errors {errors}"
    )
