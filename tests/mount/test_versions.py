"""One inode per source version, and the passthrough route, on real mounts.

Each version of a test file carries its version number in every 4 KiB page, so any byte range
tells which version it came from.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import SERVED, is_mounted, mounted, wait_for

PAGE = 4096
ROUTES = pytest.mark.parametrize("route", ["passthrough", "served"])


def route_option(route: str) -> str:
    return "fuse.passthrough=on" if route == "passthrough" else SERVED


def version_bytes(version: int, size: int) -> bytes:
    page = (b"v%08d|" % version) * (PAGE // 10) + b"\n" * (PAGE % 10)
    return (page * (size // PAGE + 1))[:size]


def versions_in(data: bytes) -> set[int]:
    return {int(data[i + 1 : i + 9]) for i in range(0, len(data) - 9, PAGE)}


def replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def run_py(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)


def kernel_reads(m) -> int:
    return m.stats().get("kernel", {}).get("requests", {}).get("read", 0)


# (a) a v1 handle and a v2 private mapping in another process each see only their own version
@ROUTES
def test_old_handle_and_new_private_mapping_see_their_own_versions(src: Path, mnt: Path, route: str) -> None:
    size = 4 << 20
    (src / "f.bin").write_bytes(version_bytes(1, size))
    with mounted(src, mnt, options=[route_option(route)]):
        with open(mnt / "f.bin", "rb") as old:
            assert versions_in(old.read(size)) == {1}
            replace(src / "f.bin", version_bytes(2, size))
            code = (
                "import mmap,sys\n"
                "f=open(sys.argv[1],'rb')\n"
                "m=mmap.mmap(f.fileno(),0,flags=mmap.MAP_PRIVATE,prot=mmap.PROT_READ)\n"
                "sys.stdout.write(m[:].decode('latin1')[1:9]+' '+str(len(m)))\n"
            )
            r = run_py(code, str(mnt / "f.bin"))
            assert r.returncode == 0, r.stderr
            assert r.stdout == f"00000002 {size}"
            old.seek(0)
            again = old.read(size)
            assert versions_in(again) == {1}
            mapped = mmap.mmap(old.fileno(), 0, prot=mmap.PROT_READ)
            assert versions_in(mapped[:]) == {1}
            mapped.close()
        with open(mnt / "f.bin", "rb") as new:
            assert versions_in(new.read()) == {2}


# (b) a mapping of an 8 MiB version survives a 1 MiB file renamed over it: size and bytes, no SIGBUS
@ROUTES
def test_mapping_keeps_its_version_after_a_smaller_file_replaces_it(src: Path, mnt: Path, route: str) -> None:
    (src / "f.bin").write_bytes(version_bytes(1, 8 << 20))
    with mounted(src, mnt, options=[route_option(route)]), open(mnt / "f.bin", "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        assert versions_in(m[: 1 << 20]) == {1}  # part of it touched before the change
        replace(src / "f.bin", version_bytes(2, 1 << 20))
        r = run_py("import sys;print(len(open(sys.argv[1],'rb').read()))", str(mnt / "f.bin"))
        assert r.stdout.strip() == str(1 << 20)
        assert os.fstat(f.fileno()).st_size == 8 << 20
        assert versions_in(m[:]) == {1}  # the pages past 1 MiB are read now: still version 1
        m.close()


# (c) np.load(mmap_mode='r') of a new version while the old one is open
@ROUTES
def test_np_load_mmap_of_a_new_version_while_the_old_is_open(src: Path, mnt: Path, route: str) -> None:
    a = np.arange(1 << 20, dtype=np.int64)
    np.save(src / "a.npy", a)
    with mounted(src, mnt, options=[route_option(route)]), open(mnt / "a.npy", "rb") as old:
        old.read(4096)
        b = a * 3
        tmp = src / "b.npy"
        np.save(tmp, b)
        os.replace(tmp, src / "a.npy")
        loaded = np.load(mnt / "a.npy", mmap_mode="r")
        assert np.array_equal(loaded, b)
        del loaded
        old.seek(0)
        assert np.array_equal(np.load(old), a)


# (d) a file replaced after a stat is read whole by the next open
@ROUTES
def test_replace_after_stat_is_read_whole_next_open(src: Path, mnt: Path, route: str) -> None:
    (src / "f.bin").write_bytes(version_bytes(1, 100_000))
    with mounted(src, mnt, options=[route_option(route)]):
        assert (mnt / "f.bin").stat().st_size == 100_000
        assert (mnt / "f.bin").read_bytes() == version_bytes(1, 100_000)
        replace(src / "f.bin", version_bytes(2, 300_000))
        for _ in range(2):
            assert (mnt / "f.bin").read_bytes() == version_bytes(2, 300_000)
        assert (mnt / "f.bin").stat().st_size == 300_000


STRESS_READER = r"""
import mmap, os, sys, time
path, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
PAGE = 4096
bad = opens = stale = 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        continue
    except OSError as e:  # replaced again between the kernel's one retry and its open (as on NFS)
        if e.errno != 116:  # ESTALE
            raise
        stale += 1
        continue
    try:
        size = os.fstat(fd).st_size
        if mode == "read":
            data = b"".join(iter(lambda: os.read(fd, 1 << 16), b""))
        elif mode == "pread":
            data = b"".join(os.pread(fd, PAGE, off) for off in range(0, size, PAGE))
        else:
            flags = mmap.MAP_SHARED if mode == "shared" else mmap.MAP_PRIVATE
            m = mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
            data = m[:]
            m.close()
    finally:
        os.close(fd)
    opens += 1
    if len(data) != size or len({data[i + 1 : i + 9] for i in range(0, len(data) - 9, PAGE)}) != 1:
        bad += 1
print(opens, bad, stale)
"""


# (e) four processes read, pread, map shared and private while new versions are renamed in every 30 ms
@ROUTES
def test_stress_every_read_sees_one_version(src: Path, mnt: Path, route: str) -> None:
    path = src / "f.bin"
    replace(path, version_bytes(0, 512 * 1024))
    seconds = 6.0
    with mounted(src, mnt, options=[route_option(route)]):
        readers = [
            subprocess.Popen(
                [sys.executable, "-c", STRESS_READER, str(mnt / "f.bin"), mode, str(seconds)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for mode in ("read", "pread", "shared", "private")
        ]
        version = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            version += 1
            replace(path, version_bytes(version, (256 + (version % 5) * 64) * 1024))
            time.sleep(0.03)
        results = [r.communicate(timeout=60)[0].split() for r in readers]
    assert version > 50
    for opens, bad, stale in results:
        # no read ever sees another version; an open may rarely fail with ESTALE when the name is
        # replaced again between the kernel's lookup and its single retry of the open
        assert int(opens) > 10 and int(bad) == 0 and int(stale) * 10 <= int(opens), results


REWRITER = r"""
import mmap, os, random, sys, time
src, mnt, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
PAGE = 4096
def version_bytes(version, size):
    page = (b"v%08d|" % version) * (PAGE // 10) + b"\n" * (PAGE % 10)
    return (page * (size // PAGE + 1))[:size]
rng = random.Random(7)
live, version, reads, mixed = [], 0, 0, []
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    name = f"r{rng.randrange(400)}.bin"
    path = os.path.join(src, name)
    version += 1
    data = version_bytes(version, rng.choice((1, 3, 70, 300, 1500)) * 1000)
    if name in live and rng.random() < 0.3:  # in place: the same inode, truncated and written
        with open(path, "r+b") as f:
            f.truncate(0)
            f.write(data)
    else:  # a new inode renamed over the name
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
        if name not in live:
            live.append(name)
    if len(live) > 200:
        os.unlink(os.path.join(src, live.pop(rng.randrange(len(live)))))
    if rng.random() < 0.05:
        os.listdir(mnt)  # entries with their attributes (READDIRPLUS): fresh metadata of every file
    for name in rng.sample(live, min(3, len(live))):
        with open(os.path.join(mnt, name), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if rng.random() < 0.2:
                with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                    got = m[:]
            else:
                got = f.read()
        reads += 1
        if len(got) != size or len({got[i + 1 : i + 9] for i in range(0, len(got) - 9, PAGE)}) != 1:
            mixed.append(name)
print(reads, len(mixed))
"""


# (f) files replaced by a rename or rewritten in place, each write followed by reads of three files
# through the mount, a fifth of them mapped, and now and then a listing: every read is one version
# whole. On the passthrough route a re-open of a kept backing file (the source file itself) was
# answered from metadata a listing fetched before a rewrite in place: new bytes under the old size
# (mixed reads, SIGBUS past the new end of a mapping).
@ROUTES
def test_files_rewritten_in_place_are_read_as_one_version(src: Path, mnt: Path, route: str) -> None:
    with mounted(src, mnt, options=[route_option(route)]):
        done = run_py(REWRITER, str(src), str(mnt), "6", timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -7: SIGBUS in a mapping
    reads, mixed = map(int, done.stdout.split())
    assert reads > 300 and mixed == 0, done.stdout


MAPPER = r"""
import mmap, os, sys
with open(sys.argv[1], "rb") as f:
    size = os.fstat(f.fileno()).st_size
    with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        data = m[:]
sys.stdout.buffer.write(size.to_bytes(8, "little") + data)
"""


# (g) the same, one step at a time: a file read (its passthrough backing file kept registered), the
# directory listed (READDIRPLUS: metadata for the next open), the file rewritten in place, smaller;
# a mapping opened then faulted with SIGBUS past the new end before 89ace26 (passthrough route; the
# served route may serve its copy of the old version whole within the fuse.revalidate bound)
@ROUTES
def test_a_mapping_after_a_listing_and_a_rewrite_in_place_sees_one_version(src: Path, mnt: Path, route: str) -> None:
    (src / "f.bin").write_bytes(version_bytes(1, 300_000))
    with mounted(src, mnt, options=[route_option(route)]):
        assert (mnt / "f.bin").read_bytes() == version_bytes(1, 300_000)
        time.sleep(0.2)  # the release is closed off the request's thread
        os.listdir(mnt)
        with open(src / "f.bin", "r+b") as f:
            f.truncate(0)
            f.write(version_bytes(2, 8_000))
        done = subprocess.run([sys.executable, "-c", MAPPER, str(mnt / "f.bin")], capture_output=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -7: SIGBUS
    size, data = int.from_bytes(done.stdout[:8], "little"), done.stdout[8:]
    assert size == len(data)
    if route == "served":  # its own copy of the old version, whole, within fuse.revalidate (1 s)
        assert data in (version_bytes(1, 300_000), version_bytes(2, 8_000))
    else:  # the kernel reads the source file itself: only the new version is whole there
        assert data == version_bytes(2, 8_000)


# (h) an open handle whose pages the kernel dropped keeps reading its version after the path was opened
# in a new one: its open was answered from metadata (no source file held), and the new version's open
# freed the old one's blocks, so its next read failed with ESTALE before (SIGBUS in a mapping)
@ROUTES
def test_an_open_handle_keeps_its_version_after_the_path_is_opened_new(src: Path, mnt: Path, route: str) -> None:
    old, new = version_bytes(1, 400_000), version_bytes(2, 300_000)
    (src / "f.bin").write_bytes(old)
    with mounted(src, mnt, options=[route_option(route)]):
        assert (mnt / "f.bin").read_bytes() == old
        time.sleep(1.2)  # past fuse.revalidate: the next open is revalidated by a stat, not reopened
        with open(mnt / "f.bin", "rb", buffering=0) as held:
            os.posix_fadvise(held.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # its pages: reads reach fastfs
            head = held.read(PAGE)
            replace(src / "f.bin", new)
            time.sleep(1.2)
            assert (mnt / "f.bin").read_bytes() == new
            assert head + held.read() == old


# -- passthrough ------------------------------------------------------------------------------------
def test_passthrough_reads_and_maps_without_a_read_request(src: Path, mnt: Path) -> None:
    data = os.urandom(6 << 20)
    (src / "f.bin").write_bytes(data)
    np.save(src / "a.npy", np.arange(1 << 18, dtype=np.float64))
    with mounted(src, mnt, options=["fuse.passthrough=on"]) as m:
        assert "PASSTHROUGH" in m.stats()["kernel"]["flags"]
        before = kernel_reads(m)  # the fixture's liveness check read the stats file
        assert (mnt / "f.bin").read_bytes() == data
        with open(mnt / "f.bin", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            assert mm[:] == data
        assert np.array_equal(np.load(mnt / "a.npy", mmap_mode="r"), np.arange(1 << 18, dtype=np.float64))
        assert kernel_reads(m) == before
        counters = m.stats()["counters"]
        assert counters["opens_passthrough"] >= 3 and counters["opens"] == 0


def test_passthrough_off_serves_reads(src: Path, mnt: Path) -> None:
    data = os.urandom(1 << 20)
    (src / "f.bin").write_bytes(data)
    with mounted(src, mnt, options=["fuse.passthrough=off"]) as m:
        assert "PASSTHROUGH" not in m.stats()["kernel"]["flags"]
        before = kernel_reads(m)
        assert (mnt / "f.bin").read_bytes() == data
        assert kernel_reads(m) > before
        assert m.stats()["counters"]["opens_passthrough"] == 0


def test_auto_passes_local_sources_through(src: Path, mnt: Path) -> None:
    (src / "f.bin").write_bytes(b"x" * 100_000)
    with mounted(src, mnt) as m:  # tmp is a local filesystem
        before = kernel_reads(m)
        assert (mnt / "f.bin").read_bytes() == b"x" * 100_000
        assert m.stats()["counters"]["opens_passthrough"] == 1
        assert kernel_reads(m) == before


# -- a mount by a user who is not root: fusermount3, no passthrough, served ---------------------------
# The interpreter lives under /root (0700): everything is imported as root, then the ids are dropped.
DAEMON_AS = """
import importlib, json, logging.handlers, os, pkgutil, select, signal, socket, subprocess, sys
import encodings.ascii, encodings.latin_1, encodings.utf_8
import fastfs.config, fastfs.daemon, fastfs.fsio
for package in (fastfs.config, fastfs.daemon, fastfs.fsio):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
os.setgroups([])
os.setresgid({gid}, {gid}, {gid})
os.setresuid({uid}, {uid}, {uid})
from fastfs.daemon.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
PROBE_AS = """
import hashlib, os, sys
os.setgroups([])
os.setresgid({gid}, {gid}, {gid})
os.setresuid({uid}, {uid}, {uid})
with open({mnt!r} + "/f.bin", "rb") as f:
    print(hashlib.sha256(f.read()).hexdigest())
print(os.getxattr({mnt!r}, "user.fastfs.stats").decode())
"""


def _unprivileged() -> tuple[int, int]:
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user")
    return pw.pw_uid, pw.pw_gid


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("fusermount3") is None, reason="needs root and fusermount3")
def test_unprivileged_mount_through_fusermount_serves_reads() -> None:
    uid, gid = _unprivileged()
    device_mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    base = Path(tempfile.mkdtemp(prefix="fastfs-user-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        src, mnt, state = base / "src", base / "mnt", base / "state"
        for d in (src, mnt, state):
            d.mkdir()
            os.chown(d, uid, gid)
        data = os.urandom(3 << 20)
        (src / "f.bin").write_bytes(data)
        os.chown(src / "f.bin", uid, gid)

        env = {**os.environ, "STATE_DIRECTORY": str(state), "HOME": str(base)}
        code = DAEMON_AS.format(uid=uid, gid=gid)
        if device_mode & 0o006 != 0o006:
            # a user without access to /dev/fuse is told why, in one line
            r = subprocess.run(
                [sys.executable, "-c", code, "mount", str(src), str(mnt), "--foreground"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                cwd="/",
            )
            assert r.returncode == 1 and "cannot open /dev/fuse: Permission denied" in r.stderr, r.stderr
            assert not is_mounted(mnt)
            os.chmod("/dev/fuse", 0o666)  # what udev sets on a usual machine; restored below
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "mount", str(src), str(mnt), "--foreground"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd="/",
        )
        try:
            assert wait_for(lambda: is_mounted(mnt) or proc.poll() is not None, timeout=30)
            assert proc.poll() is None, proc.stdout.read()
            probe = PROBE_AS.format(uid=uid, gid=gid, mnt=str(mnt))
            r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd="/")
            if r.returncode != 0:
                proc.send_signal(signal.SIGTERM)
                raise AssertionError(r.stderr + "\ndaemon:\n" + proc.communicate(timeout=30)[0])
            digest, stats_text = r.stdout.split("\n", 1)
            assert digest == hashlib.sha256(data).hexdigest()
            snap = json.loads(stats_text)
            assert "PASSTHROUGH" not in snap["kernel"]["flags"]
            assert snap["kernel"]["requests"]["read"] > 0 and snap["counters"]["opens"] == 1
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
            if is_mounted(mnt):
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        assert proc.returncode == 0
        assert not is_mounted(mnt)
    finally:
        os.chmod("/dev/fuse", device_mode)
        shutil.rmtree(base, ignore_errors=True)


def test_open_less_rereads_make_no_request(src: Path, mnt: Path) -> None:
    """fuse.no_open: a hot re-open + read + close of a small file costs no round trip at all (no OPEN,
    no RELEASE, and no FLUSH, which open-less files cannot refuse at open)."""
    for i in range(20):
        (src / f"f{i}").write_bytes(bytes([i]) * 3000)
    with mounted(src, mnt, options=["no_open"]) as m:
        for i in range(20):
            assert (mnt / f"f{i}").read_bytes() == bytes([i]) * 3000
        before = dict(m.stats()["kernel"]["requests"])
        for i in range(20):  # os.open, not Python's open(), which asks isatty (an IOCTL request)
            fd = os.open(mnt / f"f{i}", os.O_RDONLY)
            try:
                assert os.read(fd, 4096) == bytes([i]) * 3000
            finally:
                os.close(fd)
        after = m.stats()["kernel"]["requests"]
        changed = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        assert set(changed) <= {"getxattr"}, changed  # only the stats queries themselves
