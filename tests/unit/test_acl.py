"""POSIX ACLs in the permission checks (fastfs.fsio.access), what the mount shows of them
(fastfs.daemon.ownership) and the INIT flag that has the kernel apply them (issue 24 item 3).

The parser is checked against an encoder written apart (:mod:`posixacl`); the evaluation against
a table of the kernel's rules, properties, and the kernel itself: files and directories with random
ACLs that ``nobody`` (with a supplementary group) tries to open, list and search.
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import stat
import struct

import pytest
from asuser import NOBODY, NOGROUP, run_as, shared_dir
from hypothesis import given
from hypothesis import strategies as st
from posixacl import acl_bytes, set_acl

from fastfs.daemon.kernel import abi
from fastfs.daemon.kernel.abi import Init
from fastfs.daemon.kernel.negotiate import Offer, Wishes, negotiate
from fastfs.daemon.ownership import (
    Ownership,
    no_acl,
    replaces_bits,
    shown_acl,
    shown_xattr,
    shown_xattr_names,
    translate,
)
from fastfs.fsio.access import (
    ACL_ACCESS,
    ACL_DEFAULT,
    ACL_GROUP,
    ACL_GROUP_OBJ,
    ACL_MASK,
    ACL_OTHER,
    ACL_UNDEFINED_ID,
    ACL_USER,
    ACL_USER_OBJ,
    MAY_EXEC,
    MAY_READ,
    MAY_WRITE,
    ROOT,
    Acl,
    AclEntry,
    AclError,
    Attrs,
    Caller,
    may_list,
    may_read,
    may_search,
    needs_acl,
    parse_acl,
    permitted,
    read_acl,
)

REG, DIR = stat.S_IFREG, stat.S_IFDIR
ALICE = Caller(1000, 1000, frozenset({2000}))
U = ACL_UNDEFINED_ID


def acl(spec: str) -> Acl:
    parsed = parse_acl(acl_bytes(spec))
    assert parsed is not None
    return parsed


def f(mode: int, spec: str = "", uid: int = 1001, gid: int = 3000, kind: int = REG) -> Attrs:
    return Attrs(kind | mode, uid, gid, acl(spec) if spec else None)


# -- the binary format -------------------------------------------------------------------------------
def test_parse_reads_the_kernel_format() -> None:
    assert acl("u::rw-,u:65534:---,g::r--,g:42:r-x,m::r-x,o::r--") == Acl(
        (
            AclEntry(ACL_USER_OBJ, 6, U),
            AclEntry(ACL_USER, 0, 65534),
            AclEntry(ACL_GROUP_OBJ, 4, U),
            AclEntry(ACL_GROUP, 5, 42),
            AclEntry(ACL_MASK, 5, U),
            AclEntry(ACL_OTHER, 4, U),
        )
    )
    assert parse_acl(struct.pack("<I", 2)) is None  # no entries: no ACL


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x02\x00",
        struct.pack("<IHHI", 1, ACL_USER_OBJ, 6, U),  # version 1
        struct.pack("<IHHI", 2, ACL_USER_OBJ, 6, U) + b"\0",  # not whole entries
        struct.pack("<IHHI", 2, 0x40, 6, U),  # unknown tag
    ],
)
def test_parse_refuses_what_the_kernel_refuses(data: bytes) -> None:
    with pytest.raises(AclError):
        parse_acl(data)
    assert read_acl(data) == Acl(())  # read as an ACL that denies


tags = st.sampled_from([ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER])
entries = st.builds(
    lambda tag, perm, eid: AclEntry(tag, perm, eid if tag in (ACL_USER, ACL_GROUP) else U),
    tags,
    st.integers(0, 7),
    st.integers(0, 70000),
)


@given(st.lists(entries, min_size=1, max_size=12))
def test_encode_and_parse_round_trip(items: list[AclEntry]) -> None:
    value = Acl(tuple(items))
    assert parse_acl(value.encode()) == value


@given(st.binary(max_size=80))
def test_any_bytes_parse_or_fail_with_an_acl_error(data: bytes) -> None:
    try:
        parse_acl(data)
    except AclError:
        pass


# -- the kernel's rules, as a table ------------------------------------------------------------------
TABLE = [
    # (file attributes, caller, want, allowed)
    (f(0o600, "u::rw-,u:1000:---,g::---,m::---,o::---", uid=1000), ALICE, MAY_READ, True),  # the owner: mode bits
    (f(0o040, "u::---,g::r--,o::---", uid=1000, gid=1000), ALICE, MAY_READ, False),  # even if its group may
    (f(0o644, "u::rw-,u:1000:---,g::r--,m::r--,o::r--"), ALICE, MAY_READ, False),  # a named user denied
    (f(0o640, "u::rw-,u:1000:r--,g::---,m::r--,o::---"), ALICE, MAY_READ, True),  # a named user granted
    (f(0o640, "u::rw-,u:1000:rw-,g::---,m::r--,o::---"), ALICE, MAY_READ | MAY_WRITE, False),  # ... by the mask
    (f(0o640, "u::rw-,u:1000:rw-,g::---,m::r--,o::---"), ALICE, MAY_READ, True),
    (f(0o604, "u::rw-,u:1000:r--,g::---,m::---,o::r--"), ALICE, MAY_READ, True),  # empty mask: not consulted
    (f(0o640, "u::rw-,g::r--,m::r--,o::---", gid=1000), ALICE, MAY_READ, True),  # owning group (primary)
    (f(0o640, "u::rw-,g::---,g:2000:r--,m::r--,o::---"), ALICE, MAY_READ, True),  # named group (supplementary)
    (f(0o644, "u::rw-,g::---,g:2000:---,m::r--,o::r--", gid=1000), ALICE, MAY_READ, False),  # in groups: not other
    (f(0o640, "u::rw-,g::---,g:2000:r--,m::r--,o::---", gid=1000), ALICE, MAY_READ, True),  # one group suffices
    (f(0o640, "u::rw-,g::rw-,m::r--,o::---", gid=1000), ALICE, MAY_WRITE, False),  # the mask limits the group too
    (f(0o644, "u::rw-,g::r--,g:5:---,m::r--,o::r--"), ALICE, MAY_READ, True),  # not in any group: other
    (f(0o640, "u::rw-,g::r--,m::r--,o::---"), ALICE, MAY_READ, False),
    (f(0o644, "u::rw-,u:1000:---,g::r--,m::r--,o::r--"), ALICE, MAY_READ, False),  # named user before other
    (f(0o644, "u::rw-,u:0:---,g::r--,m::r--,o::---"), ROOT, MAY_READ | MAY_WRITE, True),  # root: capabilities
    (f(0o640, "u::rw-,u:0:rwx,g::r--,m::r--,o::---"), ROOT, MAY_EXEC, False),  # but no x bit, no execute
    (f(0o755, "u::rwx,u:1000:---,g::r-x,m::r-x,o::r-x", kind=DIR), ALICE, MAY_EXEC, False),  # no search
    (f(0o751, "u::rwx,u:1000:--x,g::r-x,m::r-x,o::--x", kind=DIR), ALICE, MAY_EXEC, True),  # search only
    (f(0o751, "u::rwx,u:1000:--x,g::r-x,m::r-x,o::--x", kind=DIR), ALICE, MAY_READ | MAY_EXEC, False),
    (f(0o644, "u::rw-,g::r--,m::r--"), ALICE, MAY_READ, False),  # no other entry: the kernel's EIO
]


@pytest.mark.parametrize(("attrs", "caller", "want", "allowed"), TABLE)
def test_acl_table(attrs: Attrs, caller: Caller, want: int, allowed: bool) -> None:
    assert permitted(attrs, caller, want) is allowed


def test_an_unreadable_acl_denies_all_but_the_owner() -> None:
    broken = Attrs(REG | 0o644, 1000, 3000, read_acl(b"junk"))
    assert not may_read(broken, Caller(1001, 5)) and not may_read(broken, ROOT)
    assert may_read(broken, ALICE)
    assert may_read(Attrs(REG | 0o604, 1000, 3000, read_acl(b"junk")), Caller(1001, 5))  # no group bits: not read


def test_helpers_take_the_acl() -> None:
    d = f(0o755, "u::rwx,u:1000:---,g::r-x,m::r-x,o::r-x", kind=DIR)
    assert not may_search(d, ALICE) and not may_list(d, ALICE) and may_list(d, Caller(7, 7))
    assert may_read(f(0o640, "u::rw-,u:1000:r--,g::---,m::r--,o::---"), ALICE)


# -- properties -------------------------------------------------------------------------------------
perms = st.integers(0, 7)
ids = st.integers(0, 5)
callers = st.builds(Caller, st.integers(0, 5), ids, st.frozensets(ids, max_size=3))
wants = st.sampled_from([MAY_READ, MAY_WRITE, MAY_EXEC, MAY_READ | MAY_EXEC, MAY_READ | MAY_WRITE | MAY_EXEC])
kinds = st.sampled_from([REG, DIR])


@st.composite
def valid_acls(draw: st.DrawFn) -> tuple[int, Acl]:
    """(mode, ACL) as the kernel keeps them: owner, group, other once each, named users and groups
    with distinct ids, a mask when there are any (the mode's group bits), sorted."""
    users = draw(st.dictionaries(ids, perms, max_size=3))
    groups = draw(st.dictionaries(ids, perms, max_size=3))
    owner, group, other = draw(perms), draw(perms), draw(perms)
    items = [AclEntry(ACL_USER_OBJ, owner)]
    items += [AclEntry(ACL_USER, p, i) for i, p in sorted(users.items())]
    items.append(AclEntry(ACL_GROUP_OBJ, group))
    items += [AclEntry(ACL_GROUP, p, i) for i, p in sorted(groups.items())]
    mask = group
    if users or groups:
        mask = draw(perms)
        items.append(AclEntry(ACL_MASK, mask))
    items.append(AclEntry(ACL_OTHER, other))
    return owner << 6 | mask << 3 | other, Acl(tuple(items))


@given(perms, perms, perms, ids, ids, kinds, callers, wants)
def test_a_minimal_acl_says_what_the_mode_says(owner, group, other, uid, gid, kind, caller, want) -> None:
    mode = kind | owner << 6 | group << 3 | other
    minimal = Acl((AclEntry(ACL_USER_OBJ, owner), AclEntry(ACL_GROUP_OBJ, group), AclEntry(ACL_OTHER, other)))
    assert permitted(Attrs(mode, uid, gid, minimal), caller, want) == permitted(Attrs(mode, uid, gid), caller, want)


@given(valid_acls(), ids, ids, kinds, callers, wants)
def test_the_acl_matters_only_where_needs_acl_says(mode_acl, uid, gid, kind, caller, want) -> None:
    mode, value = mode_acl
    plain = Attrs(kind | mode, uid, gid)
    if not needs_acl(plain, caller):
        assert permitted(Attrs(kind | mode, uid, gid, value), caller, want) == permitted(plain, caller, want)


@given(valid_acls(), ids, ids, kinds, callers, wants, st.integers(0, 0o777))
def test_a_umask_never_grants_what_the_source_denies(mode_acl, uid, gid, kind, caller, want, umask) -> None:
    """The mode and the ACL as the mount shows them under a umask (translate, shown_acl) allow no
    caller anything the source's deny it (the kernel ignores an ACL once the mode has no group bits)."""
    mode, value = mode_acl
    own = Ownership(umask=umask)
    shown_mode, _, _ = translate(kind | mode, uid, gid, own)
    shown = read_acl(shown_acl(value.encode(), kind | mode, own))
    assert shown is not None
    before = permitted(Attrs(kind | mode, uid, gid, value), caller, want)
    after = permitted(Attrs(shown_mode, uid, gid, shown), caller, want)
    assert before or not after, (oct(mode), oct(shown_mode), shown)


@given(valid_acls(), ids, ids, kinds, callers, wants)
def test_a_umask_of_zero_changes_nothing(mode_acl, uid, gid, kind, caller, want) -> None:
    assert mode_acl[1].umasked(0) == mode_acl[1]


# -- what the mount shows (ownership options) -------------------------------------------------------
RAW = acl_bytes("u::rw-,u:65534:---,g::r--,m::r-x,o::r--")


def test_shown_acl_follows_the_ownership_options() -> None:
    assert shown_acl(RAW, REG | 0o654, None) == RAW
    assert shown_acl(RAW, REG | 0o654, Ownership(uid=5, gid=6)) == RAW  # named ids unchanged
    assert shown_acl(RAW, REG | 0o654, Ownership(umask=0o037)) == acl_bytes("u::rw-,u:65534:---,g::r--,m::r--,o::---")
    assert shown_acl(RAW, REG | 0o654, Ownership(file_mode=0o644)) is None  # the options' bits replace it
    assert shown_acl(RAW, DIR | 0o755, Ownership(file_mode=0o644)) == RAW  # (file_mode: not for directories)
    assert shown_acl(RAW, DIR | 0o755, Ownership(dir_mode=0o755)) is None
    assert shown_acl(b"junk", REG | 0o644, Ownership(umask=0o022)) == b"junk"  # the kernel refuses it
    assert replaces_bits(REG | 0o644, Ownership(file_mode=0o600)) and not replaces_bits(REG | 0o644, None)


def test_shown_xattrs_touch_only_acls() -> None:
    own = Ownership(file_mode=0o644)
    assert shown_xattr("user.x", b"v", REG | 0o644, own) == b"v"
    assert shown_xattr(ACL_DEFAULT, RAW, DIR | 0o755, Ownership(dir_mode=0o700)) is None
    names = ["user.x", ACL_ACCESS, ACL_DEFAULT]
    assert shown_xattr_names(names, REG | 0o644, own) == ["user.x"]
    assert shown_xattr_names(names, REG | 0o644, Ownership(umask=0o022)) == names
    assert no_acl(ACL_ACCESS, errno.EOPNOTSUPP) and no_acl(ACL_DEFAULT, errno.ENODATA)
    assert not no_acl(ACL_ACCESS, errno.EIO) and not no_acl("user.x", errno.EOPNOTSUPP)


def test_posix_acl_is_negotiated_when_wished_and_offered() -> None:
    everything = abi.INIT_IN.pack(7, 45, 131072, 0xFFFFFFFF, 0xFFFFFFFF)
    assert negotiate(Offer.parse(everything), Wishes(posix_acl=True)).has(Init.POSIX_ACL)
    assert not negotiate(Offer.parse(everything), Wishes()).has(Init.POSIX_ACL)
    older = abi.INIT_IN.pack(7, 45, 131072, int(Init.ASYNC_READ | Init.INIT_EXT), 0)
    assert not negotiate(Offer.parse(older), Wishes(posix_acl=True)).has(Init.POSIX_ACL)


# -- against the kernel ----------------------------------------------------------------------------
KERNEL_GROUP = 4242  # a supplementary group of the unprivileged caller
OTHER_UID, OTHER_GID = 12345, 4343
# Random ACLs on this many files and as many directories (seeded: the same tree every run).
KERNEL_CASES = 160
SEED = 24


def _random_acl(rng: random.Random) -> str:
    """A valid ACL (setfacl text) naming nobody, another user and the caller's groups at random."""
    bits = ["---", "r--", "rw-", "r-x", "--x", "rwx"]
    parts = [f"u::{rng.choice(bits)}", f"g::{rng.choice(bits)}", f"o::{rng.choice(bits)}"]
    named = [f"u:{u}:{rng.choice(bits)}" for u in (NOBODY, OTHER_UID) if rng.random() < 0.5]
    named += [f"g:{g}:{rng.choice(bits)}" for g in (NOGROUP, KERNEL_GROUP, OTHER_GID) if rng.random() < 0.4]
    if named or rng.random() < 0.5:
        parts.append(f"m::{rng.choice(bits)}")
    return ",".join(parts + named)


def test_acls_match_the_kernel_for_an_unprivileged_caller() -> None:
    """What access.py allows, given the mode and the ACL read back, is exactly what the kernel lets
    nobody (with a supplementary group) open, list and search."""
    caller = Caller(NOBODY, NOGROUP, frozenset({KERNEL_GROUP}))
    owners = [(NOBODY, NOGROUP), (OTHER_UID, NOGROUP), (OTHER_UID, KERNEL_GROUP), (OTHER_UID, OTHER_GID), (0, 0)]
    rng = random.Random(SEED)
    with shared_dir() as base:
        files, dirs = [], []
        for i, (uid, gid) in zip(range(KERNEL_CASES), itertools.cycle(owners), strict=False):
            path = base / f"f{i}"
            path.write_bytes(b"x")
            os.chown(path, uid, gid)
            set_acl(path, _random_acl(rng))
            files.append(str(path))
            d = base / f"d{i}"
            d.mkdir()
            (d / "inner").write_bytes(b"y")
            (d / "inner").chmod(0o644)
            os.chown(d, uid, gid)
            set_acl(d, _random_acl(rng))
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

        def attrs_of(path: str) -> Attrs:
            try:
                raw = os.getxattr(path, ACL_ACCESS)
            except OSError:
                raw = None  # the kernel dropped an ACL the mode says all of
            return Attrs.of(os.lstat(path), read_acl(raw))

        with_acl = sum(attrs_of(p).acl is not None for p in files + dirs)
        assert with_acl > KERNEL_CASES  # most kept an ACL
        assert 0 < sum(kernel[p] for p in files) < len(files)  # both answers occur
        for path in files:
            assert may_read(attrs_of(path), caller) == kernel[path], (path, attrs_of(path))
        for path in dirs:
            listed, searched = kernel[path]
            assert permitted(attrs_of(path), caller, MAY_READ) == listed, (path, attrs_of(path))
            assert may_search(attrs_of(path), caller) == searched, (path, attrs_of(path))
