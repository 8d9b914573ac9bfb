"""``fastfs bench PATH``: does fastfs help on this storage? Measured on the user's own data, read only.

Two workloads, each read directly and through a temporary fastfs mount of PATH:

* **large file**: the largest file found (larger than ``readahead.small_file_max``), read
  sequentially in 1 MiB reads, at most ``--large-bytes`` of it;
* **small files**: the directory with the most files of at most ``readahead.small_file_max``, up to
  ``--small-files`` of them in name order, each opened, read whole and closed.

With ``--drop-caches`` (root only) each is measured **cold** (``sync`` and
``/proc/sys/vm/drop_caches`` before the pass, and a fresh fastfs mount, so neither the page cache
nor fastfs's RAM hold the data) and **hot** (the next pass, everything cached). Dropping the page
cache is machine-wide (every process on a shared node pays for it), so it is never done unless
asked: without the flag an untimed warm-up pass runs first and only hot passes are compared, which
the verdict says. After the timed passes the bytes read through the mount are compared with direct
reads (CRC-32 per file, untimed). Each pass prints one progress line on stderr (``[3/10] direct,
small files, hot: 0.12 s, 208 files/s``) unless ``--json`` is given.

A PATH on a fastfs mount is refused: fastfs over fastfs measures nothing a user would run.

Nothing in PATH is written: fastfs mounts read only, and its learned state and log go to a
temporary directory that is removed at the end, as is the mount (also on error or Ctrl-C). The
tree walk stops after :data:`MAX_WALK_ENTRIES` entries, so a huge tree is sampled, not listed.

The choice of files (:func:`choose`), the verdict (:func:`verdict`) and the table are pure functions;
``--json`` prints the :func:`run` result as is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from fastfs.config.loader import load_config, parse_overrides
from fastfs.config.schema import ReadaheadConfig
from fastfs.daemon.cli.stats import StatsError, read_snapshot
from fastfs.daemon.mounttable import containing_mount, find_mount, force_unmount, is_fastfs
from fastfs.daemon.summary import human_bytes, summary_line

# Bytes per read of the large-file pass: what numpy / torch loaders ask for at a time.
READ_SIZE = 1024 * 1024
# Default share of the large file read: enough for streaming to reach steady state on slow storage.
DEFAULT_LARGE_BYTES = 1024 * 1024 * 1024
# Default number of small files read: enough for a directory scan to get going.
DEFAULT_SMALL_FILES = 1000
# Fewest small files worth a pass (fastfs needs a few opens of a directory before it scans it).
MIN_SMALL_FILES = 8
# Directory entries visited at most while looking for files (bounds the walk of a huge tree).
MAX_WALK_ENTRIES = 200_000
# Speedup at or above which fastfs counts as faster (beyond run-to-run noise).
GAIN = 1.2
# Seconds allowed for mounting and unmounting the temporary fastfs.
MOUNT_TIMEOUT = 120.0
DROP_CACHES = "/proc/sys/vm/drop_caches"
# Name prefix of the temporary directory (mount point, state, log) of one run.
TEMP_PREFIX = "fastfs-bench."
# Where the temporary mount point may go, in order (the first writable one outside PATH).
TEMP_PARENTS = (tempfile.gettempdir(), "/run", "/dev/shm", "/var/tmp")


class BenchError(Exception):
    """One-line reason the benchmark cannot run."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """What the passes read, relative to the root."""

    large: str | None
    large_bytes: int
    small_dir: str | None
    small: tuple[str, ...]
    small_bytes: int


def walk(root: str, limit: int = MAX_WALK_ENTRIES) -> Iterator[tuple[str, int]]:
    """(path relative to *root*, size) of regular files, symlinks not followed, at most *limit* entries."""
    seen = 0
    stack = [""]
    while stack and seen < limit:
        rel_dir = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir)) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            seen += 1
            if seen > limit:
                break
            rel = os.path.join(rel_dir, entry.name)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
            elif stat.S_ISREG(st.st_mode):
                yield rel, st.st_size
        stack.extend(reversed(subdirs))


def choose(files: list[tuple[str, int]], small_max: int, large_bytes: int, small_files: int) -> Choice:
    """Pure: the largest file above *small_max*, and the small files of the directory with most of them."""
    large = max((f for f in files if f[1] > small_max), key=lambda f: (f[1], f[0]), default=None)
    by_dir: dict[str, list[tuple[str, int]]] = {}
    for rel, size in files:
        if 0 < size <= small_max:
            by_dir.setdefault(os.path.dirname(rel), []).append((rel, size))
    small_dir: str | None = None
    small: list[tuple[str, int]] = []
    if by_dir:
        small_dir, small = max(by_dir.items(), key=lambda kv: (len(kv[1]), kv[0]))
        small = sorted(small)[:small_files]
        if len(small) < MIN_SMALL_FILES:
            small_dir, small = None, []
    return Choice(
        large=large[0] if large else None,
        large_bytes=min(large[1], large_bytes) if large else 0,
        small_dir=small_dir,
        small=tuple(rel for rel, _ in small),
        small_bytes=sum(size for _, size in small),
    )


def speedup(direct: float | None, fastfs: float | None) -> float | None:
    """direct time / fastfs time (above 1: fastfs faster)."""
    if not direct or not fastfs:
        return None
    return direct / fastfs


def verdict(large: float | None, small: float | None, cold: bool) -> str:
    """Pure: one line from the speedups of the passes that decide (cold ones when caches were dropped)."""
    parts = [(name, x) for name, x in (("large files", large), ("small files", small)) if x is not None]
    if not parts:
        return "nothing to compare: no file of a measurable size was found"
    figures = ", ".join(f"{name} {x:.2f}x" for name, x in parts)
    if not cold:
        return (
            "caches were not dropped (--drop-caches, as root, runs the cold passes that decide; it empties the"
            f" page cache of the whole machine); hot passes only: {figures}"
        )
    wins = [(name, x) for name, x in parts if x >= GAIN]
    if not wins:
        return f"this storage is fast locally: fastfs gains nothing here ({figures})"
    text = "fastfs is " + " and ".join(
        f"{x:.1f}x faster on {name}" if i == 0 else f"{x:.1f}x on {name}" for i, (name, x) in enumerate(wins)
    )
    rest = [(name, x) for name, x in parts if x < GAIN]
    if rest:
        text += " here; " + ", ".join(f"{name}: no gain ({x:.2f}x)" for name, x in rest)
        return text
    return text + " here"


# -- measuring ------------------------------------------------------------------------------------
def read_large(path: str, nbytes: int) -> int:
    """Read the first *nbytes* of *path* in READ_SIZE reads; returns the bytes read."""
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    done = 0
    with open(path, "rb", buffering=0) as f:
        while done < nbytes:
            n = f.readinto(view[: min(READ_SIZE, nbytes - done)])
            if not n:
                break
            done += n
    return done


def read_small(root: str, files: tuple[str, ...]) -> int:
    """Open, read whole and close each file; returns the bytes read."""
    total = 0
    for rel in files:
        with open(os.path.join(root, rel), "rb") as f:
            total += len(f.read())
    return total


def crc_large(path: str, nbytes: int) -> int:
    crc = 0
    with open(path, "rb") as f:
        left = nbytes
        while left > 0 and (chunk := f.read(min(READ_SIZE, left))):
            crc = zlib.crc32(chunk, crc)
            left -= len(chunk)
    return crc


def crc_small(root: str, files: tuple[str, ...]) -> list[int]:
    out = []
    for rel in files:
        with open(os.path.join(root, rel), "rb") as f:
            out.append(zlib.crc32(f.read()))
    return out


def can_drop_caches() -> bool:
    return os.geteuid() == 0 and os.access(DROP_CACHES, os.W_OK)


def drop_caches() -> None:
    """Flush dirty pages, then drop the page cache, dentries and inodes of every mount."""
    os.sync()
    with open(DROP_CACHES, "w") as f:
        f.write("3\n")


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    n = fn()
    return time.perf_counter() - start, n


# -- the temporary mount --------------------------------------------------------------------------
def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def temp_dir(root: str) -> str:
    """A private temporary directory outside *root* (the mount point may not be inside the source)."""
    for parent in TEMP_PARENTS:
        real = os.path.realpath(parent)
        if os.path.isdir(real) and os.access(real, os.W_OK) and not _inside(real, root):
            return tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=real)
    raise BenchError(f"no writable temporary directory outside {root}")


class TempMount:
    """A background ``fastfs mount ROOT MNT`` with state and log in *work*; :meth:`close` unmounts."""

    def __init__(self, root: str, work: str, mount_args: list[str]) -> None:
        self.root = root
        self.mnt = os.path.join(work, "mnt")
        self.state = os.path.join(work, "state")
        self.log = os.path.join(work, "fastfs.log")
        self.mount_args = mount_args
        os.makedirs(self.mnt, exist_ok=True)
        os.makedirs(self.state, mode=0o700, exist_ok=True)
        self.mounted = False

    def open(self) -> None:
        cmd = [sys.executable, "-m", "fastfs", "mount", self.root, self.mnt, "--log-file", self.log]
        cmd += [*self.mount_args, "-o", f"state.dir={self.state}"]  # learned state never outside work
        env = {**os.environ, "STATE_DIRECTORY": self.state}
        try:
            r = subprocess.run(
                cmd, capture_output=True, text=True, timeout=MOUNT_TIMEOUT, env=env, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            self.mounted = True  # may have come up late: close() cleans up
            raise BenchError(f"fastfs mount did not return within {MOUNT_TIMEOUT:.0f}s (log: {self.log})") from None
        if r.returncode != 0:
            message = (r.stderr.strip().splitlines() or ["failed"])[-1].removeprefix("fastfs: error: ")
            raise BenchError(f"fastfs mount failed: {message}")
        self.mounted = True

    def stats_line(self) -> str:
        try:
            return summary_line(read_snapshot(self.mnt))
        except StatsError as e:
            return f"stats unavailable: {e}"

    def close(self) -> None:
        if not self.mounted:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [sys.executable, "-m", "fastfs", "umount", self.mnt],
                capture_output=True,
                timeout=MOUNT_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
        force_unmount(self.mnt)
        if find_mount(self.mnt) is None:
            self.mounted = False


# -- the run --------------------------------------------------------------------------------------
def _workloads(root: str, choice: Choice) -> dict[str, tuple[Callable[[str], int], int, int, str]]:
    """name -> (pass over a tree root returning bytes read, bytes expected, amount, unit of amount)."""
    out: dict[str, tuple[Callable[[str], int], int, int, str]] = {}
    if choice.large:
        large, nbytes = choice.large, choice.large_bytes
        out["large"] = (lambda top: read_large(os.path.join(top, large), nbytes), nbytes, nbytes, "bytes")
    if choice.small:
        files = choice.small
        out["small"] = (lambda top: read_small(top, files), choice.small_bytes, len(files), "files")
    return out


class Progress:
    """One line per pass on *out*: its label when it starts, its time and rate when it ends."""

    def __init__(self, out: TextIO | None, total: int) -> None:
        self.out = out
        self.total = total
        self.done = 0
        self.open = False  # a line was started and not ended

    def start(self, label: str) -> None:
        self.done += 1
        self.open = True
        if self.out is not None:
            self.out.write(f"fastfs bench: [{self.done}/{self.total}] {label}: ")
            self.out.flush()

    def end(self, text: str) -> None:
        self.open = False
        if self.out is not None:
            self.out.write(text + "\n")
            self.out.flush()


def _rate_text(seconds: float, amount: int, unit: str) -> str:
    if seconds <= 0:
        return f"{seconds:.2f} s"
    rate = f"{human_bytes(amount / seconds)}/s" if unit == "bytes" else f"{amount / seconds:,.0f} files/s"
    return f"{seconds:.2f} s, {rate}"


def _passes(
    top: str, side: str, workloads: dict, cold: bool, before_cold: Callable[[], None], progress: Progress
) -> dict[str, dict]:
    """Time each workload over *top*: cold (after *before_cold*) when possible, then hot."""
    result: dict[str, dict] = {}
    for name, (fn, expected, amount, unit) in workloads.items():
        what = "large file" if name == "large" else "small files"
        times: dict[str, float | None] = {"cold": None}
        if cold:
            progress.start(f"{side}, {what}, cold")
            before_cold()
            seconds, n = timed(functools.partial(fn, top))
            _check_bytes(name, n, expected)
            times["cold"] = seconds
            progress.end(_rate_text(seconds, amount, unit))
        else:
            progress.start(f"{side}, {what}, warm-up")
            seconds, n = timed(functools.partial(fn, top))
            _check_bytes(name, n, expected)
            progress.end(_rate_text(seconds, amount, unit) + " (untimed)")
        progress.start(f"{side}, {what}, hot")
        seconds, n = timed(functools.partial(fn, top))
        _check_bytes(name, n, expected)
        times["hot"] = seconds
        progress.end(_rate_text(seconds, amount, unit))
        result[name] = times
    return result


def _check_bytes(name: str, got: int, expected: int) -> None:
    if got != expected:
        raise BenchError(f"{name} pass read {got} bytes, expected {expected} (did the data change during the run?)")


def run(
    path: str,
    large_bytes: int = DEFAULT_LARGE_BYTES,
    small_files: int = DEFAULT_SMALL_FILES,
    mount_args: list[str] | None = None,
    small_max: int | None = None,
    progress: TextIO | None = None,
    drop: bool = False,
) -> dict[str, Any]:
    """Measure and return the result document (the ``--json`` schema); *drop*: cold passes after
    dropping the machine's page cache (root only); *progress*: where the per-pass lines go."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BenchError(f"{path} does not exist") from None
    except OSError as e:
        raise BenchError(f"{path}: {e.strerror}") from None
    if small_max is None:
        small_max = ReadaheadConfig().small_file_max
    real = os.path.realpath(path)
    entry = containing_mount(real)
    if is_fastfs(entry):
        assert entry is not None
        raise BenchError(
            f"{path} is on the fastfs mount {entry.mountpoint}: fastfs over fastfs measures nothing; bench the"
            f" storage under it ({entry.source.removeprefix('fastfs:')})"
        )
    if drop and not can_drop_caches():
        raise BenchError("--drop-caches needs root (it writes /proc/sys/vm/drop_caches)")
    if stat.S_ISDIR(st.st_mode):
        root = real
        files = list(walk(root))
    elif stat.S_ISREG(st.st_mode):
        root = os.path.dirname(real)
        files = [(os.path.basename(real), st.st_size)]
        small_max = min(small_max, st.st_size - 1)  # a single file is the large-file workload
    else:
        raise BenchError(f"{path} is neither a directory nor a regular file")
    if not os.access(root, os.R_OK | os.X_OK):
        raise BenchError(f"{path}: permission denied")
    choice = choose(files, small_max, large_bytes, small_files)
    workloads = _workloads(root, choice)
    if not workloads:
        raise BenchError(f"{path} has no file to measure (no large file and fewer than {MIN_SMALL_FILES} small ones)")
    cold = drop
    work = temp_dir(root)
    mount = TempMount(root, work, list(mount_args or []))
    steps = Progress(progress, total=2 * 2 * len(workloads) + 2)
    try:
        direct = _passes(root, "direct", workloads, cold, drop_caches, steps)
        steps.start("mounting fastfs")
        started = time.perf_counter()
        mount.open()
        steps.end(f"{time.perf_counter() - started:.2f} s")
        via = _passes(mount.mnt, "fastfs", workloads, cold, drop_caches, steps)
        steps.start("verifying the bytes read through fastfs")
        _verify(root, mount.mnt, choice)
        steps.end("same bytes")
        stats_line = mount.stats_line()
    except BaseException:
        if steps.open:
            steps.end("failed")  # the error's own line follows on a line of its own
        raise
    finally:
        mount.close()
        if not mount.mounted:
            shutil.rmtree(work, ignore_errors=True)
    doc: dict[str, Any] = {"path": real, "root": os.geteuid() == 0, "caches_dropped": cold}
    for name, unit, amount, what in (
        ("large", "bytes", choice.large_bytes, {"file": choice.large}),
        ("small", "files", len(choice.small), {"dir": choice.small_dir, "bytes": choice.small_bytes}),
    ):
        if name not in workloads:
            doc[name] = None
            continue
        row: dict[str, Any] = {**what, "unit": unit, "amount": amount}
        for side, times in (("direct", direct[name]), ("fastfs", via[name])):
            row[side] = {
                phase: None if s is None else {"seconds": round(s, 6), "per_second": amount / s if s > 0 else None}
                for phase, s in times.items()
            }
        row["speedup"] = {p: speedup(direct[name][p], via[name][p]) for p in ("cold", "hot")}
        doc[name] = row
    basis = "cold" if cold else "hot"
    doc["verdict"] = verdict(
        doc["large"]["speedup"][basis] if doc["large"] else None,
        doc["small"]["speedup"][basis] if doc["small"] else None,
        cold,
    )
    doc["fastfs_stats"] = stats_line
    return doc


def _verify(root: str, mnt: str, choice: Choice) -> None:
    if choice.large and crc_large(os.path.join(root, choice.large), choice.large_bytes) != crc_large(
        os.path.join(mnt, choice.large), choice.large_bytes
    ):
        raise BenchError(f"{choice.large}: bytes read through fastfs differ from the source")
    if choice.small and crc_small(root, choice.small) != crc_small(mnt, choice.small):
        raise BenchError(f"{choice.small_dir or '.'}: small files read through fastfs differ from the source")


# -- presenting -----------------------------------------------------------------------------------
def _rate(cell: dict | None, unit: str) -> str:
    if not cell or not cell.get("per_second"):
        return "-"
    v = cell["per_second"]
    return f"{human_bytes(v)}/s" if unit == "bytes" else f"{v:,.0f} files/s"


def format_table(doc: dict[str, Any]) -> str:
    lines = [f"fastfs bench {doc['path']}"]
    if doc["caches_dropped"]:
        lines.append("cold passes: page cache dropped and a fresh fastfs mount before each; hot: the next pass")
    else:
        lines.append("caches were not dropped (no --drop-caches): only hot passes, after a warm-up, were measured")
    if doc["large"]:
        lines.append(f"large file:  {doc['large']['file']}, {human_bytes(doc['large']['amount'])} in 1 MiB reads")
    if doc["small"]:
        s = doc["small"]
        lines.append(f"small files: {s['amount']} files of {s['dir'] or '.'} ({human_bytes(s['bytes'])} in all)")
    lines.append("")
    header = ("", "direct", "fastfs", "speedup")
    rows = []
    for name in ("large", "small"):
        entry = doc[name]
        if not entry:
            continue
        for phase in ("cold", "hot"):
            if entry["direct"][phase] is None:
                continue
            x = entry["speedup"][phase]
            rows.append(
                (
                    f"{name} files, {phase}" if name == "small" else f"large file, {phase}",
                    _rate(entry["direct"][phase], entry["unit"]),
                    _rate(entry["fastfs"][phase], entry["unit"]),
                    "-" if x is None else f"{x:.2f}x",
                )
            )
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(4)]
    for row in (header, *rows):
        lines.append(
            "  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)])
        )
    lines += ["", f"fastfs stats: {doc['fastfs_stats']}", f"verdict: {doc['verdict']}"]
    return "\n".join(lines)


def main(args: Any) -> int:
    """Entry of ``fastfs bench`` (args: path, large_bytes, small_files, json, drop_caches, options, profile,
    config)."""
    mount_args: list[str] = []
    if args.config:
        mount_args += ["--config", os.path.abspath(args.config)]
    if args.profile:
        mount_args += ["--profile", args.profile]
    for opt in args.options:
        mount_args += ["-o", opt]
    small_max = _small_max(args)
    progress = None if args.json else sys.stderr
    drop = bool(getattr(args, "drop_caches", False))
    doc = run(args.path, args.large_bytes, args.small_files, mount_args, small_max, progress, drop)
    print(json.dumps(doc, indent=2) if args.json else format_table(doc))
    return 0


def _small_max(args: Any) -> int:
    """readahead.small_file_max of the config the mount will use (the split between the workloads)."""
    overrides: dict[str, Any] = parse_overrides(args.options)
    if args.profile:
        overrides["profile"] = args.profile
    return load_config(os.path.abspath(args.config) if args.config else None, overrides).readahead.small_file_max
