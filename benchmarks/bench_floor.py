#!/usr/bin/env python3
"""The floor of issue 23: fastfs's cost per operation next to libfuse's own C passthrough example.

Five contenders over the same tmpfs directory, in one run: tmpfs itself (``native``), libfuse 3's
``example/passthrough_ll.c`` built with ``gcc -O2`` against the system's libfuse3-dev and mounted
with ``-o cache=always`` (see ``benchkit/libfuse.py`` for where its source comes from), fastfs's
default route (passthrough of local files where the kernel has it), fastfs's served route
(``-o fuse.passthrough=off``: every read answered by the daemon) and, for the passes alone, fastfs
with ``--profile training``. Rounds are interleaved: every round mounts each contender afresh (its
page cache, dentries and inodes empty; fastfs with a fresh state directory), in an order rotated by
one each round, and runs on it, in this order:

* ``pass1``: first pass over N small files (3 KiB; open, one 4 KiB read, close; in name order);
* ``pass2``: the same pass again;
* ``open``: open + close of one of them, repeated (hot: everything cached that a kernel may cache);
* ``read4k``: 4 KiB ``pread``s at distinct page offsets of a 64 MiB file, none read before on this
  mount, after ``POSIX_FADV_RANDOM`` (no kernel read-ahead: each read not answered by the kernel is
  one 4 KiB READ);
* ``stream``: one ``readv`` stream of 1 MiB reads over a 256 MiB file after a warm-up pass, the
  file's pages dropped from the page cache before each timed pass (``POSIX_FADV_DONTNEED``; the
  served route then reads from fastfs's RAM; tmpfs is read as it is).

Figures are medians over the rounds: microseconds per operation, GB/s for the stream. Each fastfs
cell carries its ratio to libfuse (fastfs time / libfuse time; for the stream libfuse's GB/s /
fastfs's), and a table checks issue 23's targets. Requests per operation come from fastfs's
``kernel.requests`` counters, read through the stats xattr before and after each row. No
``drop_caches``: the source is tmpfs, and a fresh mount already starts cold without emptying
other processes' caches.

``--label`` names the fastfs columns, so two revisions compare by running the script twice with
``PYTHONPATH`` pointing at each; ``--json`` keeps every sample.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit import libfuse  # noqa: E402
from benchkit.cli import DEFAULT_RUNS, RAM_ROOT, add_fastfs_options, extra_options  # noqa: E402
from benchkit.datasets import make_raw, make_small_files  # noqa: E402
from benchkit.fsstats import fmt_requests, request_order, requests_per_op  # noqa: E402
from benchkit.mounts import fastfs_mount, kernel_requests  # noqa: E402
from benchkit.perop import (  # noqa: E402
    STREAM_CHUNK,
    forget_pages,
    open_close,
    open_read_close,
    page_offsets,
    preads,
    stream_gbps,
)
from benchkit.report import log, markdown_table  # noqa: E402
from benchkit.system import fs_type, mountpoint, require_root  # noqa: E402
from benchkit.units import KIB, MIB  # noqa: E402

import fastfs  # noqa: E402

# Small files of the passes (issue 23's table: 2,000 files of 3 KiB).
DEFAULT_FILES = 2000
SMALL_SIZE = 3 * KIB
# Repetitions of the hot open + close: enough for a stable per-op figure (~0.1-1.5 s per contender).
HOT_OPENS = 5000
# The point-read file and the number of distinct pages read in it (a sample of its 16,384 pages).
RANDOM_FILE_SIZE = 64 * MIB
POINT_READS = 2000
# Size of the stream's file and timed passes per round (median); fastfs's default budget holds it.
DEFAULT_STREAM_MIB = 256
STREAM_PASSES = 3
# Issue 23's targets: every row within 1.5x of libfuse on both routes; one stream served from RAM
# at 4 GB/s or more; the second pass of --profile training at 0.8x native or better.
TARGET_VS_LIBFUSE = 1.5
TARGET_STREAM_GBPS = 4.0
TARGET_TRAINING_VS_NATIVE = 0.8


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str  # "us" (per operation: lower is better) or "GB/s"
    count_label: str  # what one operation is, for the requests table
    short: str  # the row in the targets and requests tables


def _rows(files: int) -> dict[str, Row]:
    rows = (
        Row("open", "open + close of one file (hot)", "us", "per open + close", "open + close (hot)"),
        Row(
            "pass1",
            f"first pass over {files:,} files of 3 KiB (open, read, close)",
            "us",
            "per file",
            "first pass",
        ),
        Row("pass2", "second pass over them", "us", "per file", "second pass"),
        Row("read4k", "4 KiB read at a new offset (first touch)", "us", "per read", "4 KiB first touch"),
        Row("stream", "one stream, 1 MiB reads, page cache dropped (GB/s)", "GB/s", "per 1 MiB read", "stream"),
    )
    return {r.key: r for r in rows}


# The order rows run in on one mount: passes first (cold mount), then the hot loops.
RUN_ORDER = ("pass1", "pass2", "open", "read4k", "stream")
PASS_ROWS = ("pass1", "pass2")


@dataclass(frozen=True)
class Contender:
    key: str
    title: str
    short: str  # the column in the targets table
    kind: str  # "native", "libfuse" or "fastfs"
    rows: tuple[str, ...] = RUN_ORDER
    options: tuple[str, ...] = ()


@dataclass
class Data:
    src: str
    small: list[str]  # relative paths of the small files
    random_file: str
    stream_file: str
    offsets: list[int]  # distinct page offsets in random_file, in the order read


@dataclass
class Results:
    samples: dict[str, dict[str, list[float]]]
    requests: dict[str, dict[str, list[dict[str, float]]]]
    errors: list[str]

    def median(self, contender: str, row: str) -> float | None:
        values = self.samples.get(contender, {}).get(row)
        return statistics.median(values) if values else None

    def requests_of(self, contender: str, row: str) -> dict[str, float] | None:
        """Per-opcode medians of the requests per operation over the rounds (None: not counted)."""
        rounds = self.requests.get(contender, {}).get(row)
        if not rounds:
            return None
        keys = sorted({k for r in rounds for k in r}, key=request_order)
        return {k: statistics.median(r.get(k, 0.0) for r in rounds) for k in keys}


def prepare(directory: str, files: int, stream_mib: int) -> Data:
    """The data set in *directory* (generated once, deterministic, reused)."""
    src = os.path.join(directory, "src")
    os.makedirs(src, exist_ok=True)
    small_dir = os.path.join(src, f"small-{files}")
    if not os.path.isdir(small_dir):
        log(f"writing {files} files of {SMALL_SIZE} B")
        make_small_files(small_dir, files, SMALL_SIZE)
    small = sorted(os.path.join(os.path.basename(small_dir), n) for n in os.listdir(small_dir))
    random_file = os.path.join(src, "random.bin")
    stream_file = os.path.join(src, f"stream-{stream_mib}M.bin")
    for path, size in ((random_file, RANDOM_FILE_SIZE), (stream_file, stream_mib * MIB)):
        if not os.path.exists(path) or os.path.getsize(path) != size:
            log(f"writing {path} ({size // MIB} MiB)")
            make_raw(path, size)
    offsets = page_offsets(RANDOM_FILE_SIZE, POINT_READS)
    return Data(src, small, os.path.basename(random_file), os.path.basename(stream_file), offsets)


@contextlib.contextmanager
def session(
    contender: Contender, data: Data, binary: str, extra: list[str]
) -> Iterator[tuple[str, Callable[[], dict[str, int]] | None]]:
    """(root to read, request counters or None) of a fresh mount of *contender* for the block."""
    if contender.kind == "native":
        yield data.src, None
    elif contender.kind == "libfuse":
        with libfuse.reference_mount(binary, data.src, mountpoint(f"floor-{contender.key}")) as mnt:
            yield mnt, None
    else:
        with fastfs_mount(data.src, mountpoint(f"floor-{contender.key}"), [*contender.options, *extra]) as m:
            yield m.mnt, lambda: kernel_requests(m.mnt)


def run_row(row: str, root: str, data: Data, native: bool, view: memoryview) -> tuple[float, int]:
    """(figure, operations) of *row* on *root*: microseconds per operation, or GB/s for the stream."""
    if row in PASS_ROWS:
        paths = [os.path.join(root, n) for n in data.small]
        return open_read_close(paths) / len(paths) * 1e6, len(paths)
    if row == "open":
        path = os.path.join(root, data.small[0])
        open_close(path, 1)
        return open_close(path, HOT_OPENS) / HOT_OPENS * 1e6, HOT_OPENS
    if row == "read4k":
        path = os.path.join(root, data.random_file)
        return preads(path, data.offsets, advice_random=True) / len(data.offsets) * 1e6, len(data.offsets)
    if row == "stream":
        path = os.path.join(root, data.stream_file)
        passes = []
        for _ in range(STREAM_PASSES):
            if not native:  # tmpfs's pages are its data: nothing to drop
                forget_pages(path)
            passes.append(stream_gbps(path, view))
        return statistics.median(passes), STREAM_PASSES * os.path.getsize(path) // len(view)
    raise ValueError(row)


def run_round(contender: Contender, data: Data, binary: str, extra: list[str], results: Results) -> None:
    view = memoryview(bytearray(STREAM_CHUNK))
    with session(contender, data, binary, extra) as (root, counters):
        for row in contender.rows:
            if row == "stream":  # warm-up: fills fastfs's RAM cache (untimed, uncounted)
                stream_gbps(os.path.join(root, data.stream_file), view)
            before = counters() if counters else {}
            value, ops = run_row(row, root, data, contender.kind == "native", view)
            after = counters() if counters else {}
            results.samples.setdefault(contender.key, {}).setdefault(row, []).append(value)
            if after:
                per_op = requests_per_op(before, after, ops)
                results.requests.setdefault(contender.key, {}).setdefault(row, []).append(per_op)


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "GB/s":
        return f"{value:.2f}"
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def vs_libfuse(results: Results, contender: str, row: Row) -> float | None:
    """fastfs time / libfuse time of *row* (for GB/s: libfuse GB/s / fastfs GB/s)."""
    ours, ref = results.median(contender, row.key), results.median("libfuse", row.key)
    if not ours or not ref:
        return None
    return ref / ours if row.unit == "GB/s" else ours / ref


def main_table(results: Results, rows: dict[str, Row], contenders: list[Contender]) -> str:
    shown = [c for c in contenders if c.key != "training"]
    headers = ["operation", *(c.title for c in shown)]
    out = []
    for row in rows.values():
        cells: list[str] = [row.label]
        for c in shown:
            cell = _fmt(results.median(c.key, row.key), row.unit)
            x = vs_libfuse(results, c.key, row) if c.kind == "fastfs" else None
            cells.append(f"{cell} ({x:.1f}x)" if x is not None and cell != "-" else cell)
        out.append(cells)
    return markdown_table(headers, out)


def targets_table(results: Results, rows: dict[str, Row], contenders: list[Contender]) -> str:
    out: list[list[str]] = []

    def add(what: str, value: float | None, shown: str, goal: str, met: bool) -> None:
        verdict = "-" if value is None else ("yes" if met else "no")
        out.append([what, shown if value is not None else "-", goal, verdict])

    for c in contenders:
        if c.kind != "fastfs" or c.key == "training":
            continue
        for row in rows.values():
            if row.unit != "us":
                continue
            x = vs_libfuse(results, c.key, row)
            met = bool(x and x <= TARGET_VS_LIBFUSE)
            add(f"{row.short}: {c.short} / libfuse", x, f"{x:.2f}x" if x else "", f"<= {TARGET_VS_LIBFUSE}x", met)
    gbps = results.median("served", "stream")
    add(
        "one stream served from fastfs's RAM (served route)",
        gbps,
        f"{gbps:.2f} GB/s" if gbps else "",
        f">= {TARGET_STREAM_GBPS} GB/s",
        bool(gbps and gbps >= TARGET_STREAM_GBPS),
    )
    native, train = results.median("native", "pass2"), results.median("training", "pass2")
    x = native / train if native and train else None
    add(
        "second pass over the small files, `--profile training` (native time / fastfs time)",
        x,
        f"{x:.2f}x ({train:.1f} vs {native:.1f} us)" if x and train and native else "",
        f">= {TARGET_TRAINING_VS_NATIVE}x",
        bool(x and x >= TARGET_TRAINING_VS_NATIVE),
    )
    return markdown_table(["target", "measured", "goal", "met"], out)


def requests_table(results: Results, rows: dict[str, Row], contenders: list[Contender]) -> str:
    shown = [c for c in contenders if c.kind == "fastfs"]
    out = []
    for row in rows.values():
        cells = [f"{row.short}, {row.count_label}"]
        cells += [fmt_requests(results.requests_of(c.key, row.key)) if row.key in c.rows else "" for c in shown]
        out.append(cells)
    return markdown_table(["operation", *(c.title for c in shown)], out)


def _revision(path: str) -> str:
    try:
        res = subprocess.run(
            ["git", "-C", path, "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        )
        return res.stdout.strip() or "-"
    except (OSError, subprocess.SubprocessError):
        return "-"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="interleaved rounds (medians reported)")
    p.add_argument("--files", type=int, default=DEFAULT_FILES, help="small files of the passes")
    p.add_argument("--stream-mib", type=int, default=DEFAULT_STREAM_MIB, help="size of the stream's file (MiB)")
    p.add_argument("--label", default="fastfs", help="name of the fastfs revision in the column titles")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write every sample as JSON (no FILE: stdout)")
    p.add_argument("--dir", default=os.path.join(RAM_ROOT, "floor"), help="data directory (tmpfs)")
    p.add_argument("--cache-dir", default=libfuse.default_cache_dir(), help="where the reference is built")
    p.add_argument("--libfuse-src", metavar="DIR", help="libfuse source (DIR or DIR/example with passthrough_ll.c)")
    p.add_argument(
        "--reference-bin", metavar="PATH", type=os.path.abspath, help="a built passthrough_ll to use as it is"
    )
    p.add_argument(
        "--download-source",
        action="store_true",
        help="fetch Debian's fuse3 source package even when libfuse3-dev's own copy of the example is installed",
    )
    add_fastfs_options(p)
    args = p.parse_args(argv)
    for name, low in (("runs", 1), ("files", 1), ("stream_mib", 1)):
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    require_root()
    try:
        binary, origin = libfuse.reference_binary(
            args.reference_bin, args.libfuse_src, args.cache_dir, args.download_source
        )
    except libfuse.ReferenceUnavailableError as e:
        raise SystemExit(f"bench_floor: {e}") from None
    data = prepare(args.dir, args.files, args.stream_mib)
    rows = _rows(args.files)
    label = args.label
    served, training = ("fuse.passthrough=off",), ("profile=training",)
    contenders = [
        Contender("native", "native tmpfs", "native", "native"),
        Contender("libfuse", f"libfuse C example (`-o {libfuse.REFERENCE_OPTIONS}`)", "libfuse", "libfuse"),
        Contender("default", f"{label} default route", "default route", "fastfs"),
        Contender("served", f"{label} served route (`-o {served[0]}`)", "served route", "fastfs", options=served),
        Contender("training", f"{label} `--profile training`", "training", "fastfs", rows=PASS_ROWS, options=training),
    ]
    extra = extra_options(args)
    fastfs_dir = os.path.dirname(os.path.abspath(fastfs.__file__))
    load_before = os.getloadavg()
    log(f"reference {binary} ({origin}); fastfs {fastfs_dir} ({_revision(fastfs_dir)})")
    results = Results({}, {}, [])
    t0 = time.monotonic()
    for r in range(args.runs):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for c in order:
            log(f"round {r + 1}/{args.runs}: {c.key}")
            try:
                run_round(c, data, binary, extra, results)
            except Exception as e:  # a failed contender is reported under the tables; the rounds go on
                results.errors.append(f"round {r + 1}, {c.key}: {type(e).__name__}: {e}")
                log(f"FAILED {results.errors[-1]}")
    load_after = os.getloadavg()
    print(
        f"\n## bench_floor: {args.runs} interleaved round(s), source {data.src} ({fs_type(data.src)}), "
        f"{args.files} files of {SMALL_SIZE} B; microseconds per operation unless GB/s, medians\n"
    )
    print(f"- fastfs: {fastfs_dir} ({_revision(fastfs_dir)}){', -o ' + ','.join(extra) if extra else ''}")
    print(f"- libfuse: {binary}, built from {origin}, `-o {libfuse.REFERENCE_OPTIONS}`")
    print(
        f"- kernel {platform.release()}, {os.cpu_count()} CPUs, load average {load_before[0]:.2f} before / "
        f"{load_after[0]:.2f} after, {time.monotonic() - t0:.0f} s\n"
    )
    print(main_table(results, rows, contenders))
    print("\n(x): fastfs time / libfuse time (the stream: libfuse GB/s / fastfs GB/s); issue 23's target <= 1.5x.\n")
    print(targets_table(results, rows, contenders))
    print("\nKernel requests per operation (fastfs's `kernel.requests`, medians; the stats' own GETXATTR left out):\n")
    print(requests_table(results, rows, contenders))
    for error in results.errors:
        print(f"\nFAILED {error}")
    if args.json:
        doc: dict[str, Any] = {
            "label": label,
            "fastfs": {"path": fastfs_dir, "revision": _revision(fastfs_dir), "options": extra},
            "reference": {"binary": binary, "origin": origin, "options": libfuse.REFERENCE_OPTIONS},
            "kernel": platform.release(),
            "loadavg": [load_before, load_after],
            "runs": args.runs,
            "files": args.files,
            "stream_mib": args.stream_mib,
            "rows": {k: {"label": r.label, "unit": r.unit} for k, r in rows.items()},
            "contenders": {c.key: c.title for c in contenders},
            "samples": results.samples,
            "requests": results.requests,
            "medians": {c.key: {row: results.median(c.key, row) for row in c.rows} for c in contenders},
            "errors": results.errors,
        }
        text = json.dumps(doc, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())
