"""The benchmark matrix: every workload over several storages, direct vs fastfs.

A storage is a behaviour of the latency emulator (``latency_fs.Behaviour``: serialised or parallel
lookups, read-ahead, page cache kept / dropped / direct_io, attribute timeout, latency, bandwidth
per handle or per request, per-handle ranged streams) or a real network client started on loopback
(``rclone``, ``sshfs``, ``s3fs``: :mod:`benchkit.netsources`, optionally behind a delay line). It is
mounted over the data set in RAM, and every chosen workload runs ``direct`` (the storage's mount)
and ``fastfs`` (a fastfs mount of it), interleaved run by run. Every cold run: the network client
remounted, fastfs remounted (empty cache, fresh state directory), page cache dropped (``sync; echo 3
> drop_caches``). Medians of ``--runs``.

Printed: one markdown table per storage as it finishes (so a long run shows progress), then the
whole matrix: a compact table (workload rows x storage columns, ``direct / fastfs``), and a long
table with times, ratio, run-to-run spread of fastfs, fetched/delivered and waste (fastfs stats),
what the storage moved per byte of data (``src/data``) and answered (requests), and the error of
every failed cell. ``--json FILE`` writes every cell's raw numbers as well, with the command line that
made them (``benchmarks/figure.py`` draws the README's figure from that file and prints the command under it).

Run: ``python benchmarks/bench_matrix.py [--scale 0.25] [--runs 3] [--workloads random4k,@net]
[--storage rclone,sshfs:delay=2,s3fs,emu:issue14] [--behaviours base,serial]
[--behaviour slow=lat=5,dirops=serial] [--json out.json]``; ``--list`` prints the workloads, the
workload groups, the emulator presets and the network clients.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import RAM_ROOT  # noqa: E402
from benchkit.datasets import Dataset  # noqa: E402
from benchkit.measure import Cell, Fastfs, Native, Rerun, measure_interleaved, preimport  # noqa: E402
from benchkit.report import fmt_s, fmt_x, human_bytes, log, markdown_table, median, ratio  # noqa: E402
from benchkit.storages import PRESET_NOTES, PRESETS, StorageSpec, emu_spec, parse_storages, started  # noqa: E402
from benchkit.system import mountpoint, require_root  # noqa: E402
from benchkit.workloads import BY_NAME, GROUPS, WORKLOADS, Plan  # noqa: E402

# Mount point names (under benchkit.system.MOUNT_ROOT).
STORAGE_MOUNT = "matrix-storage"
FASTFS_MOUNT = "matrix-fastfs"


def parse_args(argv: list[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="size factor of every data set (0.05 for a smoke run)")
    p.add_argument("--runs", type=int, default=3, help="timed cold runs per cell (median reported)")
    p.add_argument(
        "--workloads", "--only", default="", help="comma-separated workloads or @groups (default: all; see --list)"
    )
    p.add_argument("--skip", default="", help="comma-separated workloads to leave out")
    p.add_argument(
        "--storage",
        action="append",
        default=[],
        metavar="LIST",
        help="storages: emu:PRESET|SPEC, rclone, sshfs, s3fs, gluster (options :delay=MS,keep=1,subtype=NAME), "
        "comma-separated, e.g. rclone,sshfs:delay=2,s3fs,emu:issue14 (default: every emulator preset)",
    )
    p.add_argument("--behaviours", default="", help="comma-separated emulator presets (see --list)")
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
    p.add_argument(
        "--rerun",
        action="store_true",
        help="time fastfs on a rerun of each workload: every timed mount keeps the state (learned sets) "
        "that an untimed run through a mount before it left",
    )
    p.add_argument("--list", action="store_true", help="list workloads and behaviour presets, then exit")
    return p, p.parse_args(argv)


def chosen_storages(p: Any, args: Any) -> list[StorageSpec]:
    """--storage items, then --behaviours presets, then --behaviour NAME=SPEC; default: every preset."""
    names = [n.strip() for n in args.behaviours.split(",") if n.strip()]
    if not names and not args.behaviour and not args.storage:
        names = list(PRESETS)
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        p.error(f"unknown behaviour(s) {', '.join(unknown)}; presets: {', '.join(PRESETS)}")
    out: list[StorageSpec] = []
    try:
        out = parse_storages(args.storage)
        out += [emu_spec(n, n) for n in names]
        for item in args.behaviour:
            name, sep, spec = item.partition("=")
            if not sep or not name:
                p.error(f"--behaviour wants NAME=SPEC, not {item!r}")
            out.append(emu_spec(name, spec))
    except ValueError as e:
        p.error(str(e))
    labels = [s.label for s in out]
    if len(set(labels)) != len(labels):
        p.error(f"a storage is named twice: {', '.join(labels)}")
    return out


def _expand(text: str) -> list[str]:
    """Workload names, ``@GROUP`` expanded (unknown groups stay as they are and fail the check)."""
    out: list[str] = []
    for n in (n.strip() for n in text.split(",") if n.strip()):
        out += list(GROUPS.get(n[1:], (n,))) if n.startswith("@") else [n]
    return out


def chosen_workloads(p: Any, args: Any) -> list[str]:
    names = _expand(args.workloads) or [w.name for w in WORKLOADS]
    skip = set(_expand(args.skip))
    unknown = [n for n in [*names, *skip] if n not in BY_NAME]
    if unknown:
        p.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
    return [w.name for w in WORKLOADS if w.name in names and w.name not in skip]


def spread(times: list[float]) -> float | None:
    """(max - min) / median of per-run times: the run-to-run spread (None with fewer than two runs)."""
    med = median(times)
    return (max(times) - min(times)) / med if len(times) > 1 and med else None


def cell_record(workload: str, spec: StorageSpec, plan: Plan | None, d: Cell, f: Cell) -> dict[str, Any]:
    td, tf = median(d.total()), median(f.total())
    nbytes = plan.nbytes if plan else None
    return {
        "workload": workload,
        "behaviour": spec.label,
        "spec": spec.describe(),
        "bytes": nbytes,
        "note": plan.note if plan else "",
        "direct": {
            "times": d.total(),
            "median": td,
            "error": d.error,
            "storage": d.storage(),
            "emu": d.emu,
            "source_data": ratio(d.source_bytes(), nbytes),
        },
        "fastfs": {
            "times": f.total(),
            "median": tf,
            "error": f.error,
            "storage": f.storage(),
            "emu": f.emu,
            "source_data": ratio(f.source_bytes(), nbytes),
            "fetched_delivered": f.fetched_ratio(),
            "waste": f.waste_ratio(),
            "spread": spread(f.total()),
            "request_sizes": f.sizes(),
            "peak_rss": f.peak_rss(),
            "counters": (f.snaps[-1].get("counters") if f.snaps else None),
            # how fastfs read this storage and why (shape, reason, jump probe), as `fastfs stats` says it
            "source": (f.snaps[-1].get("source") if f.snaps else None),
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
                fmt_x(d["source_data"]),
                fmt_x(f["source_data"]),
                d["storage"],
                f["storage"],
                errors or r["note"],
            ]
        )
    return rows


LONG_HEADERS = [
    "workload",
    "storage",
    "bytes",
    "direct s",
    "fastfs s",
    "direct/fastfs",
    "fastfs spread",
    "fetched/deliv",
    "waste",
    "src/data direct",
    "src/data fastfs",
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
    return markdown_table(["workload \\ storage", *behaviours], rows)


def run_storage(
    spec: StorageSpec, ds: Dataset, plans: dict[str, Plan | Exception], workloads: list[str], args: Any
) -> list[dict[str, Any]]:
    storage_mnt = mountpoint(STORAGE_MOUNT)
    fastfs_mnt = mountpoint(FASTFS_MOUNT)
    extra = [o for opt in args.fastfs_options for o in opt.split(",") if o]
    records = []
    paths = sorted({p for name in workloads for p in getattr(plans[name], "paths", [])})
    log(f"storage {spec.label}: {spec.describe()}")
    try:
        with started(spec, ds.dir, storage_mnt, paths, os.path.dirname(ds.dir)) as st:
            log(f"storage {spec.label} up: {st.describe()}")
            for name in workloads:
                plan = plans[name]
                if isinstance(plan, Exception):  # its data could not be made: a failed cell, the run goes on
                    failed = Cell(error=f"data: {type(plan).__name__}: {plan}")
                    records.append(cell_record(name, spec, None, failed, failed))
                    continue
                log(f"{spec.label} / {name}: direct and fastfs, {args.runs} interleaved cold runs")
                options = [*extra, *plan.fastfs_options]
                fastfs = (
                    Rerun(st.mnt, fastfs_mnt, plan.phases, options, emu=st)
                    if args.rerun
                    else Fastfs(st.mnt, fastfs_mnt, options, emu=st)
                )
                d, f = measure_interleaved([Native(st.mnt, st), fastfs], plan.phases, args.runs)
                rec = cell_record(name, spec, plan, d, f)
                td, tf = fmt_s(rec["direct"]["median"]), fmt_s(rec["fastfs"]["median"])
                log(f"{spec.label} / {name}: direct {td} s, fastfs {tf} s, {fmt_x(rec['ratio'])}")
                records.append(rec)
    except Exception as e:  # the storage itself failed: every remaining cell of it fails
        done = {r["workload"] for r in records}
        failed = Cell(error=f"storage: {type(e).__name__}: {e}")
        records += [cell_record(n, spec, None, failed, failed) for n in workloads if n not in done]
        log(f"storage {spec.label} FAILED: {e}")
    return records


def main(argv: list[str] | None = None) -> int:
    p, args = parse_args(argv)
    if args.list:
        print("workloads:")
        for w in WORKLOADS:
            print(f"  {w.name:16} {w.about}")
        print("emulator presets (--behaviours NAME or --storage emu:NAME):")
        for name, spec in PRESETS.items():
            print(f"  {name:8} {spec or '(defaults)':38} {PRESET_NOTES[name]}")
        print("network clients (--storage NAME[:delay=MS,keep=1,subtype=NAME]): rclone, sshfs, s3fs, gluster")
        print("workload groups (--workloads @NAME):")
        for name, members in GROUPS.items():
            print(f"  @{name:7} {','.join(members)}")
        return 0
    storages = chosen_storages(p, args)
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
    for spec in storages:
        recs = run_storage(spec, ds, plans, workloads, args)
        records += recs
        print(f"\n### storage `{spec.label}`: {spec.describe()}\n")
        print(markdown_table(LONG_HEADERS, long_rows(recs), LONG_LEFT), flush=True)
    names = [s.label for s in storages]
    print(f"\n## direct / fastfs (above 1: fastfs faster), scale {args.scale:g}, medians of {args.runs} cold runs\n")
    print(matrix_table(records, workloads, names))
    print("\nstorages:")
    for spec in storages:
        print(f"- `{spec.label}`: {spec.describe()}")
    print("\n## every cell\n")
    print(markdown_table(LONG_HEADERS, long_rows(records), LONG_LEFT))
    print(
        "\nspread = (max - min) / median of fastfs's runs; fetched/deliv = bytes fastfs read from the source / "
        "bytes it delivered; waste = prefetched bytes dropped unused / fetched; src/data = bytes the storage moved "
        "(emulator: transferred; rclone/sshfs: the server process read; s3fs: the server sent) / the workload's "
        "data; storage = data requests x mean size of all requests the storage answered, per run (medians)",
        flush=True,
    )
    if args.json:
        doc = {
            "command": shlex.join(["python", "benchmarks/bench_matrix.py", *(sys.argv[1:] if argv is None else argv)]),
            "scale": args.scale,
            "runs": args.runs,
            "seconds": round(time.time() - started, 1),
            "storages": {spec.label: spec.describe() for spec in storages},
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
