"""The benchmarks' latency emulator: its behaviour specs and what each switch makes the kernel send.

The benchmark matrix compares fastfs with direct reads over emulated storages that differ in
read-ahead, page cache and bandwidth accounting; these tests check on a real emulator mount that
each switch does what its name says (request counts and sizes seen by the emulator, bytes equal to
the source) and that a spec round-trips. ``emulated`` always unmounts, even when a test fails.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from latency_fs import Behaviour, emulated  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")

DATA = os.urandom(256 * 1024)


def test_spec_round_trip_and_errors():
    b = Behaviour.parse("lat=5,meta=0.8,mbps=200,bw=request,ra=0,cache=direct,attr=2,dirops=serial,threads=8")
    assert (b.latency_ms, b.meta_latency_ms, b.mbps, b.bandwidth) == (5.0, 0.8, 200.0, "request")
    assert (b.read_ahead_kb, b.cache, b.attr_timeout, b.parallel_dirops, b.threads) == (0, "direct", 2.0, False, 8)
    assert Behaviour.parse(b.spec()) == b
    assert Behaviour.parse("") == Behaviour()
    assert Behaviour().meta_latency_ms == Behaviour().latency_ms
    for bad in ("lat=x", "nope=1", "bw=tcp", "cache=some", "dirops=maybe", "lat"):
        with pytest.raises(ValueError):
            Behaviour.parse(bad)


def _read(emu, size: int) -> tuple[bytes, int, int]:
    """(bytes of one read of *size* at 0, emulator requests, emulator bytes) of a cold file."""
    before = emu.counters()
    with open(os.path.join(emu.mnt, "f"), "rb", buffering=0) as f:
        data = f.read(size)
    after = emu.counters()
    return data, after["reads"] - before["reads"], after["read_bytes"] - before["read_bytes"]


@pytest.mark.parametrize(
    ("spec", "requests"),
    [
        ("ra=0", 16),  # no read-ahead: buffered reads reach the source page by page
        ("cache=direct", 1),  # direct_io: the read reaches the source at the size asked
    ],
)
def test_read_ahead_and_cache_switches(tmp_path, spec, requests):
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(DATA)
    with emulated(str(src), str(tmp_path / "mnt"), behaviour=Behaviour.parse("lat=0," + spec)) as emu:
        data, reads, nbytes = _read(emu, 64 * 1024)
        assert data == DATA[: 64 * 1024]
        assert (reads, nbytes) == (requests, 64 * 1024)
        assert emu.stats()["cache"] == Behaviour.parse(spec).cache


def test_bandwidth_per_handle_serialises_per_request_does_not(tmp_path):
    """Four parallel 64 KiB reads on one handle at 2 MB/s: serialised per handle, overlapped per request."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(DATA)
    seconds = {}
    for bw in ("handle", "request"):
        spec = f"lat=0,mbps=2,bw={bw},cache=direct"
        with emulated(str(src), str(tmp_path / f"mnt-{bw}"), behaviour=Behaviour.parse(spec)) as emu:
            fd = os.open(os.path.join(emu.mnt, "f"), os.O_RDONLY)
            try:
                t = time.monotonic()
                with ThreadPoolExecutor(4) as ex:
                    parts = list(ex.map(os.pread, [fd] * 4, [64 * 1024] * 4, [i * 64 * 1024 for i in range(4)]))
                seconds[bw] = time.monotonic() - t
            finally:
                os.close(fd)
            assert b"".join(parts) == DATA
    # 4 x 64 KiB at 2 MB/s: 131 ms in sequence on one handle, 33 ms each in parallel per request
    assert seconds["handle"] >= 0.125
    assert seconds["request"] < 0.75 * seconds["handle"]


def test_ranged_stream_restarts_on_out_of_order_reads(tmp_path):
    """stream=on: in-order reads of a handle continue its stream (one start, no waste); a backwards or far
    read restarts it and charges the wasted transfer; a small forward skip continues and moves the gap."""
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(4 * 1024 * 1024)
    (src / "f").write_bytes(data)
    spec = "lat=0,stream=on,waste=64,skip=128,cache=direct"
    with emulated(str(src), str(tmp_path / "mnt"), behaviour=Behaviour.parse(spec)) as emu:
        assert emu.stats()["stream"] is True
        path = os.path.join(emu.mnt, "f")
        before = emu.counters()
        fd = os.open(path, os.O_RDONLY)
        try:
            got = [os.pread(fd, 64 * 1024, off) for off in range(0, 1024 * 1024, 64 * 1024)]  # in order
            assert b"".join(got) == data[: 1024 * 1024]
            seq = emu.counters()
            assert seq["stream_starts"] - before["stream_starts"] == 1
            assert seq["restarts"] == before["restarts"]
            assert seq["transferred_bytes"] - before["transferred_bytes"] == 1024 * 1024
            # 64 KiB ahead of the stream: within skip=128 KiB, continues (the gap is transferred)
            assert os.pread(fd, 4096, 1024 * 1024 + 64 * 1024) == data[1024 * 1024 + 65536 : 1024 * 1024 + 65536 + 4096]
            skip = emu.counters()
            assert skip["restarts"] == seq["restarts"]
            assert skip["transferred_bytes"] - seq["transferred_bytes"] == 64 * 1024 + 4096
            # backwards, then far ahead: two restarts, each wasting 64 KiB
            assert os.pread(fd, 4096, 0) == data[:4096]
            assert os.pread(fd, 4096, 3 * 1024 * 1024) == data[3 * 1024 * 1024 : 3 * 1024 * 1024 + 4096]
        finally:
            os.close(fd)
        after = emu.counters()
        assert after["restarts"] - skip["restarts"] == 2
        assert after["wasted_bytes"] - skip["wasted_bytes"] == 2 * 64 * 1024
        assert after["transferred_bytes"] - skip["transferred_bytes"] == 2 * (4096 + 64 * 1024)
        assert after["read_bytes"] - before["read_bytes"] == 1024 * 1024 + 3 * 4096


def test_stream_needs_per_handle_bandwidth():
    with pytest.raises(ValueError):
        Behaviour.parse("stream=on,bw=request")
    b = Behaviour.parse("stream=on,waste=16,skip=0")
    assert (b.stream, b.stream_waste_kb, b.stream_skip_kb) == (True, 16, 0)
    assert Behaviour.parse(b.spec()).spec() == b.spec()


def test_fault_switches_fail_and_release_reads(tmp_path):
    """The emulator's fault switches (the reliability tests' faultfs): eio fails a read of a matching
    file only, a hang blocks it until the pattern goes, and clearing the control file restores reads."""
    import json
    import threading

    from latency_fs import FAULT_SPEC

    src = tmp_path / "src"
    src.mkdir()
    (src / "bad.bin").write_bytes(DATA)
    (src / "good.bin").write_bytes(DATA[::-1])
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"eio": ["/bad*"]}))
    with emulated(str(src), str(tmp_path / "mnt"), behaviour=Behaviour.parse(FAULT_SPEC), control=str(control)) as emu:
        bad, good = os.path.join(emu.mnt, "bad.bin"), os.path.join(emu.mnt, "good.bin")
        with pytest.raises(OSError) as err, open(bad, "rb") as f:
            f.read()
        assert err.value.errno == 5  # EIO
        with open(good, "rb") as f:
            assert f.read() == DATA[::-1]
        tmp = tmp_path / "control.tmp"
        tmp.write_text(json.dumps({"hang": ["/bad.bin"]}))
        os.replace(tmp, control)
        box: dict[str, bytes] = {}

        def read_bad() -> None:
            with open(bad, "rb") as f:
                box["data"] = f.read()

        reader = threading.Thread(target=read_bad, daemon=True)
        reader.start()
        reader.join(0.5)
        assert reader.is_alive()  # held by the hang
        tmp.write_text(json.dumps({}))
        os.replace(tmp, control)
        reader.join(10)
        assert box.get("data") == DATA
