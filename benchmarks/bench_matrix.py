"""The benchmark matrix: every workload over several emulated storage behaviours, direct vs fastfs.

For each chosen behaviour of the latency emulator (``latency_fs.Behaviour``: serialised or parallel
lookups, read-ahead 128 KiB or none, page cache kept / dropped / direct_io, attribute timeout,
latency, bandwidth per handle or per request) the emulator is mounted over the data set in RAM,
and every chosen workload runs on it twice per run: ``direct`` (the emulator mount itself) and
``fastfs`` (a fastfs mount of the emulator mount). Every cold run: fastfs remounted (empty cache,
fresh state directory), page cache dropped (``sync; echo 3 > drop_caches``). Medians of ``--runs``.

Printed: one markdown table per behaviour as it finishes (so a long run shows progress), then the
whole matrix: a compact table (workload rows x behaviour columns, ``direct / fastfs``), and a long
table with times, ratio, run-to-run spread of fastfs, fetched/delivered and waste (fastfs stats),
what the storage saw, and the error of every failed cell. ``--json FILE`` writes every cell's raw
numbers as well.

Run: ``python benchmarks/bench_matrix.py [--scale 0.25] [--runs 3] [--workloads random4k,sqlite]
[--behaviours base,serial] [--behaviour slow=lat=5,dirops=serial] [--json out.json]``;
``--list`` prints the workloads and the behaviour presets.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import RAM_ROOT  # noqa: E402
from benchkit.datasets import Dataset  # noqa: E402
from benchkit.measure import Cell, Fastfs, Native, measure, preimport  # noqa: E402
from benchkit.report import fmt_s, fmt_x, human_bytes, log, markdown_table, median, ratio  # noqa: E402
from benchkit.system import mountpoint, require_root  # noqa: E402
from benchkit.workloads import BY_NAME, WORKLOADS, Plan  # noqa: E402
from latency_fs import Behaviour, emulated  # noqa: E402

# Behaviour presets: name -> spec over the defaults (1.5 ms, 400 MB/s per handle, read-ahead 128 KiB,
# page cache kept, attr 1 s, parallel lookups).
PRESETS: dict[str, str] = {
    "base": "",
    "serial": "dirops=serial",
    "issue14": "dirops=serial,meta=0.8,bw=request",
    "nora": "ra=0",
    "drop": "cache=drop",
    "direct": "cache=direct",
    "perreq": "bw=request",
    "lat0.5": "lat=0.5",
    "lat5": "lat=5",
}
# What each preset stands for (for --list and the README).
PRESET_NOTES: dict[str, str] = {
    "base": "NFS-like client: 1.5 ms, 400 MB/s per handle, read-ahead 128 KiB, page cache kept, parallel lookups",
    "serial": "lookups of one directory serialised (a FUSE source on libfuse 3.14: gcsfuse/s3fs/sshfs on Debian 12)",
    "issue14": "the storage of issue 14: serialised lookups, 0.8 ms per open/lookup, bandwidth per request",
    "nora": "no read-ahead on the source mount (buffered reads reach it page by page)",
    "drop": "page cache dropped at every open (no keep_cache)",
    "direct": "no page cache (direct_io): reads reach the source at the size asked; shared mmap fails",
    "perreq": "bandwidth charged per request (object-store range GETs), not per handle",
    "lat0.5": "0.5 ms per request (same rack)",
    "lat5": "5 ms per request (object store, distant server)",
}
# Mount point names (under benchkit.system.MOUNT_ROOT).
EMU_MOUNT = "matrix-emu"
FASTFS_MOUNT = "matrix-fastfs"


def parse_args(argv: list[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="size factor of every data set (0.05 for a smoke run)")
    p.add_argument("--runs", type=int, default=3, help="timed cold runs per cell (median reported)")
    p.add_argument("--workloads", "--only", default="", help="comma-separated workloads (default: all; see --list)")
    p.add_argument("--skip", default="", help="comma-separated workloads to leave out")
    p.add_argument("--behaviours", default="", help="comma-separated presets (default: all; see --list)")
    p.add_argument(
        "--behaviour",
        action="append",
        default=[],
        metavar="NAME=SPEC",
        help="an extra behaviour, e.g. slow=lat=5,dirops=serial (keys: lat meta mbps bw ra cache attr dirops threads)",
    )
    p.add_argument("--ram-dir", default=RAM_ROOT, help="data directory in RAM (tmpfs) behind the emulator")
    p.add_argument("-o", "--fastfs-options", action="append", default=[], help="extra fastfs mount options (k=v[,k=v])")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE", help="also write JSON ('-': stdout)")
    p.add_argument("--list", action="store_true", help="list workloads and behaviour presets, then exit")
    return p, p.parse_args(argv)


def chosen_behaviours(p: Any, args: Any) -> list[tuple[str, Behaviour]]:
    names = [n.strip() for n in args.behaviours.split(",") if n.strip()]
    if not names and not args.behaviour:
        names = list(PRESETS)
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        p.error(f"unknown behaviour(s) {', '.join(unknown)}; presets: {', '.join(PRESETS)}")
    out = []
    try:
        out = [(n, Behaviour.parse(PRESETS[n])) for n in names]
        for item in args.behaviour:
            name, sep, spec = item.partition("=")
            if not sep or not name:
                p.error(f"--behaviour wants NAME=SPEC, not {item!r}")
            out.append((name, Behaviour.parse(spec)))
    except ValueError as e:
        p.error(str(e))
    return out


def chosen_workloads(p: Any, args: Any) -> list[str]:
    names = [n.strip() for n in args.workloads.split(",") if n.strip()] or [w.name for w in WORKLOADS]
    skip = {n.strip() for n in args.skip.split(",") if n.strip()}
    unknown = [n for n in [*names, *skip] if n not in BY_NAME]
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
    return [w.name for w in WORKLOADS if w.name in names and w.name not in skip]


def spread(times: list[float]) -> float | None:
    """(max - min) / median of per-run times: the run-to-run spread (None with fewer than two runs)."""
    med = median(times)
    return (max(times) - min(times)) / med if len(times) > 1 and med else None


def cell_record(workload: str, bname: str, b: Behaviour, plan: Plan | None, d: Cell, f: Cell) -> dict[str, Any]:
    td, tf = median(d.total()), median(f.total())
    return {
        "workload": workload,
        "behaviour": bname,
        "spec": b.spec(),
        "bytes": plan.nbytes if plan else None,
        "note": plan.note if plan else "",
        "direct": {"times": d.total(), "median": td, "error": d.error, "storage": d.storage(), "emu": d.emu},
        "fastfs": {
            "times": f.total(),
            "median": tf,
            "error": f.error,
            "storage": f.storage(),
            "emu": f.emu,
            "fetched_delivered": f.fetched_ratio(),
            "waste": f.waste_ratio(),
            "spread": spread(f.total()),
            "request_sizes": f.sizes(),
            "peak_rss": f.peak_rss(),
            "counters": (f.snaps[-1].get("counters") if f.snaps else None),
        },
        "ratio": ratio(td, tf),
    }


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def long_rows(records: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in records:
        d, f = r["direct"], r["fastfs"]
        errors = "; ".join(f"{who}: {c['error']}" for who, c in (("direct", d), ("fastfs", f)) if c["error"])
        rows.append(
            [
                r["workload"],
                r["behaviour"],
                human_bytes(r["bytes"]),
                fmt_s(d["median"]),
                fmt_s(f["median"]),
                fmt_x(r["ratio"]),
                _pct(f["spread"]),
                fmt_x(f["fetched_delivered"]),
                _pct(f["waste"]),
                d["storage"],
                f["storage"],
                errors or r["note"],
            ]
        )
    return rows


LONG_HEADERS = [
    "workload",
    "emulator",
    "bytes",
    "direct s",
    "fastfs s",
    "direct/fastfs",
    "fastfs spread",
    "fetched/deliv",
    "waste",
    "storage direct",
    "storage fastfs",
    "errors / notes",
]
# Text columns of the long table (left-aligned).
LONG_LEFT = (0, 1, len(LONG_HEADERS) - 1)


def matrix_table(records: list[dict[str, Any]], workloads: list[str], behaviours: list[str]) -> str:
    by = {(r["workload"], r["behaviour"]): r for r in records}
    rows = []
    for w in workloads:
        row = [w]
        for b in behaviours:
            r = by.get((w, b))
            if r is None:
                row.append("")
            elif r["direct"]["error"] or r["fastfs"]["error"]:
                row.append(f"FAILED ({'direct' if r['direct']['error'] else 'fastfs'})")
            else:
                row.append(fmt_x(r["ratio"]))
        rows.append(row)
    return markdown_table(["workload \\ emulator", *behaviours], rows)


def run_behaviour(
    bname: str, b: Behaviour, ds: Dataset, plans: dict[str, Plan | Exception], workloads: list[str], args: Any
) -> list[dict[str, Any]]:
    emu_mnt = mountpoint(EMU_MOUNT)
    fastfs_mnt = mountpoint(FASTFS_MOUNT)
    extra = [o for opt in args.fastfs_options for o in opt.split(",") if o]
    records = []
    log(f"behaviour {bname}: {b.describe()}")
    try:
        with emulated(ds.dir, emu_mnt, behaviour=b) as emu:
            for name in workloads:
                plan = plans[name]
                if isinstance(plan, Exception):  # its data could not be made: a failed cell, the run goes on
                    failed = Cell(error=f"data: {type(plan).__name__}: {plan}")
                    records.append(cell_record(name, bname, b, None, failed, failed))
                    continue
                log(f"{bname} / {name}: direct")
                d = measure(Native(emu.mnt, emu), plan.phases, args.runs)
                log(f"{bname} / {name}: fastfs")
                f = measure(
                    Fastfs(emu.mnt, fastfs_mnt, [*extra, *plan.fastfs_options], emu=emu), plan.phases, args.runs
                )
                rec = cell_record(name, bname, b, plan, d, f)
                td, tf = fmt_s(rec["direct"]["median"]), fmt_s(rec["fastfs"]["median"])
                log(f"{bname} / {name}: direct {td} s, fastfs {tf} s, {fmt_x(rec['ratio'])}")
                records.append(rec)
    except Exception as e:  # the emulator itself failed: every remaining cell of this behaviour fails
        done = {r["workload"] for r in records}
        failed = Cell(error=f"emulator: {type(e).__name__}: {e}")
        records += [cell_record(n, bname, b, None, failed, failed) for n in workloads if n not in done]
        log(f"behaviour {bname} FAILED: {e}")
    return records


def main(argv: list[str] | None = None) -> int:
    p, args = parse_args(argv)
    if args.list:
        print("workloads:")
        for w in WORKLOADS:
            print(f"  {w.name:16} {w.about}")
        print("behaviour presets:")
        for name, spec in PRESETS.items():
            print(f"  {name:8} {spec or '(defaults)':38} {PRESET_NOTES[name]}")
        return 0
    behaviours = chosen_behaviours(p, args)
    workloads = chosen_workloads(p, args)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    require_root()
    ds = Dataset(args.ram_dir, args.scale)
    plans: dict[str, Plan | Exception] = {}
    for name in workloads:
        try:
            plans[name] = BY_NAME[name].build(ds)
        except Exception as e:
            log(f"{name}: cannot make its data: {e}")
            plans[name] = e
    preimport(sorted({m for pl in plans.values() if isinstance(pl, Plan) for m in pl.imports}))
    started = time.time()
    records: list[dict[str, Any]] = []
    for bname, b in behaviours:
        recs = run_behaviour(bname, b, ds, plans, workloads, args)
        records += recs
        print(f"\n### emulator `{bname}`: {b.describe()}\n")
        print(markdown_table(LONG_HEADERS, long_rows(recs), LONG_LEFT), flush=True)
    names = [n for n, _ in behaviours]
    print(f"\n## direct / fastfs (above 1: fastfs faster), scale {args.scale:g}, medians of {args.runs} cold runs\n")
    print(matrix_table(records, workloads, names))
    print("\nemulators:")
    for n, b in behaviours:
        print(f"- `{n}`: {b.describe()}")
    print("\n## every cell\n")
    print(markdown_table(LONG_HEADERS, long_rows(records), LONG_LEFT))
    print(
        "\nspread = (max - min) / median of fastfs's runs; fetched/deliv = bytes fastfs read from the source / "
        "bytes it delivered; waste = prefetched bytes dropped unused / fetched; storage = emulator requests x "
        "mean size per run",
        flush=True,
    )
    if args.json:
        doc = {
            "scale": args.scale,
            "runs": args.runs,
            "seconds": round(time.time() - started, 1),
            "behaviours": {n: b.spec() for n, b in behaviours},
            "cells": records,
        }
        text = json.dumps(doc, indent=1, default=str)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
