"""The disk cache tier on real mounts: remounts with the source failing, passthrough to disk files,
changed sources, damaged cache files, kill -9, the budget and the free-space floor, bad directories,
``fastfs warm --disk`` and ``fastfs stats``.

The source is faultfs (``tests/faultfs.py``), a FUSE mirror whose reads can be made to fail: a FUSE
source is served by default (``fuse.passthrough=auto``), and a byte not held by the disk tier then
fails its read instead of coming from the source. Tests over a local source mount with ``SERVED``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SERVED, force_unmount, is_mounted, mounted, run_cli, wait_for
from faultfs import faultfs_mounted

MIB = 1024 * 1024


def kernel_reads(m) -> int:
    return m.stats().get("kernel", {}).get("requests", {}).get("read", 0)


def make_tree(root: Path, big: int = 2, small: int = 40, big_size: int = 5 * MIB + 321) -> dict[str, bytes]:
    """Files under *root*: *big* large ones and *small* small ones in d/; returns name -> bytes."""
    files: dict[str, bytes] = {}
    (root / "d").mkdir(parents=True, exist_ok=True)
    for i in range(big):
        files[f"big{i}.bin"] = os.urandom(big_size + i)
    for i in range(small):
        files[f"d/s{i:03d}"] = os.urandom(2000 + 37 * i)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def written_all(m, total: int) -> bool:
    s = m.stats()
    return s["counters"]["disk_bytes_written"] >= total and s["gauges"]["disk_queue_bytes"] == 0


@contextlib.contextmanager
def faulty(tmp_path: Path, backing: Path, tag: str = "") -> Iterator:
    fmnt = tmp_path / "fsrc"
    fmnt.mkdir(exist_ok=True)
    with faultfs_mounted(backing, fmnt, tmp_path / f"faultfs-work{tag}") as fs:
        yield fs


def test_remount_reads_from_disk_with_the_source_failing_then_by_passthrough(tmp_path: Path) -> None:
    backing, mnt, disk = tmp_path / "backing", tmp_path / "mnt", tmp_path / "disk"
    mnt.mkdir()
    files = make_tree(backing)
    total = sum(len(v) for v in files.values())
    opts = [f"cache.disk_dir={disk}"]
    with faulty(tmp_path, backing, "1") as fs:
        dev_before = os.stat(fs.mnt).st_dev
        with mounted(fs.mnt, mnt, options=opts) as m:
            for name, data in files.items():
                assert (mnt / name).read_bytes() == data
            assert wait_for(lambda: written_all(m, total), timeout=30), m.stats()["counters"]
    # the source remounted, with a new st_dev (a tmpfs takes the device number it had), and failing now
    with tmpfs(tmp_path / "placeholder", "1M"), faulty(tmp_path, backing, "2") as fs:
        assert os.stat(fs.mnt).st_dev != dev_before
        fs.set(eio=["*"])
        with pytest.raises(OSError):
            (fs.mnt / "big0.bin").read_bytes()
        with mounted(fs.mnt, mnt, options=opts) as m:
            for name, data in files.items():
                if name != "big1.bin":
                    assert (mnt / name).read_bytes() == data, name
            snap = m.stats()
            c = snap["counters"]
            assert c["bytes_fetched_demand"] == c["bytes_fetched_prefetch"] == 0 and snap["errors"] == {}
            assert c["disk_hit_bytes"] >= total - len(files["big1.bin"]) and c["disk_corrupt_dropped"] == 0
            assert "PASSTHROUGH" in snap["kernel"]["flags"]
            # big1.bin: an open queues its verification (its pages never entered the kernel's cache) ...
            os.close(os.open(mnt / "big1.bin", os.O_RDONLY))
            # (as did big0.bin's: files of 1 MiB and more are verified at their first open after a
            # restart; the small ones by their reads above, each a checked read of the whole file)
            assert wait_for(lambda: m.stats()["counters"]["disk_verified_files"] == len(files))
            before = kernel_reads(m)
            # ... and the next opens go by passthrough to the disk file: no READ reaches the daemon
            assert (mnt / "big1.bin").read_bytes() == files["big1.bin"]
            with open(mnt / "big1.bin", "rb") as f:
                import mmap

                with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
                    assert mm[:] == files["big1.bin"]
            after = m.stats()
            assert kernel_reads(m) == before
            assert after["counters"]["opens_disk"] >= 2 and after["counters"]["disk_complete_fds"] >= 1
            # a small file too, read once since the restart: by passthrough to its disk file now
            assert (mnt / "d/s007").read_bytes() == files["d/s007"]
            assert m.stats()["counters"]["opens_disk"] == after["counters"]["opens_disk"] + 1
            st = os.stat(mnt / "big1.bin")  # the node shows the source's attributes, not the cache file's
            assert (st.st_mode, st.st_uid, st.st_size) == (
                os.stat(backing / "big1.bin").st_mode,
                os.stat(backing / "big1.bin").st_uid,
                len(files["big1.bin"]),
            )
            summary = run_cli("stats", mnt)
            assert summary.returncode == 0 and "disk tier" in summary.stdout and "disk hits" in summary.stdout


def test_small_files_the_tier_holds_open_by_passthrough_in_the_same_mount(tmp_path: Path) -> None:
    """A small file the tier holds whole is verified as soon as it is (no open needed) and its next
    open goes by passthrough to its disk file: no READ of it reaches the daemon, the bytes are the
    source's (served through the engine, each small file cost a READ and a checked read of its tier
    file in the daemon)."""
    backing, mnt, disk = tmp_path / "backing", tmp_path / "mnt", tmp_path / "disk"
    mnt.mkdir()
    files = make_tree(backing, big=0, small=12)
    total = sum(len(v) for v in files.values())
    opts = [f"cache.disk_dir={disk}"]
    with faulty(tmp_path, backing) as fs, mounted(fs.mnt, mnt, options=opts) as m:
        for name, data in files.items():
            assert (mnt / name).read_bytes() == data
        assert wait_for(lambda: written_all(m, total), timeout=30), m.stats()["counters"]
        assert wait_for(lambda: m.stats()["counters"]["disk_verified_files"] == len(files)), m.stats()["counters"]
        fs.set(eio=["*"])  # from now on a byte the tier does not give fails
        before, opens = kernel_reads(m), m.stats()["counters"]["opens_disk"]
        for name, data in files.items():
            with open(mnt / name, "rb", buffering=0) as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # (the kernel's pages of the node)
                assert f.read() == data, name
        c = m.stats()["counters"]
        assert c["opens_disk"] - opens == len(files) and kernel_reads(m) == before, c
        assert c["disk_corrupt_dropped"] == 0


def test_changed_source_file_is_fetched_anew(tmp_path: Path) -> None:
    backing, mnt, disk = tmp_path / "backing", tmp_path / "mnt", tmp_path / "disk"
    mnt.mkdir()
    backing.mkdir()
    old = os.urandom(3 * MIB)
    (backing / "f.bin").write_bytes(old)
    opts = [f"cache.disk_dir={disk}"]
    new = os.urandom(len(old))
    with faulty(tmp_path, backing) as fs:
        with mounted(fs.mnt, mnt, options=opts) as m:
            assert (mnt / "f.bin").read_bytes() == old
            assert wait_for(lambda: written_all(m, len(old)))
            (backing / "f.bin").write_bytes(new)  # same size: only its times tell the versions apart
            assert (mnt / "f.bin").read_bytes() == new
            assert wait_for(lambda: written_all(m, 2 * len(old)))
        with mounted(fs.mnt, mnt, options=opts) as m:
            assert (mnt / "f.bin").read_bytes() == new
            assert m.stats()["counters"]["disk_hit_bytes"] >= len(new)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_cache_file_damaged_behind_our_back_is_detected_and_refetched(tmp_path: Path, damage: str) -> None:
    backing, mnt, disk = tmp_path / "backing", tmp_path / "mnt", tmp_path / "disk"
    mnt.mkdir()
    backing.mkdir()
    data = os.urandom(6 * MIB + 7)
    (backing / "f.bin").write_bytes(data)
    opts = [f"cache.disk_dir={disk}"]
    with faulty(tmp_path, backing) as fs:
        with mounted(fs.mnt, mnt, options=opts) as m:
            assert (mnt / "f.bin").read_bytes() == data
            assert wait_for(lambda: written_all(m, len(data)))
        (victim,) = [p for p in (disk / "data").rglob("*") if p.is_file()]
        with open(victim, "r+b") as f:
            if damage == "flip":
                f.seek(len(data) // 2)
                b = f.read(1)
                f.seek(len(data) // 2)
                f.write(bytes([b[0] ^ 1]))
            else:
                f.truncate(len(data) - 1)
        with mounted(fs.mnt, mnt, options=opts) as m:
            assert (mnt / "f.bin").read_bytes() == data
            c = m.stats()["counters"]
            assert c["disk_corrupt_dropped"] == 1
            assert c["bytes_fetched_demand"] + c["bytes_fetched_prefetch"] > 0


def test_kill9_during_heavy_caching_then_remount_serves_no_wrong_byte(tmp_path: Path) -> None:
    backing, mnt, disk = tmp_path / "backing", tmp_path / "mnt", tmp_path / "disk"
    mnt.mkdir()
    files = make_tree(backing, big=12, small=300, big_size=4 * MIB + 11)
    names = sorted(files)
    opts = [f"cache.disk_dir={disk}", "cache.budget=64M"]
    with faulty(tmp_path, backing) as fs:
        with mounted(fs.mnt, mnt, options=opts) as m:
            stop = threading.Event()

            def reader(part: list[str]) -> None:
                for name in part:
                    if stop.is_set():
                        return
                    with contextlib.suppress(OSError):  # the daemon dies under it
                        (mnt / name).read_bytes()

            threads = [threading.Thread(target=reader, args=(names[i::4],)) for i in range(4)]
            for t in threads:
                t.start()
            seen: list[dict[str, int]] = []

            def caching() -> bool:
                # well under way and a file journalled whole (12 MiB written can be only heads of the big files)
                c = m.stats()["counters"]
                seen.append(c)
                return c["disk_bytes_written"] >= 12 * MIB and c["disk_files_completed"] >= 1

            try:
                assert wait_for(caching, timeout=60)
                before = seen[-1]
                os.kill(m.pid, signal.SIGKILL)
                m.proc.wait(timeout=20)
            finally:
                stop.set()
                force_unmount(mnt)
                for t in threads:
                    t.join(timeout=60)
        assert not is_mounted(mnt)
        fs.set(eio=["*"])
        served = 0
        with mounted(fs.mnt, mnt, options=opts) as m:
            for name in names:  # from disk, or EIO: never a wrong byte
                try:
                    got = (mnt / name).read_bytes()
                except OSError:
                    continue
                assert got == files[name], name
                served += 1
        # every file the daemon had journalled whole before the kill is served whole without the source
        whole = before["disk_files_completed"] - before["disk_evictions"] - before["disk_corrupt_dropped"]
        assert served >= max(1, whole), (served, before)
        fs.clear()
        with mounted(fs.mnt, mnt, options=opts) as m:
            for name in names:
                assert (mnt / name).read_bytes() == files[name], name


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _du(path: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def test_budget_and_free_space_floor_hold(tmp_path: Path) -> None:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    mnt.mkdir()
    files = make_tree(src, big=24, small=0, big_size=4 * MIB)  # 96 MiB, more than the 64 MiB budget
    with tmpfs(tmp_path / "fs", "160M") as fs:
        disk = fs / "cache"
        opts = [SERVED, f"cache.disk_dir={disk}", "cache.disk_budget=64M", "cache.disk_free_floor=40M"]
        with mounted(src, mnt, options=opts) as m:
            for name, data in files.items():
                assert (mnt / name).read_bytes() == data
            assert wait_for(lambda: m.stats()["gauges"]["disk_queue_bytes"] == 0)
            g, c = m.stats()["gauges"], m.stats()["counters"]
            assert g["disk_cache_budget"] == 64 * MIB and g["disk_cache_bytes"] <= 64 * MIB
            assert _du(disk) <= 64 * MIB and c["disk_evictions"] > 0
            # another program fills the disk past the floor: the tier gives the space back
            with open(fs / "filler", "wb") as f:
                f.write(b"\1" * (80 * MIB))
            assert _free(fs) < 40 * MIB
            assert wait_for(lambda: _free(fs) >= 40 * MIB - MIB, timeout=20), (_free(fs), m.stats()["gauges"])
            for name, data in files.items():  # and keeps to the floor while it goes on caching
                assert (mnt / name).read_bytes() == data
                assert _free(fs) >= 40 * MIB - 8 * MIB  # (at most a few blocks in flight past a check)
            assert wait_for(lambda: _free(fs) >= 40 * MIB - MIB, timeout=20)
            assert m.stats()["counters"]["disk_writes_no_room"] + m.stats()["counters"]["disk_evictions"] > 0


@pytest.mark.parametrize("case", ["inside source", "around mountpoint", "foreign", "group writable", "other owner"])
def test_bad_disk_dir_is_refused_with_one_line_before_mounting(tmp_path: Path, case: str) -> None:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "f").write_bytes(b"x")
    disk = tmp_path / "disk"
    expect = {
        "inside source": "must be outside",
        "around mountpoint": "must be outside",
        "foreign": "not a fastfs disk cache",
        "group writable": "writable by group or others",
        "other owner": "not by the daemon's user",
    }[case]
    if case == "inside source":
        disk = src / "cache"
    elif case == "around mountpoint":
        disk = tmp_path
    else:
        disk.mkdir(mode=0o700)
        if case == "foreign":
            (disk / "results.csv").write_text("keep me")
        elif case == "group writable":
            os.chmod(disk, 0o770)
        else:
            os.chown(disk, 65534, 65534)
    r = run_cli("mount", src, mnt, "-o", f"cache.disk_dir={disk}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("fastfs: error: cache.disk_dir ") and expect in lines[0], lines[0]
    assert not is_mounted(mnt)
    if case == "foreign":
        assert (disk / "results.csv").read_text() == "keep me"
    if case == "inside source":
        assert not disk.exists()  # nothing created in the source


def test_warm_disk_fills_the_tier_ahead_then_a_remount_needs_no_source(tmp_path: Path) -> None:
    backing, mnt, disk = tmp_path / "backing", tmp_path / "mnt", tmp_path / "disk"
    mnt.mkdir()
    files = make_tree(backing, big=6, small=30, big_size=4 * MIB)  # 24 MiB, past the 16 MiB RAM budget
    opts = [f"cache.disk_dir={disk}", "cache.budget=16M"]
    with faulty(tmp_path, backing) as fs:
        with mounted(fs.mnt, mnt, options=opts):
            r = run_cli("warm", "--disk", mnt)
            assert r.returncode == 0, r.stderr
            assert f"warmed {len(files)} files onto the disk tier" in r.stdout, r.stdout
            r = run_cli("warm", "--disk", "--check", mnt)
            assert r.returncode == 0 and f"on disk: {len(files)} of {len(files)} files" in r.stdout, r.stdout
            r = run_cli("warm", "--check", mnt)  # the RAM cache could not hold it all
            assert r.returncode == 1
            r = run_cli("warm", "--disk", "--evict", mnt / "big0.bin")
            assert r.returncode == 0 and "from disk" in r.stdout, r.stdout
            r = run_cli("warm", "--disk", "--check", mnt)
            assert r.returncode == 1 and f"on disk: {len(files) - 1} of {len(files)} files" in r.stdout
        fs.set(eio=["*"])
        with mounted(fs.mnt, mnt, options=opts):
            for name, data in files.items():
                if name != "big0.bin":
                    assert (mnt / name).read_bytes() == data, name
            with pytest.raises(OSError):
                (mnt / "big0.bin").read_bytes()


def test_warm_disk_on_a_mount_without_a_tier_says_so(tmp_path: Path) -> None:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "f").write_bytes(b"x" * 5000)
    with mounted(src, mnt, options=[SERVED]):
        for args in (["--disk"], ["--disk", "--check"]):
            r = run_cli("warm", *args, mnt / "f")
            assert r.returncode == 1 and "this mount has no disk tier" in r.stderr, (args, r.stderr)
