"""The README's figure: fastfs's speedup by kind of storage and workload, drawn from a benchmark run.

Reads the JSON that ``bench_matrix.py --json FILE`` writes and draws one horizontal bar per cell,
speedup = the direct run's median time / the fastfs run's median time (above 1: fastfs faster), on a
log scale around 1x, grouped by storage (each group titled with the storage's label and how the run
described it), one colour per workload. A failed cell is drawn as the word "failed", never as a bar.
The SVG is written by hand (no plotting library), so the figure regenerates anywhere the benchmarks
run, and its caption names the command that produced the data (the JSON's ``command``, else
``--caption``).

Usage (the README's figure)::

    python benchmarks/bench_matrix.py --scale 0.05 --runs 3 --storage emu:base,emu:lat5,emu:serial,emu:stream \\
        --workloads npy,torch,safetensors,small_shuffled,random4k --json benchmarks/results/matrix.json
    python benchmarks/figure.py benchmarks/results/matrix.json -o docs/speedup.svg

``--storages`` / ``--workloads`` pick and order the groups and bars (default: as in the JSON),
``--label NAME=TEXT`` retitles a storage, ``--title`` and ``--caption`` replace the texts above and
below the bars.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape, quoteattr

# Geometry of the figure (pixels).
WIDTH = 860
LEFT = 170  # bar labels (workload names) end here
PLOT_RIGHT = WIDTH - 70  # room for the value printed after the longest bar
TOP = 64  # title and subtitle above the first group
GROUP_HEAD = 34  # storage title and description above each group's bars
BAR = 16  # height of one bar
BAR_GAP = 4  # space between bars of a group
GROUP_GAP = 14  # space after a group
FOOT = 50  # axis labels under the last group
CAPTION_LINE = 13  # height of one line of the caption (the command is wrapped, never cut)
CAPTION_CHARS = 140  # characters per caption line
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
# Longest storage description shown under its title (characters); longer ones are cut with an ellipsis.
DESCRIPTION_MAX = 145
# The log axis spans powers of two around the data, at least MIN_X..MAX_X, at most FLOOR_X..CEIL_X
# (speedups beyond those are clipped, their value still printed).
MIN_X = 0.5
MAX_X = 8.0
FLOOR_X = 1 / 64
CEIL_X = 256.0
# Colours of the workloads, in order of first appearance (colour-blind safe, Okabe-Ito).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")


@dataclass(frozen=True)
class Bar:
    """One cell: a workload on a storage, its speedup (None: failed) and the medians it comes from."""

    storage: str
    workload: str
    speedup: float | None
    direct: float | None
    fastfs: float | None


def cells(doc: dict[str, Any]) -> list[Bar]:
    """The bars of a bench_matrix JSON document, in its order."""
    out = []
    for c in doc.get("cells", []):
        d, f = c.get("direct") or {}, c.get("fastfs") or {}
        td, tf = d.get("median"), f.get("median")
        ok = not d.get("error") and not f.get("error") and td and tf
        out.append(Bar(c["behaviour"], c["workload"], td / tf if ok else None, td, tf))
    return out


def _ordered(chosen: Sequence[str], present: Sequence[str], what: str) -> list[str]:
    if not chosen:
        return list(dict.fromkeys(present))
    unknown = [n for n in chosen if n not in present]
    if unknown:
        raise SystemExit(f"figure.py: no {what} {', '.join(unknown)} in the results (have: {', '.join(present)})")
    return list(chosen)


@dataclass(frozen=True)
class Axis:
    """The log-scale speedup axis: from *low* to *high* (powers of two)."""

    low: float
    high: float

    @classmethod
    def around(cls, speedups: Sequence[float]) -> Axis:
        lo = min([MIN_X, *speedups])
        hi = max([MAX_X, *speedups])
        low = max(FLOOR_X, 2.0 ** math.floor(math.log2(lo)))
        high = min(CEIL_X, 2.0 ** math.ceil(math.log2(hi)))
        return cls(low, high)

    def ticks(self) -> list[float]:
        return [2.0**e for e in range(round(math.log2(self.low)), round(math.log2(self.high)) + 1)]

    def x(self, speedup: float) -> float:
        """Horizontal position of a speedup."""
        s = min(max(speedup, self.low), self.high)
        span = math.log(self.high) - math.log(self.low)
        return LEFT + (PLOT_RIGHT - LEFT) * (math.log(s) - math.log(self.low)) / span


def _text(x: float, y: float, body: str, size: int = 12, anchor: str = "start", **attrs: str) -> str:
    extra = "".join(f" {k.rstrip('_').replace('_', '-')}={quoteattr(v)}" for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>{escape(body)}</text>'


def _short(text: str, limit: int = DESCRIPTION_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "\u2026"


def fmt_speedup(s: float) -> str:
    return f"{s:.1f}x" if s < 10 else f"{s:.0f}x"


def render_svg(
    doc: dict[str, Any],
    storages: Sequence[str] = (),
    workloads: Sequence[str] = (),
    labels: dict[str, str] | None = None,
    title: str = "",
    caption: str = "",
) -> str:
    """The SVG text of the figure for a bench_matrix JSON document."""
    bars = cells(doc)
    if not bars:
        raise SystemExit("figure.py: the results hold no cells (is it a bench_matrix.py --json file?)")
    storages = _ordered(storages, [b.storage for b in bars], "storage")
    workloads = _ordered(workloads, [b.workload for b in bars], "workload")
    by = {(b.storage, b.workload): b for b in bars}
    labels = labels or {}
    described = doc.get("storages", {})
    colour = {w: PALETTE[i % len(PALETTE)] for i, w in enumerate(workloads)}
    groups = [(s, [by[s, w] for w in workloads if (s, w) in by]) for s in storages]
    runs, scale = doc.get("runs"), doc.get("scale")
    command = doc.get("command")
    caption = caption or (f"data: {command}" if command else "data: benchmarks/bench_matrix.py --json")
    caption_lines = textwrap.wrap(caption, CAPTION_CHARS, break_on_hyphens=False) or [""]
    bars_height = sum(GROUP_HEAD + len(g) * (BAR + BAR_GAP) + GROUP_GAP for _, g in groups)
    height = TOP + bars_height + FOOT + CAPTION_LINE * len(caption_lines)
    title = title or "fastfs speedup by kind of storage and workload (direct time / fastfs time)"
    subtitle = f"cold runs, medians of {runs}, data scale {scale}; above 1x fastfs is faster (log scale)"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="{FONT}">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        _text(12, 24, title, 15, font_weight="bold"),
        _text(12, 44, subtitle, 12, fill="#444444"),
    ]
    axis = Axis.around([b.speedup for _, g in groups for b in g if b.speedup is not None])
    x_of = axis.x
    y = TOP
    for storage, group in groups:
        out.append(f'<g class="storage" id={quoteattr("storage-" + storage)}>')
        out.append(_text(12, y + 15, labels.get(storage, storage), 13, font_weight="bold"))
        if storage in described:
            out.append(_text(12, y + 29, _short(str(described[storage])), 10, fill="#666666"))
        y += GROUP_HEAD
        out += _grid(axis, y - BAR_GAP, y + len(group) * (BAR + BAR_GAP))
        for b in group:
            mid = y + BAR / 2 + 4
            out.append(f'<g class="bar" data-storage={quoteattr(storage)} data-workload={quoteattr(b.workload)}>')
            out.append(_text(LEFT - 8, mid, b.workload, 12, "end"))
            if b.speedup is None:
                out.append(_text(x_of(1) + 4, mid, "failed", 11, fill="#B00020"))
            else:
                x0, x1 = sorted((x_of(1), x_of(b.speedup)))
                tip = f"{storage} / {b.workload}: direct {b.direct:.3f} s, fastfs {b.fastfs:.3f} s"
                out.append(
                    f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 1):.1f}" height="{BAR}" '
                    f'fill="{colour[b.workload]}"><title>{escape(tip)}</title></rect>'
                )
                out.append(_text(x1 + 4, mid, fmt_speedup(b.speedup), 11))
            out.append("</g>")
            y += BAR + BAR_GAP
        out.append("</g>")
        y += GROUP_GAP
    plot_bottom = y - GROUP_GAP
    for t in axis.ticks():
        out.append(_text(x_of(t), plot_bottom + 16, f"{t:g}x", 11, "middle", fill="#444444"))
    out.append(_text(x_of(1), plot_bottom + 32, "speedup (direct / fastfs)", 11, "middle", fill="#444444"))
    for i, line in enumerate(caption_lines):
        out.append(_text(12, plot_bottom + FOOT + CAPTION_LINE * i, line, 10, fill="#666666", class_="caption"))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _grid(axis: Axis, top: float, bottom: float) -> list[str]:
    """The vertical lines of the ticks behind one group's bars (1x drawn darker)."""
    out = []
    for t in axis.ticks():
        x, one = axis.x(t), t == 1
        out.append(
            f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" '
            f'stroke="{"#333333" if one else "#dddddd"}" stroke-width="{1.5 if one else 0.75}"/>'
        )
    return out


EPILOG = """\
the README's figure, in two steps (root; --scale 1 for full-size data):
  python benchmarks/bench_matrix.py --scale 1 --runs 3 \\
      --storage emu:base,emu:lat5,emu:serial,emu:stream \\
      --workloads npy,torch,safetensors,small_shuffled,random4k \\
      --json benchmarks/results/matrix.json
  python benchmarks/figure.py benchmarks/results/matrix.json -o docs/speedup.svg
then commit the JSON and the SVG together (the caption names the JSON's command)."""


def _labels(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"figure.py: --label wants NAME=TEXT, not {item!r}")
        out[name] = text
    return out


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Draw docs/speedup.svg (speedup = direct time / fastfs time, by storage and workload) "
        "from the JSON of `bench_matrix.py --json FILE`.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results", help="a JSON file written by bench_matrix.py --json FILE ('-': stdin)")
    p.add_argument("-o", "--output", default="-", help="SVG file to write (default: stdout)")
    p.add_argument("--storages", default="", help="comma-separated storages to draw, in this order (default: all)")
    p.add_argument("--workloads", default="", help="comma-separated workloads to draw, in this order (default: all)")
    p.add_argument("--label", action="append", default=[], metavar="NAME=TEXT", help="title of a storage's group")
    p.add_argument("--title", default="", help="text above the bars")
    p.add_argument("--caption", default="", help="text under the bars (default: the command recorded in the JSON)")
    args = p.parse_args(argv)
    if args.results == "-":
        doc = json.load(sys.stdin)
    else:
        with open(args.results) as fh:
            doc = json.load(fh)
    svg = render_svg(doc, _names(args.storages), _names(args.workloads), _labels(args.label), args.title, args.caption)
    if args.output == "-":
        sys.stdout.write(svg)
    else:
        with open(args.output, "w") as fh:
            fh.write(svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
