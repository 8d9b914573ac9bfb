"""The benchmarks' storages: spec parsing, the servers' log classifiers, the delay line, and each real
network client (rclone, sshfs, s3fs, GlusterFS) end to end on loopback.

The matrix judges fastfs over these sources, so what they count must be right: a source's files read
byte-exact through its mount, its request and byte counters move by what was read, and its teardown
leaves no mount, no server and no temporary directory behind. A client that is not installed skips
its test (``make bench-deps`` installs them).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from benchkit import netsources  # noqa: E402
from benchkit.delayline import delay_line  # noqa: E402
from benchkit.storages import parse_storages  # noqa: E402
from benchkit.system import is_mounted  # noqa: E402

DATA = os.urandom(3 * 1024 * 1024 + 17)


def test_storage_specs_parse_and_reject():
    specs = parse_storages(["rclone,sshfs:delay=2,keep=1,emu:issue14,emu:lat=5,dirops=serial", "s3fs"])
    assert [(s.kind, s.label) for s in specs] == [
        ("rclone", "rclone"),
        ("sshfs", "sshfs:delay=2,keep=1"),
        ("emu", "issue14"),
        ("emu", "emu:lat=5,dirops=serial"),
        ("s3fs", "s3fs"),
    ]
    opts = specs[1].net_options()
    assert (opts.delay_ms, opts.keep_client) == (2.0, True)
    assert specs[3].behaviour().latency_ms == 5.0 and not specs[3].behaviour().parallel_dirops
    opts = parse_storages(["s3fs:subtype=objstore,delay=1"])[0].net_options()
    assert (opts.subtype, opts.delay_ms, opts.client_options()) == ("objstore", 1.0, ["-o", "subtype=objstore"])
    for bad in ("nfs", "rclone:delay=x", "rclone:speed=3", "emu:lat=x", "sshfs:delay=-1", "sshfs:subtype=a b"):
        with pytest.raises(ValueError):
            parse_storages([bad])


def test_server_log_classifiers():
    assert netsources.rclone_kind("2026/12/01 23:59:49 INFO  : /a.bin: GET from 127.0.0.1:55102") == "get"
    assert netsources.rclone_kind("2026/12/01 23:59:47 INFO  : /: PROPFIND from 127.0.0.1:55102") == "propfind"
    assert netsources.rclone_kind("2026/12/01 DEBUG : a.bin: ChunkedReader.Read at 0") is None
    assert netsources.sftp_kind('debug1: request 620: read "/d/a.bin" (handle 0) off 0 len 32768') == "read"
    assert netsources.sftp_kind("debug1: request 620: sent data len 11520") == "requests"
    assert netsources.sftp_kind('open "/d/a.bin" flags READ mode 0666') == "open"
    assert netsources.sftp_kind('lstat name "/d"') == "stat"
    assert netsources.moto_kind('127.0.0.1 - - [x] "GET /bench/a.bin HTTP/1.1" 206 -') == "get"
    assert netsources.moto_kind('127.0.0.1 - - [x] "GET /bench?list-type=2&prefix= HTTP/1.1" 200 -') == "list"
    assert netsources.moto_kind('127.0.0.1 - - [x] "GET /bench/ HTTP/1.1" 200 -') == "list"
    assert netsources.moto_kind('127.0.0.1 - - [x] "HEAD /bench/dir/b HTTP/1.1" 200 -') == "head"


def test_log_counts_take_each_line_once_and_wait_for_its_end(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("INFO  : /a: GET from x:1\nINFO  : /b: GE")
    counts = netsources.LogCounts(str(log), netsources.rclone_kind)
    assert counts.poll() == {"get": 1}
    with open(log, "a") as f:
        f.write("T from x:1\nINFO  : /: PROPFIND from x:1\n")
    assert counts.poll() == {"get": 2, "propfind": 1}
    assert counts.poll() == {"get": 2, "propfind": 1}


def test_delay_line_delays_each_direction_and_counts_bytes(tmp_path):
    """An echo server behind a 30 ms delay line: a round trip takes >= 60 ms, bulk data still flows
    pipelined (well under one round trip per chunk), and both directions' bytes are counted."""
    if shutil.which("cc") is None:
        pytest.skip("needs cc")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def echo() -> None:
        conn, _ = srv.accept()
        with conn:
            while chunk := conn.recv(65536):
                conn.sendall(chunk)

    threading.Thread(target=echo, daemon=True).start()
    payload = os.urandom(8 * 1024 * 1024)
    with (
        delay_line(srv.getsockname()[1], 30, str(tmp_path)) as dl,
        socket.create_connection(("127.0.0.1", dl.port)) as s,
    ):
        t0 = time.monotonic()
        s.sendall(b"x")
        assert s.recv(1) == b"x"
        assert time.monotonic() - t0 >= 0.06
        sender = threading.Thread(target=s.sendall, args=(payload,), daemon=True)
        t0 = time.monotonic()
        sender.start()
        got = bytearray()
        while len(got) < len(payload):
            got += s.recv(1 << 20)
        elapsed = time.monotonic() - t0
        sender.join()
        assert bytes(got) == payload
        assert elapsed < 2.0  # 128 chunks of 64 KiB one round trip each would take 7.7 s
        c = dl.counters()
        assert c["connections"] == 1 and c["bytes_up"] == c["bytes_down"] == len(payload) + 1
    srv.close()


def _tools(kind: str) -> list[str]:
    return {
        "rclone": ["rclone"],
        "sshfs": ["sshfs", netsources.SSHD, netsources.SFTP_SERVER, "unshare"],
        "s3fs": ["s3fs"],
        "gluster": ["glusterfsd", "glusterfs"],
    }[kind]


@pytest.mark.parametrize("kind", ["rclone", "sshfs", "s3fs", "gluster"])
def test_network_source_reads_exact_bytes_counts_and_tears_down(tmp_path, kind):
    if any(shutil.which(t) is None and not os.path.exists(t) for t in _tools(kind)):
        pytest.skip(f"{kind} is not installed (make bench-deps)")
    if kind == "s3fs":
        pytest.importorskip("moto.server")
    data_dir = tmp_path / "data"
    (data_dir / "sub").mkdir(parents=True)
    (data_dir / "big.bin").write_bytes(DATA)
    for i in range(5):
        (data_dir / "sub" / f"f{i}").write_bytes(DATA[i * 1000 : i * 1000 + 3000])
    mnt = tmp_path / "mnt"
    kwargs = {"paths": ["big.bin", "sub"]} if kind in ("s3fs", "gluster") else {}
    options = netsources.NetOptions(subtype="" if kind in ("rclone", "gluster") else "benchclient")
    with netsources.SOURCES[kind](str(data_dir), str(mnt), options, **kwargs) as src:
        work = src.work
        if options.subtype:  # mounted as a client fastfs does not know
            from fastfs.fsio.source import read_mount_type

            assert read_mount_type(str(mnt)) == "fuse.benchclient"
        before = src.counters()
        with open(mnt / "big.bin", "rb") as f:
            assert f.read() == DATA
        assert sorted(os.listdir(mnt / "sub")) == [f"f{i}" for i in range(5)]
        for i in range(5):
            assert (mnt / "sub" / f"f{i}").read_bytes() == DATA[i * 1000 : i * 1000 + 3000]
        after = src.counters()
        assert after["data_requests"] - before["data_requests"] >= 1 + 5
        assert after["requests"] - before["requests"] >= after["data_requests"] - before["data_requests"]
        moved = after["source_bytes"] - before["source_bytes"]
        assert len(DATA) <= moved <= 2 * len(DATA) + 1024 * 1024, moved
        src.reset()  # a cold run's client remount
        assert is_mounted(str(mnt)) and (mnt / "sub" / "f0").read_bytes() == DATA[:3000]
        server_pids = list(src.io._last) if src.io is not None else []
    assert not is_mounted(str(mnt))
    assert not os.path.exists(work)
    for pid in server_pids:  # gone (or a zombie of a parent that has not reaped it yet)
        assert _gone(pid)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_a_failed_run_keeps_the_daemons_log_and_leaves_no_mount(tmp_path, capsys, monkeypatch):
    """A run that fails through fastfs keeps the daemon's log out of the state directory that goes
    with the mount (benchkit.mounts.fastfs_mount), so a source's error can be told from the daemon's."""
    from benchkit.mounts import fastfs_mount

    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    (src / "a").write_bytes(b"abc")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the kept log goes (tempfile reads it once)
    monkeypatch.setattr("tempfile.tempdir", None)
    with pytest.raises(RuntimeError, match="the run failed"), fastfs_mount(str(src), str(mnt)) as mount:
        assert (mnt / "a").read_bytes() == b"abc"
        assert mount.log and os.path.exists(mount.log)
        raise RuntimeError("the run failed")
    assert not is_mounted(str(mnt))
    kept = [p for p in os.listdir(tmp_path) if p.startswith("fastfs-bench-failed-")]
    assert len(kept) == 1
    assert os.path.getsize(tmp_path / kept[0]) > 0
    assert str(tmp_path / kept[0]) in capsys.readouterr().err
