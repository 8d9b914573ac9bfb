"""``fastfs warm``: through a real mount (stats show the bytes fetched, later reads hit the cache) and,
without FUSE, the command's own error handling with a stand-in for the control channel."""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import random
import re
from pathlib import Path

import pytest
from conftest import SERVED, mounted, run_cli

from fastfs.daemon.cli import warm

KIB = 1024
MIB = 1024 * KIB
SUMMARY = re.compile(r"^warmed (\d+) files, .* in [0-9.]+ s \([0-9.]+ MiB/s\)", re.MULTILINE)


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
        fetched = after["bytes_fetched_warm"] - before["bytes_fetched_warm"]  # counted apart from prefetch
        assert fetched >= total, (fetched, total)

        # The data is now in the daemon's cache: reading every file is served from it, byte-exact.
        for rel, data in files.items():
            assert (mnt / rel).read_bytes() == data, rel
        final = counters(m)
        served = final["bytes_served_from_cache"] - after["bytes_served_from_cache"]
        assert served >= total, (served, total)
        refetched = sum(
            final[k] - after[k] for k in ("bytes_fetched_prefetch", "bytes_fetched_demand", "bytes_fetched_warm")
        )
        assert refetched == 0  # nothing had to come from the source again


def test_warm_single_file_and_subdirectory(src: Path, mnt: Path, tmp_path: Path) -> None:
    files = make_tree(src, tmp_path / "outside.bin")
    small = sum(len(d) for rel, d in files.items() if rel.startswith("small/"))
    with mounted(src, mnt, options=[SERVED]) as m:
        before = counters(m)
        r = run_cli("warm", str(mnt / "big.bin"), timeout=120)
        assert r.returncode == 0, r.stderr
        assert SUMMARY.search(r.stdout).group(1) == "1"
        r = run_cli("warm", str(mnt / "small"), str(mnt / "small" / "001.bin"), "-j", "16", timeout=120)
        assert r.returncode == 0, r.stderr
        assert SUMMARY.search(r.stdout).group(1) == "40"  # a file named twice is warmed once
        after = counters(m)
        fetched = after["bytes_fetched_warm"] - before["bytes_fetched_warm"]
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


# -- pipelines: lists, --check, --evict, exit status (issue 17) -------------------------------------
CHECK_LINE = re.compile(r"^(?P<path>.+): (?P<cached>\d+) of (?P<files>\d+) files cached, .* \((?P<pct>[0-9.]+)%\)$")


def _check_lines(stdout: str) -> dict[str, tuple[int, int, float]]:
    out = {}
    for line in stdout.splitlines():
        match = CHECK_LINE.match(line)
        if match:
            out[match["path"]] = (int(match["cached"]), int(match["files"]), float(match["pct"]))
    return out


def test_from_file_and_stdin_check_and_evict(src: Path, mnt: Path, tmp_path: Path) -> None:
    files = make_tree(src, tmp_path / "outside.bin")
    with mounted(src, mnt, options=[SERVED]) as m:
        small, big = mnt / "small", mnt / "big.bin"
        r = run_cli("warm", "--check", small, big)
        assert r.returncode == 1, r.stdout + r.stderr  # nothing is cached yet
        lines = _check_lines(r.stdout)
        assert lines[str(small)] == (0, 40, 0.0) and lines[str(big)] == (0, 1, 0.0)
        assert "MiB" in r.stdout and "GB" not in r.stdout

        listing = tmp_path / "list.txt"
        listing.write_text(f"{small / '000.bin'}\n\n{small / '001.bin'}\n")
        r = run_cli("warm", "--from-file", listing, "--from-file", "-", input=f"{big}\n", timeout=120)
        assert r.returncode == 0, r.stderr
        assert SUMMARY.search(r.stdout).group(1) == "3"
        r = run_cli("warm", "--check", small, big)
        lines = _check_lines(r.stdout)
        assert lines[str(small)][:2] == (2, 40) and lines[str(big)] == (1, 1, 100.0)
        assert r.returncode == 1  # small/ is not all cached

        assert run_cli("warm", small, timeout=120).returncode == 0
        r = run_cli("warm", "--check", "--from-file", "-", input=f"{small}\n{big}\n")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "cached: 41 of 41 files" in r.stdout
        before = m.stats()["counters"]
        for rel in ("small/000.bin", "big.bin"):  # served from RAM, byte-exact
            assert (mnt / rel).read_bytes() == files[rel]
        after = m.stats()["counters"]
        assert after["bytes_fetched_prefetch"] + after["bytes_fetched_demand"] == (
            before["bytes_fetched_prefetch"] + before["bytes_fetched_demand"]
        )

        r = run_cli("warm", "--evict", big)
        assert r.returncode == 0, r.stderr
        assert f"evicted {warm.human(len(files['big.bin']))} from 1 files" in r.stdout
        r = run_cli("warm", "--check", big)
        assert _check_lines(r.stdout)[str(big)] == (0, 1, 0.0) and r.returncode == 1
        assert (mnt / "big.bin").read_bytes() == files["big.bin"]


def test_warm_of_more_than_the_budget_exits_1_and_says_why(src: Path, mnt: Path) -> None:
    for i in range(12):
        (src / f"f{i:02d}.bin").write_bytes(random.Random(i).randbytes(4 * MIB))
    with mounted(src, mnt, options=["cache.budget=16M", SERVED]):
        r = run_cli("warm", mnt, timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "cache budget" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_warm_bad_list_and_no_paths_are_one_line_errors(mount, tmp_path: Path) -> None:
    for args, expected in (
        (["--from-file", tmp_path / "none.txt"], "none.txt"),
        ([], "no paths given"),
        (["--from-file", "-"], "no paths given"),
    ):
        r = run_cli("warm", *args, input="")
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], r.stderr
    r = run_cli("warm", "--check", "--evict", mount.mnt)
    assert r.returncode == 2 and "not allowed with" in r.stderr


# -- without FUSE: a fake mount root and a stand-in for the control channel -------------------------
@pytest.fixture
def fake_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    for i in range(15):
        (root / "d" / f"{i:02d}").write_bytes(bytes([i]) * (i + 1))
    monkeypatch.setattr(warm, "find_mount_root", lambda path: str(root))
    return root


class FakeDaemon:
    """Answers the control xattrs as the daemon would, with jobs finishing after *polls* polls."""

    def __init__(self, report=None, start_error=None, polls: int = 2, busy: int = 0) -> None:
        self.report = report or (lambda path: {"files_total": 1, "files_done": 1, "bytes_total": 1, "bytes_done": 1})
        self.start_error = start_error
        self.polls = polls
        self.busy = busy
        self.jobs: dict[int, tuple[str, int]] = {}
        self.started: list[str] = []

    def getxattr(self, path, name, *, follow_symlinks=True):
        assert follow_symlinks is False
        path = os.fspath(path)
        if name in (warm.XATTR_WARM, warm.XATTR_DISK_WARM):
            if self.start_error is not None:
                self.start_error(path)
            if self.busy:
                self.busy -= 1
                raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)
            job = len(self.jobs) + 1
            self.jobs[job] = (path, 0)
            self.started.append(path)
            return json.dumps({"job": job}).encode()
        assert name.startswith("user.fastfs.warm.")
        job = int(name.rsplit(".", 1)[1])
        target, polls = self.jobs[job]
        self.jobs[job] = (target, polls + 1)
        base = {"job": job, "path": target, "done": polls + 1 >= self.polls, "errors": []}
        if not base["done"]:
            return json.dumps({**base, "files_done": 0}).encode()
        return json.dumps({**base, **self.report(target)}).encode()


def run_main(paths: list[Path], jobs: int = 3, **kw) -> int:
    ns = argparse.Namespace(paths=[str(p) for p in paths], jobs=jobs, from_file=[], check=False, evict=False)
    for key, value in kw.items():
        setattr(ns, key, value)
    return warm.main(ns)


def _tree_report(path: str) -> dict:
    target = Path(path)
    sizes = (
        [target.stat().st_size] if target.is_file() else [p.stat().st_size for p in target.rglob("*") if p.is_file()]
    )
    n, total = len(sizes), sum(sizes)
    return {"files_total": n, "files_done": n, "bytes_total": total, "bytes_done": total}


def test_main_sums_job_reports(fake_mount: Path, monkeypatch, capsys) -> None:
    daemon = FakeDaemon(_tree_report)
    monkeypatch.setattr(os, "getxattr", daemon.getxattr)
    other = fake_mount / "e"
    other.mkdir()
    (other / "x").write_bytes(b"12345")
    assert run_main([fake_mount / "d", fake_mount / "d" / "03", other / "x", other / "x"]) == 0
    out, err = capsys.readouterr()
    assert daemon.started == [str(fake_mount / "d"), str(other / "x")]  # one job per path not covered
    assert SUMMARY.search(out).group(1) == "16"
    assert f"{sum(range(1, 16)) + 5} B" in out
    assert err == ""


@pytest.mark.parametrize(
    ("report", "message"),
    [
        ({"declined": 1}, "cache budget is full"),
        ({"evicted": 4096}, "evicted again"),
        ({"skipped": 2}, "no permission"),
        ({"failed": 1, "errors": ["/x: source read timed out"]}, "timed out"),
    ],
)
def test_main_exits_1_when_anything_was_not_cached(fake_mount: Path, monkeypatch, capsys, report, message) -> None:
    base = {"files_total": 2, "files_done": 2, "bytes_total": 2, "bytes_done": 1}
    monkeypatch.setattr(os, "getxattr", FakeDaemon(lambda p: {**base, **report}).getxattr)
    assert run_main([fake_mount / "d" / "03"]) == 1
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("code", [errno.ENOTSUP, errno.ENODATA])
def test_main_daemon_without_warm(fake_mount: Path, monkeypatch, capsys, code: int) -> None:
    def unsupported(path: str) -> None:
        raise OSError(code, os.strerror(code), path)

    daemon = FakeDaemon(start_error=unsupported)
    monkeypatch.setattr(os, "getxattr", daemon.getxattr)
    assert run_main([fake_mount / "d" / "01", fake_mount / "d" / "02"], jobs=1) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "cannot warm" in lines[0]
    assert SUMMARY.search(out).group(1) == "0"


def test_main_waits_while_the_daemon_is_busy(fake_mount: Path, monkeypatch, capsys) -> None:
    daemon = FakeDaemon(busy=2)
    monkeypatch.setattr(os, "getxattr", daemon.getxattr)
    monkeypatch.setattr(warm, "POLL_MAX", 0.01)
    assert run_main([fake_mount / "d" / "01", fake_mount / "d" / "02"], jobs=2) == 0
    assert len(daemon.started) == 2
    assert SUMMARY.search(capsys.readouterr().out).group(1) == "2"


def test_main_counts_and_limits_errors(fake_mount: Path, monkeypatch, capsys) -> None:
    def flaky(path: str) -> None:
        if int(os.path.basename(path)) % 5 and int(os.path.basename(path)) != 7:
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    daemon = FakeDaemon(start_error=flaky)
    monkeypatch.setattr(os, "getxattr", daemon.getxattr)
    paths = sorted((fake_mount / "d").iterdir())
    assert run_main(paths) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    # 11 failures: 10 shown, then one line for the rest.
    assert len(lines) == warm.MAX_ERRORS_SHOWN + 1
    assert lines[-1].endswith("and 1 more")
    assert sum("Input/output error" in line for line in lines) == warm.MAX_ERRORS_SHOWN
    assert "11 failed" in out
    assert SUMMARY.search(out).group(1) == "4"


def test_main_rejects_bad_jobs(fake_mount: Path, capsys) -> None:
    assert run_main([fake_mount], jobs=0) == 1
    assert run_main([fake_mount], jobs=warm.MAX_JOBS + 1) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 2


def test_read_list(tmp_path: Path) -> None:
    listing = tmp_path / "l"
    listing.write_bytes(b"/a b\n\n  \n/c\r\n/caf\xe9\n")
    assert warm.read_list(str(listing)) == ["/a b", "/c", os.fsdecode(b"/caf\xe9")]
    assert warm.read_list("-", io.StringIO("/x\n/y")) == ["/x", "/y"]
    with pytest.raises(warm.WarmError):
        warm.read_list(str(tmp_path / "missing"))


def test_human_units() -> None:
    assert [warm.human(n) for n in (0, 1023, 1536, 5 * MIB, 3 << 30)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5.0 MiB",
        "3.0 GiB",
    ]


def test_find_mount_root(tmp_path: Path) -> None:
    # tmp_path lies on an ordinary filesystem: the mount holding it is not fastfs.
    assert warm.find_mount_root(str(tmp_path)) is None
    assert warm.find_mount_root("/") is None


def test_progress_counts_files_and_shows_bytes(capsys) -> None:
    bar = warm._Progress(True)
    bar.show(10, 2000, 5 * MIB, 3 << 30, listed=True)
    bar.show(1900, 2000, 3 << 30, 3 << 30, listed=True)
    bar.close()
    err = capsys.readouterr().err
    assert "10/2000" in err and "1900/2000" in err and " 95%" in err  # by files, not weighed by bytes
    assert "5.0 MiB of 3.0 GiB" in err and "GB" not in err


def test_progress_has_no_total_until_the_trees_are_listed(capsys) -> None:
    """The total grew during the walk (0/5 ... 0/1273, ETA 54:47): no total and no ETA before it is known."""
    bar = warm._Progress(True)
    bar.show(0, 5, 0, 5 * MIB, listed=False)
    bar.show(3, 1273, 2 * MIB, 900 * MIB, listed=False)
    during = capsys.readouterr().err
    bar.show(1273, 1273, 900 * MIB, 900 * MIB, listed=True)
    bar.close()
    after = capsys.readouterr().err
    assert "/5" not in during and "/1273" not in during and "<" not in during  # no total, no ETA
    assert "2.0 MiB, listing" in during
    assert "1273/1273" in after and "900.0 MiB of 900.0 MiB" in after


def test_run_warm_shows_a_total_only_once_every_job_listed(fake_mount: Path, monkeypatch) -> None:
    shown: list[tuple[int, bool]] = []

    class Recorder:
        def show(self, files_done, files_total, bytes_done, bytes_total, listed):
            shown.append((files_total, listed))

    polls = iter([False, False, True])

    def report(path: str) -> dict:
        return {"files_total": 7, "files_done": 7, "bytes_total": 7, "bytes_done": 7}

    daemon = FakeDaemon(report, polls=3)
    original = daemon.getxattr

    def getxattr(path, name, *, follow_symlinks=True):
        doc = json.loads(original(path, name, follow_symlinks=follow_symlinks))
        if "path" in doc:
            doc["listed"] = next(polls, True)
        return json.dumps(doc).encode()

    monkeypatch.setattr(os, "getxattr", getxattr)
    result = warm.run_warm([(str(fake_mount / "d"), str(fake_mount))], 1, Recorder())
    assert result.files_done == 7
    assert [listed for _, listed in shown][:2] == [False, False] and shown[-1][1] is True


def test_warm_on_a_passthrough_mount_fills_the_source_page_cache(src: Path, mnt: Path) -> None:
    from conftest import evict_page_cache, wait_for

    from fastfs.fsio.source import cached_share

    data = random.Random(3).randbytes(24 << 20)
    (src / "big.bin").write_bytes(data)
    os.sync()  # dirty pages cannot be dropped
    evict_page_cache(src / "big.bin")
    with mounted(src, mnt, options=["fuse.passthrough=on"]) as m:
        r = run_cli("warm", str(mnt / "big.bin"), timeout=120)
        assert r.returncode == 0, r.stderr
        fd = os.open(src / "big.bin", os.O_RDONLY)
        try:
            assert wait_for(lambda: cached_share(fd, len(data)) > 0.95, timeout=20)
        finally:
            os.close(fd)
        check = run_cli("warm", "--check", str(mnt / "big.bin"), timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        assert counters(m)["bytes_passthrough_warmed"] >= len(data)
        assert counters(m)["bytes_fetched_prefetch"] == 0  # nothing went to the RAM cache
        assert (mnt / "big.bin").read_bytes() == data


# -- issue 24 items 7 and 8 --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reasons", "disk", "expected"),
    [
        ({"ram": 2}, False, "2 files only partly cached: the cache budget is full"),
        ({"write_queue": 7}, True, "7 files only partly on disk: the disk tier's write queue had no room for them"
                                   " within readahead.read_timeout (the disk writes more slowly than the source"
                                   " reads)"),
        ({"disk_room": 3}, True, "3 files only partly on disk: the disk budget or free-space floor left no room for"
                                 " all of them"),
        ({"ram": 1}, True, "1 files only partly on disk: the RAM cache had no room for their blocks on the way to the"
                           " disk (raise cache.budget)"),
    ],
)  # fmt: skip
def test_warm_says_why_files_were_declined(
    fake_mount: Path, monkeypatch, capsys, reasons: dict, disk: bool, expected: str
) -> None:
    """`warm --disk` said "the disk budget or free-space floor left no room" when the stats showed 0
    writes refused for room and 7 dropped because the write queue was full."""
    n = sum(reasons.values())
    base = {"files_total": 9, "files_done": 9, "bytes_total": 9, "bytes_done": 1, "declined": n}
    monkeypatch.setattr(os, "getxattr", FakeDaemon(lambda p: {**base, "declined_reasons": reasons}).getxattr)
    assert run_main([fake_mount / "d" / "03"], disk=disk) == 1
    err = capsys.readouterr().err.splitlines()
    assert f"fastfs warm: {expected}" in err, err


def test_ctrl_c_cancels_the_daemons_warm_job_and_says_so(tmp_path: Path) -> None:
    """Ctrl-C of `fastfs warm` exited 130 and the daemon finished the job anyway."""
    import signal
    import subprocess
    import sys

    from conftest import wait_for
    from faultfs import faultfs_mounted

    backing, fsrc, mnt = tmp_path / "backing", tmp_path / "faultsrc", tmp_path / "mnt"
    for d in (backing / "t", fsrc, mnt):
        d.mkdir(parents=True)
    for i in range(300):
        (backing / "t" / f"{i:03d}.bin").write_bytes(bytes([i % 256]) * 5000)
    with faultfs_mounted(backing, fsrc, tmp_path / "faultfs-work") as fault:
        fault.set(hang=["/t/010.bin"])  # the job stalls on it, with the rest of the tree still to warm
        with mounted(fsrc, mnt, options=["read_timeout=300"]) as m:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fastfs", "warm", str(mnt / "t")],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert wait_for(lambda: _job(mnt, 1).get("state") == "warming", timeout=30)
                proc.send_signal(signal.SIGINT)
                out, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
            assert proc.returncode == 130, (out, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(
                "fastfs warm: interrupted: cancelled 1 warm job in the daemon; "
            ), err
            assert wait_for(lambda: _job(mnt, 1).get("done") is True, timeout=30)  # without the hang released
            report = _job(mnt, 1)
            assert report["cancelled"] is True and report["files_done"] < 300
            fault.clear()
            check = run_cli("warm", "--check", mnt / "t", timeout=120)
            # the files the job never started were not warmed after all
            assert check.returncode == 1 and "of 300 files cached" in check.stdout, check.stdout
            assert m.proc.poll() is None


def _job(mnt: Path, job: int) -> dict:
    try:
        return json.loads(os.getxattr(mnt, f"user.fastfs.warm.{job}"))
    except OSError:
        return {}


def test_warms_are_counted_apart_from_prefetch(src: Path, mnt: Path) -> None:
    """After a few warms and evictions the stats said amplification 14.87, accuracy 6.0 %, wasted 2.1 GiB."""
    rng = random.Random(8)
    files = {f"w/{i:02d}.bin": rng.randbytes(200 * KIB + i) for i in range(20)}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    total = sum(len(d) for d in files.values())
    with mounted(src, mnt, options=[SERVED]) as m:
        for _ in range(2):
            assert run_cli("warm", mnt / "w").returncode == 0
            assert run_cli("warm", "--evict", mnt / "w").returncode == 0
        c = counters(m)
        assert c["bytes_fetched_warm"] == 2 * total
        assert c["bytes_evicted_on_request"] == 2 * total
        assert c["bytes_fetched_prefetch"] == 0 and c["bytes_prefetch_wasted"] == 0
        derived = m.stats()["derived"]
        assert derived["amplification"] == 0 and derived["prefetch_accuracy"] == 0
        lines = run_cli("stats", mnt).stdout.splitlines()
        assert (
            f"  warm               {warm.human(2 * total)} fetched by fastfs warm, {warm.human(2 * total)} evicted on"
            " request (neither counts in amplification, accuracy or wasted)"
        ) in lines
        assert "  prefetch accuracy  - (used 0 B), wasted 0 B" in lines


def _kernel_cached(path: Path) -> int:
    """Bytes of *path* in the kernel's page cache (fincore)."""
    out = subprocess_run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)])
    return int(out.split()[0])


def subprocess_run(cmd: list[str]) -> str:
    import subprocess

    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout


def test_evict_drops_the_kernels_page_cache_of_a_served_file_too(src: Path, mnt: Path) -> None:
    """After `warm --evict` the next read was answered from the kernel's page cache, never reaching fastfs."""
    data = random.Random(4).randbytes(3 * MIB)
    (src / "f.bin").write_bytes(data)
    with mounted(src, mnt, options=[SERVED]) as m:
        assert (mnt / "f.bin").read_bytes() == data  # now in the kernel's page cache of the mount's file
        before = counters(m)["bytes_requested"]
        assert (mnt / "f.bin").read_bytes() == data
        assert counters(m)["bytes_requested"] == before  # served by the kernel
        r = run_cli("warm", "--evict", mnt / "f.bin")
        assert r.returncode == 0 and r.stdout.startswith("evicted 3.0 MiB"), r.stdout
        from conftest import wait_for

        assert wait_for(lambda: _kernel_cached(mnt / "f.bin") == 0, timeout=10)
        assert (mnt / "f.bin").read_bytes() == data
        assert counters(m)["bytes_requested"] == before + len(data)  # this time it reached fastfs


def test_evict_on_a_passthrough_mount_drops_freshly_written_files(src: Path, mnt: Path) -> None:
    """`warm --evict` right after warming 28.6 MiB of small files reported 58.6 KiB evicted: the source
    files had just been written, and dirty pages cannot be dropped until written back."""
    rng = random.Random(5)
    for i in range(60):
        (src / f"{i:02d}.bin").write_bytes(rng.randbytes(30000))  # dirty in the page cache, no sync
    with mounted(src, mnt):  # tmp is local: passthrough
        assert run_cli("warm", mnt).returncode == 0
        r = run_cli("warm", "--evict", mnt)
        assert r.returncode == 0 and r.stdout.strip() == f"evicted {warm.human(60 * 30000)} from 60 files", r.stdout
        check = run_cli("warm", "--check", mnt)
        assert check.stdout.splitlines()[-1] == f"cached: 0 of 60 files, 0 B of {warm.human(60 * 30000)} (0.0%)"


def test_a_disk_warm_waits_for_room_in_the_write_queue_instead_of_dropping(
    src: Path, mnt: Path, tmp_path: Path
) -> None:
    """A small RAM budget makes a small write queue: the fills of a disk warm used to find it full and
    drop their writes (counted in disk_writes_dropped) before the job queued them again itself."""
    rng = random.Random(12)
    for i in range(48):
        (src / f"{i:02d}.bin").write_bytes(rng.randbytes(MIB))
    for i in range(200):
        (src / f"s{i:03d}.bin").write_bytes(rng.randbytes(20000))
    total = 48 * MIB + 200 * 20000
    with mounted(src, mnt, options=[SERVED, "budget=16M", f"disk_dir={tmp_path / 'disk'}"]) as m:
        r = run_cli("warm", "--disk", mnt, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"warmed 248 files onto the disk tier, {warm.human(total)}" in r.stdout
        c = counters(m)
        assert c["disk_writes_dropped"] == 0 and c["disk_writes"] >= 248, c
        check = run_cli("warm", "--disk", "--check", mnt)
        assert check.returncode == 0 and check.stdout.splitlines()[-1].endswith("(100.0%)"), check.stdout


def test_a_disk_warm_without_room_on_disk_says_so(src: Path, mnt: Path, tmp_path: Path) -> None:
    rng = random.Random(13)
    for i in range(4):
        (src / f"{i}.bin").write_bytes(rng.randbytes(MIB))
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    floor = free + (1 << 30)  # more than is free: the tier may use nothing
    with mounted(src, mnt, options=[SERVED, f"disk_dir={tmp_path / 'disk'}", f"disk_free_floor={floor}"]) as m:
        r = run_cli("warm", "--disk", mnt, timeout=300)
        assert r.returncode == 1, r.stdout + r.stderr
        assert (
            "fastfs warm: 4 files only partly on disk: the disk budget or free-space floor left no room for all of them"
            in (r.stderr.splitlines())
        ), r.stderr
        assert counters(m)["disk_writes_dropped"] == 0
