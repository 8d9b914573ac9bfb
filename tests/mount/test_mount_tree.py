"""The directory tree as seen through a fastfs mount: names, link types, permissions, special files.

Checks that the mirror shows the source faithfully and safely:
- readdir of 10,000 entries, unicode / space / non-UTF-8 names;
- symlinks are shown as symlinks with the same target (relative, absolute, pointing outside SRC),
  and the daemon never opens anything outside SRC (inotify watch on the outside directory);
- hard links (same bytes, st_nlink), sparse files (same bytes);
- permissions: with ``allow_other`` the kernel enforces the source modes for another user
  (``default_permissions``); without it another user cannot use the mount at all;
- FIFOs and device nodes are listed with their type and never opened by the daemon as files;
- statfs mirrors the source filesystem and reports read-only.

Another user's view is tested by a subprocess that drops to uid/gid 65534 (nobody) before doing
anything; the interpreter lives under /root, so privileges are dropped inside the child rather than
by an exec wrapper. Every subprocess has a timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import random
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import mounted, rand_bytes

MANY_ENTRIES = 10_000
NOBODY = 65534
# Bound on any helper subprocess (another user's probe, a FIFO open).
SUBPROCESS_TIMEOUT = 60.0
KIB = 1024
MIB = 1024 * KIB
SPARSE_SIZE = 40 * MIB
# How long a negative check (nobody holds the source FIFO open) is repeated after a scan.
FIFO_WATCH_SECONDS = 2.0
IN_ACCESS = 0x001
IN_OPEN = 0x020
UNICODE_NAMES = (
    "naïve café.txt",
    "日本語 ファイル.bin",
    "emoji 😀 data.npy",
    "  leading and trailing spaces  ",
    "tab\tin name",
    "new\nline",
    "Ωmega-ß-ø",
    'quote\'s "double".txt',
)
# Nesting depth of the deep-path check (each level ~48 bytes: a path of over 2 KB).
DEEP_LEVELS = 45
# A name that is not valid UTF-8 (Linux allows any bytes but "/" and NUL).
RAW_NAME = b"latin1-\xe9t\xe9-\xff.bin"


# -- helpers: another user's view ------------------------------------------------------------------

_PRELUDE = """
import errno, hashlib, json, os, stat, sys
def attempt(fn):
    try:
        return ["ok", fn()]
    except OSError as e:
        return ["err", errno.errorcode.get(e.errno, str(e.errno))]
def read_digest(p):
    with open(p, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
os.setgroups([])
os.setresgid({uid}, {uid}, {uid})
os.setresuid({uid}, {uid}, {uid})
assert os.getuid() == {uid} and os.geteuid() == {uid}
"""


def run_as(uid: int, body: str, timeout: float = SUBPROCESS_TIMEOUT) -> dict:
    """Run *body* (which sets ``result``) as *uid* in a fresh interpreter; returns ``result``."""
    code = _PRELUDE.format(uid=uid) + body + "\nprint(json.dumps(result))\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd="/")
    assert p.returncode == 0, f"probe as uid {uid} failed: {p.stderr[-3000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture
def public_base():
    """A world-traversable directory outside the pytest tmp root (which is 0700) for permission tests."""
    base = Path(tempfile.mkdtemp(prefix="fastfs-perm-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        mnt = base / "mnt"
        if not os.path.ismount(mnt):
            shutil.rmtree(base, ignore_errors=True)


# -- helpers: inotify -----------------------------------------------------------------------------


class _Inotify:
    """Minimal inotify watcher (ctypes) collecting event masks on one path."""

    def __init__(self, path: Path, mask: int) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), ctypes.c_uint32(mask))
        if wd < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")

    def events(self) -> list[tuple[int, str]]:
        out = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            pos = 0
            while pos < len(data):
                _wd, mask, _cookie, length = struct.unpack_from("iIII", data, pos)
                name = data[pos + 16 : pos + 16 + length].rstrip(b"\0").decode(errors="replace")
                out.append((mask, name))
                pos += 16 + length

    def close(self) -> None:
        os.close(self.fd)


# -- tests ----------------------------------------------------------------------------------------


def test_readdir_many_entries(src: Path, mnt: Path) -> None:
    many = src / "many"
    many.mkdir()
    rng = random.Random(3)
    names = set()
    for i in range(MANY_ENTRIES):
        name = f"entry_{i:05d}" + "x" * rng.randrange(0, 40)
        names.add(name)
        fd = os.open(many / name, os.O_CREAT | os.O_WRONLY, 0o644)
        if i % 1000 == 0:
            os.write(fd, name.encode())
        os.close(fd)
    with mounted(src, mnt) as m:
        listed = os.listdir(m.mnt / "many")
        assert len(listed) == MANY_ENTRIES
        assert set(listed) == names
        with os.scandir(m.mnt / "many") as it:
            entries = list(it)
        assert {e.name for e in entries} == names
        assert all(e.is_file(follow_symlinks=False) for e in entries)
        for i in range(0, MANY_ENTRIES, 1000):
            name = next(n for n in names if n.startswith(f"entry_{i:05d}"))
            assert (m.mnt / "many" / name).read_bytes() == name.encode()
        assert sorted(os.listdir(m.mnt)) == ["many"]


def test_unicode_and_odd_names(src: Path, mnt: Path) -> None:
    expected = {}
    for i, name in enumerate(UNICODE_NAMES):
        data = rand_bytes(100 + i * 1000, i)
        (src / name).write_bytes(data)
        expected[name] = data
    sub = src / "dir with spaces ünï"
    sub.mkdir()
    (sub / "inner file.txt").write_bytes(b"inner\n")
    long_name = "L" * 250 + ".bin"  # NAME_MAX is 255 bytes
    (src / long_name).write_bytes(b"long\n")
    deep = src.joinpath(*[f"level{i:02d}_" + "d" * 40 for i in range(DEEP_LEVELS)])
    deep.mkdir(parents=True)
    (deep / "bottom.txt").write_bytes(b"bottom\n")
    raw_data = rand_bytes(5000, 99)
    with open(os.path.join(os.fsencode(src), RAW_NAME), "wb") as f:
        f.write(raw_data)
    with mounted(src, mnt) as m:
        assert sorted(os.listdir(m.mnt)) == sorted(os.listdir(src))
        assert sorted(os.listdir(os.fsencode(m.mnt))) == sorted(os.listdir(os.fsencode(src)))
        for name, data in expected.items():
            assert (m.mnt / name).read_bytes() == data, repr(name)
            assert os.stat(m.mnt / name).st_size == len(data)
        assert (m.mnt / "dir with spaces ünï" / "inner file.txt").read_bytes() == b"inner\n"
        with open(os.path.join(os.fsencode(m.mnt), RAW_NAME), "rb") as f:
            assert f.read() == raw_data
        assert (m.mnt / long_name).read_bytes() == b"long\n"
        deep_mnt = m.mnt / deep.relative_to(src)
        assert len(str(deep_mnt)) > 2000
        assert (deep_mnt / "bottom.txt").read_bytes() == b"bottom\n"
        assert os.listdir(deep_mnt) == ["bottom.txt"]


def test_symlinks(tmp_path: Path) -> None:
    src, mnt, outside = tmp_path / "src", tmp_path / "mnt", tmp_path / "outside"
    for d in (src, mnt, outside):
        d.mkdir()
    secret = rand_bytes(4096, 11)
    (outside / "secret").write_bytes(secret)
    data = rand_bytes(70_000, 12)
    (src / "data.bin").write_bytes(data)
    (src / "sub").mkdir()
    links = {
        "rel_in": "data.bin",
        "sub/rel_up": "../data.bin",
        "abs_out": str(outside / "secret"),
        "rel_out": "../outside/secret",
        "dir_out": str(outside),
        "dangling": "does/not/exist",
        "abs_in_src": str(src / "data.bin"),
    }
    for name, target in links.items():
        os.symlink(target, src / name)
    watch = _Inotify(outside, IN_OPEN | IN_ACCESS)
    watch_secret = _Inotify(outside / "secret", IN_OPEN | IN_ACCESS)
    try:
        with mounted(src, mnt) as m:
            # metadata only: nothing here may make the daemon open a file outside SRC
            assert sorted(os.listdir(m.mnt)) == sorted(os.listdir(src))
            for name, target in links.items():
                st = os.lstat(m.mnt / name)
                assert stat.S_ISLNK(st.st_mode), name
                assert st.st_size == len(os.fsencode(target)), name
                assert os.readlink(m.mnt / name) == target, name
                with pytest.raises(OSError) as ei:
                    os.open(m.mnt / name, os.O_RDONLY | os.O_NOFOLLOW)
                assert ei.value.errno == errno.ELOOP, name
                with contextlib.suppress(OSError):
                    os.listxattr(m.mnt / name, follow_symlinks=False)
            for root, _dirs, files in os.walk(m.mnt, followlinks=False):
                for f in files:
                    os.lstat(os.path.join(root, f))
            time.sleep(0.2)  # let any asynchronous prefetch triggered by the walk start
            assert watch.events() == [], "the daemon touched a file outside SRC"
            assert watch_secret.events() == [], "the daemon opened a file outside SRC"

            # following links is done by the kernel, in the reader's namespace
            assert (m.mnt / "rel_in").read_bytes() == data
            assert (m.mnt / "sub" / "rel_up").read_bytes() == data
            assert (m.mnt / "abs_in_src").read_bytes() == data  # resolves to SRC itself, not via the mount
            assert (m.mnt / "abs_out").read_bytes() == secret
            assert sorted(os.listdir(m.mnt / "dir_out")) == ["secret"]
            with pytest.raises(FileNotFoundError):
                (m.mnt / "dangling").read_bytes()
    finally:
        watch.close()
        watch_secret.close()


def test_hard_links(src: Path, mnt: Path) -> None:
    data = rand_bytes(3 * MIB + 17, 21)
    (src / "a.bin").write_bytes(data)
    (src / "d").mkdir()
    os.link(src / "a.bin", src / "b.bin")
    os.link(src / "a.bin", src / "d" / "c.bin")
    with mounted(src, mnt) as m:
        for name in ("a.bin", "b.bin", "d/c.bin"):
            assert os.stat(m.mnt / name).st_nlink == 3, name
            assert (m.mnt / name).read_bytes() == data, name
        # reading one name, then the others (shared source inode) stays correct
        fd1 = os.open(m.mnt / "a.bin", os.O_RDONLY)
        fd2 = os.open(m.mnt / "d" / "c.bin", os.O_RDONLY)
        try:
            assert os.pread(fd1, 1000, MIB) == data[MIB : MIB + 1000]
            assert os.pread(fd2, 1000, 2 * MIB) == data[2 * MIB : 2 * MIB + 1000]
        finally:
            os.close(fd1)
            os.close(fd2)


def test_sparse_file(src: Path, mnt: Path) -> None:
    path = src / "sparse.bin"
    chunks = {0: rand_bytes(4096, 31), 10 * MIB + 123: rand_bytes(70_000, 32), SPARSE_SIZE - 5000: rand_bytes(5000, 33)}
    with open(path, "wb") as f:
        f.truncate(SPARSE_SIZE)
        for off, chunk in chunks.items():
            f.seek(off)
            f.write(chunk)
    (src / "holes_only.bin").open("wb").truncate(8 * MIB + 1)
    expected = path.read_bytes()
    assert os.stat(path).st_blocks * 512 < SPARSE_SIZE  # really sparse in the source
    with mounted(src, mnt) as m:
        got = (m.mnt / "sparse.bin").read_bytes()
        assert len(got) == SPARSE_SIZE
        assert got == expected
        for off, chunk in chunks.items():
            fd = os.open(m.mnt / "sparse.bin", os.O_RDONLY)
            try:
                assert os.pread(fd, len(chunk), off) == chunk
                assert os.pread(fd, 100, off + len(chunk)) == expected[off + len(chunk) : off + len(chunk) + 100]
            finally:
                os.close(fd)
        assert (m.mnt / "holes_only.bin").read_bytes() == bytes(8 * MIB + 1)


def _permission_tree(base: Path) -> tuple[Path, Path, dict[str, bytes]]:
    src, mnt = base / "src", base / "mnt"
    src.mkdir(mode=0o755)
    mnt.mkdir(mode=0o755)
    os.chmod(src, 0o755)
    os.chmod(mnt, 0o755)
    data = {
        "public.bin": rand_bytes(10_000, 41),
        "secret.bin": rand_bytes(10_000, 42),
        "private/inner.bin": rand_bytes(100, 43),
    }
    (src / "private").mkdir()
    for name, payload in data.items():
        (src / name).write_bytes(payload)
    os.chmod(src / "public.bin", 0o644)
    os.chmod(src / "secret.bin", 0o600)
    os.chmod(src / "private", 0o700)
    os.chmod(src / "private" / "inner.bin", 0o644)
    return src, mnt, data


_PROBE = """
m = {mnt!r}
result = {{
    "public": attempt(lambda: read_digest(m + "/public.bin")),
    "secret": attempt(lambda: read_digest(m + "/secret.bin")),
    "secret_stat": attempt(lambda: os.stat(m + "/secret.bin").st_size),
    "private_list": attempt(lambda: os.listdir(m + "/private")),
    "private_inner": attempt(lambda: read_digest(m + "/private/inner.bin")),
    "root_stat": attempt(lambda: stat.S_ISDIR(os.stat(m).st_mode)),
    "root_list": attempt(lambda: sorted(os.listdir(m))),
    "public_stat": attempt(lambda: os.stat(m + "/public.bin").st_size),
}}
"""


def test_allow_other_enforces_source_permissions(public_base: Path) -> None:
    import hashlib

    src, mnt, data = _permission_tree(public_base)
    with mounted(src, mnt, options=["allow_other"]) as m:
        # root sees everything
        assert (m.mnt / "secret.bin").read_bytes() == data["secret.bin"]
        r = run_as(NOBODY, _PROBE.format(mnt=str(m.mnt)))
        assert r["public"] == ["ok", hashlib.sha256(data["public.bin"]).hexdigest()]
        assert r["secret"] == ["err", "EACCES"]
        assert r["secret_stat"] == ["ok", len(data["secret.bin"])]
        assert r["private_list"] == ["err", "EACCES"]
        assert r["private_inner"] == ["err", "EACCES"]
        assert r["root_stat"] == ["ok", True]
        assert r["root_list"] == ["ok", sorted(["public.bin", "secret.bin", "private"])]
        # the source is not readable by that user either: same answer as the mount
        direct = run_as(NOBODY, _PROBE.format(mnt=str(src)))
        assert direct == r


def test_default_mount_refuses_other_users(public_base: Path) -> None:
    src, mnt, data = _permission_tree(public_base)
    with mounted(src, mnt) as m:
        assert (m.mnt / "public.bin").read_bytes() == data["public.bin"]
        r = run_as(NOBODY, _PROBE.format(mnt=str(m.mnt)))
        denied = (["err", "EACCES"], ["err", "EPERM"])
        for key in ("public", "secret", "secret_stat", "root_stat", "root_list", "public_stat"):
            assert r[key] in denied, (key, r[key])
        # while the same user reads the public file in the source itself
        direct = run_as(NOBODY, _PROBE.format(mnt=str(src)))
        assert direct["public"][0] == "ok"


_FIFO_PROBE = """
p = {path!r}
def nb_open_read():
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    try:
        try:
            return ["read", os.read(fd, 100).hex()]
        except BlockingIOError:
            return ["read", "EAGAIN"]
    finally:
        os.close(fd)
result = attempt(nb_open_read)
"""


def _source_fifo_has_reader(fifo: Path) -> bool:
    """True when some process holds *fifo* open for reading (a non-blocking writer open then succeeds)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        assert e.errno == errno.ENXIO, e
        return False
    os.close(fd)
    return True


def test_fifo_and_device_nodes(src: Path, mnt: Path) -> None:
    scan = src / "scan"
    scan.mkdir()
    os.mkfifo(src / "fifo")
    os.mkfifo(scan / "a_fifo")
    os.mknod(src / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    small = {f"f{i:02d}.bin": rand_bytes(2000 + i, 50 + i) for i in range(12)}
    for name, payload in small.items():
        (scan / name).write_bytes(payload)
    with mounted(src, mnt) as m:
        assert sorted(os.listdir(m.mnt)) == ["fifo", "null", "scan"]
        st = os.lstat(m.mnt / "fifo")
        assert stat.S_ISFIFO(st.st_mode)
        st = os.lstat(m.mnt / "null")
        assert stat.S_ISCHR(st.st_mode)
        assert st.st_rdev == os.makedev(1, 3)
        with os.scandir(m.mnt) as it:
            kinds = {e.name: (e.is_file(follow_symlinks=False), e.is_dir(follow_symlinks=False)) for e in it}
        assert kinds == {"fifo": (False, False), "null": (False, False), "scan": (False, True)}

        # opening the FIFO through the mount must not hang (bounded subprocess) and is never
        # turned into a read of the source FIFO by the daemon
        r = run_as(0, _FIFO_PROBE.format(path=str(m.mnt / "fifo")))
        assert r in (["ok", ["read", ""]], ["ok", ["read", "EAGAIN"]]) or r[0] == "err", r
        # a device node: refused (nodev) or, if opened, it is the kernel's device, not a source file
        r = run_as(0, _FIFO_PROBE.format(path=str(m.mnt / "null")))
        assert r[0] == "err" or r == ["ok", ["read", ""]], r
        assert not _source_fifo_has_reader(src / "fifo")

        # a small-file scan of a directory holding a FIFO reads the files and leaves the FIFO alone
        for name, payload in small.items():
            assert (m.mnt / "scan" / name).read_bytes() == payload
        deadline = time.monotonic() + FIFO_WATCH_SECONDS
        while time.monotonic() < deadline:
            assert not _source_fifo_has_reader(scan / "a_fifo"), "the daemon opened a FIFO of the source"
            assert not _source_fifo_has_reader(src / "fifo"), "the daemon opened a FIFO of the source"
            time.sleep(0.1)
        # and the daemon still answers
        assert (m.mnt / "scan" / "f00.bin").read_bytes() == small["f00.bin"]


def test_statfs(src: Path, mnt: Path) -> None:
    (src / "x").write_bytes(b"x")
    with mounted(src, mnt) as m:
        got, ref = os.statvfs(m.mnt), os.statvfs(src)
        assert got.f_blocks * got.f_frsize == ref.f_blocks * ref.f_frsize
        assert got.f_files == ref.f_files
        assert got.f_namemax == ref.f_namemax
        assert got.f_bsize > 0 and got.f_frsize > 0
        assert got.f_flag & os.ST_RDONLY
