"""Byte-exact reads through a real fastfs mount.

Every test compares bytes read through the mount with the bytes of the source file: files of edge
sizes read with many buffer sizes, preads at and past EOF, random preads, concurrent readers
(threads and processes) and files changed in the source between two opens (close-to-open).

Nothing here may hang the run: readers run in threads joined with a bound or in subprocesses with
a timeout. Run as a script (``python test_mount_read.py worker ...``) this file is the process
reader used by the concurrency test.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import evict_page_cache, mounted, rand_bytes, wait_for

# The worker processes (this file run as a script) import conftest from the tests/ directory.
_TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_TESTS_DIR, os.environ.get("PYTHONPATH")) if p)}

KIB = 1024
MIB = 1024 * KIB
# File sizes at the edges of pages, FUSE requests and cache blocks, plus one larger than a prefetch window.
SIZES = (0, 1, 4095, 4096, MIB + 1, 64 * MIB)
# Application buffer sizes: byte-at-a-time, a page, a typical chunk, an odd size above 1 MiB, whole file (None).
BUF_SIZES = (1, 4096, 65536, MIB + 3, None)
# Most read calls in one sequential pass: reading 64 MiB one byte at a time would take minutes of syscalls,
# so small buffers read a prefix of the big files (still crossing many blocks and requests).
MAX_CALLS_PER_PASS = 1 << 18
# Random preads checked against the source in the mixed-pread test.
RANDOM_PREADS = 3000
# Random preads between two drops of the mount's page cache (so most preads reach the daemon).
EVICT_EVERY = 50
# Largest random pread length (crosses 4 MiB cache blocks).
MAX_RANDOM_LEN = 5 * MIB
# Concurrent reader threads and processes.
READER_THREADS = 8
READER_PROCESSES = 3
# Bound on any reader thread or process: generous, the machine is shared and slow.
READER_TIMEOUT = 300.0
# Sleep between two source changes so even a coarse (pre-multigrain) kernel timestamp moves.
MTIME_TICK = 0.02


def _name(size: int) -> str:
    return f"f_{size}.bin"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory):
    """A module-wide source of random files of every size in SIZES, and its mount."""
    base = tmp_path_factory.mktemp("mount_read")
    src, mnt = base / "src", base / "mnt"
    src.mkdir()
    mnt.mkdir()
    data = {}
    for i, size in enumerate(SIZES):
        data[_name(size)] = rand_bytes(size, 1000 + i)
        (src / _name(size)).write_bytes(data[_name(size)])
    sub = src / "sub"
    sub.mkdir()
    for i in range(20):
        payload = rand_bytes(1000 + 7919 * i, 5000 + i)
        (sub / f"small_{i:02d}.bin").write_bytes(payload)
        data[f"sub/small_{i:02d}.bin"] = payload
    with mounted(src, mnt) as m:
        yield m, data


def _bounded_threads(targets: list, timeout: float = READER_TIMEOUT) -> None:
    """Run callables in threads; fail (not hang) if one does not finish in time; re-raise the first error."""
    errors: list[BaseException] = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported to the test thread
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(fn), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = sum(t.is_alive() for t in threads)
    assert alive == 0, f"{alive} reader threads still running after {timeout}s (hang)"
    if errors:
        raise errors[0]


def _read_sequential(path: Path, bufsize: int | None, limit_calls: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        if bufsize is None:
            size = os.fstat(fd).st_size
            out = bytearray()
            while True:  # a whole-file request, repeated only if the kernel returns short
                chunk = os.read(fd, max(size - len(out), 1))
                if not chunk:
                    return bytes(out)
                out += chunk
        parts = []
        for _ in range(limit_calls):
            chunk = os.read(fd, bufsize)
            if not chunk:
                break
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", SIZES)
def test_sequential_reads_all_buffer_sizes(tree, size: int) -> None:
    m, data = tree
    expected = data[_name(size)]
    for bufsize in BUF_SIZES:
        evict_page_cache(m.mnt / _name(size))  # every pass reaches the daemon, not the kernel's copy
        got = _read_sequential(m.mnt / _name(size), bufsize, MAX_CALLS_PER_PASS)
        want = size if bufsize is None else min(size, bufsize * MAX_CALLS_PER_PASS)
        assert len(got) == want, f"bufsize {bufsize}: got {len(got)} bytes, expected {want}"
        assert got == expected[:want], f"bufsize {bufsize}: bytes differ from the source"


@pytest.mark.parametrize("size", SIZES)
def test_readinto_and_stat(tree, size: int) -> None:
    m, data = tree
    path = m.mnt / _name(size)
    assert os.stat(path).st_size == size
    assert os.stat(path).st_size == os.stat(m.src / _name(size)).st_size
    buf = bytearray(size + 100)
    with open(path, "rb", buffering=0) as f:
        n = f.readinto(buf)
        while n < size:
            k = f.readinto(memoryview(buf)[n:])
            if not k:
                break
            n += k
    assert n == size
    assert bytes(buf[:n]) == data[_name(size)]


@pytest.mark.parametrize("size", SIZES)
def test_pread_at_and_past_eof(tree, size: int) -> None:
    m, data = tree
    expected = data[_name(size)]
    fd = os.open(m.mnt / _name(size), os.O_RDONLY)
    try:
        assert os.pread(fd, 100, size) == b""
        assert os.pread(fd, 1, size + 1) == b""
        assert os.pread(fd, 4096, size + 12345) == b""
        assert os.pread(fd, MIB, size + 10 * 64 * MIB) == b""
        if size:
            # a read straddling EOF returns exactly the tail
            start = max(0, size - 10)
            assert os.pread(fd, 100, start) == expected[start:]
            assert os.pread(fd, 1, size - 1) == expected[-1:]
            assert os.pread(fd, size + MIB, 0) == expected
    finally:
        os.close(fd)


def test_random_preads_match_source(tree) -> None:
    m, data = tree
    rng = random.Random(42)
    names = [n for n in data if data[n]]
    fds = {n: os.open(m.mnt / n, os.O_RDONLY) for n in names}
    checked = 0
    try:
        for i in range(RANDOM_PREADS):
            if i % EVICT_EVERY == 0:
                evict_page_cache(m.mnt / _name(64 * MIB))
            name = rng.choice(names) if rng.random() < 0.3 else _name(64 * MIB)
            expected = data[name]
            off = rng.randrange(0, len(expected) + 4096)
            length = rng.choice((1, 17, 4096, 4097, 65536, 131072 + 5, MIB, rng.randrange(1, MAX_RANDOM_LEN)))
            got = os.pread(fds[name], length, off)
            assert got == expected[off : off + length], f"{name} pread({length}, {off}) differs"
            checked += 1
    finally:
        for fd in fds.values():
            os.close(fd)
    assert checked == RANDOM_PREADS


def _verify_worker(mnt: Path, src: Path, names: list[str], seed: int, rounds: int) -> dict:
    """Read *names* through *mnt* (whole files and random preads) and compare with *src*; return counts."""
    rng = random.Random(seed)
    verified = mismatches = 0
    for _ in range(rounds):
        name = rng.choice(names)
        expected = (src / name).read_bytes()
        if rng.random() < 0.5:
            got = (mnt / name).read_bytes()
            ok = got == expected
        else:
            ok = True
            with open(mnt / name, "rb", buffering=0) as f:
                for _ in range(20):
                    off = rng.randrange(0, len(expected) + 1)
                    length = rng.randrange(1, 2 * MIB)
                    if os.pread(f.fileno(), length, off) != expected[off : off + length]:
                        ok = False
        verified += 1
        mismatches += 0 if ok else 1
    return {"verified": verified, "mismatches": mismatches}


def test_concurrent_threads_same_and_different_files(tree) -> None:
    m, data = tree
    big = _name(64 * MIB)
    others = [n for n in data if n != big and data[n]]
    results: list[dict] = []

    def same_file(seed: int):
        def run():
            results.append(_verify_worker(m.mnt, m.src, [big], seed, 6))

        return run

    def different_files(seed: int):
        def run():
            results.append(_verify_worker(m.mnt, m.src, others, seed, 40))

        return run

    targets = [same_file(i) for i in range(READER_THREADS // 2)]
    targets += [different_files(100 + i) for i in range(READER_THREADS - READER_THREADS // 2)]
    _bounded_threads(targets)
    total = sum(r["verified"] for r in results)
    print(f"concurrent threads: {total} reads verified")
    assert len(results) == READER_THREADS
    assert sum(r["mismatches"] for r in results) == 0
    assert total == (READER_THREADS // 2) * 6 + (READER_THREADS - READER_THREADS // 2) * 40


def test_concurrent_processes(tree) -> None:
    m, data = tree
    names = [n for n in data if data[n]]
    procs = []
    for i in range(READER_PROCESSES):
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "worker",
            str(m.mnt),
            str(m.src),
            json.dumps(names),
            str(200 + i),
            "25",
        ]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=TESTS_ENV))
    outputs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=READER_TIMEOUT)
            assert p.returncode == 0, f"reader process failed: {err[-2000:]}"
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    assert sum(o["mismatches"] for o in outputs) == 0
    assert sum(o["verified"] for o in outputs) == READER_PROCESSES * 25
    print(f"concurrent processes: {sum(o['verified'] for o in outputs)} reads verified")


# -- a file changed in the source between two opens ---------------------------------------------------


def _read_through(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_rewrite_in_place_same_size(src: Path, mnt: Path) -> None:
    a, b = rand_bytes(MIB, 1), rand_bytes(MIB, 2)
    (src / "f.bin").write_bytes(a)
    (src / "small.txt").write_bytes(b"version one\n")
    with mounted(src, mnt) as m:
        assert _read_through(m.mnt / "f.bin") == a
        assert _read_through(m.mnt / "small.txt") == b"version one\n"
        time.sleep(MTIME_TICK)
        with open(src / "f.bin", "r+b") as f:  # same inode, same size, new bytes
            f.write(b)
        with open(src / "small.txt", "r+b") as f:
            f.write(b"version two\n")
        assert _read_through(m.mnt / "f.bin") == b
        assert _read_through(m.mnt / "small.txt") == b"version two\n"


def test_size_change_between_opens(src: Path, mnt: Path) -> None:
    a, bigger, smaller = rand_bytes(MIB, 3), rand_bytes(2 * MIB + 5, 4), rand_bytes(1000, 5)
    (src / "f.bin").write_bytes(a)
    with mounted(src, mnt) as m:
        assert _read_through(m.mnt / "f.bin") == a
        time.sleep(MTIME_TICK)
        with open(src / "f.bin", "r+b") as f:  # extend in place
            f.write(bigger)
        got = _read_through(m.mnt / "f.bin")
        assert len(got) == len(bigger)
        assert got == bigger
        assert os.stat(m.mnt / "f.bin").st_size == len(bigger)
        time.sleep(MTIME_TICK)
        with open(src / "f.bin", "r+b") as f:  # shrink in place
            f.write(smaller)
            f.truncate(len(smaller))
        got = _read_through(m.mnt / "f.bin")
        assert got == smaller
        assert os.stat(m.mnt / "f.bin").st_size == len(smaller)


def test_replace_by_rename(src: Path, mnt: Path) -> None:
    a, b, c = rand_bytes(MIB + 1, 6), rand_bytes(MIB + 1, 7), rand_bytes(3 * MIB, 8)
    (src / "f.bin").write_bytes(a)
    with mounted(src, mnt) as m:
        assert _read_through(m.mnt / "f.bin") == a
        (src / "f.bin.tmp").write_bytes(b)
        os.replace(src / "f.bin.tmp", src / "f.bin")  # new inode, same size
        assert _read_through(m.mnt / "f.bin") == b
        (src / "f.bin.tmp").write_bytes(c)
        os.replace(src / "f.bin.tmp", src / "f.bin")  # new inode, new size
        assert _read_through(m.mnt / "f.bin") == c
        assert os.stat(m.mnt / "f.bin").st_size == len(c)


def _worker_main(argv: list[str]) -> None:
    mnt, src, names, seed, rounds = Path(argv[0]), Path(argv[1]), json.loads(argv[2]), int(argv[3]), int(argv[4])
    print(json.dumps(_verify_worker(mnt, src, names, seed, rounds)))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        _worker_main(sys.argv[2:])
    else:
        sys.exit("usage: test_mount_read.py worker MNT SRC NAMES_JSON SEED ROUNDS")


@pytest.mark.parametrize("loop", ["native", "python"])
def test_both_request_loops_serve_the_same_bytes(tmp_path: Path, loop: str) -> None:
    """The native request loop (daemon/kernel/_loop.c) and the Python one answer a real kernel alike:
    served reads from RAM blocks and the source, small files, passthrough opens, lookups of missing
    names, errors; the stats say which loop ran."""
    from fastfs.daemon.kernel import session

    if loop == "native" and session.native_loop is None:
        pytest.skip("the native request loop is not built (no C compiler at install)")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    files = {"big.bin": rand_bytes(9 * MIB + 123, 1), "d/small": rand_bytes(3073, 2), "empty": b""}
    for name, data in files.items():
        (src / name).write_bytes(data)
    for options in (["fuse.passthrough=off"], []):
        mnt = tmp_path / f"mnt-{len(options)}"
        mnt.mkdir()
        with mounted(src, mnt, options, env={session.LOOP_ENV: loop}) as m:
            for name, data in files.items():
                assert (mnt / name).read_bytes() == data
            with open(mnt / "big.bin", "rb", buffering=0) as f:
                for offset in (0, 4 * MIB - 7, 9 * MIB):
                    assert os.pread(f.fileno(), 70_000, offset) == files["big.bin"][offset : offset + 70_000]
            assert not (mnt / "d" / "missing").exists()
            with pytest.raises(OSError):
                os.open(mnt / "big.bin", os.O_RDWR)  # write access: EROFS
            snap = m.stats()
            assert snap["kernel"]["loop"] == loop
            assert snap["kernel"]["requests"]["lookup"] >= 3 and snap["kernel"]["requests"]["open"] >= 3


# Random 4 KiB preads of the direct-read test, and of them at least this share answered by the loop
# itself (the rest land near an earlier read, where a stream may begin, and go to the engine).
DIRECT_PREADS = 3000
DIRECT_SHARE = 0.8


@pytest.mark.parametrize("direct", [True, False])
def test_random_reads_answered_by_the_loop_are_the_versions_bytes(tmp_path: Path, direct: bool) -> None:
    """Random reads of a served file are answered by the native loop itself (one pread each,
    ``fuse.direct_reads``) once the engine hands the handle over: the bytes are the source's, they
    are counted as the engine counts its own, and a handle opened before the file was replaced keeps
    reading the version it opened while a new open reads the new one. Off, every read goes through
    the engine."""
    from fastfs.daemon.kernel import session

    if session.native_loop is None:
        pytest.skip("the native request loop is not built (no C compiler at install)")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    old, new = rand_bytes(16 * MIB, 11), rand_bytes(16 * MIB, 12)
    (src / "f.bin").write_bytes(old)
    options = ["fuse.passthrough=off", f"fuse.direct_reads={str(direct).lower()}"]
    rng = random.Random(5)
    with mounted(src, mnt, options) as m:
        fd = os.open(mnt / "f.bin", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no kernel read-ahead: one READ per pread
            pages = rng.sample(range(len(old) // 4096), DIRECT_PREADS)  # distinct: none in the page cache yet
            for off in (page * 4096 for page in pages):
                assert os.pread(fd, 4096, off) == old[off : off + 4096], off
            counters = m.stats()["counters"]
            assert counters["read_requests"] == DIRECT_PREADS, counters
            assert counters["bytes_fetched_demand"] == counters["bytes_requested"] == DIRECT_PREADS * 4096
            if direct:
                assert counters["reads_direct"] >= DIRECT_PREADS * DIRECT_SHARE, counters["reads_direct"]
            else:
                assert counters["reads_direct"] == 0, counters
            (src / "f.tmp").write_bytes(new)
            os.rename(src / "f.tmp", src / "f.bin")
            for _ in range(200):  # the handle held across the replacement: the old version, never mixed
                off = rng.randrange(len(old) // 4096) * 4096
                assert os.pread(fd, 4096, off) == old[off : off + 4096], off
        finally:
            os.close(fd)
        assert wait_for_bytes(mnt / "f.bin", new)


def wait_for_bytes(path: Path, want: bytes, timeout: float = 30.0) -> bool:
    """A new open of *path* reads *want* within *timeout* seconds (the kernel's attribute cache expires)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.read_bytes() == want:
            return True
        time.sleep(0.2)
    return False


# Threads of the mixed served-reads test, and reads per random reader.
MIXED_RANDOM_THREADS = 6
MIXED_RANDOM_READS = 400


def test_mixed_readers_of_one_served_file_get_its_bytes(tmp_path: Path) -> None:
    """Served reads of one file from many sides at once, the request loop answering the random ones
    itself where the engine lets it: random readers of mixed sizes on one shared descriptor (some
    continuing their last read, so streams start among them) with a reader opening and closing
    handles of its own, then the random readers again with a sequential reader on the same
    descriptor (the engine then takes the random reads back: a sequential stream prefetches). Every
    byte is checked."""
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    data = rand_bytes(64 * MIB + 4097, 21)
    (src / "f.bin").write_bytes(data)
    with mounted(src, mnt, ["fuse.passthrough=off"]) as m:
        fd = os.open(mnt / "f.bin", os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)

        def random_reader(seed: int):
            def run():
                rng = random.Random(seed)
                off = 0
                for _ in range(MIXED_RANDOM_READS):
                    if rng.random() < 0.7:
                        off = rng.randrange(len(data))
                    length = rng.choice((1, 100, 4096, 8192, 65536 - 1, 65536, 200_000))
                    assert os.pread(fd, length, off) == data[off : off + length], (seed, off, length)
                    off += length  # the next one may continue it

            return run

        def sequential_reader():
            off = 0
            while off < len(data):
                got = os.pread(fd, 128 * KIB, off)
                assert got == data[off : off + 128 * KIB], off
                off += len(got)

        def reopening_reader():
            rng = random.Random(99)
            for _ in range(40):
                with open(mnt / "f.bin", "rb", buffering=0) as f:
                    for _ in range(10):
                        off = rng.randrange(len(data))
                        assert os.pread(f.fileno(), 4096, off) == data[off : off + 4096], off

        try:
            _bounded_threads([*(random_reader(i) for i in range(MIXED_RANDOM_THREADS)), reopening_reader])
            assert m.stats()["counters"]["reads_direct"] > 0
            _bounded_threads([*(random_reader(10 + i) for i in range(MIXED_RANDOM_THREADS)), sequential_reader])
        finally:
            os.close(fd)
        assert m.stats()["counters"]["sequential_streams"] >= 1
        # every handle released is taken back (the kernel sends a close's RELEASE after close returns)
        assert wait_for(lambda: m.stats()["kernel"]["direct_handles"] == 0, 10)


@pytest.mark.parametrize("spin_us", [200, 0])
def test_a_spinning_reader_answers_requests_close_together_and_after_pauses(tmp_path: Path, spin_us: int) -> None:
    """With ``fuse.spin_us`` the worker reading the device keeps reading, non-blocking, for the next
    request while a reader sends one at a time: those requests are counted (``spun_reads``) and answered
    with the version's bytes. After pauses longer than the spin (and than the 1 ms within which requests
    count as close together) the workers sleep in the device read again and still answer every request;
    16 threads at once (other workers busy, no spin) get their bytes too. 0: no worker ever spins."""
    from fastfs.daemon.kernel import session

    if session.native_loop is None:
        pytest.skip("the native request loop is not built (no C compiler at install)")
    src = tmp_path / "src"
    src.mkdir()
    files = {f"f{i:03d}": rand_bytes(1000 + 37 * i, i) for i in range(300)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(src, mnt, [f"fuse.spin_us={spin_us}", "fuse.passthrough=off"]) as m:
        names = sorted(files)
        for name in names[:200]:  # one at a time, back to back
            with open(mnt / name, "rb") as f:
                assert f.read() == files[name]
        for name in names[200:220]:  # each after a pause
            time.sleep(0.005)
            assert (mnt / name).read_bytes() == files[name]
        errors: list[str] = []

        def reader(part: list[str]) -> None:
            for name in part:
                if (mnt / name).read_bytes() != files[name]:
                    errors.append(name)

        threads = [threading.Thread(target=reader, args=(names[220 + i :: 16],)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        spun = m.stats()["kernel"]["spun_reads"]
        if spin_us:
            assert spun > 100  # of the ~1,000 requests of the back-to-back part
        else:
            assert spun == 0
