"""The options every benchmark script shares (``--scale``, ``--runs``, ``--only``, ``-o``, data dirs)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

# Default timed runs per cell (the median is reported).
DEFAULT_RUNS = 3
# Default data directories: on disk for local-disk benchmarks, in RAM (tmpfs) behind the emulator so the
# emulator's model is the only cost of the emulated storage.
DISK_ROOT = "/var/tmp/fastfs-bench"
RAM_ROOT = "/dev/shm/fastfs-bench"


def base_parser(description: str, workloads: Sequence[str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="size factor of every data set (0.25: 256 MiB instead of 1 GiB, 2,500 small files)",
    )
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="timed runs per cell (median reported)")
    p.add_argument("--only", default="", help=f"comma-separated workloads to run, of: {', '.join(workloads)}")
    p.add_argument("--disk-dir", default=DISK_ROOT, help="data directory on local disk")
    p.add_argument("--ram-dir", default=RAM_ROOT, help="data directory in RAM (tmpfs) behind the emulator")
    add_fastfs_options(p)
    return p


def add_fastfs_options(p: argparse.ArgumentParser) -> None:
    """``-o k=v[,k=v]`` (repeatable): extra fastfs mount options; read them with :func:`extra_options`."""
    p.add_argument(
        "-o",
        "--fastfs-options",
        action="append",
        default=[],
        help="extra fastfs mount options (k=v[,k=v]) for every fastfs mount",
    )


def add_emulator_options(p: argparse.ArgumentParser, latency_ms: float, mbps: float) -> None:
    """``--latency-ms`` and ``--mbps`` of the scripts that mount the latency emulator (its defaults)."""
    p.add_argument("--latency-ms", type=float, default=latency_ms, help="emulated request latency")
    p.add_argument("--mbps", type=float, default=mbps, help="emulated per-handle bandwidth (MB/s)")


def selected(args: argparse.Namespace, workloads: Sequence[str]) -> list[str]:
    if not args.only:
        return list(workloads)
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in workloads]
    if unknown:
        raise SystemExit(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(workloads)}")
    return [w for w in workloads if w in wanted]


def extra_options(args: argparse.Namespace) -> list[str]:
    return [o for opt in args.fastfs_options for o in opt.split(",") if o]
