"""Confined source access (fsio/source.py): confinement, symlinks, exact reads, EOF, versions, fs types.

Every confinement test runs twice: with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` (this
kernel has it) and with the component-by-component ``O_NOFOLLOW`` walk used where it does not.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import stat
import subprocess

import pytest

from fastfs.fsio import source as source_module
from fastfs.fsio.source import (
    DIRECT_ALIGN,
    DIRECT_MIN_SIZE,
    FD_RESERVE,
    LOCAL_FS_TYPES,
    Source,
    cached_share,
    fs_type,
    split,
    stat_key,
    stream_fd_budget,
)

MIB = 1024 * 1024
REFUSED = {errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EACCES}  # how a path that escapes may fail


@pytest.fixture
def tree(tmp_path):
    """src/ with files, a subdirectory and symlinks pointing out of it (and one inside); out/ beside it."""
    src = tmp_path / "src"
    out = tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (out / "secret").write_bytes(b"outside")
    (src / "small").write_bytes(b"hello world")
    (src / "big").write_bytes(os.urandom(3 * MIB + 1234))
    (src / "sub").mkdir()
    (src / "sub" / "f").write_bytes(b"in sub")
    os.symlink(out / "secret", src / "link_out")
    os.symlink(out, src / "dir_out")
    os.symlink("small", src / "link_in")
    os.symlink("sub", src / "dir_in")
    os.symlink("../out/secret", src / "sub" / "up")
    return src


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    monkeypatch.setattr(source_module, "_openat2_works", None if request.param == "openat2" else False)
    return request.param


@pytest.fixture
def source(tree, resolver):
    s = Source(str(tree))
    yield s
    s.close()


def errno_of(fn, *args) -> int:
    with pytest.raises(OSError) as info:
        fn(*args)
    return info.value.errno


# -- paths and confinement ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "parts"),
    [("/", []), ("", []), ("/a/b", ["a", "b"]), ("//a/./b/", ["a", "b"]), ("/.", [])],
)
def test_split_drops_empty_and_dot_components(path, parts):
    assert split(path) == parts


@pytest.mark.parametrize("path", ["/..", "/../x", "/a/../../x", "/a/.."])
def test_split_refuses_dotdot(path):
    assert errno_of(split, path) == errno.EACCES


@pytest.mark.parametrize("path", ["/../out/secret", "/sub/../../out/secret", "/link_out", "/dir_out/secret", "/sub/up"])
def test_paths_escaping_the_source_are_refused(source, path):
    assert errno_of(source.open_file, path) in REFUSED


def test_no_symlink_is_followed_even_one_inside_the_source(source):
    assert errno_of(source.open_file, "/link_in") == errno.ELOOP  # the last component: ELOOP, as O_NOFOLLOW
    assert errno_of(source.open_file, "/dir_in/f") in {errno.ENOENT, errno.ENOTDIR}
    assert errno_of(source.listdir, "/dir_in") in REFUSED
    assert errno_of(source.listdir, "/dir_out") in REFUSED


def test_metadata_calls_do_not_follow_the_last_symlink_nor_any_on_the_way(source, tree):
    st = source.lstat("/link_out")
    assert stat.S_ISLNK(st.st_mode)
    assert st.st_ino == os.lstat(tree / "link_out").st_ino
    assert source.readlink("/link_out") == str(tree.parent / "out" / "secret")  # the text, not the target
    assert errno_of(source.lstat, "/dir_out/secret") in REFUSED
    assert errno_of(source.readlink, "/dir_out/secret") in REFUSED
    assert errno_of(source.getxattr, "/link_out", "user.x") == errno.ENODATA
    assert source.listxattr("/link_out") == []
    assert errno_of(source.access, "/missing", os.R_OK) == errno.ENOENT
    assert errno_of(source.access, "/dir_out/secret", os.R_OK) in REFUSED


def test_the_root_itself_and_plain_paths_resolve(source, tree):
    assert source.lstat("/").st_ino == os.stat(tree).st_ino
    assert sorted(source.listdir("/")) == sorted(os.listdir(tree))
    names = {name: (kind, ino) for name, kind, ino in source.scandir("/")}
    assert names["sub"] == (stat.S_IFDIR, os.lstat(tree / "sub").st_ino)
    assert names["small"][0] == stat.S_IFREG
    assert names["link_out"][0] == stat.S_IFLNK
    assert sorted(source.listdir("/sub")) == ["f", "up"]


def test_open_file_refuses_what_is_not_a_regular_file(source, tree):
    os.mkfifo(tree / "fifo")  # opened O_NONBLOCK: no writer does not hang the open
    assert errno_of(source.open_file, "/sub") == errno.EISDIR
    assert errno_of(source.open_file, "/fifo") == errno.EINVAL
    assert errno_of(source.open_file, "/missing") == errno.ENOENT


@pytest.mark.parametrize("failures", [1, 2])
def test_an_open_the_source_answers_with_ebadfd_is_made_again_once(source, monkeypatch, failures):
    """GlusterFS's client answered EBADFD (a descriptor's state, not the path's) to one open of 10,000
    in 2 of about 50 passes of 16 threads through fastfs, whose scan opened the same files beside them: the
    reader got the error where its own open of the file succeeds."""
    from fastfs.fsio import stats as m
    from fastfs.fsio.stats import Stats

    source.stats = Stats()
    real = source.open_rel
    left = [failures]

    def flaky(parts, flags):
        if left[0]:
            left[0] -= 1
            raise OSError(errno.EBADFD, os.strerror(errno.EBADFD))
        return real(parts, flags)

    monkeypatch.setattr(source, "open_rel", flaky)
    if failures == 1:
        f = source.open_file("/small")
        try:
            assert os.pread(f.fd, 64, 0) == b"hello world"
        finally:
            f.close()
    else:  # (twice in a row: passed on, not retried forever)
        assert errno_of(source.open_file, "/small") == errno.EBADFD
    counters = source.stats.snapshot()["counters"]
    assert counters[m.SOURCE_OPEN_RETRIES] == 1
    assert counters[m.SOURCE_OPENS] == 2


def test_a_root_whose_connection_is_gone_is_opened_again_by_its_path(tree, monkeypatch):
    """ENOTCONN (a FUSE client that died) makes the call open the root by its path again and retry
    once, when that is a file system of the kind mounted; not more than once per REATTACH_PERIOD, and
    never the directory under a mount taken down (another file system type): the error is passed on."""
    from fastfs.fsio import stats as m
    from fastfs.fsio.stats import Stats

    clock = [1000.0]
    monkeypatch.setattr(source_module.time, "monotonic", lambda: clock[0])
    s = Source(str(tree))
    s.stats = Stats()
    real = s._open_rel
    dead = {s.root_fd}  # descriptors of the "dead connection"

    def rel(parts, flags):
        if s.root_fd in dead:
            raise OSError(errno.ENOTCONN, os.strerror(errno.ENOTCONN))
        return real(parts, flags)

    monkeypatch.setattr(s, "_open_rel", rel)
    monkeypatch.setattr(s, "_root_answers", lambda: s.root_fd not in dead)
    try:
        # the path is another file system now (the directory under the mount): refused, passed on
        monkeypatch.setattr(source_module, "fs_type", lambda fd: s.fs_type + 1)
        assert errno_of(s.open_file, "/small") == errno.ENOTCONN
        # the same kind again, but within the period of the last try: passed on
        monkeypatch.setattr(source_module, "fs_type", lambda fd: s.fs_type)
        clock[0] += source_module.REATTACH_PERIOD / 2
        assert errno_of(s.open_file, "/small") == errno.ENOTCONN
        # after the period: reopened, and the call made again on the new root
        clock[0] += source_module.REATTACH_PERIOD
        old = s.root_fd
        f = s.open_file("/sub/f")
        try:
            assert os.pread(f.fd, 64, 0) == b"in sub"
        finally:
            f.close()
        assert s.root_fd != old
        assert s.lstat("/small").st_size == len(b"hello world")
        # a call that failed on a root replaced meanwhile (by another thread) is made again at once
        generation = s._generation
        assert s.reattach(generation - 1) is True
        assert s._generation == generation
        assert s.stats.snapshot()["counters"][m.SOURCE_REATTACHED] == 1
        # a call's own ESTALE (a file replaced on NFS) while the root answers: no reopen, passed on
        clock[0] += 2 * source_module.REATTACH_PERIOD
        monkeypatch.setattr(s, "_lstat", lambda path: (_ for _ in ()).throw(OSError(errno.ESTALE, "stale")))
        assert errno_of(s.lstat, "/small") == errno.ESTALE
        assert s._generation == generation
    finally:
        s.close()
    with pytest.raises(OSError):  # the replaced root is closed with the source
        os.fstat(old)


def test_a_directory_swapped_for_a_symlink_after_a_lookup_is_not_followed(source, tree):
    f = source.open_file("/sub/f")
    f.close()
    os.rename(tree / "sub", tree / "sub.old")
    os.symlink(tree.parent / "out", tree / "sub")
    os.symlink(tree.parent / "out" / "secret", tree.parent / "out" / "f")
    assert errno_of(source.open_file, "/sub/f") in REFUSED
    assert errno_of(source.lstat, "/sub/f") in REFUSED


def test_the_walk_opens_every_component_with_o_nofollow(tree, monkeypatch):
    """The fallback resolver: each component is opened relative to its parent with O_NOFOLLOW."""
    monkeypatch.setattr(source_module, "_openat2_works", False)
    calls = []
    real_open = os.open

    def spy(path, flags, *args, **kwargs):
        if kwargs.get("dir_fd") is not None:
            calls.append((path, flags))
        return real_open(path, flags, *args, **kwargs)

    s = Source(str(tree))
    try:
        monkeypatch.setattr(source_module.os, "open", spy)
        s.open_file("/sub/f").close()
    finally:
        monkeypatch.setattr(source_module.os, "open", real_open)
        s.close()
    assert [p for p, _ in calls] == ["sub", "f"]
    assert all(flags & os.O_NOFOLLOW for _, flags in calls)
    assert calls[0][1] & os.O_DIRECTORY


# -- reads -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("direct", [False, True])
def test_read_into_returns_the_exact_bytes_and_stops_at_eof(tree, direct):
    data = (tree / "big").read_bytes()
    s = Source(str(tree), direct=direct, streams=2)
    f = s.open_file("/big")
    try:
        assert f.size == len(data) and f.key == stat_key(os.stat(tree / "big"))
        for offset, length in [(0, 1), (1, 4095), (4096, 4096), (MIB - 7, 20), (2 * MIB + 3, MIB), (0, len(data))]:
            buf = bytearray(length)
            n = f.read_into(offset, memoryview(buf))
            assert n == min(length, len(data) - offset)
            assert bytes(buf[:n]) == data[offset : offset + n]
        buf = bytearray(10_000)
        assert f.read_into(len(data) - 100, memoryview(buf)) == 100  # short only at the end
        assert bytes(buf[:100]) == data[-100:]
        assert f.read_into(len(data), memoryview(buf)) == 0
        assert f.read_into(len(data) + MIB, memoryview(buf)) == 0
    finally:
        f.close()
        s.close()


@pytest.mark.parametrize("direct", [False, True])
def test_aligned_block_reads_on_streams_are_exact_also_at_an_unaligned_end(tree, direct):
    """Block reads (page-aligned buffer and length) go to the block-read streams, O_DIRECT where the
    source has it; the file's unaligned tail finishes buffered."""
    data = (tree / "big").read_bytes()
    s = Source(str(tree), direct=direct, streams=3)
    f = s.open_file("/big")
    buf = mmap.mmap(-1, MIB)
    try:
        for index in range(4):  # the last block holds the 1234-byte tail
            view = memoryview(buf)
            n = f.read_into(index * MIB, view, aligned=True)
            view.release()
            assert n == min(MIB, len(data) - index * MIB)
            assert buf[:n] == data[index * MIB : index * MIB + n]
        assert 1 <= len(f._streams) <= 3
        assert s.stream_fds == len(f._streams)
        unaligned = memoryview(buf)[1 : 1 + DIRECT_ALIGN]  # not page-aligned in memory: buffered
        assert f.read_into(DIRECT_ALIGN, unaligned, aligned=True) == DIRECT_ALIGN
        assert bytes(unaligned) == data[DIRECT_ALIGN : 2 * DIRECT_ALIGN]
        unaligned.release()
    finally:
        f.close()
        buf.close()
    assert s.stream_fds == 0  # closing the file gave its streams back
    s.close()


def test_streams_never_open_a_replacement_of_the_file(tree):
    """A stream opened after the path was replaced would read another file: it is dropped, and block
    reads keep reading the version opened."""
    old = (tree / "big").read_bytes()
    s = Source(str(tree), direct=False, streams=2)
    f = s.open_file("/big")
    try:
        new = os.urandom(len(old))
        (tree / "big.new").write_bytes(new)
        os.replace(tree / "big.new", tree / "big")
        buf = mmap.mmap(-1, MIB)
        view = memoryview(buf)
        assert f.read_into(MIB, view, aligned=True) == MIB
        view.release()
        assert buf[:MIB] == old[MIB : 2 * MIB] != new[MIB : 2 * MIB]
        buf.close()
        assert f._streams == [] and s.stream_fds == 0
    finally:
        f.close()
        s.close()


def test_stream_budget_bounds_extra_descriptors(tree):
    s = Source(str(tree), direct=False, streams=4, stream_budget=1)
    files = [s.open_file("/big") for _ in range(3)]
    buf = mmap.mmap(-1, MIB)
    try:
        for f in files:
            view = memoryview(buf)
            assert f.read_into(0, view, aligned=True) == MIB
            view.release()
        assert s.stream_fds == 1
        assert sum(len(f._streams) for f in files) == 1
        assert not s.take_stream()
    finally:
        for f in files:
            f.close()
        buf.close()
    assert s.stream_fds == 0
    assert s.take_stream()
    s.give_streams(1)
    s.close()


def test_small_files_never_get_streams(tree):
    s = Source(str(tree), direct=True, streams=4)
    f = s.open_file("/small")
    try:
        assert f.size < DIRECT_MIN_SIZE
        buf = mmap.mmap(-1, DIRECT_ALIGN)
        view = memoryview(buf)
        assert f.read_into(0, view, aligned=True) == len(b"hello world")
        view.release()
        assert buf[:11] == b"hello world"
        buf.close()
        assert f._streams == [] and s.stream_fds == 0
    finally:
        f.close()
        s.close()


# -- versions ----------------------------------------------------------------------------------------
def test_stat_key_names_one_version(tree):
    path = tree / "small"
    s = Source(str(tree))
    try:
        a, b = s.open_file("/small"), s.open_file("/small")
        assert a.key == b.key == stat_key(os.stat(path))
        a.close()
        b.close()
        before = stat_key(os.stat(path))
        (tree / "small.new").write_bytes(b"hello world")  # same size and bytes, another inode
        os.replace(tree / "small.new", path)
        replaced = stat_key(os.stat(path))
        assert replaced != before and replaced[1] != before[1]
        st = os.stat(path)
        with open(path, "r+b") as f:  # in place: same inode, new size; the mtime set back to the old one
            f.write(b"hello world!")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        rewritten = stat_key(os.stat(path))
        assert rewritten[1] == replaced[1] and rewritten != replaced
        f2 = s.open_file("/small")
        assert f2.key == rewritten
        f2.close()
    finally:
        s.close()


# -- filesystem types and descriptor budgets -----------------------------------------------------------
def test_fs_type_matches_statfs_and_the_local_table(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        expected = int(
            subprocess.run(
                ["stat", "-f", "-c", "%t", str(tmp_path)], capture_output=True, text=True, check=True
            ).stdout,
            16,
        )
        assert fs_type(fd) == expected
    finally:
        os.close(fd)
    s = Source(str(tmp_path))
    try:
        assert s.fs_type == expected
        assert s.local == (expected in LOCAL_FS_TYPES)
    finally:
        s.close()
    assert fs_type(-1) == 0  # unknown, not an error


@pytest.mark.parametrize(
    ("magic", "local"),
    [
        (0xEF53, True),  # ext4
        (0x58465342, True),  # xfs
        (0x01021994, True),  # tmpfs
        (0x794C7630, True),  # overlayfs
        (0x65735546, False),  # fuse (another FUSE filesystem is latency-bound)
        (0x6969, False),  # nfs
        (0xFF534D42, False),  # cifs
        (0x0, False),  # unknown
    ],
)
def test_local_fs_table(magic, local):
    assert (magic in LOCAL_FS_TYPES) is local


def test_tmpfs_is_detected_as_local():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    fd = os.open("/dev/shm", os.O_RDONLY | os.O_DIRECTORY)
    try:
        kind = fs_type(fd)
    finally:
        os.close(fd)
    if kind != 0x01021994:
        pytest.skip(f"/dev/shm is not tmpfs here ({kind:#x})")
    assert kind in LOCAL_FS_TYPES


@pytest.mark.parametrize(
    ("limit", "budget"), [(0, 0), (FD_RESERVE, 0), (FD_RESERVE + 1, 0), (FD_RESERVE + 2, 1), (1024, 480)]
)
def test_stream_fd_budget(limit, budget):
    assert stream_fd_budget(limit) == budget


def test_cached_share_is_a_share_or_unknown(tree):
    fd = os.open(tree / "big", os.O_RDONLY)
    try:
        share = cached_share(fd, os.fstat(fd).st_size)
        assert share is None or 0.0 <= share <= 1.0
        assert cached_share(fd, 0) is None
    finally:
        os.close(fd)


# -- kept directory descriptors (DirFds) -----------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.fixture
def kept(tree, resolver, monkeypatch):
    """A Source whose directories are kept for 1 s of a fake clock, and the directory opens it made."""
    s = Source(str(tree))
    clock = Clock()
    s.dirs = source_module.DirFds(s._open_dir, clock)
    s.dirs.trust = 1.0
    opened: list[list[str]] = []
    real = s.dirs._open_dir

    def counting(parts: list[str]) -> int:
        opened.append(list(parts))
        return real(parts)

    monkeypatch.setattr(s.dirs, "_open_dir", counting)
    yield s, clock, opened
    s.close()


def test_a_directory_used_again_within_the_bound_is_not_opened_again(kept, tree):
    s, clock, opened = kept
    for _ in range(3):
        assert s.lstat("/sub/f").st_ino == os.lstat(tree / "sub" / "f").st_ino
    assert opened == [["sub"]]  # one open, then the kept descriptor
    assert s.lstat("/small").st_ino == os.lstat(tree / "small").st_ino  # a name in the root: the root's own
    assert opened == [["sub"]]
    clock.now += 1.5  # older than the bound: opened again
    s.lstat("/sub/f")
    assert opened == [["sub"], ["sub"]]


def test_a_swapped_directory_is_seen_once_the_bound_has_passed(kept, tree):
    """Within the bound the kept descriptor names the directory the path named when it was opened
    (metadata trusted that long, as every other); after it, the path is resolved again, confined."""
    s, clock, _ = kept
    old = s.lstat("/sub/f")
    os.rename(tree / "sub", tree / "sub.old")
    os.symlink(tree.parent / "out", tree / "sub")
    os.symlink(tree.parent / "out" / "secret", tree.parent / "out" / "f")
    assert s.lstat("/sub/f").st_ino == old.st_ino  # sub.old/f: the directory opened a moment ago
    clock.now += 1.5
    assert errno_of(s.lstat, "/sub/f") in REFUSED  # never the symlink's target


def test_a_directory_made_again_is_used_once_a_stat_of_it_sees_it(kept, tree):
    """Regression (a directory removed and made again at the source, then listed through the mount):
    a lookup in it within the bound went through the kept descriptor of the removed directory, so a
    file the new directory's listing had just shown was ENOENT for up to the bound (the first open
    after the listing failed in 20 rounds of 20, fine after 1.00-1.02 s). A stat of the directory
    (every listing's check makes one) that finds another directory there drops the kept one."""
    s, clock, opened = kept
    assert s.lstat("/sub/f").st_size == (tree / "sub" / "f").stat().st_size
    (tree / "sub.new").mkdir()
    (tree / "sub.new" / "g").write_bytes(b"new")
    shutil.rmtree(tree / "sub")
    os.rename(tree / "sub.new", tree / "sub")
    assert errno_of(s.lstat, "/sub/g") == errno.ENOENT  # within the bound: the kept (removed) directory
    assert s.lstat("/sub").st_ino == (tree / "sub").stat().st_ino  # the listing's check of the directory
    assert s.lstat("/sub/g").st_size == 3  # no clock moved: the directory there now
    assert opened == [["sub"], ["sub"]]
    assert s.lstat("/sub").st_ino == (tree / "sub").stat().st_ino
    s.lstat("/sub/g")
    assert opened == [["sub"], ["sub"]]  # the same directory: kept


def test_trust_zero_keeps_no_directory_and_leaks_no_descriptor(tree, resolver):
    s = Source(str(tree))
    try:
        assert s.dirs.trust == 0
        before = open_fds()
        for _ in range(5):
            s.lstat("/sub/f")
        assert open_fds() == before
    finally:
        s.close()


def test_kept_directories_are_bounded_and_closed(kept, tree, monkeypatch):
    s, clock, opened = kept
    monkeypatch.setattr(source_module, "KEPT_DIRS", 3)
    for i in range(6):
        (tree / f"d{i}").mkdir()
        (tree / f"d{i}" / "x").write_bytes(b"x")
    before = open_fds()
    for i in range(6):
        s.lstat(f"/d{i}/x")
    assert len(open_fds() - before) == 3  # the 3 used last
    s.lstat("/d5/x")
    assert opened[-1] == ["d5"]  # (kept: not opened again)
    s.lstat("/d0/x")
    assert opened[-1] == ["d0"]  # evicted: opened again
    s.close()
    assert not open_fds() - before


def test_a_descriptor_in_use_is_closed_by_its_last_user_only(kept, tree):
    s, clock, _ = kept
    held = s.dirs.get(["sub"])  # a call using the descriptor
    clock.now += 1.5
    fresh = s.dirs.get(["sub"])  # the next call replaces it
    assert fresh.fd != held.fd
    assert os.stat("f", dir_fd=held.fd).st_ino == os.lstat(tree / "sub" / "f").st_ino  # still open
    sub = os.stat(tree / "sub")
    s.dirs.put(held)
    assert held.refs == 0
    try:  # closed by its last user (its number may be reused from now on, by another file)
        st = os.fstat(held.fd)
    except OSError:
        pass
    else:
        assert (st.st_dev, st.st_ino) != (sub.st_dev, sub.st_ino)
    s.dirs.put(fresh)
    assert os.fstat(fresh.fd).st_ino == sub.st_ino  # kept
