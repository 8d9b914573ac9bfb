"""The native loop's direct reads (``_loop.Direct``) without a mount: what it serves, what it sends
back to the engine, and that it never serves a read the engine's stream policy would have joined to a
stream (a hypothesis walk against a policy that sees every read)."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastfs.daemon.kernel import session
from fastfs.fsio import stats as m
from fastfs.fsio.policy import MAX_STREAMS, StreamPolicy
from fastfs.fsio.readpath import DIRECT_READ_MAX, DirectTally, direct_limits

if session.native_loop is None:  # pragma: no cover - depends on the install
    pytest.skip("the native request loop is not built (no C compiler at install)", allow_module_level=True)
_loop = session.native_loop

PAGE = 4096
SIZE = 64 << 20  # the file of the policy walks (never read: only offsets matter there)


@pytest.fixture
def data_fd(tmp_path: Path):
    data = os.urandom(4 << 20)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    yield data, fd
    os.close(fd)


def table():
    return _loop.Direct(*direct_limits())


def test_the_loop_knows_as_many_reads_and_windows_as_the_policy_has_streams() -> None:
    assert _loop.DIRECT_RING == MAX_STREAMS and _loop.DIRECT_WINDOWS == MAX_STREAMS
    assert len(m.LATENCY_BUCKETS) < 32 and DIRECT_READ_MAX < 1 << 32


def test_served_reads_are_the_file_bytes_and_are_tallied(data_fd) -> None:
    data, fd = data_fd
    d = table()
    d.add(5, fd, len(data), [])
    assert len(d) == 1
    for off, size in ((1_000_000, 4096), (3_000_000, 100), (17, 60_000), (len(data) - 4096, 4096)):
        assert d.read(5, off, size) == data[off : off + size]
    tally = DirectTally(*d.take(5))
    assert tally.reads == 4 and tally.nbytes == 4096 + 100 + 60_000 + 4096
    assert sum(tally.latency) == 4 and len(tally.latency) == len(m.LATENCY_BUCKETS) + 1
    assert tally.sizes == {12: 2, 7: 1, 16: 1}  # by (size - 1).bit_length(), as the stats slot them
    assert tally.ring == ((1_000_000, 4096), (3_000_000, 100), (17, 60_000), (len(data) - 4096, 4096))
    assert d.take(5) is None  # taken: nothing left
    assert d.state(5) == (True, ())  # still handed over


def test_the_descriptor_is_the_tables_own(data_fd, tmp_path: Path) -> None:
    data, fd = data_fd
    d = table()
    dup = os.dup(fd)
    d.add(5, dup, len(data), [])
    os.close(dup)  # the engine's descriptor may go: the table keeps its duplicate
    assert d.read(5, 4096, 4096) == data[4096:8192]
    before = len(os.listdir("/proc/self/fd"))
    d.remove(5)
    assert len(os.listdir("/proc/self/fd")) == before - 1 and len(d) == 0
    assert d.read(5, 100_000, 4096) is None


def _lingering_socket() -> tuple[int, socket.socket, socket.socket]:
    """A descriptor whose last close blocks for a second: a TCP socket lingering (SO_LINGER 1 s) with
    unsent bytes its peer never reads, as the last close of a FUSE or network file waits on its
    daemon. Returns (the descriptor, and the listener and peer to close after)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sock = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 1))
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            sock.send(b"x" * 65536)
    return sock.detach(), listener, peer


def test_a_handle_s_descriptor_is_closed_without_the_gil() -> None:
    """The table's last close of a source file may wait (a FLUSH round trip on a FUSE source): other
    threads' Python runs meanwhile. Held across the close, the GIL stalled every handler of the mount
    (over loopback sshfs, a fifth of the time the GIL was held in a 16-thread pass)."""
    fd, listener, peer = _lingering_socket()
    d = table()
    d.add(5, fd, 1 << 20, [])
    os.close(fd)  # the table's duplicate is the last reference: its close lingers
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        time.sleep(0.05)
        t0, before = time.monotonic(), ticks
        d.remove(5)
        took, during = time.monotonic() - t0, ticks - before
    finally:
        done.set()
        counter.join()
        peer.close()
        listener.close()
    assert took >= 0.5  # the close did linger (else this test shows nothing)
    assert len(d) == 0
    assert during >= 50, f"no other thread ran while the close lingered {took:.2f} s ({during} ticks)"


@pytest.mark.parametrize(
    ("off", "size", "why"),
    [
        (2 << 20, 4096, "inside a window the engine gave"),
        (1_000_000 + 4096, 4096, "continues a read served here"),
        (1_000_000 + 4096 + 16 * PAGE, 4096, "within the policy's slack of one"),
        (500_000, DIRECT_READ_MAX, "as large as the fills split over streams"),
        ((4 << 20) - 4096, 8192, "reaching past the size handed over (the file may have grown)"),
        (4 << 20, 4096, "at the end"),
        (700_000, 0, "empty"),
    ],
)
def test_reads_the_engine_must_see_make_the_handle_inactive(data_fd, off: int, size: int, why: str) -> None:
    data, fd = data_fd
    d = table()
    d.add(5, fd, len(data), [((2 << 20) - 100, (2 << 20) + 100)])
    assert d.read(5, 1_000_000, 4096) == data[1_000_000:1_004_096]
    assert d.read(5, off, size) is None, why
    assert d.state(5) == (False, (((2 << 20) - 100, (2 << 20) + 100),))
    assert d.read(5, 3_000_000, 4096) is None  # inactive: every read goes to the handler
    d.add(5, -1, len(data), [])  # handed over again (the descriptor it has stays)
    assert d.read(5, 3_000_000, 4096) == data[3_000_000:3_004_096]


def test_a_read_just_beyond_the_slack_is_served(data_fd) -> None:
    data, fd = data_fd
    d = table()
    d.add(5, fd, len(data), [])
    assert d.read(5, 1_000_000, 4096) is not None
    far = 1_000_000 + 4096 + 16 * PAGE + 1
    assert d.read(5, far, 4096) == data[far : far + 4096]


def test_the_ring_keeps_the_last_reads_oldest_first(data_fd) -> None:
    data, fd = data_fd
    d = table()
    d.add(5, fd, len(data), [])
    offsets = [i * 300_000 for i in range(1, 12)]
    for off in offsets:
        assert d.read(5, off, 4096) is not None
    tally = DirectTally(*d.take(5))
    assert tally.reads == 11 and tally.ring == tuple((off, 4096) for off in offsets[-MAX_STREAMS:])


def test_drain_takes_the_tallies_and_leaves_the_rings(data_fd) -> None:
    data, fd = data_fd
    d = table()
    d.add(5, fd, len(data), [])
    d.add(6, fd, len(data), [])
    d.read(5, 300_000, 4096)
    d.read(6, 600_000, 4096)
    d.read(6, 900_000, 4096)
    drained = {fh: DirectTally(*t) for fh, t in d.drain()}
    assert {fh: t.reads for fh, t in drained.items()} == {5: 1, 6: 2} and not drained[6].ring
    assert d.drain() == []
    assert DirectTally(*d.remove(6)).ring == ((600_000, 4096), (900_000, 4096))
    assert len(d) == 1


# -- against the policy ------------------------------------------------------------------------------
read_steps = st.lists(
    st.tuples(
        st.sampled_from(["random", "next", "near", "back"]),
        st.integers(0, SIZE // PAGE - 1),
        st.sampled_from([512, 4096, 8192, 32768, 65536, 131072]),
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(read_steps)
def test_the_loop_serves_only_reads_that_join_no_stream(steps) -> None:
    """The ops adapter's protocol, played without a kernel: a read the loop does not serve goes to the
    engine (the tally taken, its ring fed to the policy, the read fed to it, the handle offered again
    with the policy's windows). A second policy sees every read: whatever the loop served, that one
    started a new stream for it that is not sequential and prefetches nothing."""
    fd = os.open("/dev/zero", os.O_RDONLY)
    try:
        d = table()
        engine = StreamPolicy(SIZE, 1 << 20, 64 << 20)
        every = StreamPolicy(SIZE, 1 << 20, 64 << 20)
        last_end = 0
        served = 0
        for kind, page, size in steps:
            off = {
                "random": page * PAGE,
                "next": last_end,
                "near": last_end + (page % 20) * PAGE,
                "back": max(0, last_end - (page % 20) * PAGE),
            }[kind]
            if off + size > SIZE:
                continue
            plan = every.on_read(off, size)
            if d.read(1, off, size) is not None:
                served += 1
                assert plan.new_random and not plan.sequential and not plan.prefetch, (kind, off, size)
            else:
                tally = d.take(1)
                if tally is not None:
                    for r_off, r_len in DirectTally(*tally).ring:
                        engine.on_read(r_off, r_len)
                engine.on_read(off, size)
                windows = engine.direct_windows()
                if windows is not None:
                    d.add(1, fd, SIZE, windows)
            last_end = off + size
    finally:
        os.close(fd)
