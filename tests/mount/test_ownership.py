"""Ownership options (uid, gid, file_mode, dir_mode, umask): the pure translation and a real mount."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import mounted, rand_bytes
from hypothesis import given
from hypothesis import strategies as st

from fastfs.config import load_config, parse_overrides
from fastfs.daemon.ownership import Ownership, translate

REG, DIR, LNK = stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK


@pytest.mark.parametrize(
    ("mode", "own", "expected"),
    [
        (REG | 0o600, Ownership(file_mode=0o644), REG | 0o644),
        (DIR | 0o700, Ownership(file_mode=0o644), DIR | 0o700),  # file_mode leaves directories alone
        (DIR | 0o700, Ownership(dir_mode=0o755), DIR | 0o755),
        (REG | 0o666, Ownership(umask=0o022), REG | 0o644),
        (DIR | 0o777, Ownership(umask=0o027), DIR | 0o750),
        (REG | 0o600, Ownership(file_mode=0o666, umask=0o002), REG | 0o664),  # umask after file_mode
        (REG | 0o4755, Ownership(file_mode=0o755), REG | 0o755),  # setuid cleared with file_mode
        (DIR | 0o1777, Ownership(umask=0o022), DIR | 0o1755),  # sticky kept when only masked
        (LNK | 0o777, Ownership(file_mode=0o600, umask=0o077), LNK | 0o777),  # symlinks keep 0777
        (stat.S_IFIFO | 0o666, Ownership(file_mode=0o640), stat.S_IFIFO | 0o640),
    ],
)
def test_translate_modes(mode: int, own: Ownership, expected: int) -> None:
    assert translate(mode, 5000, 6000, own) == (expected, 5000, 6000)


def test_translate_owner_and_group() -> None:
    assert translate(REG | 0o644, 5000, 6000, Ownership(uid=1000)) == (REG | 0o644, 1000, 6000)
    assert translate(REG | 0o644, 5000, 6000, Ownership(gid=0)) == (REG | 0o644, 5000, 0)
    assert translate(REG | 0o644, 5000, 6000, None) == (REG | 0o644, 5000, 6000)


def test_from_config_is_none_when_nothing_changes() -> None:
    assert Ownership.from_config(load_config(use_default_path=False).fuse) is None
    fuse = load_config(overrides=parse_overrides(["uid=7,umask=022"]), use_default_path=False).fuse
    assert Ownership.from_config(fuse) == Ownership(uid=7, umask=0o22)


@given(
    kind=st.sampled_from([REG, DIR, LNK, stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR]),
    perm=st.integers(0, 0o7777),
    uid=st.integers(-1, 70000),
    gid=st.integers(-1, 70000),
    file_mode=st.integers(-1, 0o777),
    dir_mode=st.integers(-1, 0o777),
    umask=st.integers(0, 0o777),
)
def test_translate_properties(
    kind: int, perm: int, uid: int, gid: int, file_mode: int, dir_mode: int, umask: int
) -> None:
    own = Ownership(uid, gid, file_mode, dir_mode, umask)
    mode, out_uid, out_gid = translate(kind | perm, 5000, 6000, own)
    assert stat.S_IFMT(mode) == kind  # the type never changes
    assert out_uid == (uid if uid >= 0 else 5000) and out_gid == (gid if gid >= 0 else 6000)
    if kind == LNK:
        assert stat.S_IMODE(mode) == 0o777
        return
    assert stat.S_IMODE(mode) & umask == 0  # masked bits are never shown
    chosen = dir_mode if kind == DIR else file_mode
    if chosen >= 0:
        assert stat.S_IMODE(mode) == chosen & ~umask
    else:  # a umask that takes every group bit a mode has takes the others' too (an ACL may deny them more)
        emptied = perm & 0o070 and not perm & ~umask & 0o070
        assert stat.S_IMODE(mode) == perm & ~umask & (~0o007 if emptied else ~0)


# -- a real mount, read by other users --------------------------------------------------------------
OWNER, GROUP, OTHER_UID, OTHER_GID = 41234, 44321, 45555, 46666


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users may traverse (pytest's own temporary root is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="fastfs-own-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _cat_as(uid: int, gid: int, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/bin/cat", str(path)], user=uid, group=gid, extra_groups=[], capture_output=True, timeout=30
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read as other users")
def test_mount_shows_the_configured_owner_and_modes_and_the_kernel_enforces_them(shared_dir: Path) -> None:
    src, mnt = shared_dir / "src", shared_dir / "mnt"
    src.mkdir(mode=0o700)
    mnt.mkdir()
    (src / "sub").mkdir(mode=0o700)
    data = rand_bytes(70_000, 17)
    (src / "sub" / "f.bin").write_bytes(data)
    (src / "sub" / "f.bin").chmod(0o600)
    os.symlink("f.bin", src / "sub" / "link")
    options = [f"uid={OWNER},gid={GROUP},file_mode=0660,dir_mode=0770,umask=027,allow_other"]
    with mounted(src, mnt, options=options):
        for path, kind, perm in ((mnt, DIR, 0o750), (mnt / "sub", DIR, 0o750), (mnt / "sub" / "f.bin", REG, 0o640)):
            st_ = os.lstat(path)
            assert (stat.S_IFMT(st_.st_mode), stat.S_IMODE(st_.st_mode)) == (kind, perm), path
            assert (st_.st_uid, st_.st_gid) == (OWNER, GROUP)
        link = os.lstat(mnt / "sub" / "link")
        assert stat.S_ISLNK(link.st_mode) and link.st_uid == OWNER
        target = mnt / "sub" / "f.bin"
        owner = _cat_as(OWNER, OTHER_GID, target)
        assert owner.returncode == 0 and owner.stdout == data
        group = _cat_as(OTHER_UID, GROUP, target)
        assert group.returncode == 0 and group.stdout == data
        other = _cat_as(OTHER_UID, OTHER_GID, target)
        assert other.returncode != 0 and other.stdout == b"" and b"Permission denied" in other.stderr
    # the source was not touched
    assert stat.S_IMODE(os.stat(src / "sub" / "f.bin").st_mode) == 0o600
    assert os.stat(src / "sub" / "f.bin").st_uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read as other users")
def test_without_ownership_options_other_users_get_the_source_permissions(shared_dir: Path) -> None:
    src, mnt = shared_dir / "src", shared_dir / "mnt"
    src.mkdir(mode=0o755)
    mnt.mkdir()
    (src / "private").write_bytes(b"secret")
    (src / "private").chmod(0o600)
    (src / "public").write_bytes(b"hello")
    (src / "public").chmod(0o644)
    with mounted(src, mnt, options=["allow_other"]):
        assert os.stat(mnt / "private").st_uid == 0 and stat.S_IMODE(os.stat(mnt / "private").st_mode) == 0o600
        assert _cat_as(OTHER_UID, OTHER_GID, mnt / "public").stdout == b"hello"
        assert _cat_as(OTHER_UID, OTHER_GID, mnt / "private").returncode != 0
