"""Reliability of a fastfs mount when the source misbehaves, changes, or the daemon dies.

- Source errors (faultfs, see ``faultfs.py``, as SRC): an EIO from the source reaches the reader of
  that file only; other files keep reading; once the fault is gone the same file reads correctly
  (errors are never cached as data); the error is counted in stats. A source that hangs makes the
  read fail after ``readahead.read_timeout`` instead of hanging, and the daemon keeps serving.
- Never stale: a source file rewritten, replaced, truncated or extended is read correctly on the
  next open (close-to-open); a deleted file disappears within the entry/attr timeouts.
- Memory: reading far more data than the cache budget keeps the daemon's RSS bounded.
- Daemon death: SIGKILL during heavy reads gives readers errors, not hangs; ``fastfs umount``
  recovers the mountpoint and a new mount works at once.
- Descriptors: the daemon's fd count returns to its baseline after many opens and closes.

No timing assertions: bounds below are only there so a broken daemon fails the test instead of
hanging the run. Readers that may block run in subprocesses with timeouts or in threads joined with
a bound.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import mounted, rand_bytes, run_cli, wait_for
from faultfs import faultfs_mounted, is_mounted

KIB = 1024
MIB = 1024 * KIB
# Source read timeout of the hanging-source test.
READ_TIMEOUT_SECONDS = 3
# A read of a hanging source must fail within this bound (10x the timeout: the machine is shared).
HANG_READ_BOUND = 45.0
# Bound on a reader subprocess or thread whose source works.
READER_TIMEOUT = 120.0
# Kernel entry/attr cache timeouts of the deletion test, and how long a deletion may take to show.
ENTRY_ATTR_TIMEOUT = 1
DELETE_VISIBLE_BOUND = 10.0
# Cache budget of the memory test, and the data read through it.
MEMORY_BUDGET = 64 * MIB
MEMORY_SEQ_BYTES = 1024 * MIB  # 16x the budget, read sequentially (twice)
MEMORY_SMALL_FILES = 2000
MEMORY_SMALL_SIZE = 32 * KIB
# Allowed RSS growth above baseline + budget: Python allocator slack, thread stacks, FUSE buffers
# (1 MiB per libfuse worker), per-file bookkeeping of 2000 files.
RSS_MARGIN = 150 * MIB
# RSS sampling period.
RSS_SAMPLE_SECONDS = 0.05
# Daemon death test: reader threads, data read before the kill, bound on readers noticing.
DEATH_READERS = 6
DEATH_READ_BEFORE_KILL = 64 * MIB
DEATH_JOIN_BOUND = 60.0
# errnos a reader of a killed daemon may get.
DEAD_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO)
# fd leak test: opens of the workload, allowed slack over baseline, bound on returning to it.
FD_WORKLOAD_FILES = 300
FD_SLACK = 8
QUIESCE_BOUND = 20.0
# Sleep between two source changes so even a coarse (pre-multigrain) kernel timestamp moves.
MTIME_TICK = 0.02


def _errname(code: int | None) -> str:
    return errno.errorcode.get(code or 0, str(code))


def _read_file(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _bounded(fn, timeout: float):
    """Run *fn* in a daemon thread; return its result or raise its exception; fail if it does not end."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"operation did not finish within {timeout}s (hang)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


_READER = """
import errno, json, os, sys, time
t0 = time.monotonic()
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
except OSError as e:
    print(json.dumps({"stage": "open", "errno": errno.errorcode.get(e.errno, str(e.errno)),
                      "seconds": time.monotonic() - t0}))
    sys.exit(0)
try:
    data = os.pread(fd, int(sys.argv[2]), 0)
    print(json.dumps({"stage": "read", "errno": None, "n": len(data), "seconds": time.monotonic() - t0}))
except OSError as e:
    print(json.dumps({"stage": "read", "errno": errno.errorcode.get(e.errno, str(e.errno)),
                      "seconds": time.monotonic() - t0}))
finally:
    os.close(fd)
"""


def _read_in_subprocess(path: Path, size: int, timeout: float) -> dict:
    """open + pread in a child process; a hang ends in a failed assertion, never a hung run."""
    try:
        p = subprocess.run(
            [sys.executable, "-c", _READER, str(path), str(size)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading {path} did not finish within {timeout}s")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# -- source faults ------------------------------------------------------------------------------------


@pytest.fixture
def faulty(tmp_path: Path):
    """backing dir -> faultfs mount (used as SRC) -> yields (faultfs, backing, faultsrc, mnt, data)."""
    backing, faultsrc, mnt = tmp_path / "backing", tmp_path / "faultsrc", tmp_path / "mnt"
    for d in (backing, faultsrc, mnt):
        d.mkdir()
    data = {
        "bad.bin": rand_bytes(2 * MIB + 5, 1),
        "good.bin": rand_bytes(2 * MIB + 7, 2),
        "slow.bin": rand_bytes(3 * MIB, 3),
        "dir/one.txt": b"one\n" * 1000,
        "dir/two.bin": rand_bytes(70_000, 4),
    }
    (backing / "dir").mkdir()
    for name, payload in data.items():
        (backing / name).write_bytes(payload)
    with faultfs_mounted(backing, faultsrc, tmp_path / "faultfs-work") as fs:
        yield fs, faultsrc, mnt, data


def test_source_eio_reaches_reader_only_and_is_not_cached(faulty) -> None:
    fs, faultsrc, mnt, data = faulty
    with mounted(faultsrc, mnt) as m:
        fs.set(eio=["/bad*"])
        r = _read_in_subprocess(m.mnt / "bad.bin", 1 * MIB, READER_TIMEOUT)
        assert r["stage"] == "read", f"open failed with {r['errno']}; only the read should fail"
        assert r["errno"] == "EIO", r
        # other files keep reading correctly while the fault is active
        for name in ("good.bin", "dir/one.txt", "dir/two.bin"):
            assert _bounded(lambda n=name: _read_file(m.mnt / n), READER_TIMEOUT) == data[name], name
        # a second attempt still fails (the fault is still there), and does not hang
        r = _read_in_subprocess(m.mnt / "bad.bin", 4096, READER_TIMEOUT)
        assert r["errno"] == "EIO", r
        errors = m.stats()["errors"]
        assert errors.get("EIO", 0) >= 1, errors
        assert m.stats()["counters"]["pread_errors"] >= 1
        # fault cleared: the same file now reads correctly (the error was not cached as data)
        fs.clear()
        assert _bounded(lambda: _read_file(m.mnt / "bad.bin"), READER_TIMEOUT) == data["bad.bin"]
        fd = os.open(m.mnt / "bad.bin", os.O_RDONLY)
        try:
            assert os.pread(fd, 4096, MIB) == data["bad.bin"][MIB : MIB + 4096]
        finally:
            os.close(fd)


# Mid-stream fault: a file larger than the prefetch window, read partly before the fault appears.
MIDSTREAM_SIZE = 48 * MIB
MIDSTREAM_WINDOW = 16 * MIB
MIDSTREAM_BEFORE = 2 * MIB


def test_source_eio_mid_stream_never_served_as_data(faulty) -> None:
    """Prefetch that fails must not become data: bytes before the error are right, then EIO."""
    fs, faultsrc, mnt, data = faulty
    payload = rand_bytes(MIDSTREAM_SIZE, 90)
    (fs.backing / "stream.bin").write_bytes(payload)
    opts = [f"readahead.max_window={MIDSTREAM_WINDOW}"]
    with mounted(faultsrc, mnt, options=opts) as m:

        def read_until_error() -> tuple[int, str | None]:
            pos = 0
            with open(m.mnt / "stream.bin", "rb", buffering=0) as f:
                while pos < MIDSTREAM_BEFORE:
                    chunk = f.read(256 * KIB)
                    assert chunk == payload[pos : pos + len(chunk)], f"bytes differ at {pos}"
                    pos += len(chunk)
                fs.set(eio=["/stream.bin"])
                try:
                    while True:
                        chunk = f.read(MIB)
                        if not chunk:
                            return pos, None
                        assert chunk == payload[pos : pos + len(chunk)], f"wrong bytes at {pos} after the fault"
                        pos += len(chunk)
                except OSError as e:
                    return pos, _errname(e.errno)

        pos, err = _bounded(read_until_error, READER_TIMEOUT)
        print(f"mid-stream fault: {pos / MIB:.1f} MiB correct bytes, then {err}")
        assert err == "EIO", f"read {pos} bytes of {MIDSTREAM_SIZE} without the injected error"
        assert pos < MIDSTREAM_SIZE
        fs.clear()
        assert _bounded(lambda: _read_file(m.mnt / "stream.bin"), READER_TIMEOUT) == payload


def test_source_eio_on_small_file_scan(faulty) -> None:
    """A failing file in a directory being scanned fails alone; its neighbours read correctly."""
    fs, faultsrc, mnt, data = faulty
    scan = fs.backing / "scan"
    scan.mkdir()
    files = {f"s{i:02d}.bin": rand_bytes(5000 + i, 100 + i) for i in range(12)}
    for name, payload in files.items():
        (scan / name).write_bytes(payload)
    with mounted(faultsrc, mnt) as m:
        fs.set(eio=["/scan/s05.bin"])
        for name, payload in files.items():
            if name == "s05.bin":
                with pytest.raises(OSError) as ei:
                    _bounded(lambda: _read_file(m.mnt / "scan" / "s05.bin"), READER_TIMEOUT)
                assert ei.value.errno == errno.EIO
            else:
                assert _bounded(lambda n=name: _read_file(m.mnt / "scan" / n), READER_TIMEOUT) == payload, name
        fs.clear()
        assert _bounded(lambda: _read_file(m.mnt / "scan" / "s05.bin"), READER_TIMEOUT) == files["s05.bin"]


def test_hanging_source_times_out(faulty) -> None:
    fs, faultsrc, mnt, data = faulty
    with mounted(faultsrc, mnt, options=[f"readahead.read_timeout={READ_TIMEOUT_SECONDS}"]) as m:
        try:
            fs.set(hang=["/slow.bin"])
            r = _read_in_subprocess(m.mnt / "slow.bin", 1 * MIB, HANG_READ_BOUND)
            print(f"read of a hanging source: {r}")
            assert r["errno"] in ("EIO", "ETIMEDOUT"), r
            # the daemon still serves other files while the source read is stuck
            for name in ("good.bin", "dir/two.bin"):
                assert _bounded(lambda n=name: _read_file(m.mnt / n), READER_TIMEOUT) == data[name], name
            snap = m.stats()
            assert snap["counters"]["read_timeouts"] >= 1, snap["counters"]
            assert snap["errors"].get("ETIMEDOUT", 0) + snap["errors"].get("EIO", 0) >= 1, snap["errors"]
            # a second reader of the same stuck file is bounded too
            r = _read_in_subprocess(m.mnt / "slow.bin", 4096, HANG_READ_BOUND)
            assert r["errno"] in ("EIO", "ETIMEDOUT"), r
        finally:
            fs.clear()
        # source answers again: the file reads correctly (the timeout was not cached as data)
        assert _bounded(lambda: _read_file(m.mnt / "slow.bin"), READER_TIMEOUT) == data["slow.bin"]
        assert _bounded(lambda: _read_file(m.mnt / "good.bin"), READER_TIMEOUT) == data["good.bin"]


# A reader that keeps its handle: random 4 KiB preads of distinct pages of the file's first half, then
# one more per line read from stdin, from its second half, each far from any other (so the loop, which
# answers such reads itself once the engine handed the handle over, never sends it back to the engine
# as the start of a stream); one JSON line per step.
_HANDLE_READER = """
import errno, hashlib, json, os, random, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
half = int(sys.argv[2]) // 4096 // 2
for page in random.Random(7).sample(range(half - 64), int(sys.argv[3])):
    os.pread(fd, 4096, page * 4096)
print(json.dumps({"ready": True}), flush=True)
for page, line in zip(range(half + 64, 2 * half, 64), sys.stdin):
    t0 = time.monotonic()
    try:
        data = os.pread(fd, 4096, page * 4096)
        out = {"errno": None, "offset": page * 4096, "sha": hashlib.sha256(data).hexdigest()}
    except OSError as e:
        out = {"errno": errno.errorcode.get(e.errno, str(e.errno))}
    out["seconds"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)
"""
# Random reads the handle reader makes before the source hangs.
HANDLE_READS = 300


def test_hanging_source_bounds_the_reads_the_loop_answers(faulty) -> None:
    """A handle whose random reads the native loop answers itself (fuse.direct_reads): when its file
    hangs at the source, a read fails after the read timeout instead of hanging, other files keep
    reading, and once the source answers the same handle reads the right bytes again."""
    from fastfs.daemon.kernel import session

    if session.native_loop is None:
        pytest.skip("the native request loop is not built (no C compiler at install)")
    fs, faultsrc, mnt, data = faulty
    slow = data["slow.bin"]
    options = [f"readahead.read_timeout={READ_TIMEOUT_SECONDS}", "readahead.source_shape=parallel"]
    with mounted(faultsrc, mnt, options=options) as m:
        reader = subprocess.Popen(
            [sys.executable, "-c", _HANDLE_READER, str(m.mnt / "slow.bin"), str(len(slow)), str(HANDLE_READS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert reader.stdin is not None and reader.stdout is not None

        def step() -> dict:
            reader.stdin.write("next\n")
            reader.stdin.flush()
            return json.loads(reader.stdout.readline())

        try:
            assert _bounded(lambda: json.loads(reader.stdout.readline()), READER_TIMEOUT) == {"ready": True}
            snap = m.stats()
            assert snap["counters"]["reads_direct"] > 0 and snap["kernel"]["direct_handles"] == 1, snap["kernel"]
            fs.set(hang=["/slow.bin"])
            try:
                r = _bounded(step, HANG_READ_BOUND)
                assert r["errno"] in ("EIO", "ETIMEDOUT"), r
                # the handle goes back to the engine and the read counts as stuck there (the watchdog
                # tells the adapter before it answers the request: the kernel's retry of the page, sent
                # the moment the answer arrives, fails at once, and the count stays at one)
                assert wait_for(lambda: m.stats()["kernel"]["direct_handles"] == 0, 10)
                assert wait_for(lambda: m.stats()["counters"]["read_timeouts"] == 1, 10)
                # its next read fails at once (the file is stuck), not after another timeout
                r = _bounded(step, HANG_READ_BOUND)
                assert r["errno"] == "EIO" and r["seconds"] < READ_TIMEOUT_SECONDS, r
                for name in ("good.bin", "dir/two.bin"):
                    assert _bounded(lambda n=name: _read_file(m.mnt / n), READER_TIMEOUT) == data[name], name
            finally:
                fs.clear()
            r = _bounded(step, READER_TIMEOUT)
            assert r["errno"] is None and r["sha"] == hashlib.sha256(slow[r["offset"] : r["offset"] + 4096]).hexdigest()
        finally:
            reader.kill()
            reader.wait(10)


# -- never stale --------------------------------------------------------------------------------------

# Big enough to span several cache blocks and a prefetch window.
STALE_SIZE = 9 * MIB + 123


def _held_view(fd: int, old: bytes, new: bytes) -> str:
    """Describe what a handle opened before a change reads after it (documentation only)."""
    try:
        got = _bounded(lambda: os.pread(fd, max(len(old), len(new)) + MIB, 0), READER_TIMEOUT)
    except OSError as e:
        return f"error {_errname(e.errno)}"
    if got == new:
        what = "the new version"
    elif got == old:
        what = "the old version"
    elif got == old[: len(got)]:
        what = "a prefix of the old version"
    elif got == new[: len(got)]:
        what = "a prefix of the new version"
    else:
        what = "a mix of old and new bytes"
    return f"{len(got)} bytes ({what}; old {len(old)}, new {len(new)})"


@pytest.mark.parametrize("change", ["rewrite_in_place", "replace_by_rename", "truncate", "extend"])
def test_never_stale_on_next_open(src: Path, mnt: Path, change: str) -> None:
    old = rand_bytes(STALE_SIZE, 10)
    (src / "f.bin").write_bytes(old)
    if change == "rewrite_in_place":
        new = rand_bytes(STALE_SIZE, 11)
    elif change == "replace_by_rename":
        new = rand_bytes(STALE_SIZE - 1000, 12)
    elif change == "truncate":
        new = old[: 3 * MIB + 1]
    else:
        new = old + rand_bytes(5 * MIB + 3, 13)
    with mounted(src, mnt) as m:
        # read twice so the old version is in every cache (fastfs blocks, kernel pages)
        assert _read_file(m.mnt / "f.bin") == old
        assert _read_file(m.mnt / "f.bin") == old
        held = os.open(m.mnt / "f.bin", os.O_RDONLY)
        try:
            assert os.pread(held, 4096, 0) == old[:4096]
            time.sleep(MTIME_TICK)
            if change == "rewrite_in_place":
                with open(src / "f.bin", "r+b") as f:
                    f.write(new)
            elif change == "replace_by_rename":
                (src / "f.bin.tmp").write_bytes(new)
                os.replace(src / "f.bin.tmp", src / "f.bin")
            elif change == "truncate":
                os.truncate(src / "f.bin", len(new))
            else:
                with open(src / "f.bin", "ab") as f:
                    f.write(new[len(old) :])
            assert (src / "f.bin").read_bytes() == new
            # the guarantee: the next open sees the new bytes and the new size
            got = _bounded(lambda: _read_file(m.mnt / "f.bin"), READER_TIMEOUT)
            assert len(got) == len(new), f"{change}: next open read {len(got)} bytes, source has {len(new)}"
            assert got == new, f"{change}: next open returned stale bytes"
            assert os.stat(m.mnt / "f.bin").st_size == len(new)
            # a handle held across the change: documented; for a replaced file it never mixes versions
            # (it keeps its own source descriptor, and new opens bypass the shared page cache)
            view = _held_view(held, old, new)
            print(f"{change}: handle opened before the change reads {view}")
            if change == "replace_by_rename":
                assert "old version" in view, view
        finally:
            os.close(held)
        # and again: a third open after the held handle was closed
        assert _read_file(m.mnt / "f.bin") == new


def test_deleted_and_created_files_show_within_timeouts(src: Path, mnt: Path) -> None:
    (src / "gone.bin").write_bytes(rand_bytes(100_000, 20))
    (src / "d").mkdir()
    (src / "d" / "gone_too.txt").write_bytes(b"bye\n")
    opts = [f"fuse.attr_timeout={ENTRY_ATTR_TIMEOUT},fuse.entry_timeout={ENTRY_ATTR_TIMEOUT}"]
    with mounted(src, mnt, options=opts) as m:
        assert (m.mnt / "gone.bin").read_bytes() == (src / "gone.bin").read_bytes()
        assert (m.mnt / "d" / "gone_too.txt").read_bytes() == b"bye\n"
        os.unlink(src / "gone.bin")
        os.unlink(src / "d" / "gone_too.txt")
        (src / "d" / "new.txt").write_bytes(b"new\n")
        deadline = time.monotonic() + DELETE_VISIBLE_BOUND
        while True:
            gone = not os.path.lexists(m.mnt / "gone.bin") and not os.path.lexists(m.mnt / "d" / "gone_too.txt")
            if gone or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert gone, f"deleted source files still visible after {DELETE_VISIBLE_BOUND}s"
        with pytest.raises(FileNotFoundError):
            os.open(m.mnt / "gone.bin", os.O_RDONLY)
        assert "gone.bin" not in os.listdir(m.mnt)
        assert sorted(os.listdir(m.mnt / "d")) == ["new.txt"]
        assert (m.mnt / "d" / "new.txt").read_bytes() == b"new\n"


# -- memory ---------------------------------------------------------------------------------------------


class _Sampler(threading.Thread):
    """Samples the daemon's RSS every RSS_SAMPLE_SECONDS and its stats gauges now and then."""

    def __init__(self, m, pid: int) -> None:
        super().__init__(daemon=True)
        self.m = m
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.samples = 0
        self.max_cache_bytes = 0
        self.cache_budget: int | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
                self.samples += 1
                if n % 10 == 0:
                    gauges = self.m.stats().get("gauges", {})
                    if "cache_bytes" in gauges:
                        self.max_cache_bytes = max(self.max_cache_bytes, gauges["cache_bytes"])
                        self.cache_budget = gauges.get("cache_budget", self.cache_budget)
            except (psutil.Error, OSError, ValueError):
                pass
            n += 1
            self.stop.wait(RSS_SAMPLE_SECONDS)


def _sha256_file(path: Path, chunk: int = 8 * MIB) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest(), n
            h.update(b)
            n += len(b)


def test_memory_bounded_by_budget(src: Path, mnt: Path) -> None:
    rng = random.Random(30)
    with open(src / "big.bin", "wb") as f:
        for _ in range(MEMORY_SEQ_BYTES // (64 * MIB)):
            f.write(rng.randbytes(64 * MIB))
    small_dir = src / "small"
    small_dir.mkdir()
    for i in range(MEMORY_SMALL_FILES):
        (small_dir / f"{i:05d}.bin").write_bytes(rng.randbytes(MEMORY_SMALL_SIZE))
    ref_digest, ref_size = _sha256_file(src / "big.bin")
    with mounted(src, mnt, options=[f"cache.budget={MEMORY_BUDGET}"]) as m:
        assert (m.mnt / "small" / "00000.bin").read_bytes() == (small_dir / "00000.bin").read_bytes()
        baseline = psutil.Process(m.pid).memory_info().rss
        sampler = _Sampler(m, m.pid)
        sampler.start()
        try:
            digest, size = _bounded(lambda: _sha256_file(m.mnt / "big.bin"), 600)
            assert (digest, size) == (ref_digest, ref_size)
            mismatches = 0
            for i in range(MEMORY_SMALL_FILES):
                name = f"{i:05d}.bin"
                if (m.mnt / "small" / name).read_bytes() != (small_dir / name).read_bytes():
                    mismatches += 1
            assert mismatches == 0

            # a second sequential pass, concurrent with random preads: cache turnover under pressure
            def random_preads() -> int:
                r = random.Random(31)
                fd = os.open(m.mnt / "big.bin", os.O_RDONLY)
                sfd = os.open(src / "big.bin", os.O_RDONLY)
                try:
                    for _ in range(300):
                        off, ln = r.randrange(0, MEMORY_SEQ_BYTES), r.randrange(1, 2 * MIB)
                        assert os.pread(fd, ln, off) == os.pread(sfd, ln, off)
                finally:
                    os.close(fd)
                    os.close(sfd)
                return 300

            box: dict = {}
            t = threading.Thread(target=lambda: box.setdefault("n", random_preads()), daemon=True)
            t.start()
            digest2, _ = _bounded(lambda: _sha256_file(m.mnt / "big.bin"), 600)
            t.join(600)
            assert not t.is_alive()
            assert box.get("n") == 300, "random preads failed"
            assert digest2 == ref_digest
        finally:
            sampler.stop.set()
            sampler.join(10)
        growth = sampler.peak - baseline
        print(
            f"daemon RSS baseline {baseline / MIB:.1f} MiB, peak {sampler.peak / MIB:.1f} MiB, "
            f"growth {growth / MIB:.1f} MiB over {sampler.samples} samples; max cache_bytes "
            f"{sampler.max_cache_bytes / MIB:.1f} MiB of budget {MEMORY_BUDGET / MIB:.0f} MiB"
        )
        assert sampler.samples > 0
        assert growth <= MEMORY_BUDGET + RSS_MARGIN, f"RSS grew {growth / MIB:.1f} MiB"
        gauges = m.stats()["gauges"]
        assert gauges["cache_budget"] == MEMORY_BUDGET, gauges
        assert gauges["cache_bytes"] <= gauges["cache_budget"], gauges
        assert sampler.max_cache_bytes <= MEMORY_BUDGET


# -- daemon death ----------------------------------------------------------------------------------------


def test_sigkill_during_reads_then_umount_and_remount(src: Path, mnt: Path) -> None:
    data = {f"big{i}.bin": rand_bytes(16 * MIB + i, 40 + i) for i in range(3)}
    for i in range(50):
        data[f"s{i:02d}.bin"] = rand_bytes(10_000 + i, 60 + i)
    for name, payload in data.items():
        (src / name).write_bytes(payload)
    names = sorted(data)
    progress = {"bytes": 0, "verified": 0, "bad": 0}
    lock = threading.Lock()
    results: list[str] = [""] * DEATH_READERS
    stop = threading.Event()

    with mounted(src, mnt) as m:

        def reader(k: int) -> None:
            rng = random.Random(k)
            try:
                while not stop.is_set():
                    name = rng.choice(names)
                    with open(m.mnt / name, "rb", buffering=0) as f:
                        parts = []
                        while True:
                            b = f.read(MIB)
                            if not b:
                                break
                            parts.append(b)
                            with lock:
                                progress["bytes"] += len(b)
                    with lock:
                        progress["verified"] += 1
                        progress["bad"] += b"".join(parts) != data[name]
                results[k] = "stopped"
            except OSError as e:
                results[k] = _errname(e.errno)

        threads = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(DEATH_READERS)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + READER_TIMEOUT
        while progress["bytes"] < DEATH_READ_BEFORE_KILL and time.monotonic() < deadline:
            time.sleep(0.05)
        assert progress["bytes"] >= DEATH_READ_BEFORE_KILL, "readers made no progress before the kill"
        os.kill(m.pid, signal.SIGKILL)
        end = time.monotonic() + DEATH_JOIN_BOUND
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        stop.set()  # only matters if a reader never saw an error (then the assertion below fails)
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads), "a reader hung after the daemon was killed"
        print(f"before the kill: {progress['verified']} files verified; readers ended with {results}")
        assert progress["bad"] == 0
        assert all(r in {_errname(e) for e in DEAD_ERRNOS} for r in results), results
        # recovery: fastfs umount makes the directory usable again
        p = run_cli("umount", str(m.mnt), timeout=60)
        assert p.returncode == 0, p.stderr
        assert not is_mounted(str(m.mnt)), "a dead mount is still in the mount table"
        assert os.listdir(m.mnt) == []

    # a new mount on the same directory works at once
    with mounted(src, mnt) as m2:
        for name in names[:5] + names[-3:]:
            assert (m2.mnt / name).read_bytes() == data[name], name


# -- descriptor leaks ------------------------------------------------------------------------------------


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _wait_fd_count(pid: int, limit: int) -> int:
    deadline = time.monotonic() + QUIESCE_BOUND
    while True:
        n = _fd_count(pid)
        if n <= limit or time.monotonic() > deadline:
            return n
        time.sleep(0.1)


def test_no_fd_leak(src: Path, mnt: Path) -> None:
    d = src / "many"
    d.mkdir()
    data = {}
    for i in range(FD_WORKLOAD_FILES):
        payload = rand_bytes(1000 + 37 * i, 70 + i)
        (d / f"{i:04d}.bin").write_bytes(payload)
        data[i] = payload
    big = rand_bytes(20 * MIB + 1, 69)
    (src / "big.bin").write_bytes(big)
    with mounted(src, mnt) as m:
        # warm up worker threads and the stats path, then take the baseline
        assert (m.mnt / "many" / "0000.bin").read_bytes() == data[0]
        m.stats()
        time.sleep(0.5)
        baseline = _fd_count(m.pid)

        def workload(k: int) -> int:
            verified = 0
            for i in range(k, FD_WORKLOAD_FILES, 4):
                assert (m.mnt / "many" / f"{i:04d}.bin").read_bytes() == data[i]
                verified += 1
                try:
                    os.close(os.open(m.mnt / "many" / f"missing{i}", os.O_RDONLY))
                except FileNotFoundError:
                    pass
            for j in range(10):  # partial reads of a big file, closed early (prefetch in flight)
                with open(m.mnt / "big.bin", "rb", buffering=0) as f:
                    off = (j * 3 * MIB + k * MIB) % len(big)
                    f.seek(off)
                    assert f.read(100_000) == big[off : off + 100_000]
                verified += 1
            return verified

        counts: list[int] = []

        def run(k: int) -> None:
            counts.append(workload(k))

        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(READER_TIMEOUT)
        assert not any(t.is_alive() for t in threads), "workload hung"
        assert sum(counts) == FD_WORKLOAD_FILES + 40
        during = _fd_count(m.pid)
        after = _wait_fd_count(m.pid, baseline)  # waits for the baseline itself; slack only at the bound
        print(f"daemon fds: baseline {baseline}, right after workload {during}, settled {after}")
        assert after <= baseline + FD_SLACK
        gauges = m.stats()["gauges"]
        assert gauges.get("open_files") == 0, gauges


# Hung source reads that outnumber the pool's workers (kept small so faultfs, whose libfuse serves
# at most 10 requests at once, still has threads left for the healthy files).
HUNG_POOL_WORKERS = 2
HUNG_FILES = 4


def test_hung_reads_do_not_starve_other_files(faulty) -> None:
    """More stuck source reads than pool workers: healthy files must still be served."""
    fs, faultsrc, mnt, data = faulty
    for i in range(HUNG_FILES):  # one per directory: no small-file scan pulls in neighbours
        (fs.backing / f"h{i}").mkdir()
        (fs.backing / f"h{i}" / "stuck.bin").write_bytes(rand_bytes(50_000, 80 + i))
    opts = [f"readahead.read_timeout={READ_TIMEOUT_SECONDS},cache.workers={HUNG_POOL_WORKERS}"]
    with mounted(faultsrc, mnt, options=opts) as m:
        try:
            fs.set(hang=["/h*/stuck.bin"])
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", _READER, str(m.mnt / f"h{i}" / "stuck.bin"), "4096"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for i in range(HUNG_FILES)
            ]
            outcomes = []
            try:
                for p in procs:
                    out, err = p.communicate(timeout=HANG_READ_BOUND)
                    assert p.returncode == 0, err
                    outcomes.append(json.loads(out.strip().splitlines()[-1]))
            except subprocess.TimeoutExpired:
                pytest.fail("a read of a hanging source did not fail within the bound")
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait(timeout=30)
            print(f"stuck readers: {outcomes}")
            assert all(o["errno"] in ("EIO", "ETIMEDOUT") for o in outcomes), outcomes
            # the source still hangs on those files; every healthy file must read correctly
            for name in ("good.bin", "bad.bin", "dir/one.txt", "dir/two.bin"):
                r = _read_in_subprocess(m.mnt / name, len(data[name]) + 1, HANG_READ_BOUND)
                assert r["errno"] is None and r["n"] == len(data[name]), (name, r)
                assert _bounded(lambda n=name: _read_file(m.mnt / n), READER_TIMEOUT) == data[name], name
        finally:
            fs.clear()
        for i in range(HUNG_FILES):
            path = m.mnt / f"h{i}" / "stuck.bin"
            assert (
                _bounded(lambda p=path: _read_file(p), READER_TIMEOUT)
                == (fs.backing / f"h{i}" / "stuck.bin").read_bytes()
            )


# -- descriptor limits (issue 12 finding 8) ------------------------------------------------------------
# Size of each file held open: large enough that its first block is read as two pieces over two
# extra source streams (three source descriptors per open file), sparse so the test stays small.
FD_FILE_SIZE = 2 * MIB
FD_EDGE = 64 * KIB


def _nofile(soft: int, hard: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _daemon_nofile(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as f:
        line = next(x for x in f if x.startswith("Max open files"))
    soft, hard = line.split()[3:5]
    return int(soft), int(hard)


@pytest.mark.parametrize(
    ("soft", "hard", "files"),
    [(1024, 0, 400), (384, 384, 150)],
    ids=["soft-1024-raised", "hard-384-budgeted"],
)
def test_many_open_large_files_never_get_emfile(src: Path, mnt: Path, soft: int, hard: int, files: int) -> None:
    """A reader holding many large files open got EMFILE once the daemon's source descriptors (about
    five per large file) reached the soft limit: the daemon now raises it to the hard limit, and the
    extra block-read streams draw from a budget that leaves room for every open file."""
    hard = hard or resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < 4 * soft and soft == 1024:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves nothing to raise")
    payloads = {}
    for i in range(files):
        head, tail = rand_bytes(FD_EDGE, 500 + i), rand_bytes(FD_EDGE, 5000 + i)
        with open(src / f"f{i:04d}.bin", "wb") as f:
            f.write(head)
            f.seek(FD_FILE_SIZE - FD_EDGE)
            f.write(tail)
        payloads[i] = (head, tail)
    with mounted(src, mnt, preexec_fn=_nofile(soft, hard), options=["readahead.learn=false"]) as m:
        fds: list[int] = []
        errors: list[str] = []
        try:
            for i in range(files):
                try:
                    fd = os.open(m.mnt / f"f{i:04d}.bin", os.O_RDONLY)
                except OSError as e:
                    errors.append(f"open f{i:04d}: {_errname(e.errno)}")
                    continue
                fds.append(fd)
                try:
                    head = os.pread(fd, 2 * FD_EDGE, 0)
                    tail = os.pread(fd, FD_EDGE, FD_FILE_SIZE - FD_EDGE)
                except OSError as e:
                    errors.append(f"read f{i:04d}: {_errname(e.errno)}")
                    continue
                assert head == payloads[i][0] + bytes(FD_EDGE), i
                assert tail == payloads[i][1], i
        finally:
            for fd in fds:
                os.close(fd)
        assert errors == [], f"{len(errors)} failures, first: {errors[:5]}"
        limits = _daemon_nofile(m.pid)
        assert limits == (hard, hard), limits
        assert _fd_count(m.pid) <= hard


# -- one hung file must not make healthy files fail (issue 12 finding 7) ---------------------------------
# Readers of the hung file at once (more than the pool's 16 demand workers could serve), and the size of
# each read: a 1 MiB aligned read is split into 4 parallel pieces, so they ask for 80 source reads.
HUNG_READERS = 20
HUNG_READ_SIZE = MIB
# Threads of the faultfs source: enough that the source itself is not what runs out.
WIDE_SOURCE_THREADS = 96
# Bound on an open whose source lookup hangs (5x the request timeout).
METADATA_HANG_BOUND = 5 * READ_TIMEOUT_SECONDS


@pytest.fixture
def faulty_wide(tmp_path: Path):
    """As ``faulty``, with a source that serves many requests at once."""
    backing, faultsrc, mnt = tmp_path / "backing", tmp_path / "faultsrc", tmp_path / "mnt"
    for d in (backing, faultsrc, mnt):
        d.mkdir()
    data = {
        "hung.bin": rand_bytes(32 * MIB, 31),
        "open.bin": rand_bytes(8 * MIB, 32),
        "fresh.bin": rand_bytes(3 * MIB + 5, 33),
        "meta/stuck.bin": rand_bytes(5000, 34),
    }
    (backing / "meta").mkdir()
    for name, payload in data.items():
        (backing / name).write_bytes(payload)
    with faultfs_mounted(backing, faultsrc, tmp_path / "faultfs-work", max_threads=WIDE_SOURCE_THREADS) as fs:
        yield fs, faultsrc, mnt, data


_RANDOM_READER = """
import errno, json, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    os.pread(fd, int(sys.argv[2]), int(sys.argv[3]))
    print(json.dumps({"errno": None}))
except OSError as e:
    print(json.dumps({"errno": errno.errorcode.get(e.errno, str(e.errno))}))
"""


def test_one_hung_file_leaves_healthy_files_working(faulty_wide) -> None:
    """20 random reads of a hung file used to queue source reads behind the ones stuck on it, so an
    already-open healthy file got EIO and a fresh open of another file failed too."""
    fs, faultsrc, mnt, data = faulty_wide
    opts = [f"readahead.read_timeout={READ_TIMEOUT_SECONDS},readahead.learn=false"]
    with mounted(faultsrc, mnt, options=opts) as m:
        healthy = os.open(m.mnt / "open.bin", os.O_RDONLY)
        procs: list[subprocess.Popen] = []
        try:
            assert os.pread(healthy, 4096, 0) == data["open.bin"][:4096]
            fs.set(hang=["/hung.bin"])
            rng = random.Random(7)
            for _ in range(HUNG_READERS):
                offset = rng.randrange(1, 31) * MIB
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            _RANDOM_READER,
                            str(m.mnt / "hung.bin"),
                            str(HUNG_READ_SIZE),
                            str(offset),
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                )
            time.sleep(1.0)  # the hung reads are in flight
            # an already-open healthy file, read where nothing is cached yet
            for offset in (5 * MIB, 3 * MIB + 12345):
                got = _bounded(lambda o=offset: os.pread(healthy, 256 * KIB, o), HANG_READ_BOUND)
                assert got == data["open.bin"][offset : offset + 256 * KIB], offset
            # a fresh open of another file
            assert _bounded(lambda: _read_file(m.mnt / "fresh.bin"), HANG_READ_BOUND) == data["fresh.bin"]
            outcomes = []
            for p in procs:
                out, _ = p.communicate(timeout=HANG_READ_BOUND)
                outcomes.append(json.loads(out.strip().splitlines()[-1])["errno"])
            assert set(outcomes) <= {"EIO", "ETIMEDOUT"}, outcomes  # the hung file's reads fail, bounded
            # while the file is stuck, a new read of it fails at once instead of queuing behind it
            r = _read_in_subprocess(m.mnt / "hung.bin", 4096, HANG_READ_BOUND)
            assert r["errno"] in ("EIO", "ETIMEDOUT") and r["seconds"] < READ_TIMEOUT_SECONDS, r
        finally:
            fs.clear()
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
            os.close(healthy)
        # the source answers again: the file reads correctly
        assert _bounded(lambda: _read_file(m.mnt / "hung.bin"), READER_TIMEOUT) == data["hung.bin"]
        assert m.stats()["counters"]["read_timeouts"] >= 1


def test_hung_metadata_call_fails_within_the_request_timeout(faulty_wide) -> None:
    """A lookup or open whose source call hangs must fail with EIO after fuse.request_timeout, as a read
    does after readahead.read_timeout (today it waits as long as the source does)."""
    fs, faultsrc, mnt, data = faulty_wide
    opts = [f"fuse.request_timeout={READ_TIMEOUT_SECONDS},fuse.entry_timeout=0,fuse.attr_timeout=0"]
    with mounted(faultsrc, mnt, options=opts) as m:
        fs.set(hang_meta=["/meta/*"])
        # not _read_in_subprocess: a reader killed inside a FUSE request waits for its answer, so
        # the fault must be lifted before the reader is killed and reaped
        proc = subprocess.Popen(
            [sys.executable, "-c", _READER, str(m.mnt / "meta" / "stuck.bin"), "4096"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            out, _ = proc.communicate(timeout=METADATA_HANG_BOUND)
        except subprocess.TimeoutExpired:
            out = None
        finally:
            fs.clear()
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=READER_TIMEOUT)
        assert out is not None, f"an open whose source lookup hangs did not fail within {METADATA_HANG_BOUND}s"
        r = json.loads(out.strip().splitlines()[-1])
        assert r["stage"] == "open" and r["errno"] == "EIO", r
        assert _bounded(lambda: _read_file(m.mnt / "meta" / "stuck.bin"), READER_TIMEOUT) == data["meta/stuck.bin"]


def test_a_close_hung_at_the_source_holds_up_no_other_release_nor_the_stats(faulty_wide) -> None:
    """Closing a source descriptor is a round trip on a FUSE source (its FLUSH) and never ends on a
    hung one. The releases the daemon answered run on one thread: a close made there held every
    later release, and ``fastfs stats`` (which runs those releases first) hung with it. A second open of
    a file already open closed its own source descriptor before it answered: it hung as well."""
    fs, faultsrc, mnt, data = faulty_wide
    with mounted(faultsrc, mnt) as m:
        try:
            fd = os.open(m.mnt / "open.bin", os.O_RDONLY)
            try:
                assert os.pread(fd, 4096, 0) == data["open.bin"][:4096]  # (its handle holds a source file)
                fs.set(hang_close=["/open.bin"])
                # a second open asks the source again; the version's handles hold a file already
                fd2 = _bounded(lambda: os.open(m.mnt / "open.bin", os.O_RDONLY), QUICK_BOUND)
                try:
                    assert os.pread(fd2, 4096, MIB) == data["open.bin"][MIB : MIB + 4096]
                finally:
                    os.close(fd2)
            finally:
                os.close(fd)  # the kernel's RELEASE: the daemon's close of the source file hangs
            # other files open, read and close; their releases are not held up behind the hung close
            for _ in range(3):
                assert _bounded(lambda: _read_file(m.mnt / "fresh.bin"), QUICK_BOUND) == data["fresh.bin"]
                assert _bounded(lambda: _read_file(m.mnt / "meta" / "stuck.bin"), QUICK_BOUND) == data["meta/stuck.bin"]
            snap = _bounded(m.stats, QUICK_BOUND)
            assert wait_for(lambda: _bounded(m.stats, QUICK_BOUND)["gauges"]["open_files"] == 0, QUICK_BOUND), snap
            assert _bounded(m.stats, QUICK_BOUND)["gauges"]["closes_pending"] >= 1  # the hung one, still waiting
        finally:
            fs.clear()
        assert wait_for(lambda: m.stats()["gauges"]["closes_pending"] == 0, QUICK_BOUND)


# -- warm must not hold the daemon (issue 12 finding 4) ---------------------------------------------------
# A hung file of many blocks: warmed one block after another it cost blocks x read_timeout.
WARM_HUNG_SIZE = 64 * MIB
# Bound on a warm request returning (it only starts a job) and on a metadata call meanwhile.
QUICK_BOUND = 5.0


def test_warm_over_a_hung_file_returns_at_once_is_bounded_and_gives_up_once(faulty_wide) -> None:
    fs, faultsrc, mnt, data = faulty_wide
    (fs.backing / "tree").mkdir()
    (fs.backing / "tree" / "big.bin").write_bytes(rand_bytes(WARM_HUNG_SIZE, 41))
    (fs.backing / "tree" / "ok.bin").write_bytes(data["fresh.bin"])
    opts = [f"readahead.read_timeout={READ_TIMEOUT_SECONDS},readahead.learn=false"]
    with mounted(faultsrc, mnt, options=opts) as m:
        try:
            fs.set(hang=["/tree/big.bin"])
            t0 = time.monotonic()
            answer = json.loads(_bounded(lambda: os.getxattr(m.mnt / "tree", "user.fastfs.warm"), QUICK_BOUND))
            assert time.monotonic() - t0 < QUICK_BOUND and "job" in answer, answer
            # the daemon keeps answering while the job waits for the hung file
            _bounded(lambda: os.stat(m.mnt), QUICK_BOUND)
            assert _bounded(lambda: _read_file(m.mnt / "open.bin"), QUICK_BOUND * 3) == data["open.bin"]
            # one caller's jobs are bounded: the 8 allowed are taken, the next is refused at once
            jobs = [answer["job"]]
            with pytest.raises(OSError) as refused:
                for _ in range(9):
                    jobs.append(json.loads(os.getxattr(m.mnt / "tree", "user.fastfs.warm"))["job"])
            assert refused.value.errno == errno.EAGAIN and len(jobs) == 8, jobs

            def report(job: int) -> dict:
                return json.loads(os.getxattr(m.mnt, f"user.fastfs.warm.{job}"))

            deadline = time.monotonic() + HANG_READ_BOUND
            while not all(report(j)["done"] for j in jobs):
                assert time.monotonic() < deadline, [report(j) for j in jobs]
                time.sleep(0.1)
            first = report(jobs[0])
            print(f"first warm job over a hung file: {first}")
            # the hung file was given up once, after one timeout, not after one per block
            assert first["failed"] == 1 and "timed out" in first["errors"][0], first
            assert first["seconds"] < 3 * READ_TIMEOUT_SECONDS, first
            assert first["files_done"] == 2 and first["bytes_done"] == len(data["fresh.bin"]), first
            for job in jobs[1:]:
                assert report(job)["failed"] == 1 and report(job)["seconds"] < 3 * READ_TIMEOUT_SECONDS
            # those started after the first timeout found the file stuck and did not wait for it again
            assert sum(report(j)["seconds"] < READ_TIMEOUT_SECONDS for j in jobs) >= len(jobs) - 2
        finally:
            fs.clear()
        assert (
            _bounded(lambda: _read_file(m.mnt / "tree" / "big.bin"), READER_TIMEOUT)
            == (fs.backing / "tree" / "big.bin").read_bytes()
        )


# -- a daemon whose request the watchdog abandoned still exits at umount (issue 24 finding 2) ---------
# Seconds the daemon gets to exit after `fastfs umount` returned, while the source still hangs.
EXIT_AFTER_UMOUNT_BOUND = 20.0


def test_daemon_exits_after_umount_while_an_abandoned_request_is_still_stuck(faulty_wide) -> None:
    """A lookup hangs at the source, the watchdog answers it EIO and abandons its worker; after `fastfs
    umount` the daemon must shut down (engine closed, learned state saved, "unmounted" logged) while
    the abandoned worker is still stuck in the source, and be gone as soon as the source answers (it
    used to wait for the abandoned worker forever: a systemd unit would never stop). The process
    cannot be reaped before the source answers: a thread inside a FUSE request the source has read
    waits for its answer uninterruptibly, also when killed."""
    fs, faultsrc, mnt, data = faulty_wide
    opts = [
        f"readahead.read_timeout={READ_TIMEOUT_SECONDS},fuse.request_timeout={READ_TIMEOUT_SECONDS}",
        "fuse.entry_timeout=0,fuse.attr_timeout=0",
    ]
    with mounted(faultsrc, mnt, options=opts) as m:
        try:
            fs.set(hang_meta=["/meta", "/meta/*"])
            r = _read_in_subprocess(m.mnt / "meta" / "stuck.bin", 4096, METADATA_HANG_BOUND)
            assert r["errno"] == "EIO", r
            assert wait_for(lambda: m.stats()["kernel"]["abandoned_workers"] >= 1, READER_TIMEOUT)
            done = run_cli("umount", m.mnt)
            assert done.returncode == 0, done.stderr
            assert wait_for(lambda: "unmounted" in m.log(), EXIT_AFTER_UMOUNT_BOUND), (
                f"the daemon did not shut down within {EXIT_AFTER_UMOUNT_BOUND}s of umount:\n{m.log()}"
            )
            fs.clear()  # the source answers the abandoned lookup: nothing is left to hold the process
            try:
                rc = m.proc.wait(timeout=EXIT_AFTER_UMOUNT_BOUND)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the daemon was still running {EXIT_AFTER_UMOUNT_BOUND}s after the source answered")
            assert rc == 0, m.log()
        finally:
            fs.clear()


# -- a signalled reader of a hung file returns promptly (issue 24 finding 5) --------------------------
# read_timeout of this test: long, so a reader that only returns at the timeout is told apart.
SIGNAL_READ_TIMEOUT = 30
# Seconds after SIGINT within which the reader must have returned.
SIGNAL_RETURN_BOUND = 5.0


@pytest.mark.parametrize("reader", ["dd", "python"])
def test_a_reader_of_a_hung_file_returns_soon_after_sigint(faulty_wide, reader: str) -> None:
    """dd (which catches SIGINT to print its statistics) and a Python reader (whose SIGINT handler
    raises KeyboardInterrupt) read a file whose source reads hang; the kernel sends that read as
    asynchronous read-ahead, which never gets FUSE_INTERRUPT. After SIGINT the reader must return
    within seconds, not at read_timeout."""
    fs, faultsrc, mnt, data = faulty_wide
    with mounted(faultsrc, mnt, options=[f"readahead.read_timeout={SIGNAL_READ_TIMEOUT}"]) as m:
        try:
            fs.set(hang=["/hung.bin"])
            path = str(m.mnt / "hung.bin")
            if reader == "dd":
                cmd = ["dd", f"if={path}", "of=/dev/null", "bs=1M", "count=4"]
            else:
                cmd = [sys.executable, "-c", f"f = open({path!r}, 'rb')\nwhile f.read(1 << 20): pass"]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(1.5)  # the reader is blocked in the hung read by now
                assert proc.poll() is None, "the read of a hung file returned before the signal"
                t0 = time.monotonic()
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=SIGNAL_READ_TIMEOUT + 10)
                except subprocess.TimeoutExpired:
                    pytest.fail("the signalled reader never returned")
                waited = time.monotonic() - t0
            finally:
                if proc.poll() is None:
                    fs.clear()
                    proc.kill()
                    proc.wait(READER_TIMEOUT)
            assert waited < SIGNAL_RETURN_BOUND, f"{reader} returned {waited:.1f}s after SIGINT"
        finally:
            fs.clear()


def _reads_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def test_a_source_mount_restarted_under_fastfs_is_read_again(tmp_path: Path) -> None:
    """A source that is another FUSE client (rclone, s3fs, sshfs) may die and be mounted again at the
    same path while fastfs stays mounted (a service restarted): fastfs then reads the new mount, as a
    reader of that path would, instead of answering ENOTCONN for good (the root it opened at mount
    belongs to the dead connection)."""
    backing, faultsrc, mnt = tmp_path / "backing", tmp_path / "faultsrc", tmp_path / "mnt"
    for d in (backing, faultsrc, mnt):
        d.mkdir()
    (backing / "dir").mkdir()
    data = {"top.bin": rand_bytes(2 * MIB + 3, 11), "dir/small.txt": b"small\n" * 300, "dir/late.bin": b""}
    for name, payload in data.items():
        (backing / name).write_bytes(payload)
    first = faultfs_mounted(backing, faultsrc, tmp_path / "faultfs-work-1")
    fs = first.__enter__()
    try:
        with mounted(faultsrc, mnt) as m:
            assert (mnt / "top.bin").read_bytes() == data["top.bin"]
            assert (mnt / "dir" / "small.txt").read_bytes() == data["dir/small.txt"]
            fs.proc.kill()  # the source's client dies: its mount answers ENOTCONN until unmounted
            fs.proc.wait(timeout=30)
            first.__exit__(None, None, None)  # its mount is taken down, as `fusermount -u` would
            first = None
            (backing / "dir" / "late.bin").write_bytes(b"written while the source was down\n")
            # no source mounted: an error, never the empty directory under the mount as the source
            with pytest.raises(OSError):
                (mnt / "dir" / "small.txt").read_bytes()
            assert m.stats()["counters"]["source_reattached"] == 0
            with faultfs_mounted(backing, faultsrc, tmp_path / "faultfs-work-2"):
                # (a reopen is tried at most once per second: the one just refused holds the next back)
                assert wait_for(lambda: _reads_or_none(mnt / "dir" / "small.txt") is not None, timeout=30)
                # a file read before, a listing, a file changed meanwhile, one never read before
                assert (mnt / "dir" / "small.txt").read_bytes() == data["dir/small.txt"]
                assert sorted(os.listdir(mnt / "dir")) == ["late.bin", "small.txt"]
                assert (mnt / "dir" / "late.bin").read_bytes() == b"written while the source was down\n"
                assert (mnt / "top.bin").read_bytes() == data["top.bin"]
                counters = m.stats()["counters"]
                assert counters["source_reattached"] >= 1, counters
    finally:
        if first is not None:
            first.__exit__(None, None, None)
