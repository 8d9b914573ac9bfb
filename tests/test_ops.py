"""Unit tests of the FUSE operations adapter, called directly (no mount)."""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastfs.config.loader import load_config
from fastfs.daemon.fusebind import FuseOSError
from fastfs.daemon.ops import STATS_DIR, STATS_FILE, VIRTUAL_FH_BASE, FastOps, _RateLimitedLog
from fastfs.fsio.engine import Engine

CONTENT = bytes(range(256)) * 4096  # 1 MiB, every offset distinguishable modulo 256


class FileInfo:
    """Stand-in for ``struct fuse_file_info`` (the fields open touches)."""

    def __init__(self, flags: int = os.O_RDONLY) -> None:
        self.flags = flags
        self.fh = 0
        self.keep_cache = 0
        self.direct_io = 0


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "dir").mkdir(parents=True)
    (root / "data.bin").write_bytes(CONTENT)
    (root / "dir" / "small.txt").write_bytes(b"hello\n")
    os.symlink("data.bin", root / "link")
    return root


@pytest.fixture
def engine(tree: Path):
    config = load_config(None, {"cache.budget": "64M", "readahead.learn": "false"}, use_default_path=False)
    eng = Engine(str(tree), config)
    yield eng
    eng.close()


@pytest.fixture
def ops(engine, tree: Path) -> FastOps:
    return FastOps(engine, {"source": str(tree), "mountpoint": "/mnt/test"}, no_open=False)


def _errno(call, *args, **kwargs) -> int:
    with pytest.raises(FuseOSError) as info:
        call(*args, **kwargs)
    return info.value.errno


def _open(ops: FastOps, path: str, flags: int = os.O_RDONLY) -> FileInfo:
    fi = FileInfo(flags)
    assert ops.open(path, fi) == 0
    return fi


# -- read-only ------------------------------------------------------------------------------------
WRITE_CALLS = [
    ("create", ("/new", 0o644, FileInfo(os.O_CREAT | os.O_WRONLY))),
    ("write", ("/data.bin", b"x", 0, 1)),
    ("truncate", ("/data.bin", 0)),
    ("unlink", ("/data.bin",)),
    ("mkdir", ("/newdir", 0o755)),
    ("rmdir", ("/dir",)),
    ("rename", ("/data.bin", "/moved")),
    ("symlink", ("/newlink", "data.bin")),
    ("link", ("/hard", "/data.bin")),
    ("chmod", ("/data.bin", 0o600)),
    ("chown", ("/data.bin", 1, 1)),
    ("utimens", ("/data.bin", (0, 0))),
    ("setxattr", ("/data.bin", "user.x", b"1", 0)),
    ("removexattr", ("/data.bin", "user.x")),
    ("mknod", ("/fifo", stat.S_IFIFO | 0o644, 0)),
]


@pytest.mark.parametrize(("name", "args"), WRITE_CALLS, ids=[c[0] for c in WRITE_CALLS])
def test_write_operations_answer_erofs(ops: FastOps, tree: Path, name: str, args: tuple) -> None:
    before = sorted(os.listdir(tree))
    assert _errno(getattr(ops, name), *args) == errno.EROFS
    assert sorted(os.listdir(tree)) == before
    assert (tree / "data.bin").read_bytes() == CONTENT


@pytest.mark.parametrize("flags", [os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC, os.O_WRONLY | os.O_APPEND])
def test_open_for_writing_is_erofs(ops: FastOps, flags: int) -> None:
    assert _errno(ops.open, "/data.bin", FileInfo(flags)) == errno.EROFS
    assert _errno(ops.access, "/data.bin", os.W_OK) == errno.EROFS


# -- metadata and data ----------------------------------------------------------------------------
def test_getattr_mirrors_lstat(ops: FastOps, tree: Path) -> None:
    attrs = ops.getattr("/data.bin")
    st = os.lstat(tree / "data.bin")
    assert attrs["st_size"] == len(CONTENT)
    assert attrs["st_mode"] == st.st_mode
    assert attrs["st_mtime"] == st.st_mtime_ns
    link = ops.getattr("/link")
    assert stat.S_ISLNK(link["st_mode"])
    assert ops.readlink("/link") == "data.bin"
    assert _errno(ops.getattr, "/missing") == errno.ENOENT


def test_readdir_lists_dot_entries_and_names(ops: FastOps) -> None:
    assert sorted(ops.readdir("/", 0)) == sorted([".", "..", "data.bin", "dir", "link"])
    assert sorted(ops.readdir("/dir", 0)) == [".", "..", "small.txt"]


def test_open_read_release(ops: FastOps) -> None:
    fi = _open(ops, "/data.bin")
    assert 0 < fi.fh < VIRTUAL_FH_BASE
    assert fi.direct_io == 0
    assert ops.read("/data.bin", 4096, 0, fi.fh) == CONTENT[:4096]
    assert ops.read("/data.bin", 1000, 12345, fi.fh) == CONTENT[12345:13345]
    assert ops.read("/data.bin", 4096, len(CONTENT) - 10, fi.fh) == CONTENT[-10:]
    assert ops.read("/data.bin", 4096, len(CONTENT) + 5, fi.fh) == b""
    buf = bytearray(777)
    assert ops.read_into(None, fi.fh, 300, memoryview(buf)) == 777
    assert bytes(buf) == CONTENT[300:1077]
    assert ops.release("/data.bin", fi.fh) == 0
    assert _errno(ops.read, "/data.bin", 10, 0, fi.fh) == errno.EBADF


def test_no_open_mode_reads_by_path(engine, tree: Path) -> None:
    ops = FastOps(engine, {"source": str(tree)}, no_open=True)
    assert _errno(ops.open, "/data.bin", FileInfo()) == errno.ENOSYS
    assert ops.read("/data.bin", 5000, 100, 0) == CONTENT[100:5100]
    assert ops.read("/dir/small.txt", 100, 0, 0) == b"hello\n"
    # The stats file still works without open: the snapshot sized by getattr is served.
    size = ops.getattr(STATS_FILE)["st_size"]
    data = ops.read(STATS_FILE, size + 100, 0, 0)
    assert len(data) == size
    assert json.loads(data)["mount"]["source"] == str(tree)


def test_statfs_and_access(ops: FastOps) -> None:
    sv = ops.statfs("/")
    assert sv["f_bsize"] > 0 and sv["f_blocks"] > 0
    assert sv["f_flag"] & os.ST_RDONLY
    assert ops.access("/data.bin", os.R_OK) == 0
    assert _errno(ops.access, "/missing", os.R_OK) in (errno.ENOENT, errno.EACCES)


# -- hidden stats ---------------------------------------------------------------------------------
def test_stats_directory_is_hidden_but_reachable(ops: FastOps) -> None:
    assert ".fastfs" not in ops.readdir("/", 0)
    d = ops.getattr(STATS_DIR)
    assert stat.S_ISDIR(d["st_mode"]) and stat.S_IMODE(d["st_mode"]) == 0o555
    f = ops.getattr(STATS_FILE)
    assert stat.S_ISREG(f["st_mode"]) and stat.S_IMODE(f["st_mode"]) == 0o444
    assert f["st_size"] > 0
    assert ops.readdir(STATS_DIR, 0) == [".", "..", "stats"]
    assert _errno(ops.getattr, "/.fastfs/other") == errno.ENOENT
    assert _errno(ops.open, STATS_DIR, FileInfo()) == errno.EISDIR
    assert _errno(ops.open, STATS_FILE, FileInfo(os.O_WRONLY)) == errno.EROFS


def test_stats_file_serves_one_snapshot_and_is_not_counted(ops: FastOps, engine, tree: Path) -> None:
    fi = _open(ops, "/data.bin")
    ops.read("/data.bin", 65536, 0, fi.fh)
    requested = engine.snapshot()["counters"]["bytes_requested"]
    sfi = _open(ops, STATS_FILE)
    assert sfi.fh >= VIRTUAL_FH_BASE and sfi.direct_io == 1 and sfi.keep_cache == 0
    first = ops.read(STATS_FILE, 100, 0, sfi.fh)
    ops.read("/data.bin", 65536, 65536, fi.fh)  # the open snapshot must not change under the reader
    rest = ops.read(STATS_FILE, 1 << 20, 100, sfi.fh)
    snap = json.loads(first + rest)
    assert snap["counters"]["bytes_requested"] == requested
    assert snap["mount"] == {"source": str(tree), "mountpoint": "/mnt/test", "pid": os.getpid()}
    ops.release(STATS_FILE, sfi.fh)
    assert _errno(ops.read, STATS_FILE, 100, 0, sfi.fh) == errno.EBADF
    # Reading stats did not count as data reads.
    assert engine.snapshot()["counters"]["bytes_requested"] == requested + 65536


def test_stats_xattr_on_root_only(ops: FastOps) -> None:
    snap = json.loads(ops.getxattr("/", "user.fastfs.stats"))
    assert "counters" in snap and snap["mount"]["mountpoint"] == "/mnt/test"
    assert _errno(ops.getxattr, "/data.bin", "user.fastfs.stats") == errno.ENODATA
    assert "user.fastfs.stats" not in ops.listxattr("/")
    assert ops.listxattr(STATS_FILE) == []


def test_missing_xattr_is_enodata(ops: FastOps) -> None:
    assert _errno(ops.getxattr, "/data.bin", "user.nothing.here") in (errno.ENODATA, errno.ENOTSUP)
    assert _errno(ops.getxattr, STATS_FILE, "user.nothing.here") == errno.ENODATA


# -- control channel and error translation with a stub engine -------------------------------------
class StubEngine:
    """Engine stand-in whose calls raise what a test asks for."""

    def __init__(self, raise_with: BaseException | None = None) -> None:
        self.config = load_config(None, None, use_default_path=False)
        self.raise_with = raise_with
        self.warm_calls: list[str] = []

    def _maybe_raise(self) -> None:
        if self.raise_with is not None:
            raise self.raise_with

    def lstat(self, path: str) -> os.stat_result:
        self._maybe_raise()
        return os.lstat("/")

    def listdir(self, path: str) -> list[str]:
        self._maybe_raise()
        return ["x"]

    def read_into(self, fh: int, offset: int, dest: memoryview, path: str | None = None) -> int:
        self._maybe_raise()
        return 0

    def open(self, path: str, flags: int):
        self._maybe_raise()
        raise AssertionError("not reached")

    def getxattr(self, path: str, name: str) -> bytes:
        self._maybe_raise()
        raise OSError(errno.ENODATA, "no data")

    def snapshot(self, top: int = 10) -> dict:
        return {"counters": {}}

    def warm(self, path: str) -> dict:
        self.warm_calls.append(path)
        return {"files": 3, "bytes": 12345678901234, "seconds": 0.25, "path": path * 10}


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (OSError(errno.ENOENT, "gone"), errno.ENOENT),
        (OSError(errno.ETIMEDOUT, "slow"), errno.ETIMEDOUT),
        (OSError("no errno"), errno.EIO),
        (RuntimeError("bug"), errno.EIO),
        (ValueError("embedded null byte"), errno.EIO),
        (KeyError("x"), errno.EIO),
    ],
)
def test_error_translation(exc: BaseException, code: int) -> None:
    ops = FastOps(StubEngine(exc), no_open=False)
    assert _errno(ops.getattr, "/x") == code
    assert _errno(ops.readdir, "/", 0) == code
    assert _errno(ops.read, "/x", 10, 0, 5) == code
    assert _errno(ops.open, "/x", FileInfo()) == code


def test_unexpected_errors_are_logged_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    ops = FastOps(StubEngine(RuntimeError("bug")), no_open=False)
    with caplog.at_level("ERROR", logger="fastfs.ops"):
        for _ in range(50):
            _errno(ops.getattr, "/x")
    lines = [r for r in caplog.records if "getattr" in r.getMessage()]
    assert len(lines) == 1
    assert "RuntimeError" in lines[0].getMessage()


def test_rate_limited_log_counts_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    limiter = _RateLimitedLog(interval=0.0)
    with caplog.at_level("ERROR", logger="fastfs.ops"):
        limiter.log("read", RuntimeError("a"))
        limiter.log("read", RuntimeError("b"))
    assert len(caplog.records) == 2


def _wait_done(ops: FastOps, job: int) -> dict:
    deadline = time.monotonic() + 30
    while True:
        report = json.loads(ops.getxattr("/", f"user.fastfs.warm.{job}", 0, 1 << 16))
        if report["done"] or time.monotonic() > deadline:
            return report
        time.sleep(0.01)


def test_warm_xattr_starts_one_job_per_call_and_reports_progress(ops: FastOps, tree: Path) -> None:
    # A size query (buffer 0) starts the job and keeps the answer for the real query.
    first = ops.getxattr("/dir", "user.fastfs.warm", 0, 0)
    second = ops.getxattr("/dir", "user.fastfs.warm", 0, len(first))
    assert first == second
    job = json.loads(second)["job"]
    # A call whose buffer is large enough starts its own job.
    other = json.loads(ops.getxattr("/data.bin", "user.fastfs.warm", 0, 1 << 16))["job"]
    assert other != job
    report = _wait_done(ops, job)
    assert report["done"] and report["files_done"] == report["files_total"] == 1
    assert report["bytes_done"] == report["bytes_total"] == len(b"hello\n")
    assert _wait_done(ops, other)["bytes_done"] == len(CONTENT)
    assert json.loads(ops.getxattr("/data.bin", "user.fastfs.cached", 0, 1 << 16)) == {
        "size": len(CONTENT),
        "cached": len(CONTENT),
    }
    assert json.loads(ops.getxattr("/data.bin", "user.fastfs.evict", 0, 1 << 16))["evicted"] == len(CONTENT)
    assert json.loads(ops.getxattr("/data.bin", "user.fastfs.cached", 0, 1 << 16))["cached"] == 0
    assert _errno(ops.getxattr, "/", "user.fastfs.warm.999") == errno.ENODATA
    assert _errno(ops.getxattr, "/", "user.fastfs.warm.x") == errno.ENODATA
    assert _errno(ops.getxattr, STATS_DIR, "user.fastfs.warm") == errno.ENOTSUP
    assert _errno(ops.getxattr, "/dir", "user.fastfs.cached") == errno.EISDIR


def test_other_callers_see_stats_without_paths_and_not_others_jobs(ops: FastOps, tree: Path) -> None:
    """Issue 12 finding 5 (unit): only the mounting user and root see paths in the stats."""
    fi = _open(ops, "/data.bin")
    ops.read("/data.bin", 65536, 0, fi.fh)
    ops.release("/data.bin", fi.fh)
    job = json.loads(ops.getxattr("/dir", "user.fastfs.warm", 0, 1 << 16))["job"]
    full = json.loads(ops.getxattr("/", "user.fastfs.stats"))
    assert full["top_files"] and full["mount"]["source"] == str(tree)
    ops.context = lambda: (65534, 65534, 0)
    redacted = json.loads(ops.getxattr("/", "user.fastfs.stats"))
    assert redacted["redacted"] is True and redacted["top_files"] == []
    assert redacted["mount"] == {"mountpoint": "/mnt/test", "pid": os.getpid()}
    assert redacted["counters"] == {**full["counters"], **redacted["counters"]}
    assert str(tree) not in json.dumps(redacted) and "data.bin" not in json.dumps(redacted)
    sfi = _open(ops, STATS_FILE)
    text = ops.read(STATS_FILE, 1 << 20, 0, sfi.fh)
    assert b"data.bin" not in text and json.loads(text)["redacted"] is True
    assert _errno(ops.getxattr, "/", f"user.fastfs.warm.{job}") == errno.ENODATA
    ops.context = lambda: (ops.control.owner_uid, 0, 0)
    assert json.loads(ops.getxattr("/", f"user.fastfs.warm.{job}", 0, 1 << 16))["job"] == job


# -- property test over read/getattr arguments ----------------------------------------------------
NAMES = [
    "/data.bin",
    "/dir/small.txt",
    "/dir",
    "/link",
    "/",
    "/missing",
    STATS_FILE,
    STATS_DIR,
    "/.fastfs/x",
    "/../etc/passwd",
    "/dir/../data.bin",
    "//data.bin",
    "/data.bin/",
    "/a\x00b",
    "/" + "n" * 5000,
]
BIG = 2**64

paths = st.one_of(st.sampled_from(NAMES), st.text(max_size=300).map(lambda s: "/" + s))
ints = st.one_of(st.integers(min_value=-BIG, max_value=BIG), st.sampled_from([0, 1, 4095, 4096, 1 << 20, -1]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=paths, size=ints, offset=ints, fh=st.one_of(ints, st.sampled_from(["open", "stats", 0])))
def test_read_arguments_give_data_or_errno(ops: FastOps, path: str, size: int, offset: int, fh: object) -> None:
    handles = []
    if fh == "open":
        fh = _open(ops, "/data.bin").fh
        handles.append(fh)
    elif fh == "stats":
        fh = _open(ops, STATS_FILE).fh
        handles.append(fh)
    try:
        data = ops.read(path, size, offset, fh)
    except FuseOSError as e:
        assert isinstance(e.errno, int) and e.errno > 0
    else:
        assert isinstance(data, bytes)
        assert len(data) <= size
        if handles and fh < VIRTUAL_FH_BASE and offset >= 0:
            assert data == CONTENT[offset : offset + size]
    finally:
        for h in handles:
            ops.release(None, h)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=paths)
def test_metadata_arguments_give_result_or_errno(ops: FastOps, path: str) -> None:
    for call in (ops.getattr, ops.readdir, ops.readlink, ops.listxattr):
        try:
            call(path) if call is not ops.readdir else call(path, 0)
        except FuseOSError as e:
            assert isinstance(e.errno, int) and e.errno > 0
    try:
        ops.access(path, os.R_OK)
    except FuseOSError as e:
        assert e.errno > 0
