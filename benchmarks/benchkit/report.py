"""Timing, medians, ratios and tables (plain text and markdown), and the progress log.

Every figure a benchmark prints goes through these: ``fmt_s`` seconds, ``fmt_x`` ratios, ``human_bytes``
sizes; ``None`` (a failed or missing measurement) prints as ``-`` so a failed cell never breaks a table.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .units import GIB, KIB, MIB


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def fmt_s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}"


def fmt_x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def fmt_mbps(nbytes: int | None, seconds: float | None) -> str:
    if not nbytes or not seconds:
        return "-"
    return f"{nbytes / seconds / 1e6:.0f}"


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("G", GIB), ("M", MIB), ("K", KIB)):
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{int(n)}"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], notes: Sequence[str] = ()) -> None:
    """Plain-text table: first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = "  ".join("-" * w for w in widths)
    print(f"\n== {title} ==")
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(row)))
        if i == 0:
            print(line)
    for note in notes:
        print(f"  {note}")
    sys.stdout.flush()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: Iterable[int] = (0,)) -> str:
    """A GitHub-flavoured markdown table (``|`` in cells escaped); columns *left* left-aligned, others right."""
    left = set(left)

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(cell(h) for h in headers) + " |"]
    out.append("|" + "|".join(":---" if i in left else "---:" for i in range(len(headers))) + "|")
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
