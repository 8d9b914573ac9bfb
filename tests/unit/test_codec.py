"""The typed request decoders and reply encoders (daemon/kernel/requests.py, replies.py) and the
directory passes (daemon/listings.py): pure code, checked against the kernel's layouts in abi.py."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastfs.daemon import listings as ls
from fastfs.daemon.kernel import abi, replies
from fastfs.daemon.kernel import requests as rq

u64 = st.integers(min_value=0, max_value=2**64 - 1)
u32 = st.integers(min_value=0, max_value=2**32 - 1)


@given(fh=u64, offset=u64, size=u32, flags=u32, owner=u64)
def test_read_in_takes_the_fields_of_fuse_read_in(fh, offset, size, flags, owner) -> None:
    body = memoryview(bytearray(abi.READ_IN.pack(fh, offset, size, flags, owner, flags, 0)))
    r = rq.read_in(body)
    assert r == (fh, offset, size) and (r.fh, r.offset, r.size) == (fh, offset, size)
    handled = rq.typed(rq.read_in, lambda request, req: req)(None, body)  # type: ignore[arg-type]
    assert type(handled) is rq.ReadIn and handled == r


@given(flags=u32, fh=u64)
def test_getattr_in_and_its_short_form(flags, fh) -> None:
    assert rq.getattr_in(memoryview(abi.GETATTR_IN.pack(flags, 0, fh))) == (flags, fh)
    assert rq.getattr_in(memoryview(b"")) == (0, 0)


@given(name=st.binary(max_size=300))
def test_names_end_at_the_first_nul(name: bytes) -> None:
    decoded = rq.lookup_in(memoryview(name + b"\0tail")).name
    assert os.fsencode(decoded) == name.split(b"\0")[0]
    assert os.fsencode(rq.lookup_in(memoryview(name)).name) == name.split(b"\0")[0]  # no NUL: all of it


def test_the_other_decoders() -> None:
    assert rq.open_in(memoryview(abi.OPEN_IN.pack(os.O_RDONLY | os.O_NOFOLLOW, 7))) == (os.O_NOFOLLOW,)
    assert rq.release_in(memoryview(abi.RELEASE_IN.pack(9, 1, 2, 3))).fh == 9
    assert rq.forget_in(memoryview(abi.FORGET_IN.pack(5))).nlookup == 5
    assert rq.interrupt_in(memoryview(abi.INTERRUPT_IN.pack(77))).unique == 77
    assert rq.access_in(memoryview(abi.ACCESS_IN.pack(os.R_OK, 0))).mask == os.R_OK
    assert rq.listxattr_in(memoryview(abi.GETXATTR_IN.pack(4096, 0))).size == 4096
    assert rq.getxattr_in(memoryview(abi.GETXATTR_IN.pack(10, 0) + b"user.x\0")) == (10, "user.x")
    body = abi.BATCH_FORGET_IN.pack(3, 0) + abi.FORGET_ONE.pack(20, 1) + abi.FORGET_ONE.pack(21, 2)
    assert rq.batch_forget_in(memoryview(body)).items == [(20, 1), (21, 2)]  # a count past the body: cut
    with pytest.raises(Exception):  # noqa: B017 - struct.error: the session answers EIO
        rq.read_in(memoryview(b"\0" * 8))


def test_entry_and_attr_replies_carry_the_attributes(tmp_path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 5000)
    s = os.lstat(tmp_path / "f")
    r = replies.Replies(1.5, 2.25, 0.0)
    entry = abi.ENTRY_OUT.unpack(r.entry(42, s))
    assert entry[:6] == (42, 0, 1, 2, 500_000_000, 250_000_000)
    assert entry[6:] == replies.attr_fields(s)
    attr = abi.ATTR_OUT.unpack(r.attr(s))
    assert attr[:3] == (2, 250_000_000, 0) and attr[3:] == replies.attr_fields(s)
    fields = replies.attr_fields(s)
    assert fields[0] == s.st_ino and fields[1] == 5000 and fields[9] == s.st_mode
    assert fields[4] * 10**9 + fields[7] == s.st_mtime_ns
    assert r.negative is None  # no negative caching: ENOENT instead
    shown = replies.Replies(1, 1, 1, lambda mode, uid, gid: (stat.S_IFMT(mode) | 0o400, 5, 6))
    assert abi.ATTR_OUT.unpack(shown.attr(s))[3 + 9 : 3 + 12 + 1] == (stat.S_IFREG | 0o400, s.st_nlink, 5, 6)


def test_directories_attributes_are_cached_for_their_own_timeout(tmp_path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    r = replies.Replies(60, 60, 1, None, 0.75)
    for attrs, timeout in ((os.lstat(tmp_path), (0, 750_000_000)), (os.lstat(tmp_path / "f"), (60, 0))):
        entry = abi.ENTRY_OUT.unpack(r.entry(42, attrs))
        assert (entry[2], entry[4]) == (60, 0)  # the name: entry_timeout
        assert (entry[3], entry[5]) == timeout  # the attributes: dir_timeout for a directory
        assert abi.ATTR_OUT.unpack(r.attr(attrs))[:2] == timeout
    assert abi.ATTR_OUT.unpack(replies.Replies(1, 2, 0).attr(os.lstat(tmp_path)))[:2] == (2, 0)  # default: attr


def test_negative_entry_caches_the_absence_for_its_ttl() -> None:
    reply = abi.ENTRY_OUT.unpack(replies.negative_entry(2.5))
    assert reply[0] == 0 and reply[2] == 2 and reply[4] == 500_000_000 and not any(reply[6:])
    assert replies.Replies(1, 1, 2.5).negative == replies.negative_entry(2.5)


def test_xattr_size_protocol() -> None:
    assert abi.GETXATTR_OUT.unpack(replies.xattr(b"abc", 0)) == (3, 0)
    assert replies.xattr(b"abc", 3) == b"abc"
    with pytest.raises(OSError):
        replies.xattr(b"abc", 2)


def _parse(payload: bytes) -> list[tuple[str, int, int, int]]:
    out, pos = [], 0
    while pos < len(payload):
        ino, off, namelen, kind = abi.DIRENT.unpack_from(payload, pos)
        out.append((payload[pos + abi.DIRENT.size : pos + abi.DIRENT.size + namelen].decode(), off, ino, kind))
        pos += abi.rec_align(abi.DIRENT.size + namelen)
    return out


@given(names=st.lists(st.text(alphabet="abcxyz", min_size=1, max_size=40), max_size=60), size=st.integers(64, 2048))
def test_dirents_page_through_a_listing_with_the_pass_cookie(names, size) -> None:
    listing = [(n, stat.S_IFREG, i + 10) for i, n in enumerate(names)]
    cookie = 7 << ls.PASS_SHIFT
    seen, start = [], 0
    while start < len(listing):
        payload, end = replies.dirents(listing, start, size, cookie)
        assert len(payload) <= size and end > start  # (every name here fits one request)
        for k, (name, off, ino, kind) in enumerate(_parse(payload)):
            assert (name, off, ino, kind) == (listing[start + k][0], cookie + start + k + 1, start + k + 10, 8)
        seen += [e[0] for e in _parse(payload)]
        start = end
    assert seen == names


def test_direntplus_records_and_fit() -> None:
    listing = [(".", stat.S_IFDIR, 1), ("..", stat.S_IFDIR, 1), ("file", stat.S_IFREG, 9)]
    base = abi.ENTRY_OUT.size + abi.DIRENT.size
    assert replies.fit_plus(listing, 0, 3 * (base + 8)) == 3
    assert replies.fit_plus(listing, 0, 2 * (base + 8)) == 2
    entry = bytes(range(128))
    payload = replies.direntplus([(None, ".", stat.S_IFDIR, 1), (entry, "file", stat.S_IFREG, 9)], 1, 0)
    assert payload[:128] == bytes(128) and payload[base + 8 : base + 8 + 128] == entry
    assert abi.DIRENT.unpack_from(payload, base + 8 + 128) == (9, 3, 4, 8)


# -- directory passes ------------------------------------------------------------------------------
def test_each_pass_keeps_its_own_listing_and_ends_at_its_end() -> None:
    versions = {"n": 0}

    def fetch(nodeid: int) -> list[replies.Dirent]:
        versions["n"] += 1
        return [(f"v{versions['n']}-{i}", stat.S_IFREG, i) for i in range(5)]

    passes = ls.Listings(fetch, limit=3)
    a, index, cookie_a = passes.get(1, 0)
    b, _, cookie_b = passes.get(1, 0)
    assert a != b and cookie_a != cookie_b and index == 0
    again, index, cookie = passes.get(1, cookie_a + 3)  # the offset of a's entry 2
    assert again is a and index == 3 and cookie == cookie_a
    assert passes.get(2, cookie_a + 3)[0] is not a  # another directory never continues a's pass
    passes.done(1, cookie_a)
    assert len(passes) == 2  # b and directory 2's
    fresh, index, cookie = passes.get(1, cookie_a + 3)  # forgotten: a fresh listing goes on by index
    assert fresh != a and index == 3 and cookie == cookie_a


def test_passes_are_bounded_and_their_numbers_wrap(monkeypatch) -> None:
    passes = ls.Listings(lambda nodeid: [], limit=2)
    for _ in range(5):
        passes.get(1, 0)
    assert len(passes) == 2
    passes._next = ls.MAX_PASS
    assert passes.get(1, 0)[2] == ls.MAX_PASS << ls.PASS_SHIFT
    assert passes.get(1, 0)[2] == 1 << ls.PASS_SHIFT
    assert (ls.MAX_PASS << ls.PASS_SHIFT | ls.INDEX_MASK) < 2**63  # the kernel's loff_t is signed
