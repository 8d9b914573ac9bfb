"""The ``fastfs`` command line and the mount lifecycle, against real mounts."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SERVED, _session_state_dir, force_unmount, is_mounted, mounted, run_cli, wait_for

from fastfs.daemon.summary import human_bytes

DATA = os.urandom(3 * 1024 * 1024 + 123)
# Seconds to wait for a daemon to exit or a log line to appear.
WAIT = 30.0
# Seconds within which a slow mount must have said what it waits for (due after 2 s).
NOTICE_WITHIN = 10.0


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fastfs: error: "), result.stderr
    return lines[0]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def populated(src: Path) -> Path:
    (src / "data.bin").write_bytes(DATA)
    (src / "sub").mkdir()
    (src / "sub" / "note.txt").write_text("note\n")
    return src


# -- bad input --------------------------------------------------------------------------------------
def _cases(tmp: Path, src: Path, mnt: Path) -> dict[str, tuple[list[object], str]]:
    (tmp / "afile").write_text("x")
    full = tmp / "full"
    full.mkdir()
    (full / "x").write_text("x")
    inner = src / "inner"
    inner.mkdir()
    bad_key = tmp / "bad_key.yaml"
    bad_key.write_text("cache:\n  nonsense: 1\n")
    bad_value = tmp / "bad_value.yaml"
    bad_value.write_text("cache:\n  workers: -3\n")
    bad_yaml = tmp / "bad.yaml"
    bad_yaml.write_text("cache: [unclosed\n")
    return {
        "src-missing": (["mount", tmp / "nope", mnt], "does not exist"),
        "src-file": (["mount", tmp / "afile", mnt], "not a directory"),
        "mnt-missing": (["mount", src, tmp / "nope"], "does not exist"),
        "mnt-file": (["mount", src, tmp / "afile"], "not a directory"),
        "mnt-not-empty": (["mount", src, full], "not empty"),
        "mnt-inside-src": (["mount", src, inner], "inside"),
        # (not "create it": a mount point made there would change the source)
        "mnt-missing-inside-src": (["mount", src, src / "nope"], "inside source"),
        "mnt-is-src": (["mount", src, src], "is the source itself"),
        "bad-config-key": (["mount", src, mnt, "--config", bad_key], "cache.nonsense"),
        "bad-config-value": (["mount", src, mnt, "--config", bad_value], "cache.workers"),
        "bad-yaml": (["mount", src, mnt, "--config", bad_yaml], "YAML"),
        "missing-config": (["mount", src, mnt, "--config", tmp / "none.yaml"], "not found"),
        "bad-option-value": (["mount", src, mnt, "-o", "budget=lots"], "cache.budget"),
        "unknown-option": (["mount", src, mnt, "-o", "frobnicate=1"], "frobnicate"),
        "no-paths": (["mount"], "SRC and MNT"),
    }


CASE_NAMES = [
    "src-missing",
    "src-file",
    "mnt-missing",
    "mnt-file",
    "mnt-not-empty",
    "mnt-inside-src",
    "mnt-missing-inside-src",
    "mnt-is-src",
    "bad-config-key",
    "bad-config-value",
    "bad-yaml",
    "missing-config",
    "bad-option-value",
    "unknown-option",
    "no-paths",
]


@pytest.mark.parametrize("foreground", [False, True], ids=["background", "foreground"])
@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input_is_one_line_and_mounts_nothing(
    tmp_path: Path, src: Path, mnt: Path, case: str, foreground: bool
) -> None:
    args, expected = _cases(tmp_path, src, mnt)[case]
    if foreground:
        args = [*args, "--foreground"]
    result = run_cli(*args, timeout=60)
    line = _one_line_error(result)
    assert expected in line
    assert not is_mounted(mnt)
    assert not any(is_mounted(p) for p in tmp_path.rglob("*") if p.is_dir() and not p.is_symlink())


def test_mountpoint_already_mounted(populated: Path, mnt: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    with mounted(populated, mnt):
        expected = (
            f"fastfs: error: mountpoint {mnt} is already a fastfs mount (fastfs:{populated}): unmount it first"
            f" (fastfs umount {mnt}) or mount on another directory"
        )
        assert _one_line_error(run_cli("mount", other, mnt)) == expected
        assert _one_line_error(run_cli("mount", other, mnt, "--foreground")) == expected
        assert (mnt / "data.bin").read_bytes() == DATA


def test_help_names_the_background_log() -> None:
    result = run_cli("mount", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "/var/log/fastfs/" in text and "0600" in text and "/tmp/" not in text


def test_usage_error_is_one_line() -> None:
    _one_line_error(run_cli("mount", "--no-such-flag"))
    _one_line_error(run_cli("frobnicate"))


# -- background mount -------------------------------------------------------------------------------
def test_background_mount_is_live_on_return_and_umount_works(populated: Path, mnt: Path, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    pid = None
    try:
        result = run_cli("mount", populated, mnt, "--log-file", log, timeout=90)
        assert result.returncode == 0, result.stderr + log.read_text()
        assert result.stderr == ""
        # Live the moment the command returned: no polling.
        assert (mnt / "data.bin").read_bytes() == DATA
        assert sorted(os.listdir(mnt)) == ["data.bin", "sub"]
        pid = json.loads((mnt / ".fastfs" / "stats").read_bytes())["mount"]["pid"]
        assert pid != os.getpid() and _pid_alive(pid)
        result = run_cli("umount", mnt)
        assert result.returncode == 0, result.stderr
        assert not is_mounted(mnt)
        assert wait_for(lambda: not _pid_alive(pid)), "daemon kept running after umount"
        assert "mounted" in log.read_text()
        assert os.listdir(mnt) == []
    finally:
        force_unmount(mnt)
        if pid is not None and _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def _session_state() -> Path:
    return Path(_session_state_dir())


def test_background_mounts_of_the_same_basename_get_their_own_private_logs(populated: Path, tmp_path: Path) -> None:
    """Issue 12 finding 6: the default log was /tmp/fastfs-<basename>.log: predictable, shared by mounts
    of the same basename, world-readable."""
    name = f"samename{os.getpid()}"
    mnts = [tmp_path / "a" / name, tmp_path / "b" / name]
    logs_dir = _session_state() / "logs"
    try:
        for mnt in mnts:
            mnt.mkdir(parents=True)
            result = run_cli("mount", populated, mnt, timeout=90)
            assert result.returncode == 0, result.stderr
            assert (mnt / "sub" / "note.txt").read_text() == "note\n"
        assert not Path(f"/tmp/fastfs-{name}.log").exists()
        logs = sorted(logs_dir.glob(f"{name}-*.log"))
        assert len(logs) == 2, logs
        for log in logs:
            assert stat.S_IMODE(log.stat().st_mode) == 0o600
        texts = [log.read_text() for log in logs]
        for mnt in mnts:
            assert sum(f"on {mnt}" in text for text in texts) == 1, texts
        assert stat.S_IMODE(logs_dir.stat().st_mode) == 0o700
        for mnt in mnts:
            assert run_cli("umount", mnt).returncode == 0
    finally:
        for mnt in mnts:
            force_unmount(mnt)
        for log in logs_dir.glob(f"{name}-*.log"):
            log.unlink()
        Path(f"/tmp/fastfs-{name}.log").unlink(missing_ok=True)


@pytest.mark.parametrize("which", ["override", "default"])
def test_log_file_symlink_is_refused_and_its_target_untouched(populated: Path, mnt: Path, tmp_path: Path, which: str):
    """Issue 12 finding 6: a symlink planted at the log path made the daemon append to its target."""
    from fastfs.daemon import logsetup

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    victim.chmod(0o600)
    if which == "override":
        link = tmp_path / "planted.log"
        args = ["--log-file", link]
    else:
        link = Path(logsetup.default_log_file(str(mnt), str(_session_state())))
        link.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        args = []
    link.symlink_to(victim)
    try:
        line = _one_line_error(run_cli("mount", populated, mnt, *args, timeout=90))
        assert "symlink" in line, line
        assert not is_mounted(mnt)
        assert victim.read_bytes() == b"precious\n"
    finally:
        force_unmount(mnt)
        link.unlink()


def test_a_slow_start_says_what_it_waits_for(tmp_path: Path) -> None:
    """A mount over a source with 4 s metadata latency printed nothing for 12.6 s: after 2 s of
    silence `fastfs mount` names the stage it waits for (here the daemon's first look at the source)."""
    from faultfs import faultfs_mounted

    backing, src, mnt = tmp_path / "backing", tmp_path / "faultsrc", tmp_path / "mnt"
    for d in (backing, src, mnt):
        d.mkdir()
    (backing / "f").write_bytes(DATA)
    with faultfs_mounted(backing, src, tmp_path / "faultfs-work") as fault:
        fault.set(hang_meta=["/.fastfs"])  # only the daemon looks there (the reserved control name)
        env = {**os.environ, "STATE_DIRECTORY": _session_state_dir()}
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastfs", "mount", str(src), str(mnt), "--log-file", str(tmp_path / "log")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            lines: list[str] = []
            reader = threading.Thread(target=lambda: lines.append(proc.stderr.readline()), daemon=True)
            reader.start()
            reader.join(NOTICE_WITHIN)  # the notice is due after 2 s; without one the test fails, not hangs
            fault.clear()
            reader.join(WAIT)
            first = lines[0] if lines else ""
            out, err = proc.communicate(timeout=WAIT)
            assert first == f"fastfs: waiting (2 s): opening the source {src}\n", (first, err)
            assert proc.returncode == 0 and out.startswith(f"fastfs: mounted {src} on {mnt}"), (out, err)
            assert (mnt / "f").read_bytes() == DATA
            assert run_cli("umount", mnt).returncode == 0
        finally:
            fault.clear()
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT)
            force_unmount(mnt)


def test_a_quick_mount_prints_no_waiting_notice(populated: Path, mnt: Path, tmp_path: Path) -> None:
    try:
        result = run_cli("mount", populated, mnt, "--log-file", tmp_path / "log", timeout=90)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert run_cli("umount", mnt).returncode == 0
    finally:
        force_unmount(mnt)


def test_log_file_given_is_created_private(populated: Path, mnt: Path, tmp_path: Path) -> None:
    log = tmp_path / "new.log"
    try:
        assert run_cli("mount", populated, mnt, "--log-file", log, timeout=90).returncode == 0
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert run_cli("umount", mnt).returncode == 0
    finally:
        force_unmount(mnt)


def test_default_log_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from fastfs.daemon import logsetup

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    a, b = logsetup.default_log_file("/x/mnt"), logsetup.default_log_file("/y/mnt")
    assert a != b and os.path.basename(a).startswith("mnt-") and a.endswith(".log")
    assert os.path.dirname(a) == ("/var/log/fastfs" if os.geteuid() == 0 else os.path.dirname(a))
    assert logsetup.default_log_dir(str(tmp_path)) == str(tmp_path / "logs")
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/s:{tmp_path}/t")
    assert logsetup.default_log_dir() == f"{tmp_path}/s/logs"
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o777)
    open_dir.chmod(0o777)
    with pytest.raises(logsetup.LogFileError, match="not safe"):
        logsetup.open_log_file(str(open_dir / "x.log"), default=True)


def test_default_log_of_another_user_is_in_their_own_state_home(tmp_path: Path) -> None:
    from asuser import run_as

    from fastfs.daemon import logsetup

    def where() -> str:
        os.environ.pop("STATE_DIRECTORY", None)
        os.environ.pop("XDG_STATE_HOME", None)
        os.environ["HOME"] = "/home/someone"
        return logsetup.default_log_dir()

    assert run_as(where) == "/home/someone/.local/state/fastfs/logs"


def test_background_mount_failure_reports_and_cleans_up(populated: Path, mnt: Path, tmp_path: Path) -> None:
    # The metrics port is taken by a listening socket: the daemon cannot start, the parent says why.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_cli(
            "mount", populated, mnt, "-o", f"metrics=127.0.0.1:{port}", "--log-file", tmp_path / "log", timeout=90
        )
    try:
        line = _one_line_error(result)
        assert "metrics" in line
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)


# -- signals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_unmounts_cleanly_with_exit_0(populated: Path, mnt: Path, sig: int) -> None:
    with mounted(populated, mnt) as m:
        assert (mnt / "data.bin").read_bytes() == DATA
        m.proc.send_signal(sig)
        assert m.proc.wait(timeout=WAIT) == 0, m.log()
        assert not is_mounted(mnt)
        assert "unmounted" in m.log()
        assert "Traceback" not in m.log()


def test_sigkill_then_umount_recovers(populated: Path, mnt: Path) -> None:
    with mounted(populated, mnt) as m:
        m.proc.kill()
        m.proc.wait(timeout=WAIT)
        assert is_mounted(mnt)
        # Reading the dead mount fails at once instead of hanging.
        probe = subprocess.run(
            [sys.executable, "-c", f"open({str(mnt / 'data.bin')!r}, 'rb').read()"],
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert probe.returncode != 0
        assert "Transport endpoint is not connected" in probe.stderr or "Input/output error" in probe.stderr
        # A new mount on the dead one is refused with a hint, and so is reading its stats.
        assert "umount" in _one_line_error(run_cli("mount", populated, mnt))
        assert "not running" in _one_line_error(run_cli("stats", mnt))
        result = run_cli("umount", mnt)
        assert result.returncode == 0, result.stderr
        assert not is_mounted(mnt)
    with mounted(populated, mnt):
        assert (mnt / "data.bin").read_bytes() == DATA


def test_umount_errors(tmp_path: Path) -> None:
    assert "not mounted" in _one_line_error(run_cli("umount", tmp_path))
    assert "not mounted" in _one_line_error(run_cli("umount", tmp_path / "missing"))


def test_umount_leaves_other_fuse_file_systems_alone(tmp_path: Path) -> None:
    """Issue 12 finding 2: another FUSE file system (here faultfs) is not unmounted, not even lazily."""
    from faultfs import faultfs_mounted

    backing, other = tmp_path / "backing", tmp_path / "other"
    backing.mkdir()
    other.mkdir()
    (backing / "f").write_bytes(b"still here")
    with faultfs_mounted(backing, other, tmp_path / "faultfs-work"):
        for args in (["umount", other], ["umount", "--lazy", other]):
            line = _one_line_error(run_cli(*args))
            assert f"{other} is not a fastfs mount" in line, line
            assert is_mounted(other)
            assert (other / "f").read_bytes() == b"still here"


def test_force_unmount_is_one_function_for_fastfs_and_for_any_fuse(tmp_path: Path, populated: Path, mnt: Path) -> None:
    """fastfs.daemon.mounttable.force_unmount: by default only a fastfs mount (the daemon's cleanup of a
    failed start), with any_fuse any FUSE mount (what tests and benchmarks clean up with)."""
    from faultfs import faultfs_mounted

    from fastfs.daemon.mounttable import force_unmount as daemon_force_unmount

    backing, other = tmp_path / "backing", tmp_path / "other"
    backing.mkdir()
    other.mkdir()
    (backing / "f").write_bytes(b"still here")
    with faultfs_mounted(backing, other, tmp_path / "faultfs-work"):
        daemon_force_unmount(other)
        assert is_mounted(other) and (other / "f").read_bytes() == b"still here"
        daemon_force_unmount(other, any_fuse=True)
        assert not is_mounted(other)
    with mounted(populated, mnt) as m:
        daemon_force_unmount(mnt)
        assert not is_mounted(mnt)
        assert m.proc.wait(timeout=WAIT) == 0, m.log()


def test_unmount_right_after_mounting_is_a_clean_stop(populated: Path, mnt: Path) -> None:
    # An unmount that lands before the daemon's own readiness poll sees the mount still ends in
    # exit 0: the mount was live (the kernel's INIT only reaches a mounted file system).
    for _ in range(3):
        with mounted(populated, mnt, poll=0.001) as m:  # sees the mount before the daemon's poll
            subprocess.run(["fusermount3", "-u", str(mnt)], check=True, capture_output=True, timeout=WAIT)
            assert m.proc.wait(timeout=WAIT) == 0, m.log()
            assert not is_mounted(mnt)


def test_umount_busy_and_lazy(populated: Path, mnt: Path) -> None:
    with mounted(populated, mnt) as m:
        with open(mnt / "data.bin", "rb") as f:
            result = run_cli("umount", mnt)
            if result.returncode != 0:  # busy: a one-line error that suggests --lazy
                assert "--lazy" in _one_line_error(result)
                assert is_mounted(mnt)
                assert run_cli("umount", mnt, "--lazy").returncode == 0
            assert f.read() == DATA  # an open file keeps working after a lazy detach
        assert m.proc.wait(timeout=WAIT) == 0, m.log()
        assert not is_mounted(mnt)


def _config_path(m) -> Path:
    args = list(m.proc.args)
    return Path(args[args.index("--config") + 1])


def test_sighup_reloads_config(populated: Path, mnt: Path) -> None:
    with mounted(populated, mnt, config_text="log:\n  level: info\n") as m:
        config = _config_path(m)
        config.write_text("cache:\n  workers: not-a-number\n")
        m.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "reload failed" in m.log()), m.log()
        assert "cache.workers" in m.log()
        assert (mnt / "data.bin").read_bytes() == DATA  # still serving
        config.write_text("log:\n  level: info\nfuse:\n  attr_timeout: 5\n")
        m.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "reloaded; needs restart:" in m.log()), m.log()
        line = [x for x in m.log().splitlines() if "reloaded; needs restart:" in x][-1]
        assert "fuse.attr_timeout" in line
        assert m.proc.poll() is None


def test_sigusr1_logs_stats(populated: Path, mnt: Path) -> None:
    with mounted(populated, mnt) as m:
        (mnt / "data.bin").read_bytes()
        m.proc.send_signal(signal.SIGUSR1)
        assert wait_for(lambda: "stats: requested" in m.log()), m.log()
        assert m.proc.poll() is None


def _daemon_pid(mnt: Path) -> int:
    return json.loads(os.getxattr(mnt, "user.fastfs.stats"))["mount"]["pid"]


def _rotate_and_check(log: Path, pid: int, mnt: Path) -> None:
    """logrotate's move and SIGUSR2: the next lines go to a new file at the old name, none to the moved one."""
    rotated = log.with_name(log.name + ".1")
    os.rename(log, rotated)
    os.kill(pid, signal.SIGUSR2)
    assert wait_for(lambda: log.exists() and "reopened" in log.read_text()), rotated.read_text()
    (mnt / "data.bin").read_bytes()
    os.kill(pid, signal.SIGUSR1)
    assert wait_for(lambda: "stats: requested" in log.read_text()), log.read_text()
    assert "stats: requested" not in rotated.read_text() and "reopened" not in rotated.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_sigusr2_reopens_the_log_of_a_background_mount(populated: Path, mnt: Path, tmp_path: Path) -> None:
    log = tmp_path / "bg.log"
    try:
        result = run_cli("mount", populated, mnt, "--log-file", log, timeout=90)
        assert result.returncode == 0, result.stderr
        _rotate_and_check(log, _daemon_pid(mnt), mnt)
        assert run_cli("umount", mnt).returncode == 0
    finally:
        force_unmount(mnt)


def test_sigusr2_reopens_the_log_file_of_a_foreground_mount(populated: Path, mnt: Path, tmp_path: Path) -> None:
    log = tmp_path / "fg.log"
    with mounted(populated, mnt, options=[f"log.file={log}"]) as m:
        assert wait_for(lambda: log.exists() and "mounted" in log.read_text())
        _rotate_and_check(log, m.pid, mnt)
        assert m.proc.poll() is None


# -- stats ------------------------------------------------------------------------------------------
def test_stats_command(populated: Path, mnt: Path) -> None:
    with mounted(populated, mnt, options=[SERVED]):
        assert (mnt / "data.bin").read_bytes() == DATA
        result = run_cli("stats", mnt)
        assert result.returncode == 0, result.stderr
        for word in ("hit ratio", "amplification", "prefetch accuracy", "cache", "p95", "errors"):
            assert word in result.stdout
        result = run_cli("stats", mnt, "--json")
        snap = json.loads(result.stdout)
        assert snap["counters"]["bytes_requested"] >= len(DATA)
        assert snap["mount"]["mountpoint"] == str(mnt.resolve())
        result = run_cli("stats", mnt, "--top", "5")
        assert result.returncode == 0
        assert "/data.bin" in result.stdout


def test_stats_watch_prints_rates_until_interrupted(populated: Path, mnt: Path) -> None:
    with mounted(populated, mnt):
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastfs", "stats", str(mnt), "--watch", "0.5"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            header = proc.stdout.readline()
            first = proc.stdout.readline()
            assert "req/s" in header and "hit" in header
            assert first.strip()
        finally:
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, err
        assert "Traceback" not in err


@pytest.mark.parametrize("interval", ["-1", "0", "0.01", "nan", "inf", "soon"])
def test_stats_watch_interval_is_validated(populated: Path, mnt: Path, interval: str) -> None:
    """`--watch -1` ran at about 8 rows a second: an interval under the floor is a usage error."""
    result = run_cli("stats", mnt, "--watch", interval, timeout=20)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastfs: error: argument --watch: expected"), result.stderr


def test_stats_shows_opens_and_bytes_by_route(populated: Path, mnt: Path, tmp_path: Path) -> None:
    """After reads by passthrough, `fastfs stats` said only `requested 0 B in 0 reads`."""
    with mounted(populated, mnt) as m:  # tmp is local: passthrough
        assert (mnt / "data.bin").read_bytes() == DATA
        assert m.stats()["counters"]["opens_passthrough"] == 1
        lines = run_cli("stats", mnt).stdout.splitlines()
        assert "  opens served       0, 0 B read through fastfs" in lines
        assert (
            f"  opens passthrough  1, files of {human_bytes(len(DATA))} (the kernel reads them from the source;"
            " not in requested)"
        ) in lines
        assert not any(line.startswith("  opens disk") for line in lines)  # no disk tier
    with mounted(populated, mnt, options=[SERVED, f"cache.disk_dir={tmp_path / 'disk'}"]):
        assert (mnt / "data.bin").read_bytes() == DATA
        lines = run_cli("stats", mnt).stdout.splitlines()
        assert f"  opens served       1, {human_bytes(len(DATA))} read through fastfs" in lines
        assert "  opens passthrough  0, files of 0 B (the kernel reads them from the source; not in requested)" in lines
        assert "  opens disk         0, files of 0 B (the kernel reads them from the disk tier)" in lines


def test_stats_of_a_path_inside_a_mount_finds_the_mount(populated: Path, mnt: Path) -> None:
    """`fastfs stats MNT/sub` said "not a fastfs mount" (warm finds the mount from inside it)."""
    with mounted(populated, mnt, options=[SERVED]):
        assert (mnt / "data.bin").read_bytes() == DATA
        for inside in (mnt / "sub", mnt / "sub" / "note.txt", mnt / "data.bin"):
            result = run_cli("stats", inside, "--json")
            assert result.returncode == 0, result.stderr
            snap = json.loads(result.stdout)
            assert snap["mount"]["mountpoint"] == str(mnt) and snap["counters"]["bytes_requested"] >= len(DATA)
        assert run_cli("stats", mnt / "sub").stdout.startswith(f"fastfs mount {mnt} ")


def test_stats_on_plain_directory_is_an_error(tmp_path: Path) -> None:
    line = _one_line_error(run_cli("stats", tmp_path))
    assert "is not a fastfs mount" in line
    _one_line_error(run_cli("stats", tmp_path / "missing", "--json"))


def test_hidden_stats_file(populated: Path, mnt: Path) -> None:
    with mounted(populated, mnt, options=[SERVED]) as m:
        assert ".fastfs" not in os.listdir(mnt)
        first = m.stats()
        assert first["mount"]["source"] == str(populated.resolve())
        assert first["mount"]["pid"] == m.pid
        assert (mnt / "data.bin").read_bytes() == DATA
        before = m.stats()["counters"]["bytes_requested"]
        assert before >= len(DATA)
        for _ in range(5):
            json.loads((mnt / ".fastfs" / "stats").read_bytes())
        assert m.stats()["counters"]["bytes_requested"] == before
        assert json.loads(os.getxattr(mnt, "user.fastfs.stats"))["counters"]["bytes_requested"] == before
        assert os.listdir(mnt / ".fastfs") == ["stats"]
        with pytest.raises(OSError) as info:
            os.open(mnt / ".fastfs" / "stats", os.O_WRONLY)
        assert info.value.errno in (errno.EROFS, errno.EACCES)


def test_stats_file_stays_fresh_in_no_open_mode(populated: Path, mnt: Path) -> None:
    with mounted(populated, mnt, options=["no_open"]) as m:
        first = m.stats()["counters"]["bytes_requested"]
        assert (mnt / "data.bin").read_bytes() == DATA
        assert (mnt / "sub" / "note.txt").read_text() == "note\n"
        assert wait_for(lambda: m.stats()["counters"]["bytes_requested"] >= first + len(DATA)), m.stats()
        assert ".fastfs" not in os.listdir(mnt)


def test_stats_file_in_no_open_mode_is_always_one_whole_snapshot(populated: Path, mnt: Path) -> None:
    """Regression: in no_open mode a pass over .fastfs/stats could get the head of one snapshot and the
    tail of another (the kernel's cached pages dropped mid-pass, the rest read from a new snapshot):
    'Extra data' from json.loads in the benchmarks. Every pass must parse, whatever reads come between."""
    with mounted(populated, mnt, options=["no_open"]):
        for i in range(300):
            with open(mnt / ".fastfs" / "stats", "rb") as f:
                raw = f.read()
            json.loads(raw)  # raises on a torn snapshot
            if i % 3 == 0:
                assert (mnt / "data.bin").read_bytes() == DATA  # counters change, so does the length
                os.listxattr(mnt / "data.bin")


def test_changed_source_file_is_seen_on_next_open(populated: Path, mnt: Path) -> None:
    target = populated / "sub" / "note.txt"
    with mounted(populated, mnt):
        assert (mnt / "sub" / "note.txt").read_text() == "note\n"
        target.write_text("a longer second version\n")
        os.utime(target, ns=(1, 10**18))  # a different mtime whatever the clock granularity
        assert (mnt / "sub" / "note.txt").read_text() == "a longer second version\n"
        assert os.stat(mnt / "sub" / "note.txt").st_size == len("a longer second version\n")


# -- systemd integration ----------------------------------------------------------------------------
def test_notify_socket_gets_ready_status_and_stopping(populated: Path, mnt: Path, tmp_path: Path) -> None:
    import socket

    sock_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(sock_path))
        sock.settimeout(WAIT)
        config = "stats:\n  status_interval: 0.5\n"
        with mounted(populated, mnt, config_text=config, env={"NOTIFY_SOCKET": str(sock_path)}) as m:
            messages = [sock.recv(4096).decode()]
            while messages[-1] != "READY=1":  # before it, the stages of the start as STATUS= lines
                messages.append(sock.recv(4096).decode())
            assert messages[0] == f"STATUS=opening the source {populated}", messages
            assert all(x.startswith("STATUS=") for x in messages[:-1]), messages
            (mnt / "data.bin").read_bytes()
            while not any(x.startswith("STATUS=") and "requested" in x for x in messages):
                messages.append(sock.recv(4096).decode())
            m.proc.send_signal(signal.SIGTERM)
            while "STOPPING=1" not in messages:
                messages.append(sock.recv(4096).decode())
            assert m.proc.wait(timeout=WAIT) == 0, m.log()
        status = [x for x in messages if x.startswith("STATUS=")][-1]
        assert "\n" not in status and "hit" in status


def test_notify_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from fastfs.daemon.notify import notify

    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False
    name = f"@fastfs-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name[1:])
        monkeypatch.setenv("NOTIFY_SOCKET", name)
        assert notify("STATUS=abstract") is True
        assert sock.recv(100) == b"STATUS=abstract"
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert notify("READY=1") is False


@pytest.fixture
def restore_logging() -> Iterator[None]:
    import logging

    saved = {}
    for name in ("fastfs", "fuse"):
        logger = logging.getLogger(name)
        saved[name] = (list(logger.handlers), logger.propagate, logger.level)
    yield
    for name, (handlers, propagate, level) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers = handlers
        logger.propagate = propagate
        logger.setLevel(level)


def test_log_format_under_systemd(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, restore_logging: None
) -> None:
    import logging

    from fastfs.daemon import logsetup

    monkeypatch.setenv("INVOCATION_ID", "x")
    logsetup.setup("info")
    logging.getLogger("fastfs.test").warning("careful")
    logging.getLogger("fastfs.test").debug("hidden")
    monkeypatch.delenv("INVOCATION_ID")
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    logsetup.setup("debug")
    logging.getLogger("fastfs.test").debug("shown")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "<4>careful"
    assert len(err) == 2 and err[1].endswith("DEBUG shown") and err[1][:4].isdigit()


def test_odd_paths_and_allow_other(tmp_path: Path) -> None:
    src = tmp_path / "my src,1\\x"
    mnt = tmp_path / "m nt"
    src.mkdir()
    mnt.mkdir()
    (src / "f").write_bytes(DATA)
    try:
        result = run_cli("mount", src, mnt, "-o", "allow_other", "--log-file", tmp_path / "log", timeout=90)
        assert result.returncode == 0, result.stderr
        assert (mnt / "f").read_bytes() == DATA
        with open("/proc/self/mountinfo") as f:
            line = next(x for x in f if "fuse.fastfs" in x and "m\\040nt" in x)
        assert "allow_other" in line and "default_permissions" in line
        snap = json.loads(run_cli("stats", mnt, "--json").stdout)
        assert snap["mount"]["source"] == str(src)
        assert run_cli("umount", mnt).returncode == 0
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)


def test_paths_from_config(populated: Path, mnt: Path, tmp_path: Path) -> None:
    config = tmp_path / "fastfs.yaml"
    config.write_text(f"source: {populated}\nmountpoint: {mnt}\nlog:\n  file: {tmp_path / 'log'}\n")
    try:
        result = run_cli("mount", "--config", config, timeout=90)
        assert result.returncode == 0, result.stderr
        assert (mnt / "data.bin").read_bytes() == DATA
        assert "mounted" in (tmp_path / "log").read_text()
        assert run_cli("umount", mnt).returncode == 0
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)


# -- issue 12 finding 9: smaller ones ---------------------------------------------------------------
def test_stats_xattr_fits_with_long_paths_in_the_top_table(src: Path, mnt: Path) -> None:
    """The top-files table of long paths once made ``user.fastfs.stats`` larger than one xattr (E2BIG)."""
    deep = src
    for i in range(14):
        deep = deep / (f"{i:02d}" + "d" * 240)
    deep.mkdir(parents=True)
    for i in range(50):
        (deep / f"{i:02d}{'f' * 200}").write_bytes(b"x" * (1000 + i))
    with mounted(src, mnt, options=[SERVED]) as m:
        for path in sorted(deep.iterdir()):
            assert (mnt / path.relative_to(src)).read_bytes() == path.read_bytes()
        snap = m.stats()  # os.getxattr: fails with E2BIG when the answer exceeds 64 KiB
        assert snap["top_files"], snap
        assert snap["top_files_dropped"] > 0
        assert all(row["path"].startswith("/00d") for row in snap["top_files"])
        result = run_cli("stats", mnt, "--top", "3")
        assert result.returncode == 0, result.stderr
        assert len(result.stdout.strip().splitlines()) == 4


def test_source_entry_named_like_the_control_directory_is_hidden(src: Path, mnt: Path) -> None:
    (src / ".fastfs").mkdir()
    (src / ".fastfs" / "secret").write_bytes(b"shadowed")
    (src / "visible").write_bytes(b"v")
    with mounted(src, mnt) as m:
        assert sorted(os.listdir(mnt)) == ["visible"]
        assert os.listdir(mnt / ".fastfs") == ["stats"]
        assert not (mnt / ".fastfs" / "secret").exists()
        assert "counters" in json.loads((mnt / ".fastfs" / "stats").read_bytes())
        assert "reserved" in m.log()
