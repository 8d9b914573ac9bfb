"""Long jobs on changing storage (issue 22): pauses, rotating checkpoints, new / deleted / growing files.

Benchmarks of seconds on data nobody writes miss what training jobs meet: a second epoch after a
pause longer than fastfs's ``attr_timeout``, an evaluator loading the newest checkpoint while a
trainer rotates them, files that appear, vanish or grow next to a running reader. Each scenario
runs ``direct`` (on the storage itself) and through fastfs in the same run and prints one table:

* ``epoch2``: a shuffled epoch over the small files (10,000 x scale), a pause (``--pause``, default
  65 s: longer than the default ``attr_timeout`` of 60 s; and no pause, for reference), a second
  epoch in a new shuffle, timed; on ``--storage`` (default ``emu:issue14``: lookups answered one at
  a time). Cold start per run (storage reset, page cache dropped, fresh fastfs state), interleaved.
* ``rotation``: a writer thread saves ``ckpt-N.pt`` (``torch.save`` to a temporary name, then
  rename) every 300 ms and every 50 ms (``--periods``), keeping the newest 3; an evaluator lists the
  directory through the mount, picks the newest, ``torch.load``s it, 20 times (one per period).
  Counted: failed loads (an error), wrong versions (the loaded step is not the listed one), how
  many checkpoints the listing was behind the writer (max / mean).
* ``listing``: a directory listed through the mount, then a new file created and another deleted
  at the source: seconds until the listing through the mount shows each change.
* ``append``: a file read to its end through an open handle, then appended to at the source:
  seconds until a read past the old end returns the new bytes, and until ``fstat`` shows the new size.

The last three run on ``--change-storage`` (default ``local``: the directory itself, tmpfs, where
fastfs's default route is passthrough; ``emu:SPEC``, ``rclone`` and ``sshfs`` serve the directory
the harness writes into) with three contenders: ``direct``, ``fastfs`` (defaults) and ``fastfs
served`` (``-o fuse.passthrough=off``); the route fastfs took is printed (opens by passthrough).
A change not seen within ``--limit`` seconds prints as ``> LIMIT``.

Run: ``python benchmarks/bench_changing.py [--only epoch2,rotation,listing,append] [--pause 65]
[--scale 1] [--runs 3] [--limit 90]``; smoke: ``--scale 0.02 --runs 1 --pause 2 --limit 3``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit.cli import RAM_ROOT  # noqa: E402
from benchkit.datasets import Dataset  # noqa: E402
from benchkit.mounts import FastfsMount, fastfs_mount  # noqa: E402
from benchkit.readers import read_files, small_file_list  # noqa: E402
from benchkit.report import fmt_s, fmt_x, log, markdown_table, median, ratio  # noqa: E402
from benchkit.storages import Storage, StorageSpec, parse_storages, started  # noqa: E402
from benchkit.system import drop_caches, mountpoint, require_root  # noqa: E402
from benchkit.units import KIB, MIB, SEED  # noqa: E402

SCENARIOS = ("epoch2", "rotation", "listing", "append")
# Default pause between the epochs (s): longer than fastfs's default attr_timeout (60 s).
DEFAULT_PAUSE = 65.0
# Writer periods of the rotation scenario (s): issue 22's trainer (300 ms) and a fast one (50 ms).
DEFAULT_PERIODS = "0.3,0.05"
# Checkpoints the writer keeps, and loads the evaluator makes.
KEEP_CHECKPOINTS = 3
EVALUATIONS = 20
# Checkpoint size at --scale 1 (a small model's state dict), and the least at any scale.
CKPT_BYTES = 4 * MIB
CKPT_MIN_BYTES = 256 * KIB
# Longest wait for a change to show (s): longer than attr_timeout, so a change that shows only when
# the kernel's cache expires is measured, not cut off.
DEFAULT_LIMIT = 90.0
# Poll interval while waiting for a change to show through a mount (s).
POLL_INTERVAL = 0.02
# Files in the listed directory of the listing scenario, and size of the growing file.
LISTING_FILES = 100
GROW_BYTES = 1 * MIB
APPEND_BYTES = 64 * KIB
# Route options of the contenders through fastfs.
SERVED = "fuse.passthrough=off"
# Mount point names (under benchkit.system.MOUNT_ROOT).
STORAGE_MOUNT = "changing-storage"
FASTFS_MOUNT = "changing-fastfs"


# -- contenders -----------------------------------------------------------------------------------
@dataclass
class Contender:
    """``direct`` (the storage mount) or fastfs over it with extra options."""

    label: str
    options: list[str] | None  # None: direct
    opens_passthrough: int = 0

    @contextlib.contextmanager
    def root(self, storage_mnt: str, fastfs_mnt: str) -> Iterator[str]:
        if self.options is None:
            yield storage_mnt
            return
        with fastfs_mount(storage_mnt, fastfs_mnt, self.options) as m:
            try:
                yield m.mnt
            finally:
                self.opens_passthrough += _passthrough_opens(m)


def _passthrough_opens(m: FastfsMount) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(m.stats().get("counters", {}).get("opens_passthrough", 0))
    return 0


def make_contenders(extra: list[str]) -> list[Contender]:
    """direct, fastfs with its defaults, fastfs on the served route (fresh route counts per scenario)."""
    return [Contender("direct", None), Contender("fastfs", list(extra)), Contender("fastfs served", [*extra, SERVED])]


def options_note(c: Contender) -> str:
    if c.options is None:
        return "the storage itself"
    return ",".join(c.options) or "defaults"


def _distinct(errors: list[str], most: int = 3) -> list[str]:
    """The first *most* distinct errors, each with how often it happened."""
    counts: dict[str, int] = {}
    for e in errors:
        counts[e] = counts.get(e, 0) + 1
    return [f"{e} (x{n})" if n > 1 else e for e, n in list(counts.items())[:most]]


def route_note(c: Contender) -> str:
    if c.options is None:
        return "the storage itself"
    return f"{'passthrough' if c.opens_passthrough else 'served'} ({c.opens_passthrough} passthrough opens)"


@contextlib.contextmanager
def storage_over(spec: StorageSpec | None, directory: str) -> Iterator[Storage | None]:
    """The storage mounted over *directory*, or None for ``local`` (the directory itself)."""
    if spec is None:
        yield None
        return
    with started(spec, directory, mountpoint(STORAGE_MOUNT)) as st:
        yield st


def storage_mnt(st: Storage | None, directory: str) -> str:
    return directory if st is None else st.mnt


def parse_storage(p: argparse.ArgumentParser, text: str) -> StorageSpec | None:
    if text == "local":
        return None
    try:
        specs = parse_storages([text])
    except ValueError as e:
        p.error(str(e))
    if len(specs) != 1 or specs[0].kind == "s3fs":
        p.error(f"{text!r}: one storage of local, emu:SPEC, rclone, sshfs (s3fs cannot see files written here)")
    return specs[0]


def _seconds(v: float | None, limit: float) -> str:
    return f"> {limit:g}" if v is None else f"{v:.2f}"


def wait_for(check: Callable[[], bool], limit: float) -> float | None:
    """Seconds until *check()* holds (polled), None if it did not within *limit*."""
    t0 = time.monotonic()
    while True:
        with contextlib.suppress(OSError):
            if check():
                return time.monotonic() - t0
        if time.monotonic() - t0 > limit:
            return None
        time.sleep(POLL_INTERVAL)


# -- epoch2 ---------------------------------------------------------------------------------------
def scenario_epoch2(args: argparse.Namespace, spec: StorageSpec | None, ds: Dataset) -> None:
    small = ds.small_dir()
    rel = os.path.relpath(small, ds.dir)
    names = small_file_list(small, False)
    contenders = [Contender("direct", None), Contender("fastfs", list(args.extra))]
    pauses = sorted({0.0, args.pause})
    times: dict[tuple[float, str], list[tuple[float, float]]] = {}
    requests: dict[tuple[float, str], list[float]] = {}
    fastfs_mnt = mountpoint(FASTFS_MOUNT)
    with storage_over(spec, ds.dir) as st:
        root_dir = storage_mnt(st, ds.dir)
        for run in range(args.runs):
            for pause in pauses:
                for c in contenders:
                    if st is not None:
                        st.reset()
                    with c.root(root_dir, fastfs_mnt) as root:
                        drop_caches()
                        base = [os.path.join(root, rel, os.path.basename(n)) for n in names]
                        e1 = _timed_epoch(base, SEED + run)
                        time.sleep(pause)
                        before = st.counters()["requests"] if st is not None else 0.0
                        e2 = _timed_epoch(base, SEED + 1000 + run)
                        if st is not None:
                            requests.setdefault((pause, c.label), []).append(st.counters()["requests"] - before)
                    times.setdefault((pause, c.label), []).append((e1, e2))
                    log(f"epoch2 run {run + 1}, pause {pause:g} s, {c.label}: epoch 1 {e1:.3f} s, epoch 2 {e2:.3f} s")
    rows = []
    for pause in pauses:
        cells = {}
        for c in contenders:
            ts = times.get((pause, c.label), [])
            reqs = median(requests.get((pause, c.label), []))
            cells[c.label] = (median(t[0] for t in ts), median(t[1] for t in ts), reqs)
        d, f = cells["direct"], cells["fastfs"]
        rows.append(
            [
                f"{pause:g} s",
                fmt_s(d[0]),
                fmt_s(d[1]),
                fmt_s(f[0]),
                fmt_s(f[1]),
                fmt_x(ratio(d[1], f[1])),
                "-" if d[2] is None else f"{d[2]:.0f}",
                "-" if f[2] is None else f"{f[2]:.0f}",
            ]
        )
    where = "local directory" if spec is None else spec.describe()
    print(f"\n### second shuffled epoch after a pause: {len(names)} files, {where}, medians of {args.runs}\n")
    headers = ["pause", "direct e1 s", "direct e2 s", "fastfs e1 s", "fastfs e2 s", "e2 direct/fastfs"]
    print(markdown_table([*headers, "storage req e2 direct", "storage req e2 fastfs"], rows), flush=True)


def _timed_epoch(paths: list[str], seed: int) -> float:
    order = list(paths)
    random.Random(seed).shuffle(order)
    t0 = time.perf_counter()
    read_files(order)
    return time.perf_counter() - t0


# -- rotation -------------------------------------------------------------------------------------
CKPT_NAME = re.compile(r"^ckpt-(\d+)\.pt$")


@dataclass
class Writer:
    """A trainer saving ``ckpt-N.pt`` by temp + rename every *period* s, keeping the newest KEEP."""

    directory: str
    period: float
    nbytes: int
    latest: int = -1
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # guards latest

    def save(self, n: int) -> None:
        import torch

        state = {"step": torch.tensor(n), "weights": torch.full((self.nbytes // 4,), float(n))}
        tmp = os.path.join(self.directory, f".ckpt-{n}.pt.tmp")
        torch.save(state, tmp)
        os.replace(tmp, os.path.join(self.directory, f"ckpt-{n}.pt"))
        with self._lock:
            self.latest = n
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, f"ckpt-{n - KEEP_CHECKPOINTS}.pt"))

    def newest(self) -> int:
        with self._lock:
            return self.latest

    def run(self) -> None:
        n = self.latest + 1
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.save(n)
            except Exception as e:  # reported under the table
                self.errors.append(f"{type(e).__name__}: {e}")
            n += 1
            next_at += self.period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Evaluation:
    ok: int = 0
    failed: int = 0
    wrong: int = 0
    behind: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def evaluate(root: str, writer: Writer, count: int) -> Evaluation:
    """List, pick the newest, torch.load it, *count* times, one per writer period."""
    import torch

    ev = Evaluation()
    t0 = time.perf_counter()
    for _ in range(count):
        written = writer.newest()
        steps = [int(m.group(1)) for m in map(CKPT_NAME.match, os.listdir(root)) if m]
        if not steps:
            ev.failed += 1
            ev.errors.append("no checkpoint listed")
            continue
        newest = max(steps)
        ev.behind.append(max(0, written - newest))
        try:
            state = torch.load(os.path.join(root, f"ckpt-{newest}.pt"), weights_only=True)
            step = int(state["step"])
            if step != newest or float(state["weights"][-1]) != float(newest):
                ev.wrong += 1
                ev.errors.append(f"ckpt-{newest}.pt held step {step}")
            else:
                ev.ok += 1
        except Exception as e:
            ev.failed += 1
            ev.errors.append(f"ckpt-{newest}.pt: {type(e).__name__}: {e}")
        time.sleep(writer.period)
    ev.seconds = time.perf_counter() - t0
    return ev


def scenario_rotation(
    args: argparse.Namespace, spec: StorageSpec | None, work: str, contenders: list[Contender]
) -> None:
    import torch  # noqa: F401 (imported before any timing)

    nbytes = max(CKPT_MIN_BYTES, int(CKPT_BYTES * args.scale))
    rows, notes = [], []
    fastfs_mnt = mountpoint(FASTFS_MOUNT)
    for period in args.periods:
        for c in contenders:
            directory = os.path.join(work, f"rotation-{period:g}-{c.label.replace(' ', '-')}")
            os.makedirs(directory)
            writer = Writer(directory, period, nbytes)
            for n in range(KEEP_CHECKPOINTS):  # a job already running: three checkpoints before the evaluator
                writer.save(n)
            with storage_over(spec, directory) as st, c.root(storage_mnt(st, directory), fastfs_mnt) as root:
                thread = threading.Thread(target=writer.run, daemon=True)
                thread.start()
                try:
                    ev = evaluate(root, writer, EVALUATIONS)
                finally:
                    writer.stop()
                    thread.join()
            behind = f"{max(ev.behind)} / {sum(ev.behind) / len(ev.behind):.1f}" if ev.behind else "-"
            row = [f"{period * 1000:g} ms", c.label, ev.ok, ev.failed, ev.wrong, behind, f"{ev.seconds:.1f}"]
            rows.append([*row, route_note(c)])
            c.opens_passthrough = 0  # the route of the next period's mount is counted afresh
            notes += [f"{period * 1000:g} ms, {c.label}: {e}" for e in _distinct(ev.errors + writer.errors)]
            log(f"rotation {period * 1000:g} ms, {c.label}: {ev.ok} ok, {ev.failed} failed, {ev.wrong} wrong")
    where = "local directory" if spec is None else spec.describe()
    print(f"\n### checkpoint rotation ({nbytes // KIB} KiB checkpoints, keep {KEEP_CHECKPOINTS}), {where}\n")
    headers = ["writer period", "reader", "loads ok", "failed", "wrong version", "behind max / mean", "seconds"]
    print(markdown_table([*headers, "route"], rows, (0, 1, 7)))
    for n in notes:
        print(f"- {n}")
    sys.stdout.flush()


# -- listing --------------------------------------------------------------------------------------
def scenario_listing(
    args: argparse.Namespace, spec: StorageSpec | None, work: str, contenders: list[Contender]
) -> None:
    directory = os.path.join(work, "listing")
    os.makedirs(directory)
    for i in range(LISTING_FILES):
        with open(os.path.join(directory, f"file-{i:04d}"), "wb") as f:
            f.write(b"x" * 100)
    rows = []
    fastfs_mnt = mountpoint(FASTFS_MOUNT)
    with storage_over(spec, directory) as st:
        for k, c in enumerate(contenders):
            victim = os.path.join(directory, f"victim-{k}")
            with open(victim, "wb") as f:
                f.write(b"v")
            new_name = f"new-{k}"
            with c.root(storage_mnt(st, directory), fastfs_mnt) as root:
                victim_name = os.path.basename(victim)
                if victim_name not in os.listdir(root):  # listed once with the victim in it (the kernel keeps it)
                    wait_listing(root, lambda names, v=victim_name: v in names, args.limit)
                with open(os.path.join(directory, new_name), "wb") as f:
                    f.write(b"n")
                os.unlink(victim)
                t_new, t_gone = _listing_times(root, new_name, victim_name, args.limit)
            rows.append([c.label, _seconds(t_new, args.limit), _seconds(t_gone, args.limit), options_note(c)])
            log(f"listing, {c.label}: new {_seconds(t_new, args.limit)} s, deleted {_seconds(t_gone, args.limit)} s")
    where = "local directory" if spec is None else spec.describe()
    print(f"\n### a new and a deleted file in a listed directory ({LISTING_FILES} files), {where}\n")
    headers = ["reader", "new file listed after s", "deleted file gone after s", "fastfs options"]
    print(markdown_table(headers, rows, (0, 3)), flush=True)


def wait_listing(root: str, pred: Callable[[set[str]], bool], limit: float) -> set[str]:
    names: set[str] = set()

    def check() -> bool:
        nonlocal names
        names = set(os.listdir(root))
        return pred(names)

    wait_for(check, limit)
    return names


def _listing_times(root: str, new: str, gone: str, limit: float) -> tuple[float | None, float | None]:
    """Seconds until *new* is listed and *gone* is not (one poll loop watching both)."""
    t0 = time.monotonic()
    t_new = t_gone = None
    while time.monotonic() - t0 <= limit and (t_new is None or t_gone is None):
        names = set(os.listdir(root))
        now = time.monotonic() - t0
        if t_new is None and new in names:
            t_new = now
        if t_gone is None and gone not in names:
            t_gone = now
        time.sleep(POLL_INTERVAL)
    return t_new, t_gone


# -- append ---------------------------------------------------------------------------------------
def scenario_append(args: argparse.Namespace, spec: StorageSpec | None, work: str, contenders: list[Contender]) -> None:
    directory = os.path.join(work, "append")
    os.makedirs(directory)
    rows = []
    fastfs_mnt = mountpoint(FASTFS_MOUNT)
    rng = random.Random(SEED)
    with storage_over(spec, directory) as st:
        for k, c in enumerate(contenders):
            name = f"grow-{k}.bin"
            head, tail = rng.randbytes(GROW_BYTES), rng.randbytes(APPEND_BYTES)
            with open(os.path.join(directory, name), "wb") as f:
                f.write(head)
            with c.root(storage_mnt(st, directory), fastfs_mnt) as root:
                if _visible_after(os.path.join(root, name), args.limit) is None:
                    # a client whose listing lags (rclone's dir cache) may not show the new file in time
                    rows.append([c.label, f"> {args.limit:g} (file not listed)", "-", "-", route_note(c)])
                    log(f"append, {c.label}: the new file was not visible within {args.limit:g} s")
                    continue
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    seen = _read_to_end(fd)  # like tail -f: the reader is at the end
                    ok = seen == head
                    with open(os.path.join(directory, name), "ab") as f:
                        f.write(tail)
                    t_bytes, t_size = _append_times(fd, len(head), tail, args.limit)
                finally:
                    os.close(fd)
            rows.append(
                [
                    c.label,
                    _seconds(t_bytes, args.limit),
                    _seconds(t_size, args.limit),
                    "yes" if ok else "NO",
                    route_note(c),
                ]
            )
            log(f"append, {c.label}: bytes {_seconds(t_bytes, args.limit)} s, size {_seconds(t_size, args.limit)} s")
    where = "local directory" if spec is None else spec.describe()
    sizes = f"{GROW_BYTES // KIB} KiB + {APPEND_BYTES // KIB} KiB"
    print(f"\n### a file appended to while a reader holds it open ({sizes}), {where}\n")
    headers = ["reader", "new bytes read after s", "fstat new size after s", "old bytes right", "route"]
    print(markdown_table(headers, rows, (0, 4)), flush=True)


def _visible_after(path: str, limit: float) -> float | None:
    """Seconds until *path* exists (polled by :func:`wait_for`), None when not within *limit*."""
    return wait_for(lambda: os.path.exists(path), limit)


def _read_to_end(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, MIB):
        parts.append(chunk)
    return b"".join(parts)


def _append_times(fd: int, old: int, tail: bytes, limit: float) -> tuple[float | None, float | None]:
    """Seconds until a read at *old* returns *tail*, and until fstat shows old + len(tail)."""
    t0 = time.monotonic()
    t_bytes = t_size = None
    while time.monotonic() - t0 <= limit and (t_bytes is None or t_size is None):
        now = time.monotonic() - t0
        if t_bytes is None and os.pread(fd, len(tail), old) == tail:
            t_bytes = now
        if t_size is None and os.fstat(fd).st_size == old + len(tail):
            t_size = now
        time.sleep(POLL_INTERVAL)
    return t_bytes, t_size


# -- main -----------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help=f"comma-separated scenarios of: {', '.join(SCENARIOS)}")
    p.add_argument("--scale", type=float, default=1.0, help="size factor (small files: 10,000 x scale)")
    p.add_argument("--runs", type=int, default=3, help="runs of the epoch scenario (medians)")
    p.add_argument("--pause", type=float, default=DEFAULT_PAUSE, help="seconds between the epochs (default 65)")
    p.add_argument("--periods", default=DEFAULT_PERIODS, help="writer periods of the rotation scenario (s)")
    p.add_argument("--limit", type=float, default=DEFAULT_LIMIT, help="longest wait for a change to show (s)")
    p.add_argument("--storage", default="emu:issue14", help="storage of the epoch scenario (emu:SPEC, rclone, ...)")
    p.add_argument("--change-storage", default="local", help="storage of the others: local, emu:SPEC, rclone, sshfs")
    p.add_argument("--ram-dir", default=RAM_ROOT, help="data directory in RAM (tmpfs)")
    p.add_argument("-o", "--fastfs-options", action="append", default=[], help="extra fastfs mount options")
    args = p.parse_args(argv)
    args.scenarios = [s.strip() for s in args.only.split(",") if s.strip()] or list(SCENARIOS)
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    try:
        args.periods = [float(x) for x in args.periods.split(",") if x.strip()]
    except ValueError:
        p.error(f"--periods wants seconds like 0.3,0.05, not {args.periods!r}")
    if args.runs < 1 or args.pause < 0 or args.limit <= 0 or not args.periods or min(args.periods) <= 0:
        p.error("--runs >= 1, --pause >= 0, --limit > 0 and periods > 0, please")
    args.extra = [o for opt in args.fastfs_options for o in opt.split(",") if o]
    return p, args


def main(argv: list[str] | None = None) -> int:
    p, args = parse_args(argv)
    epoch_spec = parse_storage(p, args.storage)
    change_spec = parse_storage(p, args.change_storage)
    require_root()
    if "epoch2" in args.scenarios:
        scenario_epoch2(args, epoch_spec, Dataset(args.ram_dir, args.scale))
    work = os.path.join(args.ram_dir, f"changing-{os.getpid()}")
    os.makedirs(work)
    try:
        runners: dict[str, Callable[..., Any]] = {
            "rotation": scenario_rotation,
            "listing": scenario_listing,
            "append": scenario_append,
        }
        for name, fn in runners.items():
            if name in args.scenarios:
                fn(args, change_spec, work, make_contenders(args.extra))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
