"""``fastfs status``: every fastfs mount with its health; dead mounts flagged with their recovery."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import SERVED, force_unmount, is_mounted, mounted, rand_bytes, run_cli, wait_for

from fastfs.daemon.cli import status
from fastfs.daemon.mounttable import MountEntry, find_mount, mount_record

STATUS_KEYS = {
    "mountpoint",
    "source",
    "state",
    "pid",
    "uptime_seconds",
    "started",
    "cache_bytes",
    "cache_budget",
    "hit_ratio",
    "recover",
    "error",
}


def _one_line_error(result) -> str:
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastfs: error: ") and "Traceback" not in result.stderr
    return lines[0]


def test_status_lists_live_and_dead_mounts_and_the_recovery_works(tmp_path: Path) -> None:
    data = rand_bytes(3 * 1024 * 1024, 5)
    srcs, mnts = [], []
    for name in ("a", "b"):
        (tmp_path / f"src{name}").mkdir()
        (tmp_path / f"src{name}" / "f.bin").write_bytes(data)
        (tmp_path / f"mnt{name}").mkdir()
        srcs.append(tmp_path / f"src{name}")
        mnts.append(tmp_path / f"mnt{name}")
    with mounted(srcs[0], mnts[0], options=["budget=64M", SERVED]) as live, mounted(srcs[1], mnts[1]) as doomed:
        assert (mnts[0] / "f.bin").read_bytes() == data
        assert (mnts[0] / "f.bin").read_bytes() == data
        doomed.proc.kill()
        doomed.proc.wait(timeout=30)
        assert is_mounted(mnts[1])

        result = run_cli("status", *mnts, "--json")
        assert result.returncode == 1, result.stderr  # a dead mount is a failure
        doc = json.loads(result.stdout)
        assert list(doc) == ["mounts"] and len(doc["mounts"]) == 2
        ok, dead = doc["mounts"]
        assert set(ok) == set(dead) == STATUS_KEYS
        assert ok["state"] == "ok" and ok["mountpoint"] == str(mnts[0]) and ok["source"] == str(srcs[0])
        assert ok["pid"] == live.pid and ok["uptime_seconds"] > 0 and abs(ok["started"] - time.time()) < 600
        assert ok["cache_budget"] == 64 * 1024 * 1024 and 0 < ok["cache_bytes"] <= ok["cache_budget"]
        assert 0 <= ok["hit_ratio"] <= 1 and ok["recover"] is None and ok["error"] is None
        assert dead["state"] == "dead" and dead["source"] == str(srcs[1]) and dead["pid"] is None
        assert dead["recover"] == f"fastfs umount {mnts[1]}"

        table = run_cli("status", *mnts)
        assert table.returncode == 1 and table.stderr == ""
        lines = table.stdout.splitlines()
        assert lines[0].split() == ["MOUNTPOINT", "SOURCE", "STATE", "PID", "UPTIME", "CACHE", "HIT"]
        row = next(line for line in lines if line.startswith(str(mnts[0]) + " "))
        assert " ok " in row and f" {live.pid} " in row and "/ 64.0 MiB" in row
        assert any(line.startswith(str(mnts[1]) + " ") and " dead " in line for line in lines)
        assert f"recover with: fastfs umount {mnts[1]}" in table.stdout

        # mounting over the dead mount says how to recover, in both modes
        for extra in ([], ["--foreground"]):
            line = _one_line_error(run_cli("mount", srcs[1], mnts[1], *extra))
            assert f"fastfs umount {mnts[1]}" in line
        # the recovery command works, and status is clean again
        assert run_cli(*dead["recover"].split()[1:]).returncode == 0
        assert not is_mounted(mnts[1])
        again = run_cli("status", mnts[0], "--json")
        assert again.returncode == 0 and [m["state"] for m in json.loads(again.stdout)["mounts"]] == ["ok"]
        everything = run_cli("status", "--json")  # the whole machine (other mounts may be listed too)
        assert str(mnts[0]) in [m["mountpoint"] for m in json.loads(everything.stdout)["mounts"]]


def test_status_of_a_path_that_is_not_a_mount_is_a_one_line_error(tmp_path: Path) -> None:
    assert "is not a fastfs mount" in _one_line_error(run_cli("status", tmp_path))
    assert "is not a fastfs mount" in _one_line_error(run_cli("status", tmp_path / "missing", "--json"))


def _entry(mnt: str = "/m") -> MountEntry:
    return MountEntry("0:99", mnt, "fuse.fastfs", "fastfs:/data/src")


def test_probe_does_not_hang_on_a_hung_mount(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def hung_getxattr(path: str, name: str) -> bytes:
        release.wait(10)  # a daemon that does not answer
        return b"{}"

    monkeypatch.setattr(os, "getxattr", hung_getxattr)
    start = time.monotonic()
    try:
        (result,) = status.probe([_entry()], timeout=0.2)
        assert time.monotonic() - start < 2
    finally:
        release.set()
    assert result.state == "unresponsive" and result.source == "/data/src"
    assert result.recover == "fastfs umount --lazy /m" and "no answer" in result.error


@pytest.mark.parametrize(
    ("code", "state", "recover"),
    [
        (errno.ENOTCONN, "dead", "fastfs umount /m"),
        (errno.EACCES, "inaccessible", None),
        (errno.EIO, "unresponsive", "fastfs umount --lazy /m"),
    ],
)
def test_states_of_failed_probes(code: int, state: str, recover: str | None) -> None:
    result = status.from_error(_entry(), OSError(code, os.strerror(code)))
    assert (result.state, result.recover) == (state, recover) and result.error


def test_table_of_no_mounts_and_exit_status() -> None:
    assert status.format_table([]) == "no fastfs mounts"
    dead = status.from_error(_entry(), OSError(errno.ENOTCONN, "x"))
    text = status.format_table([dead])
    assert "dead" in text and "recover with: fastfs umount /m" in text


def test_stats_of_a_missing_path_says_it_does_not_exist(tmp_path: Path) -> None:
    line = _one_line_error(run_cli("stats", tmp_path / "nonexistent"))
    assert line == f"fastfs: error: {tmp_path / 'nonexistent'} does not exist"
    assert "is not a fastfs mount" in _one_line_error(run_cli("stats", tmp_path))


def test_background_mount_prints_one_line_with_mountpoint_pid_and_log(tmp_path: Path) -> None:
    src, mnt, log = tmp_path / "src", tmp_path / "mnt", tmp_path / "d.log"
    src.mkdir()
    mnt.mkdir()
    (src / "x").write_bytes(b"x")
    try:
        result = run_cli("mount", src, mnt, "--log-file", log, timeout=90)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) == 1
        snap = json.loads(os.getxattr(mnt, "user.fastfs.stats"))
        pid = snap["mount"]["pid"]
        assert lines[0] == f"fastfs: mounted {src} on {mnt} (pid {pid}, log {log})"
        assert (mnt / "x").read_bytes() == b"x"
        assert run_cli("umount", mnt).returncode == 0
    finally:
        force_unmount(mnt)


# -- a killed daemon over a hung source (issue 24 item 4) -------------------------------------------------
# Seconds a `fastfs status` may take: its deadline (5 s) plus interpreter start-up on a loaded machine.
STATUS_BOUND = status.PROBE_TIMEOUT + 3.0
# Seconds a `fastfs umount` of a dead mount may take (it never waits for the mount).
UMOUNT_BOUND = 15.0


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return "gone"
    return text[text.rindex(")") + 2]


def _waits_on_fuse(pid: int) -> bool:
    """True when a thread of *pid* waits for a FUSE request's answer (here: a read of the hung source)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/wchan") as f:
                if f.read() == "request_wait_answer":
                    return True
        except OSError:
            continue
    return False


def _timed_cli(*args: object) -> tuple[float, object]:
    start = time.monotonic()
    result = run_cli(*args, timeout=60)
    return time.monotonic() - start, result


def test_a_daemon_killed_over_a_hung_source_is_dead_and_umount_recovers(tmp_path: Path) -> None:
    """kill -9 of a daemon whose read of a hung source blocks a reader: status said `unresponsive`
    after 5 s, a second status ran past 20 s, `stat MNT` hung and `fastfs umount` hung past 30 s."""
    from faultfs import faultfs_mounted

    backing, src, mnt = tmp_path / "backing", tmp_path / "faultsrc", tmp_path / "mnt"
    for d in (backing, src, mnt):
        d.mkdir()
    (backing / "slow.bin").write_bytes(rand_bytes(2 << 20, 9))
    with faultfs_mounted(backing, src, tmp_path / "faultfs-work") as fault:
        fault.set(hang=["/slow.bin"])
        reader = None
        try:
            with mounted(src, mnt, options=["read_timeout=300", "request_timeout=300"]) as m:
                reader = subprocess.Popen(["dd", f"if={mnt}/slow.bin", "of=/dev/null", "bs=1M"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
                assert wait_for(lambda: _proc_state(reader.pid) == "D", timeout=30)  # blocked in the mount
                assert wait_for(lambda: _waits_on_fuse(m.pid), timeout=30)  # the daemon's read of the source
                assert wait_for(lambda: mount_record(find_mount(str(mnt))) is not None, timeout=30)
                m.proc.kill()
                assert wait_for(lambda: _proc_state(m.pid) in ("Z", "gone"), timeout=30)
                assert is_mounted(mnt)
                for _ in range(2):  # the second one too: nothing of the first is left waiting
                    seconds, result = _timed_cli("status", mnt, "--json")
                    assert seconds < STATUS_BOUND, seconds
                    assert result.returncode == 1, result.stderr
                    (entry,) = json.loads(result.stdout)["mounts"]
                    assert (entry["state"], entry["recover"]) == ("dead", f"fastfs umount {mnt}"), entry
                    assert entry["source"] == str(src) and f"pid {m.pid}" in entry["error"]
                seconds, table = _timed_cli("status")
                assert seconds < STATUS_BOUND and f"recover with: fastfs umount {mnt}" in table.stdout
                seconds, done = _timed_cli("umount", mnt)
                assert seconds < UMOUNT_BOUND and done.returncode == 0, done.stderr
                assert not is_mounted(mnt)
                assert reader.wait(timeout=30) != 0  # the blocked read returned (an error) once aborted
                fault.clear()  # the killed daemon's stuck thread returns, and the process can be reaped
        finally:
            fault.clear()
            if reader is not None and reader.poll() is None:
                reader.kill()
            force_unmount(mnt)


def test_a_stopped_daemon_is_unresponsive_within_the_deadline(src: Path, mnt: Path) -> None:
    (src / "f").write_bytes(b"x")
    with mounted(src, mnt) as m:
        os.kill(m.pid, signal.SIGSTOP)
        try:
            for _ in range(2):
                seconds, result = _timed_cli("status", mnt, "--json")
                assert seconds < STATUS_BOUND, seconds
                (entry,) = json.loads(result.stdout)["mounts"]
                assert entry["state"] == "unresponsive" and entry["recover"] == f"fastfs umount --lazy {mnt}"
        finally:
            os.kill(m.pid, signal.SIGCONT)
        assert json.loads(run_cli("status", mnt, "--json").stdout)["mounts"][0]["state"] == "ok"
