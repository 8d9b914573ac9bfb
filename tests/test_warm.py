"""``fastfs warm``: through a real mount (stats show the bytes fetched, later reads hit the cache) and,
without FUSE, the command's own error handling with a stand-in for the control channel."""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import re
from pathlib import Path

import pytest
from conftest import SERVED, mounted, run_cli

from fastfs.daemon import warm

KIB = 1024
MIB = 1024 * KIB
SUMMARY = re.compile(r"^warmed (\d+) files, .* in [0-9.]+ s \([0-9.]+ GB/s\)", re.MULTILINE)


def make_tree(src: Path, outside: Path) -> dict[str, bytes]:
    """A source tree with large, small, empty and nested files plus a symlink out of it; returns
    relative path -> content of every regular file."""
    rng = random.Random(11)
    files: dict[str, bytes] = {
        "big.bin": rng.randbytes(9 * MIB + 17),
        "empty": b"",
        "a/b/c/deep.txt": b"deep\n" * 1000,
    }
    for i in range(40):
        files[f"small/{i:03d}.bin"] = rng.randbytes(3073)
    for rel, data in files.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    outside.write_bytes(b"x" * MIB)
    (src / "link-out").symlink_to(outside)  # must not be followed
    (src / "small" / "link-in").symlink_to("000.bin")
    return files


def counters(mount) -> dict[str, int]:
    return mount.stats()["counters"]


def test_warm_tree_then_reads_are_served_from_cache(src: Path, mnt: Path, tmp_path: Path) -> None:
    files = make_tree(src, tmp_path / "outside.bin")
    total = sum(len(d) for d in files.values())
    with mounted(src, mnt, options=[SERVED]) as m:
        before = counters(m)
        r = run_cli("warm", str(mnt), "-j", "4", timeout=120)
        assert r.returncode == 0, r.stderr
        match = SUMMARY.search(r.stdout)
        assert match, r.stdout
        assert int(match.group(1)) == len(files)  # regular files only, symlinks not followed
        assert r.stderr.strip() == ""
        after = counters(m)
        fetched = (after["bytes_fetched_prefetch"] + after["bytes_fetched_demand"]) - (
            before["bytes_fetched_prefetch"] + before["bytes_fetched_demand"]
        )
        assert fetched >= total, (fetched, total)

        # The data is now in the daemon's cache: reading every file is served from it, byte-exact.
        for rel, data in files.items():
            assert (mnt / rel).read_bytes() == data, rel
        final = counters(m)
        served = final["bytes_served_from_cache"] - after["bytes_served_from_cache"]
        assert served >= total, (served, total)
        refetched = sum(final[k] - after[k] for k in ("bytes_fetched_prefetch", "bytes_fetched_demand"))
        assert refetched == 0  # nothing had to come from the source again


def test_warm_single_file_and_subdirectory(src: Path, mnt: Path, tmp_path: Path) -> None:
    files = make_tree(src, tmp_path / "outside.bin")
    small = sum(len(d) for rel, d in files.items() if rel.startswith("small/"))
    with mounted(src, mnt) as m:
        before = counters(m)
        r = run_cli("warm", str(mnt / "big.bin"), timeout=120)
        assert r.returncode == 0, r.stderr
        assert SUMMARY.search(r.stdout).group(1) == "1"
        r = run_cli("warm", str(mnt / "small"), str(mnt / "small" / "001.bin"), "-j", "16", timeout=120)
        assert r.returncode == 0, r.stderr
        assert SUMMARY.search(r.stdout).group(1) == "40"  # a file named twice is warmed once
        after = counters(m)
        fetched = sum(after[k] - before[k] for k in ("bytes_fetched_prefetch", "bytes_fetched_demand"))
        assert fetched >= len(files["big.bin"]) + small
        assert (mnt / "big.bin").read_bytes() == files["big.bin"]


def test_warm_outside_a_fastfs_mount_fails_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"data")
    for target in (tmp_path, tmp_path / "f", tmp_path / "missing"):
        r = run_cli("warm", str(target))
        assert r.returncode == 1
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert str(target) in lines[0]
    r = run_cli("warm", str(tmp_path))
    assert "not inside a fastfs mount" in r.stderr


# -- without FUSE: a fake mount root and a stand-in for the xattr channel -------------------------


@pytest.fixture
def fake_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    for i in range(15):
        (root / "d" / f"{i:02d}").write_bytes(bytes([i]) * (i + 1))
    monkeypatch.setattr(warm, "find_mount_root", lambda path: str(root))
    return root


def fake_getxattr(behaviour):
    calls: list[str] = []

    def getxattr(path, name, *, follow_symlinks=True):
        assert name == warm.XATTR_WARM
        assert follow_symlinks is False
        calls.append(os.fspath(path))
        return behaviour(os.fspath(path))

    return getxattr, calls


def run_main(paths: list[Path], jobs: int = 3) -> int:
    return warm.main(argparse.Namespace(paths=[str(p) for p in paths], jobs=jobs))


def test_main_sums_daemon_answers(fake_mount: Path, monkeypatch, capsys) -> None:
    def answer(path: str) -> bytes:
        return json.dumps({"files": 1, "bytes": os.path.getsize(path), "seconds": 0.001}).encode()

    getxattr, calls = fake_getxattr(answer)
    monkeypatch.setattr(os, "getxattr", getxattr)
    assert run_main([fake_mount]) == 0
    out, err = capsys.readouterr()
    assert sorted(calls) == sorted(str(p) for p in (fake_mount / "d").iterdir())
    assert SUMMARY.search(out).group(1) == "15"
    assert f"{sum(range(1, 16))} B" in out
    assert err == ""


def test_main_reports_partial_warm(fake_mount: Path, monkeypatch, capsys) -> None:
    getxattr, _ = fake_getxattr(lambda p: b'{"files": 1, "bytes": 0, "seconds": 0, "declined": 1}')
    monkeypatch.setattr(os, "getxattr", getxattr)
    assert run_main([fake_mount / "d" / "03"]) == 0
    assert "cache budget is full" in capsys.readouterr().err


@pytest.mark.parametrize("code", [errno.ENOTSUP, errno.ENODATA])
def test_main_daemon_without_warm(fake_mount: Path, monkeypatch, capsys, code: int) -> None:
    def unsupported(path: str) -> bytes:
        raise OSError(code, os.strerror(code), path)

    getxattr, calls = fake_getxattr(unsupported)
    monkeypatch.setattr(os, "getxattr", getxattr)
    assert run_main([fake_mount], jobs=1) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "cannot warm" in lines[0]
    assert len(calls) < 15  # stops asking once the daemon said it cannot
    assert SUMMARY.search(out).group(1) == "0"


def test_main_counts_and_limits_errors(fake_mount: Path, monkeypatch, capsys) -> None:
    def flaky(path: str) -> bytes:
        if int(os.path.basename(path)) % 5 == 0:
            return b'{"files": 1, "bytes": 1, "seconds": 0}'
        if int(os.path.basename(path)) == 7:
            return b"not json"
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    getxattr, _ = fake_getxattr(flaky)
    monkeypatch.setattr(os, "getxattr", getxattr)
    assert run_main([fake_mount / "d"]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    # 12 failures: 10 shown, then one line for the rest.
    assert len(lines) == warm.MAX_ERRORS_SHOWN + 1
    assert lines[-1].endswith("and 2 more failed files")
    assert sum("Input/output error" in line for line in lines) >= 9
    assert "12 failed" in out
    assert SUMMARY.search(out).group(1) == "3"


def test_main_rejects_bad_jobs(fake_mount: Path, capsys) -> None:
    assert run_main([fake_mount], jobs=0) == 1
    assert run_main([fake_mount], jobs=warm.MAX_JOBS + 1) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 2


def test_find_mount_root(tmp_path: Path) -> None:
    # tmp_path lies on an ordinary filesystem: its nearest mount point has no .fastfs/stats.
    assert warm.find_mount_root(str(tmp_path)) is None
    assert warm.find_mount_root("/") is None
