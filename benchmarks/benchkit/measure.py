"""Contenders and cells: how one workload is timed on direct storage and on fastfs.

Each timed run is prepared the same way for every contender (page cache dropped, fastfs remounted
with an empty RAM cache and a fresh state directory; :class:`Rerun`: with the state a first run
left), so ratios compare like with like.
:func:`measure` never raises: a failing cell carries its error and the benchmark goes on.
"""

from __future__ import annotations

import contextlib
import importlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .fsstats import budget, fetched_delivered, request_sizes, wasted_fetched
from .mounts import FastfsMount, fastfs_mount
from .report import human_bytes, log, median, timed
from .system import drop_caches

# Storage counters that are gauges, not counts (never diffed around a run).
GAUGES = ("max_inflight", "max_inflight_reads", "active")


class Native:
    """Reads straight from a directory (local disk or the emulator mount)."""

    kind = "native"

    def __init__(self, root: str, emu: Any = None) -> None:
        self.root = root
        self.emu = emu

    @contextlib.contextmanager
    def session(self) -> Iterator[tuple[str, FastfsMount | None]]:
        yield self.root, None


class Fastfs:
    """Reads through a fastfs mount of *src* (remounted for every cold run)."""

    kind = "fastfs"

    def __init__(
        self, src: str, mnt: str, options: Sequence[str] = (), state_dir: str | None = None, emu: Any = None
    ) -> None:
        self.src = src
        self.mnt = mnt
        self.options = list(options)
        self.state_dir = state_dir
        self.emu = emu

    @contextlib.contextmanager
    def session(self) -> Iterator[tuple[str, FastfsMount | None]]:
        with fastfs_mount(self.src, self.mnt, self.options, self.state_dir) as m:
            yield m.mnt, m


class Rerun(Fastfs):
    """fastfs on a rerun of the job: each timed session mounts with the state that a first, untimed
    run of the same *phases* through a mount before it left (learned access sets, whole-file loads),
    as when a job is restarted or a training script runs again. The storage is reset between the two
    (network clients remount), and the timed run's page cache is dropped as for any cold run.
    ``first_times``: how long each first run took (a fresh state's time, for the report)."""

    def __init__(
        self, src: str, mnt: str, phases: Sequence[Callable[[str], Any]], options: Sequence[str] = (), emu: Any = None
    ) -> None:
        super().__init__(src, mnt, options, emu=emu)
        self.phases = list(phases)
        self.first_times: list[float] = []

    @contextlib.contextmanager
    def session(self) -> Iterator[tuple[str, FastfsMount | None]]:
        state = tempfile.mkdtemp(prefix="fastfs-rerun.")
        try:
            with fastfs_mount(self.src, self.mnt, self.options, state) as m:
                drop_caches()
                self.first_times.append(sum(timed(lambda phase=phase: phase(m.mnt)) for phase in self.phases))
            _reset_storage(self)
            with fastfs_mount(self.src, self.mnt, self.options, state) as m:
                yield m.mnt, m
        finally:
            shutil.rmtree(state, ignore_errors=True)


@dataclass
class Cell:
    """Timings of one workload on one contender: times[phase][run], plus what fastfs / the storage saw."""

    times: list[list[float]] = field(default_factory=list)
    snaps: list[dict[str, Any]] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    emu: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None

    def med(self, phase: int = 0) -> float | None:
        return median(self.times[phase]) if phase < len(self.times) else None

    def fetched_ratio(self) -> float | None:
        """Median bytes fetched from the source / bytes delivered to readers over the fastfs mounts."""
        vals = []
        for s in self.snaps:
            fetched, delivered = fetched_delivered(s)
            if delivered:
                vals.append(fetched / delivered)
        return median(vals)

    def waste_ratio(self) -> float | None:
        """Median share of the fetched bytes that were prefetched and dropped unused."""
        vals = []
        for s in self.snaps:
            wasted, fetched = wasted_fetched(s)
            if fetched:
                vals.append(wasted / fetched)
        return median(vals)

    def total(self) -> list[float]:
        """Per-run time of all phases together (runs where every phase finished)."""
        runs = min((len(t) for t in self.times), default=0)
        return [sum(t[i] for t in self.times) for i in range(runs)]

    def storage(self) -> str:
        """What the storage saw per run (medians): data requests x mean size, and all requests.

        The mean size is the source's data volume (``source_bytes``: the emulator's transferred
        bytes, a server's read bytes) per data request."""
        if not self.emu:
            return "-"
        reads = median(e.get("data_requests", e.get("reads", 0)) for e in self.emu) or 0
        nbytes = self.source_bytes() or 0
        total = median(e.get("requests", reads) for e in self.emu) or 0
        return f"{reads:.0f}x{human_bytes(nbytes / reads) if reads else '-'} of {total:.0f} req"

    def source_bytes(self) -> float | None:
        """Median bytes the storage moved per run (emulator: transferred; servers: read or sent)."""
        if not self.emu:
            return None
        return median(e.get("source_bytes", e.get("read_bytes", 0)) for e in self.emu)

    def sizes(self) -> str:
        return request_sizes(self.snaps[-1]) if self.snaps else "-"

    def peak_rss(self) -> int | None:
        return max(self.rss) if self.rss else None

    def budget(self) -> int | None:
        return budget(self.snaps[-1]) if self.snaps else None


def _emu_counters(emu: Any) -> dict[str, float] | None:
    """Cumulative counters of the storage (an Emulator or a benchkit.storages.Storage), derived keys filled."""
    if emu is None:
        return None
    from .storages import derive

    return {k: float(v) for k, v in derive(emu.counters()).items() if isinstance(v, (int, float))}


def _reset_storage(contender: Native | Fastfs) -> None:
    """Before a cold run: let the storage start cold too (network clients remount; no-op otherwise)."""
    reset = getattr(contender.emu, "reset", None)
    if reset is not None:
        reset()


def _cold_run(cell: Cell, contender: Native | Fastfs, phases: Sequence[Callable[[str], Any]]) -> None:
    _reset_storage(contender)
    with contender.session() as (root, mount):
        drop_caches()
        _run_phases(cell, contender, phases, root)
        _collect(cell, mount)


def measure(contender: Native | Fastfs, phases: Sequence[Callable[[str], Any]], runs: int, cold: bool = True) -> Cell:
    """Time *phases* (functions of the contender's root directory) *runs* times.

    cold: every run gets a new session (fastfs remounted with an empty cache and state) and the page
    cache is dropped before its first phase; later phases of the same run follow without a drop
    (second pass). hot: one session, the phases run once untimed to warm every cache, then *runs*
    timed repetitions.
    """
    cell = Cell(times=[[] for _ in phases])
    try:
        if cold:
            for _ in range(runs):
                _cold_run(cell, contender, phases)
        else:
            with contender.session() as (root, mount):
                for phase in phases:
                    phase(root)
                for _ in range(runs):
                    _run_phases(cell, contender, phases, root)
                _collect(cell, mount)
    except Exception as e:  # a failing cell is reported in its table, the benchmark goes on
        cell.error = f"{type(e).__name__}: {e}"
        log(f"FAILED {contender.kind}: {cell.error}")
    return cell


def _run_phases(cell: Cell, contender: Native | Fastfs, phases: Sequence[Callable[[str], Any]], root: str) -> None:
    before = _emu_counters(contender.emu)
    for i, phase in enumerate(phases):
        cell.times[i].append(timed(lambda phase=phase: phase(root)))
    after = _emu_counters(contender.emu)
    if before is not None and after is not None:
        cell.emu.append({k: v - before.get(k, 0) for k, v in after.items() if k not in GAUGES})


def measure_interleaved(
    contenders: Sequence[Native | Fastfs], phases: Sequence[Callable[[str], Any]], runs: int
) -> list[Cell]:
    """Cold runs of every contender, interleaved (run 1 of each, then run 2 of each, ...), so a slow
    minute of a shared machine hits both sides of a ratio. A contender that fails stops its own runs;
    the others go on."""
    cells = [Cell(times=[[] for _ in phases]) for _ in contenders]
    for _ in range(runs):
        for contender, cell in zip(contenders, cells, strict=True):
            if cell.error:
                continue
            try:
                _cold_run(cell, contender, phases)
            except Exception as e:  # reported in its table, the benchmark goes on
                cell.error = f"{type(e).__name__}: {e}"
                log(f"FAILED {contender.kind}: {cell.error}")
    return cells


def _collect(cell: Cell, mount: FastfsMount | None) -> None:
    if mount is None:
        return
    cell.snaps.append(mount.stats())
    rss = mount.peak_rss()
    if rss:
        cell.rss.append(rss)


def preimport(modules: Iterable[str]) -> None:
    """Import loader libraries before any timing (their first import takes seconds)."""

    for name in modules:
        t0 = time.perf_counter()
        importlib.import_module(name)
        log(f"imported {name} in {time.perf_counter() - t0:.1f} s")
