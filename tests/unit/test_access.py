"""Caller identity and the kernel's generic permission rules (fastfs.fsio.access, fastfs.daemon.caller):
a table, properties, and a check against the kernel itself as an unprivileged user."""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from asuser import NOBODY, NOGROUP, run_as, shared_dir
from hypothesis import given
from hypothesis import strategies as st

from fastfs.daemon.caller import caller_of, groups_of
from fastfs.fsio.access import (
    MAY_EXEC,
    MAY_READ,
    MAY_WRITE,
    ROOT,
    Caller,
    may_list,
    may_open,
    may_reach,
    may_read,
    may_search,
    permitted,
)

ALICE = Caller(1000, 1000, frozenset({2000}))


def attrs(mode: int, uid: int = 1000, gid: int = 1000, kind: int = stat.S_IFREG) -> SimpleNamespace:
    return SimpleNamespace(st_mode=kind | mode, st_uid=uid, st_gid=gid)


TABLE = [
    # (mode, file uid, file gid, kind, caller, want, allowed)
    (0o600, 1000, 1000, stat.S_IFREG, ALICE, MAY_READ, True),
    (0o600, 1001, 1000, stat.S_IFREG, ALICE, MAY_READ, False),  # group has no bits
    (0o640, 1001, 1000, stat.S_IFREG, ALICE, MAY_READ, True),  # primary group
    (0o640, 1001, 2000, stat.S_IFREG, ALICE, MAY_READ, True),  # supplementary group
    (0o640, 1001, 3000, stat.S_IFREG, ALICE, MAY_READ, False),
    (0o604, 1001, 3000, stat.S_IFREG, ALICE, MAY_READ, True),  # other
    (0o074, 1000, 1000, stat.S_IFREG, ALICE, MAY_READ, False),  # owner class wins even when others may
    (0o704, 1001, 1000, stat.S_IFREG, ALICE, MAY_READ, False),  # group class wins over other
    (0o000, 1000, 1000, stat.S_IFREG, ROOT, MAY_READ | MAY_WRITE, True),  # root overrides
    (0o600, 1000, 1000, stat.S_IFREG, ROOT, MAY_EXEC, False),  # but executes only with some x bit
    (0o601, 1000, 1000, stat.S_IFREG, ROOT, MAY_EXEC, True),
    (0o000, 1000, 1000, stat.S_IFDIR, ROOT, MAY_EXEC, True),  # and searches every directory
    (0o711, 1001, 1000, stat.S_IFDIR, ALICE, MAY_READ | MAY_EXEC, False),  # search, not list
    (0o711, 1001, 1000, stat.S_IFDIR, ALICE, MAY_EXEC, True),
    (0o755, 1001, 1000, stat.S_IFDIR, ALICE, MAY_READ | MAY_EXEC, True),
]


@pytest.mark.parametrize(("mode", "uid", "gid", "kind", "caller", "want", "allowed"), TABLE)
def test_permission_table(mode, uid, gid, kind, caller, want, allowed) -> None:
    assert permitted(attrs(mode, uid, gid, kind), caller, want) is allowed


def test_helpers_check_the_kind_too() -> None:
    assert may_read(attrs(0o644), ALICE)
    assert not may_read(attrs(0o644, kind=stat.S_IFDIR), ALICE)
    assert not may_read(attrs(0o777, kind=stat.S_IFLNK), ROOT)
    assert may_search(attrs(0o711, 1001, kind=stat.S_IFDIR), ALICE)
    assert not may_search(attrs(0o755), ALICE)  # a regular file is no directory
    assert may_list(attrs(0o755, 1001, kind=stat.S_IFDIR), ALICE)
    assert not may_list(attrs(0o733, 1001, 5, kind=stat.S_IFDIR), ALICE)
    root_dir, closed_dir = attrs(0o755, 0, 0, stat.S_IFDIR), attrs(0o700, 0, 0, stat.S_IFDIR)
    assert may_reach([root_dir, root_dir], ALICE)
    assert not may_open([root_dir, closed_dir], attrs(0o644, 0, 0), ALICE)
    assert may_open([root_dir, closed_dir], attrs(0o600, 0, 0), ROOT)


modes = st.integers(0, 0o777)
ids = st.integers(0, 5)
callers = st.builds(Caller, st.integers(0, 5), ids, st.frozensets(ids, max_size=3))
wants = st.sampled_from([MAY_READ, MAY_WRITE, MAY_EXEC, MAY_READ | MAY_EXEC, MAY_READ | MAY_WRITE | MAY_EXEC])
kinds = st.sampled_from([stat.S_IFREG, stat.S_IFDIR])


@given(modes, ids, ids, kinds, callers, wants)
def test_more_bits_never_take_a_permission_away(mode, uid, gid, kind, caller, want) -> None:
    if permitted(attrs(mode, uid, gid, kind), caller, want):
        for bit in range(9):
            assert permitted(attrs(mode | 1 << bit, uid, gid, kind), caller, want)


@given(modes, ids, ids, kinds, callers, wants)
def test_exactly_one_class_of_bits_decides(mode, uid, gid, kind, caller, want) -> None:
    if caller.uid == 0:
        return
    if caller.uid == uid:
        bits = mode >> 6
    elif gid == caller.gid or gid in caller.groups:
        bits = mode >> 3
    else:
        bits = mode
    assert permitted(attrs(mode, uid, gid, kind), caller, want) == (bits & want == want)


@given(modes, ids, kinds, wants, st.integers(1, 5))
def test_a_supplementary_group_counts_as_the_primary_one(mode, uid, kind, want, gid) -> None:
    primary = Caller(9, gid)
    supplementary = Caller(9, 99, frozenset({gid}))
    assert permitted(attrs(mode, uid, gid, kind), primary, want) == permitted(
        attrs(mode, uid, gid, kind), supplementary, want
    )


def test_groups_come_from_proc_status(tmp_path: Path) -> None:
    status = tmp_path / "123" / "status"
    status.parent.mkdir()
    status.write_text("Name:\tx\nUid:\t5\t5\t5\t5\nGroups:\t4 27 1000 \nNgid:\t0\n")
    assert groups_of(123, str(tmp_path)) == frozenset({4, 27, 1000})
    assert caller_of(5, 6, 123, str(tmp_path)) == Caller(5, 6, frozenset({4, 27, 1000}))
    assert groups_of(0, str(tmp_path)) == frozenset()  # pid 0: another pid namespace
    assert groups_of(999, str(tmp_path)) == frozenset()  # gone
    assert groups_of(os.getpid()) == frozenset(os.getgroups())


# -- against the kernel ----------------------------------------------------------------------------
KERNEL_GROUP = 4242  # a supplementary group of the unprivileged caller
OTHER_UID = 12345


def test_permissions_match_the_kernel_for_an_unprivileged_caller() -> None:
    """What access.py allows is exactly what the kernel lets nobody (with a supplementary group) open."""
    caller = Caller(NOBODY, NOGROUP, frozenset({KERNEL_GROUP}))
    owners = [(NOBODY, NOGROUP), (OTHER_UID, NOGROUP), (OTHER_UID, KERNEL_GROUP), (0, 0)]
    modes = [0o000, 0o004, 0o040, 0o400, 0o444, 0o440, 0o404, 0o044, 0o640, 0o604, 0o700, 0o070, 0o007]
    with shared_dir() as base:
        files, dirs = [], []
        for i, ((uid, gid), mode) in enumerate(itertools.product(owners, modes)):
            f = base / f"f{i}"
            f.write_bytes(b"x")
            os.chown(f, uid, gid)
            f.chmod(mode)
            files.append(str(f))
            d = base / f"d{i}"
            d.mkdir()
            (d / "inner").write_bytes(b"y")
            (d / "inner").chmod(0o644)
            os.chown(d, uid, gid)
            d.chmod(mode | (mode & 0o444) >> 2)  # some with search, some without
            dirs.append(str(d))

        def probe() -> dict:
            out = {}
            for path in files:
                try:
                    os.close(os.open(path, os.O_RDONLY))
                    out[path] = True
                except PermissionError:
                    out[path] = False
            for path in dirs:
                try:
                    os.listdir(path)
                    listed = True
                except PermissionError:
                    listed = False
                try:
                    os.close(os.open(os.path.join(path, "inner"), os.O_RDONLY))
                    searched = True
                except PermissionError:
                    searched = False
                out[path] = [listed, searched]
            return out

        kernel = run_as(probe, groups=(KERNEL_GROUP,))
        for path in files:
            assert may_read(os.lstat(path), caller) == kernel[path], (path, oct(os.lstat(path).st_mode))
        for path in dirs:
            st_ = os.lstat(path)
            listed, searched = kernel[path]
            assert permitted(st_, caller, MAY_READ) == listed, (path, oct(st_.st_mode))
            assert may_search(st_, caller) == searched, (path, oct(st_.st_mode))
