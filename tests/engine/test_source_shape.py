"""The source's access shape in the engine: the mount table's type -> the shape in force, the jump
probe started once on the first large file, and the sequential shape's fills: one source stream per
file, read strictly in order, one read at a time, a format plan fetched whole in file order, a
reader waiting for a queued block never making the stream jump.

Every source pread of the test file is recorded per descriptor (``os.preadv`` wrapped: the offset
and size asked, in the order issued), so "each handle reads in order" is checked on what the source
was actually asked, and the parallel shape serves as the contrast the checks can fail on.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import wait_for

from fastfs.config import Config
from fastfs.fsio import formats, shape, source
from fastfs.fsio.engine import Engine
from fastfs.fsio.shape import PARALLEL, SEQUENTIAL

MIB = 1024 * 1024
# Seconds a gated source read waits for the reader it waits on (a bound, never reached when it works).
GATE_TIMEOUT = 10.0


def _config(kind: str, **readahead: object) -> Config:
    base = Config()
    ra = dataclasses.replace(base.readahead, source_shape=kind, learn=False, **readahead)
    return dataclasses.replace(base, readahead=ra, cache=dataclasses.replace(base.cache, budget=256 * MIB))


def _drop_page_cache(path: Path) -> None:
    """Evict the file's pages, so the engine reads it with O_DIRECT (it reads a cached file buffered)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class Recorder:
    """Wraps ``os.preadv``: the (offset, size) asked of each descriptor of one file, in issue order.
    *gate* (optional) is called before the first O_DIRECT read of the file at *gate_from* or beyond."""

    def __init__(self, path: Path, gate=None, gate_from: int = 0) -> None:
        self.ino = os.stat(path).st_ino
        self.reads: dict[int, list[tuple[int, int]]] = {}
        self.direct: set[int] = set()
        self.gate, self.gate_from, self.gated = gate, gate_from, False
        self._lock = threading.Lock()
        self._real = os.preadv

    def __call__(self, fd: int, buffers, offset: int, *args):
        try:
            mine = os.fstat(fd).st_ino == self.ino
        except OSError:
            mine = False
        if mine:
            direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
            with self._lock:
                gate = direct and offset >= self.gate_from and not self.gated and self.gate is not None
                self.gated = self.gated or gate
                if direct:
                    self.direct.add(fd)
                self.reads.setdefault(fd, []).append((offset, sum(len(b) for b in buffers)))
            if gate:
                self.gate()
        return self._real(fd, buffers, offset, *args)


def _record(monkeypatch, path: Path, **gate) -> Recorder:
    """Drop *path*'s pages (so the engine reads it with O_DIRECT) and record its source preads."""
    _drop_page_cache(path)
    recorder = Recorder(path, **gate)
    monkeypatch.setattr(os, "preadv", recorder)
    return recorder


def _in_order(reads: list[tuple[int, int]]) -> bool:
    """Each read starts where the one before it ended (strictly increasing, contiguous)."""
    return all(offset == prev + size for (prev, size), (offset, _) in zip(reads, reads[1:], strict=False))


def _read_all(engine: Engine, fh: int, size: int, chunk: int = MIB) -> bytes:
    return b"".join(engine.read(fh, offset, chunk) for offset in range(0, size, chunk))


def test_sequential_shape_reads_each_source_handle_in_order(tmp_path: Path, monkeypatch) -> None:
    """1 MiB sequential reads of a 48 MiB file: with the sequential shape every source descriptor is
    read strictly in order (the fills on one O_DIRECT stream, whole blocks one after the other), the
    source reads the file once; the parallel shape spreads pieces over several handles out of order."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(48 * MIB)
    (src / "f.bin").write_bytes(data)
    seen = {}
    for kind in (SEQUENTIAL, PARALLEL):
        recorder = _record(monkeypatch, src / "f.bin")
        engine = Engine(str(src), _config(kind))
        try:
            fh = engine.open("/f.bin").fh
            assert _read_all(engine, fh, len(data)) == data
            engine.release(fh)
            counters = engine.snapshot()["counters"]
        finally:
            engine.close()
            monkeypatch.setattr(os, "preadv", recorder._real)
        seen[kind] = (recorder, counters)
    recorder, counters = seen[SEQUENTIAL]
    assert recorder.direct, "the fills used no O_DIRECT stream"
    # one handle: the stream (the format probe's head came from block 0, the stream's first read)
    assert list(recorder.reads) == list(recorder.direct), recorder.reads.keys()
    stream = recorder.reads[next(iter(recorder.direct))]
    assert _in_order(stream), stream[:20]
    assert stream[0][0] == 0 and sum(size for _, size in stream) == len(data)  # the whole file, once
    assert max(size for _, size in stream) <= source.STREAM_READ_MAX  # one FUSE request at a time
    assert sum(size for reads in recorder.reads.values() for _, size in reads) <= 1.1 * len(data)
    assert counters["stream_fills"] == len(data) // (4 * MIB) and counters["stream_jumps"] == 0
    # the contrast: the parallel shape's pieces are out of order on their handles
    recorder, counters = seen[PARALLEL]
    assert len(recorder.direct) > 1
    assert not all(_in_order(recorder.reads[fd]) for fd in recorder.direct)
    assert counters["stream_fills"] == 0


def test_plan_fetched_in_file_order_and_a_waiting_reader_does_not_reorder_the_stream(
    tmp_path: Path, monkeypatch
) -> None:
    """An .npy's plan fits the budget: it is fetched whole at open, in file order, on one stream (the
    format probe's head from its first block: the file's own descriptor is never read). A reader that
    asks for the file's last MiB first waits for the stream to get there (the stream's second block is
    held until the reader waits): the stream never jumps, and every read is then served from RAM."""
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.arange(6 * MIB, dtype=np.float32))  # 24 MiB of data after the header
    data = (src / "a.npy").read_bytes()
    waiting = threading.Event()
    recorder = _record(monkeypatch, src / "a.npy", gate=lambda: waiting.wait(GATE_TIMEOUT), gate_from=4 * MIB)
    engine = Engine(str(src), _config(SEQUENTIAL))
    real_wait = engine.fills.wait_fill
    reader = threading.current_thread()

    def wait_fill(entry, block, timeout):  # the reader now waits for a queued block
        if threading.current_thread() is reader:
            waiting.set()
        return real_wait(entry, block, timeout)

    engine.fills.wait_fill = wait_fill
    try:
        fh = engine.open("/a.npy").fh
        entry = engine.handles.get(fh)
        last = (len(data) - 1) // engine.block_size
        assert wait_for(lambda: engine.cache.peek(entry.key, last) is not None, timeout=10)  # the plan is queued
        tail = engine.read(fh, len(data) - MIB, MIB)
        assert waiting.is_set()  # it waited for the stream, which was held until then
        assert tail == data[-MIB:]
        assert _read_all(engine, fh, len(data)) == data
        counters = engine.snapshot()["counters"]
        engine.release(fh)
    finally:
        engine.close()
        monkeypatch.setattr(os, "preadv", recorder._real)
    assert len(recorder.direct) == 1 and list(recorder.reads) == list(recorder.direct)  # one handle
    stream = recorder.reads[next(iter(recorder.direct))]
    assert _in_order(stream), stream[:20]
    assert stream[0][0] == 0 and stream[-1][0] + stream[-1][1] >= len(data)  # every block, in file order
    assert counters["stream_jumps"] == 0 and counters["stream_fills"] == last + 1
    assert counters["format_plans"] == 1 and counters["bytes_fetched_demand"] == 0  # all of it ahead of the reader


def _fake_mount_table(tmp_path: Path, src: Path, mount_type: str, monkeypatch) -> None:
    """The process's mount table says *src* is a mount of *mount_type* (and statfs calls nothing local)."""
    table = tmp_path / "mountinfo"
    table.write_text(f"22 1 252:1 / / rw - ext4 /dev/vda rw\n60 22 0:70 / {src} rw - {mount_type} remote: rw\n")
    monkeypatch.setattr(source, "MOUNTINFO", str(table))
    monkeypatch.setattr(source, "LOCAL_FS_TYPES", frozenset())


@pytest.mark.parametrize(
    ("mount_type", "setting", "kind", "reason"),
    [
        ("fuse.rclone", "auto", SEQUENTIAL, "rclone serves a handle as one ranged download"),
        ("fuse.rclone", "parallel", PARALLEL, "readahead.source_shape=parallel"),
        ("nfs4", "auto", PARALLEL, "nfs4 reads any offset on any handle"),
        ("nfs4", "sequential", SEQUENTIAL, "readahead.source_shape=sequential"),
    ],
)
def test_mount_table_line_decides_the_engines_shape(tmp_path, monkeypatch, mount_type, setting, kind, reason):
    src = tmp_path / "src"
    src.mkdir()
    _fake_mount_table(tmp_path, src, mount_type, monkeypatch)
    engine = Engine(str(src), _config(setting))
    try:
        section = engine.snapshot()["source"]
    finally:
        engine.close()
    assert section["mount_type"] == mount_type and section["local"] is False
    assert (section["shape"], section["reason"], section["setting"]) == (kind, reason, setting)
    assert section["probe"] == shape.PROBE_NONE
    assert section["dir_times_kept"] is (mount_type != "fuse.rclone")  # (rclone's directories keep no times)


def _probed_tree(tmp_path: Path, monkeypatch, bigs: int) -> Path:
    """A source of an unknown FUSE client: small.bin (1 MiB of data) and *bigs* sparse files
    big1.bin ... of PROBE_MIN_SIZE (the probe is faked: their bytes are zeros)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "small.bin").write_bytes(os.urandom(MIB))
    for i in range(1, bigs + 1):
        with open(src / f"big{i}.bin", "wb") as f:
            f.truncate(shape.PROBE_MIN_SIZE)
    _fake_mount_table(tmp_path, src, "fuse.unknownfs", monkeypatch)
    return src


def _open_read(engine: Engine, src: Path, name: str, offset: int = 0) -> None:
    fh = engine.open(f"/{name}").fh
    assert engine.read(fh, offset, 4096) == (src / name).read_bytes()[offset : offset + 4096]
    engine.release(fh)


def test_unknown_fuse_client_is_probed_at_large_files_opens_until_its_verdict_holds(
    tmp_path: Path, monkeypatch
) -> None:
    """A FUSE client nobody knows: one handle in order until the jump probe says; the probe runs on
    the first large file opened, off the reader's thread, and a stream verdict is probed again at
    the next PROBE_CONFIRMS large files' opens (not by more reads of the first), then holds."""
    src = _probed_tree(tmp_path, monkeypatch, shape.PROBE_CONFIRMS + 2)
    probed: list[tuple[str, int, str]] = []

    def probe(path: str, size: int) -> tuple[float, float]:
        probed.append((path, size, threading.current_thread().name))
        return 0.0005, 0.030  # a jump restarts the download, every time

    engine = Engine(str(src), _config("auto"))
    engine.fills.jump_probe = probe

    def state() -> str:
        return engine.snapshot()["source"]["probe"]

    try:
        assert state() == shape.PROBE_DUE
        assert engine.shaper.sequential  # in order until the probe tells
        _open_read(engine, src, "small.bin")  # too small to probe
        _open_read(engine, src, "big1.bin")
        assert wait_for(lambda: state() == shape.PROBE_RECHECK, timeout=10)
        assert engine.shaper.stream  # the verdict is in force meanwhile
        _open_read(engine, src, "big1.bin", 8 * MIB)  # its version's fills: no new probe
        for i in range(2, shape.PROBE_CONFIRMS + 2):
            _open_read(engine, src, f"big{i}.bin")
            assert wait_for(lambda i=i: len(probed) == i and state() != shape.PROBE_RUNNING, timeout=10)
        assert state() == shape.PROBE_DONE
        _open_read(engine, src, f"big{shape.PROBE_CONFIRMS + 2}.bin")
        section = engine.snapshot()["source"]
    finally:
        engine.close()
    names = [f"/big{i}.bin" for i in range(1, shape.PROBE_CONFIRMS + 2)]
    assert [(path, size) for path, size, _ in probed] == [(n, shape.PROBE_MIN_SIZE) for n in names]
    assert all(thread != threading.current_thread().name for _, _, thread in probed)  # pool jobs
    assert section["shape"] == SEQUENTIAL and "30.0 ms" in section["reason"]
    assert (section["probe_continue_ms"], section["probe_jump_ms"]) == (0.5, 30.0)


def test_a_stream_verdict_of_a_busy_link_is_undone_by_the_next_quiet_probe(tmp_path: Path, monkeypatch) -> None:
    """The first probe ran next to a loader on a busy link and took a jump for a restart (over sshfs
    once: jump 3.6 ms, continuing read 0.8 ms); the next large file's open probes again, quietly, and
    the source is read in parallel from then on (read as one stream, np.load over sshfs at 10 ms
    delay ran 0.98x direct against 7.7x)."""
    src = _probed_tree(tmp_path, monkeypatch, 2)
    answers = [(0.0008, 0.0036), (0.0012, 0.0012)]

    def probe(path: str, size: int) -> tuple[float, float]:
        return answers.pop(0)

    engine = Engine(str(src), _config("auto"))
    engine.fills.jump_probe = probe
    try:
        _open_read(engine, src, "big1.bin")
        assert wait_for(lambda: engine.shaper.probe_state == shape.PROBE_RECHECK, timeout=10)
        assert engine.shaper.sequential
        _open_read(engine, src, "big2.bin")
        assert wait_for(lambda: engine.shaper.probe_state == shape.PROBE_DONE, timeout=10)
        assert not engine.shaper.sequential
        section = engine.snapshot()["source"]
    finally:
        engine.close()
    assert answers == []
    assert section["shape"] == PARALLEL and section["probes"] == 2


def test_a_random_reader_pays_no_block_while_the_shape_waits_for_the_jump_probe(tmp_path: Path, monkeypatch) -> None:
    """An unknown FUSE client is read in order until its jump probe tells; meanwhile the format probe
    of a large file reads its head alone (64 KiB), not block 0 on the stream: 2,000 random 4 KiB
    preads of a 1 GiB file over sshfs had fetched 1.51x what they delivered for that 4 MiB block."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(48 * MIB)
    (src / "r.bin").write_bytes(data)
    _fake_mount_table(tmp_path, src, "fuse.unknownfs", monkeypatch)
    release = threading.Event()

    def probe(path: str, size: int) -> tuple[float, float]:
        release.wait(GATE_TIMEOUT)  # the probe runs for the whole test: the shape stays provisional
        return 0.0005, 0.0005

    engine = Engine(str(src), _config("auto"))
    engine.fills.jump_probe = probe
    offsets = [(i * 7919 * 4096) % (len(data) - 4 * MIB) + 4 * MIB for i in range(64)]  # outside block 0
    try:
        fh = engine.open("/r.bin").fh
        assert wait_for(lambda: engine.snapshot()["source"]["probe"] == shape.PROBE_RUNNING, timeout=10)
        assert wait_for(lambda: not engine.handles.get(fh).format.planning, timeout=10)  # its head was read
        assert engine.shaper.sequential  # (in order until the probe tells)
        for offset in offsets:
            assert engine.read(fh, offset, 4096) == data[offset : offset + 4096]
        engine.release(fh)
        counters = engine.snapshot()["counters"]
    finally:
        release.set()
        engine.close()
    assert counters["stream_fills"] == 0
    assert counters["bytes_fetched_prefetch"] <= formats.HEAD_BYTES  # the format probe's head, nothing more
    fetched = counters["bytes_fetched_prefetch"] + counters["bytes_fetched_demand"]
    assert fetched <= len(offsets) * 4096 + formats.HEAD_BYTES


def test_a_format_plan_waits_for_the_running_jump_probe(tmp_path: Path, monkeypatch) -> None:
    """The format probe of the first large file plans while the source's jump probe still runs: it
    waits for the probe's answer instead of reading the whole file on one stream as if the source
    were a stream client. (Once the .npy planner stopped importing numpy, its plan came before the
    probe's answer on the benchmarks' emulator, and np.load of 1 GiB ran 1.5x direct instead of 9x.)"""
    src = tmp_path / "src"
    src.mkdir()
    arr = np.arange(6 * MIB, dtype=np.float32)  # 24 MiB of data: above PROBE_MIN_SIZE with the padding below
    np.save(src / "w.npy", np.concatenate([arr, arr[: 3 * MIB]]))
    data = (src / "w.npy").read_bytes()
    assert len(data) >= shape.PROBE_MIN_SIZE
    _fake_mount_table(tmp_path, src, "fuse.unknownfs", monkeypatch)
    probing = threading.Event()

    def probe(path: str, size: int) -> tuple[float, float]:
        probing.set()
        time.sleep(0.5)  # a slow probe: the format plan is decided long before it answers
        return 0.0005, 0.0005

    engine = Engine(str(src), _config("auto"))
    engine.fills.jump_probe = probe
    try:
        fh = engine.open("/w.npy").fh
        assert probing.wait(10)
        assert wait_for(lambda: not engine.handles.get(fh).format.planning, timeout=10)
        assert not engine.shaper.sequential  # the plan was decided after the probe's answer
        assert engine.read(fh, 0, len(data)) == data
        engine.release(fh)
        counters = engine.snapshot()["counters"]
    finally:
        engine.close()
    assert counters["stream_fills"] == 0  # no block read on one stream


def test_page_faults_out_of_plan_order_are_fetched_once(tmp_path: Path, monkeypatch) -> None:
    """A mapped load that touches the file far ahead of the plan before it copies in order (safetensors'
    load_file: the kernel reads around each touch, 1 MiB on either side) on a source read in parallel:
    those reads take their whole blocks at demand priority, so the plan's fills find them and the
    source reads each byte of the file once. (Read exactly, each was fetched again by the plan: 1.13x
    the file over sshfs.)"""
    src = tmp_path / "src"
    src.mkdir()
    data = _safetensors_bytes(os.urandom(40 * MIB))
    (src / "m.safetensors").write_bytes(data)
    recorder = _record(monkeypatch, src / "m.safetensors")
    engine = Engine(str(src), _config(PARALLEL))
    try:
        fh = engine.open("/m.safetensors").fh
        assert wait_for(lambda: not engine.handles.get(fh).format.planning, timeout=10)
        assert engine.handles.get(fh).format.plan is not None
        for touch in (16 * MIB, 32 * MIB):  # far ahead of where the plan releases its fills
            assert engine.read(fh, touch, MIB) == data[touch : touch + MIB]
            assert engine.read(fh, touch - MIB, MIB) == data[touch - MIB : touch]
        assert _read_all(engine, fh, len(data)) == data
        engine.release(fh)
    finally:
        engine.close()
        monkeypatch.setattr(os, "preadv", recorder._real)
    fetched = sum(size for reads in recorder.reads.values() for _, size in reads)
    # each byte once, but the format probe's head (read exactly, then again with block 0); read
    # exactly, the four touches' MiB were read again by the plan's fills of their blocks
    assert fetched <= len(data) + MIB, (fetched, len(data))


def test_jump_probe_reads_one_fresh_handle(tmp_path: Path) -> None:
    """The probe's I/O on a real file: positive timings; a file too small to jump far is refused."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(shape.PROBE_MIN_SIZE))
    (src / "small.bin").write_bytes(b"x" * MIB)
    _drop_page_cache(src / "big.bin")
    root = source.Source(str(src))
    try:
        continue_s, jump_s = source.jump_probe(root, "/big.bin", shape.PROBE_MIN_SIZE)
        assert continue_s > 0 and jump_s > 0
        with pytest.raises(OSError):
            source.jump_probe(root, "/small.bin", MIB)
        with pytest.raises(OSError):
            source.jump_probe(root, "/gone.bin", shape.PROBE_MIN_SIZE)
    finally:
        root.close()


def test_sequential_large_exact_read_uses_the_files_descriptor_and_the_read_timeout(
    tmp_path: Path, monkeypatch
) -> None:
    """A large page-aligned read outside blocks (random access) with the sequential shape: one read of
    the file's own descriptor (not the fills' stream, not split), on a pool worker under the read
    timeout even when small reads run inline (the kernel layer's watchdog): a hung source fails it
    with EIO within the timeout, and the file then counts the stuck read."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(16 * MIB)
    (src / "f.bin").write_bytes(data)
    _drop_page_cache(src / "f.bin")
    engine = Engine(str(src), _config(SEQUENTIAL, read_timeout=1.0, enabled=False))
    engine.inline_reads = True
    release = threading.Event()
    asked: list[tuple[int, int, bool, int]] = []
    try:
        fh = engine.open("/f.bin").fh
        src_file = engine.handles.get(fh).src
        real = type(src_file).read_into

        def hang(self, offset, view, aligned=False):
            asked.append((offset, len(view), aligned, threading.get_ident()))
            if offset == 8 * MIB and not release.is_set():
                release.wait(30)
            return real(self, offset, view, aligned)

        monkeypatch.setattr(type(src_file), "read_into", hang)
        assert engine.read(fh, 4 * MIB, MIB) == data[4 * MIB : 5 * MIB]
        assert asked == [(4 * MIB, MIB, False, asked[0][3])]  # one read, whole, not a stream's
        assert asked[0][3] != threading.get_ident()  # on a pool worker
        outcome: list[BaseException | bytes] = []
        reader = threading.Thread(target=lambda: outcome.append(_try_read(engine, fh, 8 * MIB, MIB)))
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), "a large read of a hung source was not bounded by the read timeout"
        assert isinstance(outcome[0], OSError) and outcome[0].errno == errno.EIO
        assert engine.handles.get(fh).stuck == 1
        release.set()
        assert wait_for(lambda: engine.handles.get(fh).stuck == 0, timeout=10)
        engine.release(fh)
    finally:
        release.set()
        engine.close()


def _try_read(engine: Engine, fh: int, offset: int, size: int) -> BaseException | bytes:
    try:
        return engine.read(fh, offset, size)
    except OSError as e:
        return e


def test_source_section_in_stats_summary_and_metrics(tmp_path: Path, monkeypatch) -> None:
    """The snapshot's ``source`` section reaches ``fastfs stats`` (one line) and Prometheus (an info metric)."""
    from fastfs.daemon.metrics import SnapshotCollector

    try:  # (the stats client's module moved to daemon/cli/ on main)
        from fastfs.daemon.cli.stats import format_summary
    except ImportError:
        from fastfs.daemon.statscli import format_summary

    src = tmp_path / "src"
    src.mkdir()
    _fake_mount_table(tmp_path, src, "fuse.rclone", monkeypatch)
    engine = Engine(str(src), _config("auto"))
    try:
        snap = engine.snapshot()
    finally:
        engine.close()
    line = next(line for line in format_summary(snap).splitlines() if "source shape" in line)
    assert line == (
        "  source shape       sequential (rclone serves a handle as one ranged download);"
        " mount type fuse.rclone, jump probe none; directory times not kept: listings made anew after fuse.revalidate"
    )
    families = {f.name: f for f in SnapshotCollector(lambda: snap, "/mnt/x").families(snap)}
    (sample,) = families["fastfs_source_info"].samples
    assert sample.labels == {"mount": "/mnt/x", "mount_type": "fuse.rclone", "shape": "sequential"}
    assert sample.value == 1.0
    assert "source shape" not in format_summary({k: v for k, v in snap.items() if k != "source"})  # older daemons


def test_first_reads_wait_for_block_0_on_the_stream_not_the_files_descriptor(tmp_path: Path, monkeypatch) -> None:
    """safetensors' loader reads 8 bytes at offset 0, then the header, right after its open, while
    the format probe is still queued: with the sequential shape those reads come from block 0, which
    the probe fills as the stream's first read; the file's own descriptor is never read (over rclone
    a read of it at the start was one more download of the file)."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(12 * MIB)
    (src / "m.bin").write_bytes(data)
    recorder = _record(monkeypatch, src / "m.bin")
    engine = Engine(str(src), _config(SEQUENTIAL))
    hold = threading.Event()
    real_probe = engine.probe._probe_format

    def held_probe(entry):  # the probe's job runs only once the reader has read
        hold.wait(GATE_TIMEOUT)
        real_probe(entry)

    engine.probe._probe_format = held_probe
    try:
        fh = engine.open("/m.bin").fh
        assert engine.read(fh, 0, 8) == data[:8]
        assert engine.read(fh, 8, 20000) == data[8:20008]
        hold.set()
        assert wait_for(lambda: not engine.handles.get(fh).format.planning, timeout=10)
        assert _read_all(engine, fh, len(data)) == data
        engine.release(fh)
    finally:
        hold.set()
        engine.close()
        monkeypatch.setattr(os, "preadv", recorder._real)
    assert list(recorder.reads) == list(recorder.direct), recorder.reads  # one handle: the stream
    assert _in_order(recorder.reads[next(iter(recorder.direct))])


class _HookedEvent(threading.Event):
    """An Event that tells *waiting* when someone starts waiting on it."""

    def __init__(self, waiting: threading.Event) -> None:
        super().__init__()
        self.waiting = waiting

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_a_read_before_the_plan_waits_for_it_and_comes_from_its_block(tmp_path: Path, monkeypatch) -> None:
    """A loader that parses the header as fast as the probe and faults on a tensor before the plan is
    queued: its read outside blocks waits for the plan (the probe is held until it waits) and is
    served from the plan's block on the stream; the file's own descriptor is never read."""
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.arange(4 * MIB, dtype=np.float32))  # 16 MiB of data
    data = (src / "a.npy").read_bytes()
    recorder = _record(monkeypatch, src / "a.npy")
    engine = Engine(str(src), _config(SEQUENTIAL))
    reader_waits = threading.Event()
    real_plan = engine.probe._plan_format

    def held_plan(entry):  # the probe plans only once the reader waits for its plan
        reader_waits.wait(GATE_TIMEOUT)
        real_plan(entry)

    engine.probe._plan_format = held_plan
    try:
        fh = engine.open("/a.npy").fh
        entry = engine.handles.get(fh)
        assert entry.format.planning and entry.format.planned is not None
        entry.format.planned = _HookedEvent(reader_waits)
        offset = 9 * MIB + 4096
        assert engine.read(fh, offset, 256 * 1024) == data[offset : offset + 256 * 1024]
        assert reader_waits.is_set()
        assert entry.format.plan is not None
        assert _read_all(engine, fh, len(data)) == data
        counters = engine.snapshot()["counters"]
        engine.release(fh)
    finally:
        reader_waits.set()
        engine.close()
        monkeypatch.setattr(os, "preadv", recorder._real)
    assert list(recorder.reads) == list(recorder.direct), recorder.reads  # one handle: the stream
    assert _in_order(recorder.reads[next(iter(recorder.direct))])
    assert counters["stream_jumps"] == 0


def test_a_block_queued_while_the_probe_parses_waits_for_the_plans_order(tmp_path: Path, monkeypatch) -> None:
    """A reader's block further on, queued while the format probe parses the head it got from block 0,
    is read in file order with the plan's blocks (the stream waits for the plan before its next
    read), not ahead of them: no jump forward and back."""
    from fastfs.fsio import probe as probe_module

    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.arange(5 * MIB, dtype=np.float32))  # 20 MiB of data
    data = (src / "a.npy").read_bytes()
    recorder = _record(monkeypatch, src / "a.npy")
    parsing, queued, plan_waited = threading.Event(), threading.Event(), threading.Event()
    real_plan_for = formats.plan_for

    def plan_for(head, size, read_at):  # the probe has block 0 and parses: a reader queues block 3 now
        parsing.set()
        queued.wait(GATE_TIMEOUT)
        return real_plan_for(head, size, read_at)

    monkeypatch.setattr(formats, "plan_for", plan_for)
    monkeypatch.setattr(probe_module, "threading", SimpleNamespace(Event=lambda: _HookedEvent(plan_waited)))
    engine = Engine(str(src), _config(SEQUENTIAL))
    block3 = 3 * engine.block_size
    try:
        fh = engine.open("/a.npy").fh
        entry = engine.handles.get(fh)
        assert parsing.wait(GATE_TIMEOUT)
        block = engine.fills.fetch_block(entry, 3, demand=True)  # what a tight stream's demand does
        assert block is not None
        # the stream either waits for the plan or goes to block 3 at once (a jump)
        assert wait_for(
            lambda: plan_waited.is_set() or any(o >= block3 for fd in recorder.direct for o, _ in recorder.reads[fd]),
            timeout=GATE_TIMEOUT,
        )
        queued.set()
        assert _read_all(engine, fh, len(data)) == data
        counters = engine.snapshot()["counters"]
        engine.release(fh)
    finally:
        queued.set()
        engine.close()
        monkeypatch.setattr(os, "preadv", recorder._real)
    assert list(recorder.reads) == list(recorder.direct)
    assert _in_order(recorder.reads[next(iter(recorder.direct))]), recorder.reads
    assert counters["stream_jumps"] == 0


PASS, SERVE = "passthrough", "served"


def _safetensors_bytes(payload: bytes) -> bytes:
    header = b'{"w":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (len(payload), len(payload))
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + payload


@pytest.mark.parametrize(
    ("mount_type", "routes", "head_reads"),
    [
        # a jump restarts a download: only what a loader maps is served; one fresh handle reads the
        # first page of the file whose name says nothing, none for the others
        (
            "fuse.rclone",
            {"a.npy": "passthrough", "b.safetensors": "served", "c.data": "served", "d.bin": "passthrough"},
            2,
        ),
        # a jump costs one ranged request: every large file passes through, no first page read
        (
            "fuse.s3fs",
            {"a.npy": "passthrough", "b.safetensors": "passthrough", "c.data": "passthrough", "d.bin": "passthrough"},
            0,
        ),
    ],
)
def test_stream_client_routes_large_files_by_their_loader(tmp_path, monkeypatch, mount_type, routes, head_reads):
    src = tmp_path / "src"
    src.mkdir()
    npy = np.lib.format
    with open(src / "a.npy", "wb") as f:
        npy.write_array(f, np.zeros(2 * MIB, dtype=np.uint8))
    (src / "b.safetensors").write_bytes(_safetensors_bytes(os.urandom(2 * MIB)))
    (src / "c.data").write_bytes(_safetensors_bytes(os.urandom(2 * MIB)))  # a name that says nothing
    (src / "d.bin").write_bytes(os.urandom(2 * MIB))
    (src / "small.safetensors").write_bytes(_safetensors_bytes(os.urandom(1024)))  # a scan's size: served
    _fake_mount_table(tmp_path, src, mount_type, monkeypatch)
    engine = Engine(str(src), _config("auto"))
    try:
        engine.opener.kernel_route = True
        got = {}
        for name in routes:
            before = engine.snapshot()["counters"]["source_opens"]
            r = engine.open("/" + name)
            got[name] = r.route
            opened = engine.snapshot()["counters"]["source_opens"] - before
            head_reads -= opened - 1  # the open's own, and one more for a first page read
            assert r.route != "passthrough" or r.backing_fd >= 0
            engine.release(r.fh)
        small = engine.open("/small.safetensors")
        assert small.route == "served"
        engine.release(small.fh)
        c = engine.snapshot()["counters"]
    finally:
        engine.close()
    assert got == routes
    assert head_reads == 0
    passed = sum(route == "passthrough" for route in routes.values())
    assert (c["stream_route_passthrough"], c["stream_route_served"]) == (passed, len(routes) - passed)


def test_the_first_large_open_on_an_unknown_client_waits_for_the_jump_probe(tmp_path, monkeypatch) -> None:
    """On a FUSE client fastfs does not know, the first large file's open starts the jump probe and
    waits for its answer before it routes the file: found a stream client, an in-order loader's file
    passes through (served on one stream while the shape was provisional, two 1 GiB files read by
    two processes over the emulated stream client ran 0.53x direct)."""
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "a.npy", "wb") as f:
        np.lib.format.write_array(f, np.zeros(shape.PROBE_MIN_SIZE, dtype=np.uint8))
    _fake_mount_table(tmp_path, src, "fuse.unknownfs", monkeypatch)
    probed: list[str] = []

    def probe(path: str, size: int) -> tuple[float, float]:
        time.sleep(0.2)  # a restarted download or two
        probed.append(path)
        return 0.0005, 0.030

    engine = Engine(str(src), _config("auto"))
    engine.fills.jump_probe = probe
    try:
        engine.opener.kernel_route = True
        assert engine.shaper.provisional
        r = engine.open("/a.npy")
        engine.release(r.fh)
        section = engine.snapshot()["source"]
    finally:
        engine.close()
    assert r.route == PASS  # (served on one stream, without the wait)
    assert probed == ["/a.npy"] and section["shape"] == SEQUENTIAL


def test_a_probe_hung_on_its_file_holds_up_other_opens_only_briefly(tmp_path, monkeypatch) -> None:
    """The open that started the jump probe, and opens of other files of a probe's size while it runs,
    wait for its answer until SETTLE_WAIT after it started at most; smaller files do not wait, and
    after that span no open does: a probe hung on a hung file must not add seconds to every open."""
    src = tmp_path / "src"
    src.mkdir()
    sizes = {"hung.npy": shape.PROBE_MIN_SIZE, "big.npy": shape.PROBE_MIN_SIZE, "mid.npy": 8 * MIB}
    for name, size in sizes.items():
        with open(src / name, "wb") as f:
            np.lib.format.write_array(f, np.zeros(size, dtype=np.uint8))
    _fake_mount_table(tmp_path, src, "fuse.unknownfs", monkeypatch)
    release, probing = threading.Event(), threading.Event()

    def probe(path: str, size: int) -> tuple[float, float]:
        probing.set()
        release.wait(GATE_TIMEOUT)  # hung until the test ends
        return 0.0005, 0.0005

    engine = Engine(str(src), _config("auto"))
    engine.fills.jump_probe = probe
    took: dict[str, float] = {}

    def timed_open(name: str, key: str) -> None:
        t0 = time.monotonic()
        r = engine.open("/" + name)
        took[key] = time.monotonic() - t0
        assert r.route == SERVE  # (the shape still waits for the probe: served, as before it)
        engine.release(r.fh)

    first = threading.Thread(target=timed_open, args=("hung.npy", "first"))
    try:
        engine.opener.kernel_route = True
        first.start()
        assert probing.wait(GATE_TIMEOUT)
        started = time.monotonic()
        timed_open("mid.npy", "mid")
        timed_open("big.npy", "big")
        big_done = time.monotonic() - started
        first.join(GATE_TIMEOUT)
        timed_open("big.npy", "later")
    finally:
        release.set()
        first.join(GATE_TIMEOUT)
        engine.close()
    assert took["mid"] < shape.SETTLE_WAIT / 4, took  # a smaller file: not held up
    assert big_done <= shape.SETTLE_WAIT + 0.5, (big_done, took)  # held up until the span ends at most
    assert took["first"] >= shape.SETTLE_WAIT * 0.9, took  # the open that started it waited, bounded
    assert took["later"] < shape.SETTLE_WAIT / 4, took  # after the span: no wait


def test_with_a_disk_tier_large_files_of_a_stream_client_stay_served(tmp_path, monkeypatch) -> None:
    """A disk tier is a request for local copies of what the mount reads: only served reads make them."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "d.bin").write_bytes(os.urandom(2 * MIB))
    _fake_mount_table(tmp_path, src, "fuse.rclone", monkeypatch)
    config = _config("auto")
    tier = tmp_path / "tier"
    tier.mkdir()
    config = dataclasses.replace(config, cache=dataclasses.replace(config.cache, disk_dir=str(tier)))
    engine = Engine(str(src), config)
    try:
        engine.opener.kernel_route = True
        r = engine.open("/d.bin")
        assert r.route == SERVE
        engine.release(r.fh)
        c = engine.snapshot()["counters"]
    finally:
        engine.close()
    assert c["stream_route_passthrough"] == c["stream_route_served"] == 0


def test_a_version_opened_again_on_a_stream_client_is_served(tmp_path, monkeypatch) -> None:
    """A reload through the client costs its whole download again: the second open is served, so
    RAM keeps the version for the loads after it."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(2 * MIB)
    (src / "d.bin").write_bytes(data)
    _fake_mount_table(tmp_path, src, "fuse.rclone", monkeypatch)
    engine = Engine(str(src), _config("auto"))
    try:
        engine.opener.kernel_route = True
        routes = []
        for _ in range(3):
            r = engine.open("/d.bin")
            routes.append(r.route)
            if r.route == SERVE:
                assert _read_all(engine, r.fh, len(data)) == data
            engine.release(r.fh)
        c = engine.snapshot()["counters"]
    finally:
        engine.close()
    assert routes == [PASS, SERVE, SERVE]
    assert (c["stream_route_passthrough"], c["stream_route_served"]) == (1, 2)
