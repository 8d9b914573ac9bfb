"""Where the time of one random 4 KiB pread goes: direct vs through fastfs, with and without the emulator.

A diagnostic, not a benchmark table: it times every pread of a random 4 KiB reader one by one
(distinct aligned offsets, so no read is a page cache hit) on these contenders, in one process:

* ``tmpfs``: the data set in RAM read directly (the floor: a syscall and a copy);
* ``fastfs/tmpfs``: fastfs mounted over tmpfs: the FUSE hop plus fastfs's engine and no storage cost;
* ``emu``: the latency emulator read directly (``--latency-ms``, default 1.5 ms; ``--latency-ms 0``
  leaves only the emulator's own FUSE hop);
* ``fastfs/emu``: fastfs mounted over the emulator, the case of issue 14;

each fastfs case with the default options and with ``readahead.read_timeout=0`` (the engine then
preads exact reads on the FUSE thread itself instead of handing them to the pool's demand workers,
so the difference is the cost of the hand-off). Per contender it prints the median / mean / p90
time per read, and for fastfs what the daemon saw: its mean source pread time (stats ``lat_sum /
preads``: the time inside ``os.preadv`` on the source), its CPU time and context switches per read
(summed over the daemon's threads from /proc), and what the emulator saw (requests, bytes, its own
time per request). ``--strace`` also runs the fastfs/emu case under ``strace -c -f`` on the daemon.

Run: ``python benchmarks/probe_random_read.py [--count 2000] [--latency-ms 1.5] [--strace]``
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import RAM_ROOT  # noqa: E402
from benchkit.datasets import Dataset  # noqa: E402
from benchkit.mounts import FastfsMount, fastfs_mount  # noqa: E402
from benchkit.report import log, markdown_table  # noqa: E402
from benchkit.system import drop_caches, mountpoint, require_root  # noqa: E402
from benchkit.units import KIB, MIB  # noqa: E402
from latency_fs import Behaviour, Emulator, emulated  # noqa: E402

# Request size of the probe: one page, as SQLite and random readers ask.
READ_SIZE = 4 * KIB
# Size of the probed file: large enough that 2,000 distinct 4 KiB offsets are a sparse sample.
FILE_BYTES = 256 * MIB
# Pipe wake-ups timed per idle gap, and the gaps (s): none (busy) and the emulator's latency.
WAKE_ROUNDS = 500
# Shortest gap between pipe writes (s): enough for the reader to be back in read(), too short to idle deeply.
WAKE_BUSY_GAP = 0.00005
# Seconds strace is given to attach before the timed reads start.
STRACE_ATTACH = 1.0


def offsets(size: int, count: int, seed: int = 1234) -> list[int]:
    return [b * READ_SIZE for b in random.Random(seed).sample(range(size // READ_SIZE), count)]


def timed_preads(path: str, offs: list[int]) -> list[float]:
    """Seconds of each pread of READ_SIZE at *offs* (one descriptor, opened before the clock starts)."""
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(READ_SIZE)
    out = []
    try:
        for off in offs:
            t = time.perf_counter_ns()
            if os.preadv(fd, [buf], off) != READ_SIZE:
                raise RuntimeError(f"short read at {off}")
            out.append((time.perf_counter_ns() - t) / 1e9)
    finally:
        os.close(fd)
    return out


def proc_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds, context switches) summed over every thread of *pid* (schedstat: ns, not ticks)."""
    cpu, switches = 0.0, 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu += int(f.read().split()[0]) / 1e9
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        switches += int(line.split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return cpu, switches


WAKE_CODE = (
    "import os, sys, time\n"
    "r, w = int(sys.argv[1]), int(sys.argv[2])\n"
    "out = []\n"
    "while True:\n"
    "    b = os.read(r, 8)\n"
    "    if len(b) < 8: break\n"
    "    out.append(time.perf_counter_ns() - int.from_bytes(b, 'little'))\n"
    "out.sort()\n"
    "os.write(w, str(out[len(out) // 2]).encode())\n"
)


def wakeup_latency(gap: float, rounds: int) -> float:
    """Median ns from a write into a pipe to the reading process being awake, after *gap* s of idling."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", WAKE_CODE, str(r1), str(w2)], pass_fds=(r1, w2))
    os.close(r1)
    os.close(w2)
    try:
        time.sleep(0.2)
        for _ in range(rounds):
            time.sleep(gap)
            os.write(w1, time.perf_counter_ns().to_bytes(8, "little"))
        os.close(w1)
        return int(os.read(r2, 64)) / 1e9
    finally:
        os.close(r2)
        child.wait(timeout=30)


def usec(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e6:.0f}"


class Probe:
    def __init__(self, offs: list[int], rel: str) -> None:
        self.offs = offs
        self.rel = rel
        self.rows: list[list[str]] = []

    def run(
        self,
        label: str,
        root: str,
        daemon: FastfsMount | None = None,
        emu: Emulator | None = None,
        around: Callable[[int], Any] | None = None,
    ) -> None:
        drop_caches()
        pid = daemon.pid if daemon else None
        before = proc_usage(pid) if pid else None
        emu_before = emu.counters() if emu else None
        snap0 = daemon.stats() if daemon else None
        tracer = around(pid) if around and pid else None
        try:
            times = timed_preads(os.path.join(root, self.rel), self.offs)
        finally:
            if tracer is not None:
                tracer.send_signal(signal.SIGINT)
                _, out = tracer.communicate(timeout=30)
                log(f"strace -c -f of the fastfs daemon during {label}:\n{out.decode(errors='replace')}")
        n = len(times)
        row = [
            label,
            usec(statistics.median(times)),
            usec(statistics.fmean(times)),
            usec(sorted(times)[int(0.9 * n)]),
        ]
        if daemon and before and snap0 is not None:
            after = proc_usage(pid)
            snap = daemon.stats()
            c0, c1 = snap0["counters"], snap["counters"]
            preads = c1["preads"] - c0["preads"]
            lat = snap.get("pread_latency", {})
            lat0 = snap0.get("pread_latency", {})
            lat_sum = lat.get("sum_seconds", 0) - lat0.get("sum_seconds", 0)
            fetched = (c1["bytes_fetched_demand"] + c1["bytes_fetched_prefetch"]) - (
                c0["bytes_fetched_demand"] + c0["bytes_fetched_prefetch"]
            )
            row += [
                str(preads),
                usec(lat_sum / preads if preads else None),
                f"{fetched / (n * READ_SIZE):.2f}",
                usec((after[0] - before[0]) / n),
                f"{(after[1] - before[1]) / n:.1f}",
            ]
        else:
            row += ["-"] * 5
        if emu and emu_before is not None:
            e1 = emu.counters()
            reads = e1["reads"] - emu_before["reads"]
            nbytes = e1["read_bytes"] - emu_before["read_bytes"]
            wait = e1["read_wait_seconds"] - emu_before["read_wait_seconds"]
            row += [
                str(int(reads)),
                f"{nbytes / reads / KIB:.0f}K" if reads else "-",
                usec(wait / reads if reads else None),
            ]
        else:
            row += ["-"] * 3
        self.rows.append(row)
        log(f"{label}: median {row[1]} us")


def engine_times(root: str, rel: str, offs: list[int], options: dict[str, object]) -> list[float]:
    """Seconds of each ``Engine.read_into`` of READ_SIZE in-process (no FUSE, no kernel hop)."""
    import tempfile

    from fastfs.config.loader import load_config
    from fastfs.fsio.engine import Engine

    state = tempfile.mkdtemp(prefix="probe-state.")
    config = load_config(overrides={"state.dir": state, "readahead.learn": False, **options}, use_default_path=False)
    engine = Engine(root, config)
    try:
        fh = engine.open("/" + rel).fh
        dest = memoryview(bytearray(READ_SIZE))
        out = []
        for off in offs:
            t = time.perf_counter_ns()
            engine.read_into(fh, off, dest)
            out.append((time.perf_counter_ns() - t) / 1e9)
        engine.release(fh)
        return out
    finally:
        engine.close()
        shutil.rmtree(state, ignore_errors=True)


def strace_daemon(pid: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["strace", "-c", "-f", "-q", "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    time.sleep(STRACE_ATTACH)
    return proc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=2000, help="preads per contender (distinct offsets)")
    p.add_argument("--latency-ms", type=float, default=1.5, help="emulated request latency")
    p.add_argument("--emu", default="", help="extra emulator settings (latency_fs.Behaviour spec)")
    p.add_argument("--ram-dir", default=RAM_ROOT, help="data directory in RAM (tmpfs)")
    p.add_argument("--strace", action="store_true", help="also run fastfs/emu under strace -c -f (slows it)")
    p.add_argument("-o", "--fastfs-options", default="", help="extra fastfs options for every fastfs mount")
    args = p.parse_args(argv)
    require_root()
    ds = Dataset(args.ram_dir, 1.0)
    path = ds.raw(f"probe-{FILE_BYTES // MIB}M.bin", FILE_BYTES)
    rel = os.path.basename(path)
    offs = offsets(FILE_BYTES, args.count)
    probe = Probe(offs, rel)
    extra = [o for o in args.fastfs_options.split(",") if o]
    variants = [("", extra), (" inline", [*extra, "readahead.read_timeout=0"])]
    fmnt = mountpoint("probe-fastfs")
    emnt = mountpoint("probe-emu")
    probe.run("tmpfs", ds.dir)
    for suffix, opts in variants:
        with fastfs_mount(ds.dir, fmnt, opts) as m:
            probe.run("fastfs/tmpfs" + suffix, m.mnt, m)
    behaviour = Behaviour.parse(args.emu, Behaviour(latency_ms=args.latency_ms))
    with emulated(ds.dir, emnt, behaviour=behaviour) as emu:
        probe.run("emu", emu.mnt, emu=emu)
        for suffix, opts in variants:
            with fastfs_mount(emu.mnt, fmnt, opts) as m:
                probe.run("fastfs/emu" + suffix, m.mnt, m, emu)
        if args.strace:
            with fastfs_mount(emu.mnt, fmnt, extra) as m:
                probe.run("fastfs/emu under strace", m.mnt, m, emu, around=strace_daemon)
    engine = []
    for label, options in (("default", {}), ("inline (read_timeout=0)", {"readahead.read_timeout": 0})):
        t = sorted(engine_times(ds.dir, rel, offs, options))
        engine.append(f"{label} median {usec(t[len(t) // 2])} us, mean {usec(statistics.fmean(t))} us")
    print("\nEngine.read_into in-process over tmpfs (no FUSE): " + "; ".join(engine))
    wakes = [(gap, wakeup_latency(gap, WAKE_ROUNDS)) for gap in (WAKE_BUSY_GAP, 0.0005, behaviour.latency_ms / 1000)]
    print(
        f"\nprocess wake-up through a pipe (median of {WAKE_ROUNDS}): "
        + ", ".join(f"{usec(v)} us after {g * 1000:g} ms idle" for g, v in wakes)
    )
    print(
        f"\nrandom {READ_SIZE // KIB} KiB preads, {args.count} distinct offsets in {FILE_BYTES // MIB} MiB; "
        f"emulator: {behaviour.describe()}\n"
    )
    print(
        markdown_table(
            [
                "contender",
                "median us",
                "mean us",
                "p90 us",
                "fastfs preads",
                "fastfs pread us",
                "fetched/deliv",
                "daemon CPU us/read",
                "daemon ctx sw/read",
                "emu requests",
                "emu req size",
                "emu us/request",
            ],
            probe.rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
