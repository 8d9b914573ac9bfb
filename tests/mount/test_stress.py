"""Bounded stress test: many processes x threads reading one mount, every byte verified.

Several reader processes, each with several threads, run for ``FASTFS_STRESS_SECONDS`` (default 20)
over a mixed tree through one mount with a small cache budget (so eviction and prefetch
back-pressure happen all the time). Each thread mixes:
- sequential whole-file reads of large files with varying buffer sizes,
- random preads of large files,
- in-order scans of runs of small files (what triggers small-file scans),
- whole reads of medium files.
Every read is compared with a pread of the same range of the source. A watchdog thread in each
process aborts the process if any single read takes longer than ``OP_TIMEOUT`` (deadlock), and the
parent bounds each process with a timeout.

At the end, after the readers exit, the engine's invariants are checked through its stats:
cache_bytes <= cache_budget (sampled throughout and at the end), no in-flight blocks, no open files,
and the daemon's descriptor count back at its baseline. The counts of verified reads are printed
(``pytest -s`` shows them).

Run as ``python test_stress.py worker CONFIG_JSON`` this file is the reader process.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

KIB = 1024
MIB = 1024 * KIB
# Seconds of load; lengthen for benchmarks with FASTFS_STRESS_SECONDS.
DEFAULT_SECONDS = 20.0
STRESS_SECONDS = float(os.environ.get("FASTFS_STRESS_SECONDS", DEFAULT_SECONDS))
# Reader processes x threads (2 shared cores: enough concurrency to interleave every path).
PROCESSES = 3
THREADS_PER_PROCESS = 4
# Cache budget of the mount: small, so the tree does not fit and blocks are evicted constantly.
BUDGET = 64 * MIB
# The mixed tree.
LARGE_FILES = 4
LARGE_SIZE = 24 * MIB + 4097  # odd size: the last block is partial
MEDIUM_FILES = 60
MEDIUM_MAX = 3 * MIB
SMALL_DIRS = 3
SMALL_PER_DIR = 300
SMALL_MAX = 16 * KIB
# Share of opens that first drop the mount's page cache of the file, so reads reach the daemon
# instead of being served by the kernel from pages of an earlier pass.
EVICT_FRACTION = 0.7
# Longest a single read may take before the worker declares a deadlock.
OP_TIMEOUT = 60.0
# Extra time a worker process gets beyond the load duration before it is killed.
PROCESS_GRACE = 240.0
# After the load: bound on reaching quiescence (in-flight fetches finished, handles released).
QUIESCE_BOUND = 30.0
# Daemon descriptors allowed above the baseline after quiescence.
FD_SLACK = 8
# Period of the parent's stats sampling (gauge invariants during the load).
STATS_SAMPLE_SECONDS = 0.5
# Errors kept verbatim in a worker's report.
MAX_REPORTED_ERRORS = 10


# -- tree -------------------------------------------------------------------------------------------


def _build_tree(src: Path) -> dict:
    rng = random.Random(2024)
    large = []
    (src / "large").mkdir()
    for i in range(LARGE_FILES):
        name = f"large/l{i}.bin"
        with open(src / name, "wb") as f:
            remaining = LARGE_SIZE + i * 12345
            while remaining:
                n = min(remaining, 8 * MIB)
                f.write(rng.randbytes(n))
                remaining -= n
        large.append(name)
    medium = []
    (src / "medium").mkdir()
    for i in range(MEDIUM_FILES):
        name = f"medium/m{i:03d}.bin"
        (src / name).write_bytes(rng.randbytes(rng.randrange(64 * KIB, MEDIUM_MAX)))
        medium.append(name)
    small_dirs = []
    for d in range(SMALL_DIRS):
        dname = f"small{d}"
        (src / dname).mkdir()
        names = []
        for i in range(SMALL_PER_DIR):
            name = f"{dname}/s{i:04d}.bin"
            (src / name).write_bytes(rng.randbytes(rng.randrange(0, SMALL_MAX)))
            names.append(name)
        small_dirs.append(names)
    return {"large": large, "medium": medium, "small_dirs": small_dirs}


# -- worker process ------------------------------------------------------------------------------------


class _Worker:
    """One reader process: threads reading through the mount, verifying against the source."""

    def __init__(self, cfg: dict) -> None:
        self.mnt = Path(cfg["mnt"])
        self.src = Path(cfg["src"])
        self.tree = cfg["tree"]
        self.deadline = time.monotonic() + cfg["seconds"]
        self.seed = cfg["seed"]
        self.lock = threading.Lock()
        self.counts = {"reads": 0, "bytes": 0, "files": 0, "seq": 0, "random": 0, "scan": 0, "medium": 0}
        self.mismatches: list[str] = []
        self.errors: list[str] = []
        self.error_count = 0
        self.started: dict[int, tuple[float, str]] = {}  # thread index -> (start, what)

    # one verified read through the mount
    def _check(self, k: int, fd: int, sfd: int, size: int, offset: int, name: str) -> int:
        self.started[k] = (time.monotonic(), f"{name} pread({size}, {offset})")
        got = os.pread(fd, size, offset)
        self.started.pop(k, None)
        want = os.pread(sfd, size, offset)
        with self.lock:
            self.counts["reads"] += 1
            self.counts["bytes"] += len(got)
            if got != want:
                self.mismatches.append(f"{name} pread({size}, {offset}): {len(got)} bytes vs {len(want)}")
        return len(got)

    def _open_pair(self, name: str, rng: random.Random) -> tuple[int, int]:
        fd = os.open(self.mnt / name, os.O_RDONLY)
        try:
            if rng.random() < EVICT_FRACTION:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            return fd, os.open(self.src / name, os.O_RDONLY)
        except BaseException:
            os.close(fd)
            raise

    def _whole(self, k: int, rng: random.Random, name: str, bufsize: int) -> None:
        fd, sfd = self._open_pair(name, rng)
        try:
            size = os.fstat(sfd).st_size
            off = 0
            while True:
                n = self._check(k, fd, sfd, bufsize, off, name)
                off += n
                if n == 0:
                    break
            if off != size:
                with self.lock:
                    self.mismatches.append(f"{name}: read {off} bytes, source has {size}")
        finally:
            os.close(fd)
            os.close(sfd)
        with self.lock:
            self.counts["files"] += 1

    def _random(self, k: int, rng: random.Random, name: str) -> None:
        fd, sfd = self._open_pair(name, rng)
        try:
            size = os.fstat(sfd).st_size
            for _ in range(rng.randrange(10, 60)):
                off = rng.randrange(0, size + 10)
                self._check(k, fd, sfd, rng.choice((4096, 65536, 131072, rng.randrange(1, 3 * MIB))), off, name)
        finally:
            os.close(fd)
            os.close(sfd)

    def _thread(self, k: int) -> None:
        rng = random.Random(self.seed * 1000 + k)
        while time.monotonic() < self.deadline:
            op = rng.random()
            try:
                if op < 0.25:
                    self._whole(k, rng, rng.choice(self.tree["large"]), rng.choice((65536, 131072, MIB, 4 * MIB + 5)))
                    kind = "seq"
                elif op < 0.5:
                    self._random(k, rng, rng.choice(self.tree["large"]))
                    kind = "random"
                elif op < 0.8:
                    names = rng.choice(self.tree["small_dirs"])
                    start = rng.randrange(0, len(names))
                    for name in names[start : start + rng.randrange(5, 60)]:
                        self._whole(k, rng, name, 128 * KIB)
                        if time.monotonic() > self.deadline:
                            break
                    kind = "scan"
                else:
                    self._whole(k, rng, rng.choice(self.tree["medium"]), rng.choice((4096, 65536, 1 << 20)))
                    kind = "medium"
                with self.lock:
                    self.counts[kind] += 1
            except OSError as e:
                self.started.pop(k, None)
                with self.lock:
                    self.error_count += 1
                    if len(self.errors) < MAX_REPORTED_ERRORS:
                        self.errors.append(f"{errno.errorcode.get(e.errno, e.errno)}: {e}")

    def _watchdog(self) -> None:
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            for k, (t0, what) in list(self.started.items()):
                if now - t0 > OP_TIMEOUT:
                    print(json.dumps({"deadlock": f"thread {k}: {what} running for {now - t0:.0f}s"}), flush=True)
                    os._exit(3)

    def run(self, threads: int) -> dict:
        threading.Thread(target=self._watchdog, daemon=True).start()
        ts = [threading.Thread(target=self._thread, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return {
            **self.counts,
            "mismatches": self.mismatches[:MAX_REPORTED_ERRORS],
            "mismatch_count": len(self.mismatches),
            "errors": self.errors,
            "error_count": self.error_count,
        }


# -- the test -------------------------------------------------------------------------------------------


class _GaugeSampler(threading.Thread):
    def __init__(self, m) -> None:
        super().__init__(daemon=True)
        self.m = m
        self.stop = threading.Event()
        self.samples = 0
        self.violations: list[dict] = []

    def run(self) -> None:
        while not self.stop.wait(STATS_SAMPLE_SECONDS):
            try:
                g = self.m.stats().get("gauges", {})
            except (OSError, ValueError):
                continue
            self.samples += 1
            if "cache_bytes" in g and "cache_budget" in g and g["cache_bytes"] > g["cache_budget"]:
                self.violations.append(g)


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.slow
def test_stress_mixed_readers(src: Path, mnt: Path) -> None:
    from conftest import mounted

    tree = _build_tree(src)
    with mounted(src, mnt, options=[f"cache.budget={BUDGET}"]) as m:
        assert (m.mnt / tree["medium"][0]).read_bytes() == (src / tree["medium"][0]).read_bytes()
        m.stats()
        baseline_fds = _fd_count(m.pid)
        sampler = _GaugeSampler(m)
        sampler.start()
        procs = []
        reports = []
        try:
            for i in range(PROCESSES):
                cfg = {"mnt": str(m.mnt), "src": str(src), "tree": tree, "seconds": STRESS_SECONDS, "seed": i}
                procs.append(
                    subprocess.Popen(
                        [sys.executable, os.path.abspath(__file__), "worker", json.dumps(cfg)],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )
            for p in procs:
                try:
                    out, err = p.communicate(timeout=STRESS_SECONDS + PROCESS_GRACE)
                except subprocess.TimeoutExpired:
                    pytest.fail("a stress worker did not finish (deadlock?)")
                last = out.strip().splitlines()[-1] if out.strip() else "{}"
                assert p.returncode == 0, f"worker exited {p.returncode}: {last} {err[-2000:]}"
                reports.append(json.loads(last))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
            sampler.stop.set()
            sampler.join(10)

        total = {k: sum(r[k] for r in reports) for k in ("reads", "bytes", "files", "seq", "random", "scan", "medium")}
        mismatches = sum(r["mismatch_count"] for r in reports)
        errors = sum(r["error_count"] for r in reports)
        print(
            f"\nstress {STRESS_SECONDS:.0f}s, {PROCESSES} processes x {THREADS_PER_PROCESS} threads: "
            f"{total['reads']} reads verified ({total['bytes'] / MIB:.0f} MiB), {total['files']} whole files, "
            f"ops seq={total['seq']} random={total['random']} scan={total['scan']} medium={total['medium']}; "
            f"mismatches={mismatches} errors={errors}"
        )
        assert mismatches == 0, [r["mismatches"] for r in reports]
        assert errors == 0, [r["errors"] for r in reports]
        assert total["reads"] > 0 and total["seq"] > 0 and total["random"] > 0 and total["scan"] > 0

        # invariants after quiescence
        deadline = time.monotonic() + QUIESCE_BOUND
        while True:
            snap = m.stats()
            g = snap["gauges"]
            quiet = g.get("inflight_blocks", 0) == 0 and g.get("open_files", 0) == 0
            fds = _fd_count(m.pid)
            if (quiet and fds <= baseline_fds + FD_SLACK) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        print(
            f"gauges after quiescence: {json.dumps(g, sort_keys=True)}; daemon fds {fds} (baseline {baseline_fds}); "
            f"counters: {json.dumps(snap['counters'], sort_keys=True)}; errors: {snap['errors']}"
        )
        assert sampler.violations == [], sampler.violations[:3]
        assert g["cache_budget"] == BUDGET, g
        assert g["cache_bytes"] <= g["cache_budget"], g
        assert g["inflight_blocks"] == 0, g
        assert g["open_files"] == 0, g
        assert fds <= baseline_fds + FD_SLACK
        assert snap["errors"] == {}, snap["errors"]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        print(json.dumps(_Worker(json.loads(sys.argv[2])).run(THREADS_PER_PROCESS)), flush=True)
    else:
        sys.exit("usage: test_stress.py worker CONFIG_JSON")
