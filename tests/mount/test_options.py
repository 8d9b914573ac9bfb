"""The standard FUSE / mount options people type, with their usual meaning (issue 26).

``fastfs mount SRC MNT -o ro,allow_other,default_permissions,fsname=NAME,noatime`` mounts with NAME in
the mount table; ``rw`` is refused in one line; ``subtype=`` changes the type and fastfs's commands
still know the mount; ``nonempty``, ``allow_root`` and ``--allow-other`` do what they do elsewhere;
``$FASTFS_OPTIONS`` takes the same options under the command line's. (The same line through the
mount(8) helper and fstab: tests/mount/test_service.py.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import force_unmount, is_mounted, run_cli

from fastfs.daemon.mounttable import find_mount, is_fastfs


def _error(result) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastfs: error: "), result.stderr
    return lines[0].removeprefix("fastfs: error: ")


def _proc_mounts_line(mnt: Path) -> list[str]:
    """The /proc/mounts fields (source, mount point, type, options) of the mount on *mnt*."""
    with open("/proc/mounts", encoding="utf-8") as f:
        lines = [line.split() for line in f if line.split()[1:2] == [str(mnt)]]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "f.txt").write_bytes(b"standard options\n")
    return src, mnt


def _mount(src: Path, mnt: Path, tmp_path: Path, *args: str, env: dict | None = None):
    return run_cli("mount", src, mnt, "--log-file", tmp_path / "fastfs.log", *args, env=env, timeout=90)


def test_the_line_people_type_mounts_with_its_name_in_proc_mounts(tree: tuple[Path, Path], tmp_path: Path) -> None:
    src, mnt = tree
    try:
        done = _mount(src, mnt, tmp_path, "-o", "ro,allow_other,default_permissions,fsname=trainset,noatime")
        assert done.returncode == 0, done.stderr
        source, point, fstype, options = _proc_mounts_line(mnt)[:4]
        assert (source, point, fstype) == ("trainset", str(mnt), "fuse.fastfs")
        assert {"ro", "noatime", "allow_other", "default_permissions"} <= set(options.split(","))
        assert (mnt / "f.txt").read_bytes() == b"standard options\n"
        assert is_fastfs(find_mount(str(mnt)))
        status = json.loads(run_cli("status", mnt, "--json").stdout)["mounts"]
        assert [(m["state"], m["source"]) for m in status] == [("ok", str(src))]
        assert run_cli("umount", mnt).returncode == 0
    finally:
        force_unmount(mnt)


def test_rw_is_refused_in_one_line(tree: tuple[Path, Path], tmp_path: Path) -> None:
    src, mnt = tree
    assert _error(_mount(src, mnt, tmp_path, "-o", "ro,rw")) == (
        "-o rw: fastfs mounts are read-only (drop rw; ro is implied)"
    )
    assert not is_mounted(mnt)


def test_a_subtype_changes_the_type_and_the_commands_still_know_the_mount(
    tree: tuple[Path, Path], tmp_path: Path
) -> None:
    src, mnt = tree
    try:
        done = _mount(src, mnt, tmp_path, "-o", "subtype=datasets")
        assert done.returncode == 0, done.stderr
        assert _proc_mounts_line(mnt)[2] == "fuse.datasets"
        status = run_cli("status", "--json")
        assert str(mnt) in [m["mountpoint"] for m in json.loads(status.stdout)["mounts"]]
        stats = run_cli("stats", mnt, "--json")
        assert stats.returncode == 0 and json.loads(stats.stdout)["mount"]["source"] == str(src)
        assert run_cli("umount", mnt).returncode == 0
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)


def test_nonempty_mounts_over_files_and_says_so_without_it(tree: tuple[Path, Path], tmp_path: Path) -> None:
    src, mnt = tree
    (mnt / "hidden.txt").write_bytes(b"under the mount")
    assert _error(_mount(src, mnt, tmp_path)) == (
        f"mountpoint {mnt} is not empty: use an empty directory, or -o nonempty to hide its files"
    )
    try:
        done = _mount(src, mnt, tmp_path, "-o", "nonempty")
        assert done.returncode == 0, done.stderr
        assert os.listdir(mnt) == ["f.txt"]
        assert run_cli("umount", mnt).returncode == 0
    finally:
        force_unmount(mnt)
    assert (mnt / "hidden.txt").read_bytes() == b"under the mount"


def test_allow_other_flag_and_allow_root_as_root(tree: tuple[Path, Path], tmp_path: Path) -> None:
    src, mnt = tree
    if os.geteuid() != 0:
        pytest.skip("allow_root changes nothing only for a mount made by root")
    for args, expected in ((["--allow-other"], {"allow_other", "default_permissions"}), (["-o", "allow_root"], set())):
        try:
            done = _mount(src, mnt, tmp_path, *args)
            assert done.returncode == 0, done.stderr
            options = set(_proc_mounts_line(mnt)[3].split(","))
            assert expected <= options and ("allow_other" in options) == ("allow_other" in expected)
            assert (mnt / "f.txt").read_bytes() == b"standard options\n"
            assert run_cli("umount", mnt).returncode == 0
        finally:
            force_unmount(mnt)


def test_options_from_the_environment_under_the_command_line(tree: tuple[Path, Path], tmp_path: Path) -> None:
    src, mnt = tree
    env = {"FASTFS_OPTIONS": "budget=64M,fsname=fromenv,workers=3"}
    printed = run_cli("mount", src, mnt, "-o", "workers=5", "--print-config", env=env)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert "environment FASTFS_OPTIONS" in lines[0] and "command line" in lines[0]
    assert any(line.strip().startswith("budget: 64M") and "environment FASTFS_OPTIONS" in line for line in lines)
    assert any(line.strip().startswith("workers: 5") and "command line" in line for line in lines)
    try:
        done = _mount(src, mnt, tmp_path, "-o", "workers=5", env=env)
        assert done.returncode == 0, done.stderr
        assert _proc_mounts_line(mnt)[0] == "fromenv"
        snap = json.loads(os.getxattr(mnt, "user.fastfs.stats"))
        assert snap["gauges"]["cache_budget"] == 64 << 20 and snap["gauges"]["pool_workers"] == 5
        assert run_cli("umount", mnt).returncode == 0
    finally:
        force_unmount(mnt)
    bad = run_cli("mount", src, mnt, env={"FASTFS_OPTIONS": "budgt=1G"})
    assert _error(bad) == "FASTFS_OPTIONS budgt=1G: unknown option; did you mean budget?"
    assert not is_mounted(mnt)
