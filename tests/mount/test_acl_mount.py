"""POSIX ACLs on ``allow_other`` mounts (issue 24 item 3): the mount never grants what the source denies.

The source (in a directory every user can traverse) holds files whose ACLs deny or grant ``nobody``
what their mode bits say (``0644`` + ``user:nobody:---``; ``0600`` + ``user:nobody:r--``), a
directory whose ACL denies ``nobody`` search, and a plain file. ``nobody`` (a forked child:
:func:`asuser.run_as`) must get exactly what it gets on the source, checked on the source first, on
each read route: passthrough to the source, served by the daemon (``fuse.passthrough=off``) and
passthrough to a complete file of the disk tier (fastfs over a FUSE source, which the daemon serves).
ACLs are set with ``os.setxattr`` in the kernel's binary format (:mod:`posixacl`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from asuser import NOBODY, ChildError, run_as, shared_dir
from conftest import SERVED, mounted, rand_bytes, wait_for
from posixacl import set_acl

MIB = 1024 * 1024
# Files of 1 MiB and more (the disk tier hands every file it holds whole to the kernel; these sizes keep
# the test's reads and warms over several blocks).
SIZE = MIB + 4321
# Bound on a warm job finishing (the tree is small and local).
JOB_BOUND = 60.0

# relative path -> (mode, ACL or ""); "closed" is a directory
TREE: dict[str, tuple[int, str]] = {
    "plain.bin": (0o644, ""),
    "denied.bin": (0o644, f"u::rw-,u:{NOBODY}:---,g::r--,m::r--,o::r--"),
    "granted.bin": (0o600, f"u::rw-,u:{NOBODY}:r--,g::---,m::r--,o::---"),
    "others.bin": (0o644, "u::rw-,u:12345:r--,g::r--,m::r--,o::r--"),  # nobody reads it as one of the others
    "closed": (0o755, f"u::rwx,u:{NOBODY}:---,g::r-x,m::r-x,o::r-x"),
    "closed/inner.bin": (0o644, ""),
}
FILES = [rel for rel in TREE if rel.endswith(".bin")]
# What nobody may read (on the source, and so through every mount).
READABLE = {"plain.bin", "granted.bin", "others.bin"}


def make_source(src: Path) -> dict[str, bytes]:
    data: dict[str, bytes] = {}
    for i, (rel, (mode, acl)) in enumerate(TREE.items()):
        path = src / rel
        if rel.endswith(".bin"):
            data[rel] = rand_bytes(SIZE + i, 2400 + i)
            path.write_bytes(data[rel])
        else:
            path.mkdir()
        os.chmod(path, mode)
        if acl:
            set_acl(path, acl)
    return data


def reads_as_nobody(root: Path, data: dict[str, bytes]) -> dict[str, str]:
    """As nobody: for each file, "read" (its bytes, exactly), "wrong bytes", or the errno name of the failure."""

    def probe() -> dict[str, str]:
        out: dict[str, str] = {}
        for rel in FILES:
            try:
                out[rel] = "read" if (root / rel).read_bytes() == data[rel] else "wrong bytes"
            except OSError as e:
                out[rel] = errno.errorcode.get(e.errno or 0, str(e.errno))
        return out

    return run_as(probe)


def expected(changes: dict[str, str] | None = None) -> dict[str, str]:
    """What nobody gets on the source (then through every mount), with *changes* (name -> outcome)."""
    out = {rel: "read" if rel in READABLE else "EACCES" for rel in FILES}
    return {**out, **(changes or {})}


@pytest.fixture
def tree() -> Iterator[tuple[Path, dict[str, bytes]]]:
    with shared_dir() as base:
        src = base / "src"
        src.mkdir(mode=0o755)
        data = make_source(src)
        assert reads_as_nobody(src, data) == expected()  # the source itself denies and grants so
        yield base, data


@pytest.mark.parametrize("route", ["passthrough", "served"])
def test_acls_decide_for_other_users_as_on_the_source(tree, route: str) -> None:
    base, data = tree
    mnt = base / "mnt"
    mnt.mkdir(mode=0o755)
    options = ["allow_other", "readahead.learn=false"] + ([SERVED] if route == "served" else [])
    with mounted(base / "src", mnt, options=options) as m:
        assert reads_as_nobody(mnt, data) == expected()
        c = m.stats()["counters"]
        assert c["opens_passthrough"] > 0 if route == "passthrough" else c["opens_passthrough"] == 0
        assert "POSIX_ACL" in m.stats()["kernel"]["flags"]
        for rel in FILES:  # root (the daemon's user here) still reads everything
            assert (mnt / rel).read_bytes() == data[rel]
        # what the ACLs say is visible through the mount too
        assert os.getxattr(mnt / "denied.bin", "system.posix_acl_access") == os.getxattr(
            base / "src" / "denied.bin", "system.posix_acl_access"
        )


def test_a_mount_without_allow_other_does_not_ask_for_acls(tree) -> None:
    """Only the mounting user (root here) can use it; the kernel checks no permissions, ACLs neither."""
    base, data = tree
    mnt = base / "mnt"
    mnt.mkdir(mode=0o755)
    with mounted(base / "src", mnt) as m:
        assert "POSIX_ACL" not in m.stats()["kernel"]["flags"]
        for rel in FILES:
            assert (mnt / rel).read_bytes() == data[rel]


def test_acls_decide_for_files_the_disk_tier_passes_through(tree) -> None:
    """A FUSE source is served; files the disk tier holds whole are opened by passthrough to its data
    files (owned by the daemon, 0600): the kernel checks the mount's inode, ACL included."""
    base, data = tree
    inner, mnt, disk = base / "inner", base / "mnt", base / "disk"
    inner.mkdir(mode=0o755)
    mnt.mkdir(mode=0o755)
    # fastfs over fastfs: the outer daemon's source is a FUSE mount (served, with a disk tier)
    with mounted(base / "src", inner), mounted(inner, mnt, options=["allow_other", f"cache.disk_dir={disk}"]) as m:
        for rel in FILES:
            assert (mnt / rel).read_bytes() == data[rel]
        total = sum(len(d) for d in data.values())
        assert wait_for(lambda: m.stats()["counters"]["disk_bytes_written"] >= total, timeout=30)
        for rel in FILES:  # an open queues the verification of a complete file; later opens pass through
            os.close(os.open(mnt / rel, os.O_RDONLY))
        assert wait_for(lambda: m.stats()["counters"]["disk_verified_files"] == len(FILES), timeout=30)
        before = m.stats()["counters"]["opens_disk"]
        assert reads_as_nobody(mnt, data) == expected()
        assert m.stats()["counters"]["opens_disk"] - before == len(READABLE)  # the readable ones, from disk


def _warm_as_nobody(mnt: Path, target: Path) -> dict:
    def warm() -> dict:
        answer = json.loads(os.getxattr(target, "user.fastfs.warm"))
        deadline = time.monotonic() + JOB_BOUND
        while time.monotonic() < deadline:
            report = json.loads(os.getxattr(mnt, f"user.fastfs.warm.{answer['job']}"))
            if report["done"]:
                return report
            time.sleep(0.02)
        raise TimeoutError("warm job did not finish")

    return run_as(warm, timeout=JOB_BOUND + 30)


def test_warm_by_another_user_follows_the_acls(tree) -> None:
    base, data = tree
    mnt = base / "mnt"
    mnt.mkdir(mode=0o755)
    with mounted(base / "src", mnt, options=["allow_other", "readahead.learn=false", SERVED]) as m:
        report = _warm_as_nobody(mnt, mnt)
        assert report["files_done"] == len(READABLE) and report["bytes_done"] == sum(len(data[r]) for r in READABLE)
        assert report["skipped"] == 2 and report["failed"] == 0, report  # denied.bin and closed/
        for rel in FILES:
            cached = json.loads(os.getxattr(mnt / rel, "user.fastfs.cached"))["cached"]
            assert cached == (len(data[rel]) if rel in READABLE else 0), rel
        for target in (mnt / "denied.bin", mnt / "closed", mnt / "closed" / "inner.bin"):
            with pytest.raises(ChildError) as info:
                _warm_as_nobody(mnt, target)
            assert info.value.errno == errno.EACCES, (target, info.value)
        assert _warm_as_nobody(mnt, mnt / "granted.bin")["files_done"] == 1
        c = m.stats()["counters"]
        fetched = c["bytes_fetched_prefetch"] + c["bytes_fetched_demand"] + c["bytes_fetched_warm"]
        assert fetched == sum(len(data[r]) for r in READABLE)  # nothing else was read on nobody's behalf


@contextlib.contextmanager
def _mount_with(base: Path, options: list[str]) -> Iterator[Path]:
    mnt = base / "mnt"
    mnt.mkdir(mode=0o755, exist_ok=True)
    with mounted(base / "src", mnt, options=["allow_other", *options]):
        yield mnt


def test_ownership_options_with_acls(tree) -> None:
    """uid/gid: the ACL still applies (its named entries keep their ids). umask: it clears the same bits
    of the ACL as of the mode (others.bin, readable by the others through its ACL, is not with a umask
    clearing the others' read bit), and where it takes every group bit (the kernel then ignores the
    ACL) the others' bits too. file_mode/dir_mode: the bits shown replace the
    source's permissions, ACL included (no ACL is shown or applied there)."""
    base, data = tree
    with _mount_with(base, ["fuse.uid=1000", "fuse.gid=1000"]) as mnt:
        assert reads_as_nobody(mnt, data) == expected()
    with _mount_with(base, ["fuse.umask=0004"]) as mnt:  # others lose read, by the mode and by the ACL's other::
        assert reads_as_nobody(mnt, data) == expected({"plain.bin": "EACCES", "others.bin": "EACCES"})
    with _mount_with(base, ["fuse.umask=0040"]) as mnt:  # takes all group bits of the files: others' go too
        everything_denied = {"plain.bin": "EACCES", "granted.bin": "EACCES", "others.bin": "EACCES"}
        assert reads_as_nobody(mnt, data) == expected(everything_denied)  # (denied.bin: not through 0604)
    with _mount_with(base, ["fuse.file_mode=0644"]) as mnt:  # every file 0644; closed/ keeps its ACL
        assert reads_as_nobody(mnt, data) == expected({"denied.bin": "read"})
        with pytest.raises(OSError) as info:
            os.getxattr(mnt / "denied.bin", "system.posix_acl_access")
        assert info.value.errno == errno.ENODATA
    with _mount_with(base, ["fuse.dir_mode=0755"]) as mnt:  # closed/ opens; files keep their ACLs
        assert reads_as_nobody(mnt, data) == expected({"closed/inner.bin": "read"})
