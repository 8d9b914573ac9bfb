"""The mount is read-only: every write-type operation fails with EROFS and SRC never changes.

Each operation is tried through a live mount (as root, so permission checks never answer first)
on an existing file, an existing directory and a new name, and must raise ``OSError(EROFS)``.
The source tree's digest (names, modes, sizes, mtimes and contents) is compared before and after.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import mounted, tree_digest

CONTENT = b"original content\n" * 1000


@pytest.fixture(scope="module")
def ro_mount(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("readonly")
    src, mnt = base / "src", base / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "file.bin").write_bytes(CONTENT)
    (src / "empty_dir").mkdir()
    (src / "dir").mkdir()
    (src / "dir" / "inner.txt").write_bytes(b"inner\n")
    os.symlink("file.bin", src / "link")
    try:
        os.setxattr(src / "file.bin", "user.tag", b"value")
    except OSError as e:  # a tmpfs before Linux 6.6 has no user xattrs; the write ops still must fail
        if e.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    before = tree_digest(src)
    with mounted(src, mnt) as m:
        yield m, before
    assert tree_digest(src) == before, "the source changed through a read-only mount"


def _open_close(path: Path, flags: int, mode: int = 0o644) -> None:
    fd = os.open(path, flags, mode)
    os.close(fd)


def _write_via_fd(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)


# (id, operation given the mount root); each must raise EROFS
OPERATIONS: list[tuple[str, Callable[[Path], object]]] = [
    ("open_wronly", lambda m: _open_close(m / "file.bin", os.O_WRONLY)),
    ("open_rdwr", lambda m: _open_close(m / "file.bin", os.O_RDWR)),
    ("open_append", lambda m: _open_close(m / "file.bin", os.O_WRONLY | os.O_APPEND)),
    ("open_trunc", lambda m: _open_close(m / "file.bin", os.O_WRONLY | os.O_TRUNC)),
    ("open_create_new", lambda m: _open_close(m / "new.bin", os.O_WRONLY | os.O_CREAT)),
    ("open_create_existing", lambda m: _open_close(m / "file.bin", os.O_WRONLY | os.O_CREAT)),
    ("open_create_excl", lambda m: _open_close(m / "new2.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL)),
    ("open_create_in_subdir", lambda m: _open_close(m / "dir" / "new.bin", os.O_RDWR | os.O_CREAT)),
    ("builtin_open_w", lambda m: open(m / "file.bin", "wb").close()),
    ("builtin_open_a", lambda m: open(m / "file.bin", "ab").close()),
    ("builtin_open_x", lambda m: open(m / "other.bin", "xb").close()),
    ("truncate", lambda m: os.truncate(m / "file.bin", 10)),
    ("truncate_zero", lambda m: os.truncate(m / "file.bin", 0)),
    ("unlink", lambda m: os.unlink(m / "file.bin")),
    ("unlink_in_subdir", lambda m: os.unlink(m / "dir" / "inner.txt")),
    ("unlink_symlink", lambda m: os.unlink(m / "link")),
    ("mkdir", lambda m: os.mkdir(m / "newdir")),
    ("mkdir_in_subdir", lambda m: os.mkdir(m / "dir" / "newdir")),
    ("rmdir_empty", lambda m: os.rmdir(m / "empty_dir")),
    ("rename_file", lambda m: os.rename(m / "file.bin", m / "renamed.bin")),
    ("rename_over_existing", lambda m: os.rename(m / "dir" / "inner.txt", m / "file.bin")),
    ("rename_dir", lambda m: os.rename(m / "empty_dir", m / "moved_dir")),
    ("symlink", lambda m: os.symlink("file.bin", m / "newlink")),
    ("link", lambda m: os.link(m / "file.bin", m / "hardlink")),
    ("chmod", lambda m: os.chmod(m / "file.bin", 0o777)),
    ("chmod_dir", lambda m: os.chmod(m / "dir", 0o700)),
    ("chown", lambda m: os.chown(m / "file.bin", 65534, 65534)),
    ("lchown_symlink", lambda m: os.chown(m / "link", 65534, 65534, follow_symlinks=False)),
    ("utime", lambda m: os.utime(m / "file.bin", (1, 1))),
    ("utime_now", lambda m: os.utime(m / "file.bin")),
    ("setxattr_new", lambda m: os.setxattr(m / "file.bin", "user.new", b"v")),
    ("setxattr_replace", lambda m: os.setxattr(m / "file.bin", "user.tag", b"other")),
    ("removexattr", lambda m: os.removexattr(m / "file.bin", "user.tag")),
    ("mknod_fifo", lambda m: os.mkfifo(m / "fifo")),
    ("mknod_regular", lambda m: os.mknod(m / "node", stat.S_IFREG | 0o644)),
    ("write_on_readonly_fd", lambda m: _write_via_fd(m / "file.bin")),
]
# A write on a descriptor opened read-only is refused by the kernel before any filesystem sees it.
EXPECTED_ERRNO = {"write_on_readonly_fd": errno.EBADF}


@pytest.mark.parametrize("name,op", OPERATIONS, ids=[name for name, _ in OPERATIONS])
def test_write_operation_fails_with_erofs(ro_mount, name: str, op: Callable[[Path], object]) -> None:
    m, before = ro_mount
    with pytest.raises(OSError) as ei:
        op(m.mnt)
    want = EXPECTED_ERRNO.get(name, errno.EROFS)
    assert ei.value.errno == want, f"{name}: {errno.errorcode.get(ei.value.errno)} instead of {errno.errorcode[want]}"
    assert tree_digest(m.src) == before, f"{name} changed the source"
    # the mount still serves the original bytes
    assert (m.mnt / "file.bin").read_bytes() == CONTENT


def test_rmdir_nonempty_and_missing_names(ro_mount) -> None:
    m, before = ro_mount
    for op in (lambda: os.rmdir(m.mnt / "dir"), lambda: os.rename(m.mnt / "dir", m.mnt / "dir2")):
        with pytest.raises(OSError) as ei:
            op()
        assert ei.value.errno == errno.EROFS
    assert tree_digest(m.src) == before


def test_read_side_still_works(ro_mount) -> None:
    m, before = ro_mount
    assert (m.mnt / "file.bin").read_bytes() == CONTENT
    assert os.listxattr(m.mnt / "file.bin") == os.listxattr(m.src / "file.bin")
    for name in os.listxattr(m.src / "file.bin"):
        assert os.getxattr(m.mnt / "file.bin", name) == os.getxattr(m.src / "file.bin", name)
    assert os.readlink(m.mnt / "link") == "file.bin"
    assert sorted(os.listdir(m.mnt)) == sorted(os.listdir(m.src))
    assert os.access(m.mnt / "file.bin", os.R_OK)
    assert not os.access(m.mnt / "file.bin", os.W_OK)
    assert os.statvfs(m.mnt).f_flag & os.ST_RDONLY
    assert tree_digest(m.src) == before
