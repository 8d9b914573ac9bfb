"""systemd and mount(8) integration: the unit, install-service, sd_notify, SIGHUP, the mount helper.

The notify tests bind a real ``AF_UNIX``/``SOCK_DGRAM`` socket, start ``fastfs mount --foreground``
with ``NOTIFY_SOCKET`` pointing at it (as systemd does for ``Type=notify``) and check the state of
the mountpoint at the moment each message arrives. The mount helper is exercised three ways: called
directly with the arguments mount(8) passes, through ``mount -t fuse.fastfs`` (with a temporary
``/sbin/mount.fuse.fastfs`` symlink when none is installed) and through an fstab line read by
``mount --fstab``. Every test that mounts unmounts in ``finally`` even when it failed, and kills
the background daemons it started (found by their unique temporary mountpoint).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import FASTFS, rand_bytes, run_cli

from fastfs.config import schema
from fastfs.config.loader import load_config
from fastfs.daemon import mounttable
from fastfs.daemon.cli import mounthelper, service
from fastfs.daemon.mounttable import force_unmount, is_fastfs, mounts

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "fastfs@.service"
EXAMPLE = REPO / "config" / "fastfs.example.yaml"
HELPER = Path(sys.executable).parent / "mount.fuse.fastfs"
SBIN_HELPER = Path("/sbin/mount.fuse.fastfs")
MIB = 1 << 20
# Bound on starting or stopping a daemon and on each notify wait: generous, the machine is shared.
TIMEOUT = 60.0
# Short STATUS= period so several updates arrive quickly.
STATUS_INTERVAL = 0.5
# STATUS= messages awaited after READY=1.
STATUS_COUNT = 2
# Poll period while waiting for a mount, a stats value or a process to go away.
POLL = 0.1
# PATH of a systemd service: the installed unit must not depend on the caller's PATH.
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
# Bound on one external command (mount, umount, systemd-analyze, a helper run).
CMD_TIMEOUT = 120


# -- helpers -----------------------------------------------------------------------------------
def _fuse_mounted(mnt: Path) -> int:
    """fastfs mounts stacked on *mnt*, counting dead ones (os.path.ismount is False on those)."""
    path = service.canonical_mountpoint(str(mnt))
    return sum(1 for entry in mounts() if entry.mountpoint == path and is_fastfs(entry))


def _pids_using(mnt: Path) -> list[int]:
    """Processes whose command line names *mnt* (our background daemons: the path is unique)."""
    needle = os.fsencode(str(mnt))
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if needle in args:
                pids.append(int(entry))
    return pids


def _force_unmount(mnt: Path) -> None:
    """Remove every mount on *mnt*, live or dead, then kill daemons still naming it."""
    for _ in range(service.MAX_STACKED_MOUNTS):  # one layer at a time
        if not _fuse_mounted(mnt):
            break
        force_unmount(mnt, any_fuse=True)
    for pid in _pids_using(mnt):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait_for(pred, what: str, timeout: float = TIMEOUT, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"daemon exited with {proc.returncode} while waiting for {what}: {_tail(log)}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}: {_tail(log)}")
        time.sleep(POLL)


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return " | ".join(log.read_text(errors="replace").splitlines()[-15:])


def _stats(mnt: Path) -> dict:
    return json.loads((mnt / ".fastfs" / "stats").read_text())


def _live(mnt: Path) -> bool:
    try:
        return os.path.ismount(mnt) and bool(_stats(mnt))
    except (OSError, ValueError):
        return False


def _budget(mnt: Path) -> int | None:
    try:
        return _stats(mnt)["gauges"].get("cache_budget")
    except (OSError, ValueError, KeyError):
        return None


@contextlib.contextmanager
def _notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket like systemd's notify socket (short path: sun_path holds 108 bytes)."""
    tmp = tempfile.mkdtemp(prefix="fastfs-notify-", dir="/tmp")
    path = os.path.join(tmp, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(path)
        sock.settimeout(POLL)
        yield sock, path
    finally:
        sock.close()
        shutil.rmtree(tmp, ignore_errors=True)


@dataclasses.dataclass
class Daemon:
    proc: subprocess.Popen
    log: Path
    sock: socket.socket | None

    def messages(self, until, what: str, on_message=None, timeout: float = TIMEOUT) -> list[str]:
        """Receive notify lines until ``until(lines_so_far)``; *on_message* sees each line as it arrives."""
        assert self.sock is not None
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        while not until(lines):
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}; got {lines}: {_tail(self.log)}")
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                if self.proc.poll() is not None and not until(lines):
                    # Drain what the daemon sent before it exited, then give up.
                    with contextlib.suppress(TimeoutError):
                        while True:
                            lines += self.sock.recv(65536).decode().splitlines()
                    if until(lines):
                        break
                    pytest.fail(f"daemon exited ({self.proc.returncode}) before {what}; got {lines}: {_tail(self.log)}")
                continue
            for line in data.decode().splitlines():
                lines.append(line)
                if on_message is not None:
                    on_message(line)
        return lines


@contextlib.contextmanager
def _daemon(src: Path, mnt: Path, tmp: Path, args: list[str], notify: str | None = None) -> Iterator[Daemon]:
    """``fastfs mount SRC MNT --foreground ARGS`` under a fake service manager; always cleaned up."""
    log = tmp / "daemon.log"
    env = dict(os.environ, STATE_DIRECTORY=str(tmp / "state"))
    env.pop("NOTIFY_SOCKET", None)
    if notify:
        env["NOTIFY_SOCKET"] = notify
    (tmp / "state").mkdir(exist_ok=True)
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [*FASTFS, "mount", str(src), str(mnt), "--foreground", *args],
            stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        yield Daemon(proc, log, None)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(TIMEOUT)
        _force_unmount(mnt)


@contextlib.contextmanager
def _cleanup_mount(mnt: Path) -> Iterator[None]:
    try:
        yield
    finally:
        _force_unmount(mnt)


def _verify_unit(path: Path, tmp: Path) -> None:
    """``systemd-analyze verify`` on a copy named as an instance; no complaint about it allowed."""
    d = tmp / "verify"
    d.mkdir(exist_ok=True)
    inst = d / "fastfs@test.service"
    shutil.copy(path, inst)
    done = subprocess.run(["systemd-analyze", "verify", str(inst)], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    complaints = [ln for ln in (done.stdout + done.stderr).splitlines() if "fastfs" in ln]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr


def _unit_directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


# -- the unit file -----------------------------------------------------------------------------
def test_unit_verifies(tmp_path: Path) -> None:
    _verify_unit(UNIT, tmp_path)


def test_unit_settings_and_every_line_commented() -> None:
    text = UNIT.read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith(("#", "[")):
            assert lines[i - 1].startswith("#"), f"line {i + 1} has no comment above it: {line}"
    d = _unit_directives(text)
    assert d["Type"] == ["notify"] and d["NotifyAccess"] == ["main"]
    assert d["ExecStart"] == ["/usr/bin/env fastfs mount --foreground --config /etc/fastfs/%i.yaml"]
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert d["ExecStopPost"][0].startswith("-") and "cleanup /etc/fastfs/%i.yaml" in d["ExecStopPost"][0]
    assert d["Restart"] == ["on-failure"] and d["OOMScoreAdjust"] == ["-900"]
    assert d["StateDirectory"] == ["fastfs/%i"]
    for key in ("LimitNOFILE", "TimeoutStartSec", "TimeoutStopSec", "After", "Wants", "WantedBy"):
        assert key in d, key
    # Any of these would give the service a private mount namespace: the mount would be invisible.
    for key in ("PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateDevices", "ReadOnlyPaths", "PrivateMounts"):
        assert key not in d, key


# -- install-service ---------------------------------------------------------------------------
def test_install_service(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert service.install(argparse.Namespace(prefix=str(tmp_path))) == 0
    out = capsys.readouterr().out
    assert "systemctl enable --now fastfs@NAME" in out
    unit = tmp_path / "etc/systemd/system/fastfs@.service"
    text = unit.read_text()
    d = _unit_directives(text)
    exe = d["ExecStart"][0].split()[0]
    assert os.path.isabs(exe) and os.path.basename(exe) == "fastfs" and os.access(exe, os.X_OK)
    assert d["ExecStart"][0].split()[1:] == ["mount", "--foreground", "--config", "/etc/fastfs/%i.yaml"]
    post = d["ExecStopPost"][0]
    assert post.split()[0] == "-" + sys.executable
    for key in ("ExecStart", "ExecStopPost"):
        assert "/usr/bin/env" not in d[key][0]
    # Only the Exec lines differ from the shipped unit.
    shipped = UNIT.read_text().splitlines()
    installed = text.splitlines()
    assert len(shipped) == len(installed)
    assert [a for a, b in zip(shipped, installed, strict=True) if a != b and not a.startswith("Exec")] == []
    _verify_unit(unit, tmp_path)
    example = tmp_path / "etc/fastfs/example.yaml"
    assert example.read_bytes() == EXAMPLE.read_bytes()
    link = tmp_path / "sbin/mount.fuse.fastfs"
    assert link.is_symlink() and link.resolve() == HELPER.resolve()

    # A second install refreshes the unit but keeps an edited example.
    example.write_text("cache:\n  budget: 2G\n")
    unit.write_text("stale")
    assert service.install(argparse.Namespace(prefix=str(tmp_path))) == 0
    assert example.read_text() == "cache:\n  budget: 2G\n"
    assert unit.read_text() == text


def test_install_service_cli(tmp_path: Path) -> None:
    done = run_cli("install-service", "--prefix", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "systemctl enable --now fastfs@" in done.stdout
    text = (tmp_path / "etc/systemd/system/fastfs@.service").read_text()
    assert _unit_directives(text)["ExecStart"][0].split()[0] != "/usr/bin/env"
    assert (tmp_path / "etc/fastfs/example.yaml").read_bytes() == EXAMPLE.read_bytes()


def test_uninstall_service_removes_what_install_service_installed(tmp_path: Path) -> None:
    assert run_cli("install-service", "--prefix", tmp_path).returncode == 0
    unit, link = tmp_path / "etc/systemd/system/fastfs@.service", tmp_path / "sbin/mount.fuse.fastfs"
    example, own = tmp_path / "etc/fastfs/example.yaml", tmp_path / "etc/fastfs/data.yaml"
    own.write_text("source: /data\nmountpoint: /mnt/data\n")
    assert unit.is_file() and link.is_symlink() and example.is_file()
    done = run_cli("uninstall-service", "--prefix", tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines() == [
        f"removed {unit}",
        f"removed {link}",
        f"removed {example}",
        f"kept the configs in {tmp_path / 'etc/fastfs'}: data.yaml",
    ]
    assert not unit.exists() and not link.is_symlink() and not example.exists()
    assert own.read_text() == "source: /data\nmountpoint: /mnt/data\n"
    again = run_cli("uninstall-service", "--prefix", tmp_path)
    assert again.returncode == 0 and again.stdout.splitlines() == [
        f"kept the configs in {tmp_path / 'etc/fastfs'}: data.yaml"
    ]


def test_uninstall_service_keeps_what_it_did_not_install(tmp_path: Path) -> None:
    assert service.install(argparse.Namespace(prefix=str(tmp_path))) == 0
    unit, link = tmp_path / "etc/systemd/system/fastfs@.service", tmp_path / "sbin/mount.fuse.fastfs"
    example = tmp_path / "etc/fastfs/example.yaml"
    unit.write_text("[Unit]\nDescription=someone else's unit\n")
    link.unlink()
    link.write_text("#!/bin/sh\n")  # a helper installed by a package
    example.write_text("cache:\n  budget: 2G\n")
    done = run_cli("uninstall-service", "--prefix", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"kept {unit}: it is not the unit fastfs installs",
        f"kept {link}: installed by a package, not by fastfs install-service",
        f"kept {example}: edited",
        f"kept the configs in {tmp_path / 'etc/fastfs'}: example.yaml",
    ]
    assert unit.exists() and link.read_text() == "#!/bin/sh\n" and example.exists()


def test_install_service_unwritable_prefix_fails_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert service.install(argparse.Namespace(prefix=str(blocker))) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("fastfs install-service:") and "\n" not in err


def test_installed_unit_commands_run_as_systemd_would(src: Path, mnt: Path, tmp_path: Path) -> None:
    """ExecStart, ExecReload, SIGTERM and ExecStopPost of the installed unit, with systemd's PATH."""
    prefix = tmp_path / "root"
    assert service.install(argparse.Namespace(prefix=str(prefix))) == 0
    d = _unit_directives((prefix / "etc/systemd/system/fastfs@.service").read_text())
    cfg = tmp_path / "inst.yaml"
    cfg.write_text(f"source: {src}\nmountpoint: {mnt}\ncache:\n  budget: 64M\n")

    def command(key: str, pid: int = 0) -> list[str]:
        line = d[key][0].lstrip("-").replace("/etc/fastfs/%i.yaml", str(cfg)).replace("$MAINPID", str(pid))
        return shlex.split(line)

    data = rand_bytes(MIB + 9, 6)
    (src / "u.bin").write_bytes(data)
    (tmp_path / "state").mkdir()
    env = {"PATH": SYSTEMD_PATH, "STATE_DIRECTORY": str(tmp_path / "state"), "LANG": "C.UTF-8"}
    log = tmp_path / "unit.log"
    with _notify_socket() as (sock, path), _cleanup_mount(mnt), open(log, "wb") as logf:
        proc = subprocess.Popen(command("ExecStart"), env={**env, "NOTIFY_SOCKET": path}, stdin=subprocess.DEVNULL,
                                stdout=logf, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            daemon = Daemon(proc, log, sock)
            daemon.messages(lambda ls: "READY=1" in ls, "READY=1")
            assert (mnt / "u.bin").read_bytes() == data and _budget(mnt) == 64 * MIB
            cfg.write_text(cfg.read_text().replace("64M", "96M"))
            done = subprocess.run(command("ExecReload", proc.pid), env=env, capture_output=True, timeout=CMD_TIMEOUT)
            assert done.returncode == 0
            _wait_for(lambda: _budget(mnt) == 96 * MIB, "cache_budget 96M after ExecReload", proc=proc, log=log)
            proc.send_signal(signal.SIGTERM)  # KillSignal
            daemon.messages(lambda ls: "STOPPING=1" in ls, "STOPPING=1")
            assert proc.wait(TIMEOUT) == 0, _tail(log)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(TIMEOUT)
        assert _fuse_mounted(mnt) == 0
        done = subprocess.run(command("ExecStopPost"), env=env, capture_output=True, text=True, timeout=CMD_TIMEOUT)
        assert done.returncode == 0 and done.stderr == "", done.stderr


# -- the example config ------------------------------------------------------------------------
def test_example_config_is_the_defaults() -> None:
    config = load_config(str(EXAMPLE))
    assert config.source and config.mountpoint
    assert config == dataclasses.replace(schema.Config(), source=config.source, mountpoint=config.mountpoint)
    data = yaml.safe_load(EXAMPLE.read_text())
    for f in dataclasses.fields(schema.Config):
        assert f.name in data, f"example config lacks {f.name}"
        value = getattr(schema.Config(), f.name)
        if dataclasses.is_dataclass(value):
            missing = {g.name for g in dataclasses.fields(value)} - set(data[f.name])
            assert not missing, f"example config lacks {f.name}.{sorted(missing)}"


# -- sd_notify protocol ------------------------------------------------------------------------
def test_notify_ready_status_stopping(src: Path, mnt: Path, tmp_path: Path) -> None:
    data = rand_bytes(3 * MIB + 17, 1)
    (src / "f.bin").write_bytes(data)
    seen_at_ready: dict[str, object] = {}

    def on_message(line: str) -> None:
        if line == "READY=1" and not seen_at_ready:
            # The state of the mount at the moment READY=1 arrives, before anything else happens.
            seen_at_ready["ismount"] = os.path.ismount(mnt)
            seen_at_ready["fuse"] = _fuse_mounted(mnt)
            seen_at_ready["bytes"] = (mnt / "f.bin").read_bytes()

    with (
        _notify_socket() as (sock, path),
        _daemon(src, mnt, tmp_path, ["-o", f"stats.status_interval={STATUS_INTERVAL}"], notify=path) as d,
    ):
        d.sock = sock
        lines = d.messages(lambda ls: "READY=1" in ls, "READY=1", on_message)
        assert seen_at_ready["ismount"] is True and seen_at_ready["fuse"] == 1
        assert seen_at_ready["bytes"] == data
        n = len(lines)
        lines += d.messages(
            lambda ls: sum(x.startswith("STATUS=") and len(x) > len("STATUS=") for x in ls) >= STATUS_COUNT,
            f"{STATUS_COUNT} STATUS= lines",
        )
        assert "READY=1" not in lines[n:], "READY=1 sent twice"
        assert d.proc.poll() is None
        d.proc.send_signal(signal.SIGTERM)
        lines += d.messages(lambda ls: "STOPPING=1" in ls, "STOPPING=1")
        assert d.proc.wait(TIMEOUT) == 0, _tail(d.log)
        assert _fuse_mounted(mnt) == 0 and not os.path.ismount(mnt)
    assert lines.count("READY=1") == 1


def test_sighup_reloads_budget_without_remount(src: Path, mnt: Path, tmp_path: Path) -> None:
    data = rand_bytes(2 * MIB + 5, 2)
    (src / "g.bin").write_bytes(data)
    cfg = tmp_path / "fastfs.yaml"
    cfg.write_text("cache:\n  budget: 64M\n")
    with _notify_socket() as (sock, path), _daemon(src, mnt, tmp_path, ["--config", str(cfg)], notify=path) as d:
        d.sock = sock
        d.messages(lambda ls: "READY=1" in ls, "READY=1")
        assert _budget(mnt) == 64 * MIB
        dev = os.stat(mnt).st_dev
        assert (mnt / "g.bin").read_bytes() == data
        cfg.write_text("cache:\n  budget: 128M\n")
        d.proc.send_signal(signal.SIGHUP)
        _wait_for(lambda: _budget(mnt) == 128 * MIB, "cache_budget 128M after SIGHUP", proc=d.proc, log=d.log)
        assert d.proc.poll() is None  # same daemon process ...
        assert os.path.ismount(mnt) and os.stat(mnt).st_dev == dev  # ... same mount, never remounted
        assert (mnt / "g.bin").read_bytes() == data


# -- ExecStopPost cleanup ----------------------------------------------------------------------
def test_cleanup_detaches_only_dead_mounts(src: Path, mnt: Path, tmp_path: Path) -> None:
    (src / "h.bin").write_bytes(b"x" * 4096)
    cfg = tmp_path / "unit.yaml"
    cfg.write_text(yaml.safe_dump({"source": str(src), "mountpoint": str(mnt)}))
    cleanup = [sys.executable, "-m", "fastfs.daemon.cli.service", "cleanup", str(cfg)]
    with _daemon(src, mnt, tmp_path, []) as d:
        _wait_for(lambda: _live(mnt), "mount", proc=d.proc, log=d.log)
        # A live mount is left alone.
        done = subprocess.run(cleanup, capture_output=True, text=True, timeout=CMD_TIMEOUT)
        assert done.returncode == 0, done.stderr
        assert (mnt / "h.bin").read_bytes() == b"x" * 4096
        # The daemon dies without unmounting: a dead mount stays behind ...
        d.proc.kill()
        d.proc.wait(TIMEOUT)
        assert _fuse_mounted(mnt) == 1
        with pytest.raises(OSError) as exc:
            os.statvfs(mnt)
        assert exc.value.errno in mounttable.DEAD_ERRNOS
        # ... until the unit's ExecStopPost removes it.
        done = subprocess.run(cleanup, capture_output=True, text=True, timeout=CMD_TIMEOUT)
        assert done.returncode == 0, done.stderr
        assert "detached 1" in done.stderr
        assert _fuse_mounted(mnt) == 0 and os.listdir(mnt) == []


def test_cleanup_tolerates_bad_config(tmp_path: Path) -> None:
    for text in ("", "source: /x\n", ": : bad yaml [", f"mountpoint: {tmp_path}\n"):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(text)
        assert service.cleanup(str(cfg)) == 0
    assert service.cleanup(str(tmp_path / "missing.yaml")) == 0


# -- mount helper: option mapping -------------------------------------------------------------
@pytest.mark.parametrize(
    ("optstring", "config", "overrides"),
    [
        ("", None, {}),
        ("ro", None, {}),
        ("rw", None, {}),
        ("defaults", None, {}),
        ("ro,budget=2G,config=/etc/fastfs/x.yaml,_netdev", "/etc/fastfs/x.yaml", {"cache.budget": "2G"}),
        ("ro,nodev,nosuid,noexec,exec,auto,noauto,user,nouser,nofail,sync,async", None, {}),
        ("ro,noatime,nonempty,allow_root", None,
         {"fuse.noatime": "true", "fuse.nonempty": "true", "fuse.allow_root": "true"}),
        ("x-systemd.automount,x-systemd.requires=nfs.mount,X-mount.mkdir,comment=systemd.x", None, {}),
        ("workers=8,block_size=1M,max_window=32M", None,
         {"cache.workers": "8", "cache.block_size": "1M", "readahead.max_window": "32M"}),
        ("cache.workers=4,readahead.learn=false", None, {"cache.workers": "4", "readahead.learn": "false"}),
        ("noreadahead,allow_other", None, {"readahead.enabled": "false", "fuse.allow_other": "true"}),
        ("no_open", None, {"fuse.no_open": "true"}),
        ("formats=off,nolearn", None, {"readahead.formats": "off", "readahead.learn": "false"}),
        ('log_file="/var/log/fast fs.log",log_level=debug', None,
         {"log.file": "/var/log/fast fs.log", "log.level": "debug"}),
        ("metrics=127.0.0.1:9188", None, {"stats.metrics": "127.0.0.1:9188"}),
        ("budget=1G,budget=2G", None, {"cache.budget": "2G"}),
        ("default_permissions,fsname=data,subtype=fastfs", None,
         {"fuse.default_permissions": "true", "fuse.fsname": "data", "fuse.subtype": "fastfs"}),
        ("uid=1000,gid=100,umask=022,file_mode=0644,dir_mode=0755", None,
         {"fuse.uid": "1000", "fuse.gid": "100", "fuse.umask": "022", "fuse.file_mode": "0644",
          "fuse.dir_mode": "0755"}),
        ("profile=training", None, {"profile": "training"}),
    ],
)  # fmt: skip
def test_map_options(optstring: str, config: str | None, overrides: dict[str, str]) -> None:
    assert mounthelper.map_options(optstring) == (config, overrides, [])


@pytest.mark.parametrize(
    ("optstring", "needle"),
    [
        ("ro,bogus=1", "bogus"),
        ("ro,budgt=1G", "did you mean budget"),
        ("budget", "missing a value"),
        ("remount", "remount"),
        ("bind", "bind"),
        ("setuid=nobody", "setuid"),
        ("config", "config"),
        ("config=/a.yaml,config=/b.yaml", "config"),
        ("source=/data", "source"),
        ("mountpoint=/mnt", "mountpoint"),
        ('log_file="a,b"', "comma"),
        ("cache.=1", "cache."),
    ],
)  # fmt: skip
def test_map_options_errors(optstring: str, needle: str) -> None:
    _, _, errors = mounthelper.map_options(optstring)
    assert len(errors) == 1 and needle in errors[0] and "\n" not in errors[0]


def test_build_command() -> None:
    cmd = mounthelper.build_command("/s", "/m", "/c.yaml", {"cache.budget": "2G", "readahead.enabled": "false"})
    assert cmd == [sys.executable, "-m", "fastfs", "mount", "/s", "/m", "--config", "/c.yaml",
                   "-o", "cache.budget=2G", "-o", "readahead.enabled=false"]  # fmt: skip


# -- mount helper: real mounts -----------------------------------------------------------------
def _helper_env(tmp: Path) -> dict[str, str]:
    (tmp / "state").mkdir(exist_ok=True)
    env = dict(os.environ, STATE_DIRECTORY=str(tmp / "state"))
    env.pop("NOTIFY_SOCKET", None)
    return env


def _check_mounted_and_unmount(mnt: Path, name: str, data: bytes, budget: int) -> None:
    assert os.path.ismount(mnt) and _fuse_mounted(mnt) == 1
    assert (mnt / name).read_bytes() == data
    assert _budget(mnt) == budget
    done = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=CMD_TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert _fuse_mounted(mnt) == 0
    # The background daemon exits once its mount is gone.
    _wait_for(lambda: not _pids_using(mnt), "the background daemon to exit")


def _check_standard_options(mnt: Path) -> None:
    """The mount made from ro,allow_other,default_permissions,fsname=trainset,noatime shows them."""
    with open("/proc/mounts", encoding="utf-8") as f:
        (line,) = [fields for fields in map(str.split, f) if fields[1:2] == [str(mnt)]]
    assert line[0] == "trainset" and line[2] == "fuse.fastfs"
    assert {"ro", "noatime", "allow_other", "default_permissions"} <= set(line[3].split(","))


def test_helper_called_as_mount_does(src: Path, mnt: Path, tmp_path: Path) -> None:
    assert HELPER.is_file(), f"console script {HELPER} missing: pip install -e the repository"
    data = rand_bytes(5 * MIB + 3, 3)
    (src / "a.bin").write_bytes(data)
    opts = "rw,budget=64M,_netdev,nofail,noatime,x-systemd.automount,workers=4"
    with _cleanup_mount(mnt):
        done = subprocess.run([str(HELPER), str(src), str(mnt), "-o", opts], env=_helper_env(tmp_path),
                              capture_output=True, text=True, timeout=CMD_TIMEOUT)  # fmt: skip
        assert done.returncode == 0, done.stderr
        _check_mounted_and_unmount(mnt, "a.bin", data, 64 * MIB)


def test_mount_t_fuse_fastfs(src: Path, mnt: Path, tmp_path: Path) -> None:
    assert HELPER.is_file(), f"console script {HELPER} missing: pip install -e the repository"
    data = rand_bytes(3 * MIB + 1, 4)
    (src / "b.bin").write_bytes(data)
    created = False
    if not SBIN_HELPER.exists() and not SBIN_HELPER.is_symlink():
        SBIN_HELPER.symlink_to(HELPER)
        created = True
    try:
        with _cleanup_mount(mnt):
            done = subprocess.run(["mount", "-t", "fuse.fastfs", str(src), str(mnt), "-o", "ro,budget=64M"],
                                  env=_helper_env(tmp_path), capture_output=True, text=True,
                                  timeout=CMD_TIMEOUT)  # fmt: skip
            assert done.returncode == 0, done.stderr
            _check_mounted_and_unmount(mnt, "b.bin", data, 64 * MIB)

            # The fstab form, read from a private fstab by `mount --fstab FILE MNT`.
            cfg = tmp_path / "x.yaml"
            cfg.write_text("cache:\n  budget: 96M\n")
            fstab = tmp_path / "fstab"
            fstab.write_text(f"{src} {mnt} fuse.fastfs ro,config={cfg},_netdev,nofail,x-systemd.automount 0 0\n")
            done = subprocess.run(["mount", "--fstab", str(fstab), str(mnt)], env=_helper_env(tmp_path),
                                  capture_output=True, text=True, timeout=CMD_TIMEOUT)  # fmt: skip
            assert done.returncode == 0, done.stderr
            _check_mounted_and_unmount(mnt, "b.bin", data, 96 * MIB)

            # The standard FUSE options with their usual meaning, by -t and from an fstab line.
            standard = "ro,allow_other,default_permissions,fsname=trainset,noatime"
            done = subprocess.run(["mount", "-t", "fuse.fastfs", str(src), str(mnt), "-o", standard],
                                  env=_helper_env(tmp_path), capture_output=True, text=True,
                                  timeout=CMD_TIMEOUT)  # fmt: skip
            assert done.returncode == 0, done.stderr
            _check_standard_options(mnt)
            _check_mounted_and_unmount(mnt, "b.bin", data, _budget(mnt))
            fstab.write_text(f"{src} {mnt} fuse.fastfs {standard},_netdev 0 0\n")
            done = subprocess.run(["mount", "--fstab", str(fstab), str(mnt)], env=_helper_env(tmp_path),
                                  capture_output=True, text=True, timeout=CMD_TIMEOUT)  # fmt: skip
            assert done.returncode == 0, done.stderr
            _check_standard_options(mnt)
            _check_mounted_and_unmount(mnt, "b.bin", data, _budget(mnt))

            # A bad option fails with one line and mounts nothing.
            done = subprocess.run(["mount", "-t", "fuse.fastfs", str(src), str(mnt), "-o", "ro,bogus=1"],
                                  env=_helper_env(tmp_path), capture_output=True, text=True,
                                  timeout=CMD_TIMEOUT)  # fmt: skip
            assert done.returncode != 0
            assert len(done.stderr.strip().splitlines()) == 1 and "bogus" in done.stderr
            assert _fuse_mounted(mnt) == 0
    finally:
        if created:
            SBIN_HELPER.unlink()


@pytest.mark.parametrize(
    ("optstring", "needle"),
    [
        ("ro,bogus=1", "bogus"),
        ("budget=12Q", "cache.budget"),
        ("ro,workers=0", "cache.workers"),
        ("budget=1K", "cache.budget"),
        ("readahead=maybe", "readahead.enabled"),
        ("metrics=host:notaport", "stats.metrics"),
        ("remount", "remount"),
        ("config=/nonexistent/fastfs.yaml", "/nonexistent/fastfs.yaml"),
    ],
)  # fmt: skip
def test_helper_bad_options_fail_with_one_line(src: Path, mnt: Path, tmp_path: Path, optstring: str,
                                               needle: str) -> None:  # fmt: skip
    assert HELPER.is_file(), f"console script {HELPER} missing: pip install -e the repository"
    with _cleanup_mount(mnt):
        done = subprocess.run([str(HELPER), str(src), str(mnt), "-o", optstring], env=_helper_env(tmp_path),
                              capture_output=True, text=True, timeout=CMD_TIMEOUT)  # fmt: skip
        assert done.returncode == mounthelper.EXIT_USAGE
        err = done.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("mount.fuse.fastfs: ") and needle in err[0], done.stderr
        assert _fuse_mounted(mnt) == 0


def test_helper_source_from_config(src: Path, mnt: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "y.yaml"
    cfg.write_text(f"source: {src}\n")
    # -f (fake): validate and print the command without mounting.
    done = subprocess.run([str(HELPER), "none", str(mnt), "-f", "-v", "-o", f"ro,config={cfg}"],
                          env=_helper_env(tmp_path), capture_output=True, text=True, timeout=CMD_TIMEOUT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"fastfs mount {src} {mnt} --config {cfg}" in done.stderr
    assert _fuse_mounted(mnt) == 0
    cfg.write_text("cache:\n  workers: 2\n")
    done = subprocess.run([str(HELPER), "none", str(mnt), "-f", "-o", f"config={cfg}"],
                          env=_helper_env(tmp_path), capture_output=True, text=True, timeout=CMD_TIMEOUT)  # fmt: skip
    assert done.returncode == mounthelper.EXIT_USAGE and "source" in done.stderr
