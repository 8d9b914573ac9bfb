"""The mount table shared by the daemon and the commands: mountinfo parsing, records, daemon liveness."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for

from fastfs.daemon import mounttable
from fastfs.daemon.mounttable import MountEntry, MountRecord

MOUNTINFO = (
    "36 27 0:40 / /mnt/with\\040space ro,nosuid,nodev,relatime - fuse.fastfs fastfs:/data"
    " ro,user_id=1000,group_id=1000\n"
    "37 27 0:41 / /mnt/other rw - fuse.sshfs host:/x rw,user_id=0,group_id=0\n"
)


def test_mountinfo_fields_escapes_and_owner(tmp_path: Path) -> None:
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    first, second = mounttable.mounts(str(path))
    assert (first.device, first.mountpoint, first.fstype, first.source) == (
        "0:40", "/mnt/with space", "fuse.fastfs", "fastfs:/data"
    )  # fmt: skip
    assert first.user_id == 1000 and second.user_id == 0
    assert mounttable.is_fastfs(first) and not mounttable.is_fastfs(second)


def test_connection_id_is_the_kernels_dev_t() -> None:
    assert mounttable.connection_id("0:53") == 53
    assert mounttable.connection_id("1:2") == (1 << 20) | 2


def test_canonical_never_touches_the_last_component(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert mounttable.canonical(str(tmp_path / "link" / "mnt")) == str(tmp_path / "real" / "mnt")
    assert mounttable.canonical(str(tmp_path / "link")) == str(tmp_path / "link")  # not followed


def test_daemon_alive_tells_a_running_process_from_a_gone_reused_or_zombie_one() -> None:
    me = MountRecord("0:1", "/m", "fuse.fastfs", os.getpid(), "/s", mounttable.process_start_ticks(os.getpid()) or 0)
    assert mounttable.daemon_alive(me)
    assert not mounttable.daemon_alive(MountRecord("0:1", "/m", "fuse.fastfs", os.getpid(), "/s", 1))  # pid reused
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    record = MountRecord("0:1", "/m", "fuse.fastfs", child.pid, "/s", mounttable.process_start_ticks(child.pid) or 0)
    try:
        assert wait_for(lambda: not mounttable.daemon_alive(record), timeout=30)  # a zombie until reaped
    finally:
        child.wait()
    assert not mounttable.daemon_alive(record)  # gone


def test_records_are_found_only_for_their_own_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(mounttable.RUNTIME_ENV, str(tmp_path / "run"))
    entry = MountEntry("0:77", "/mnt/x", "fuse.data", "fastfs:/src", "user_id=0,group_id=0")
    assert not mounttable.is_fastfs(entry)  # another type, no record
    assert mounttable.record_mount(MountRecord("0:77", "/mnt/x", "fuse.data", 123, "/src")) is not None
    assert mounttable.mount_record(entry) == MountRecord("0:77", "/mnt/x", "fuse.data", 123, "/src")
    assert mounttable.is_fastfs(entry)
    reused = MountEntry("0:77", "/mnt/y", "fuse.data", "other", "user_id=0,group_id=0")  # the device number reused
    assert mounttable.mount_record(reused) is None and not mounttable.is_fastfs(reused)
    mounttable.forget_mount("0:77")
    assert mounttable.mount_record(entry) is None
