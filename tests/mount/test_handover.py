"""Small files handed to the kernel's page cache at open (fastfs.fsio.handover), on real served mounts.

A scan fetches a directory's small files whole; a later open of one of them puts its bytes into the
kernel's page cache before the reply, so its reads never reach the daemon. Every test asserts bytes
and sizes: a handover must never show one version's bytes or size to a reader of another.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from conftest import SERVED, mounted, wait_for

PAGE = 4096
SMALL = 3000
# Seconds the kernel caches attributes, and the scan's metadata answers opens without a source check,
# in the tests that replace files (the documented trust of a scan's metadata: a replaced file shows
# once it passed); PAST waits it out.
TRUST = 0.3
PAST = 0.5


def counters(m) -> dict:
    return m.stats()["counters"]


def requests(m) -> dict:
    return dict(m.stats()["kernel"]["requests"])


def version_bytes(version: int, size: int) -> bytes:
    page = (b"v%08d|" % version) * (PAGE // 10) + b"\n" * (PAGE % 10)
    return (page * (size // PAGE + 1))[:size]


def read_fd(path: Path) -> tuple[bytes, int]:
    """(bytes, fstat size) of one open + read + close (os.open: Python's open() also asks isatty)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 20), os.fstat(fd).st_size
    finally:
        os.close(fd)


def scanned(src: Path, mnt: Path, m, files: dict[str, bytes], opened: int = 3) -> None:
    """Open the first *opened* files (the scan trigger), then wait until the scan fetched the rest."""
    names = sorted(files)
    for name in names[:opened]:
        assert read_fd(mnt / "d" / name) == (files[name], len(files[name]))
    assert wait_for(lambda: counters(m)["small_file_scan_files"] >= len(names) - opened)


def make_files(src: Path, n: int = 40) -> dict[str, bytes]:
    (src / "d").mkdir()
    files = {f"f{i:03d}.bin": version_bytes(i, SMALL + 7 * i) for i in range(n)}
    for name, data in files.items():
        (src / "d" / name).write_bytes(data)
    return files


def test_a_scanned_small_file_is_read_from_the_kernel_without_a_read_request(src: Path, mnt: Path) -> None:
    """Failed before the handover: one READ per file (the scan's copy sat in fastfs's RAM only)."""
    files = make_files(src)
    with mounted(src, mnt, options=[SERVED]) as m:
        scanned(src, mnt, m, files)
        before, stats_before = requests(m), counters(m)
        rest = sorted(files)[3:]
        for name in rest:
            assert read_fd(mnt / "d" / name) == (files[name], len(files[name]))
        after, stats_after = requests(m), counters(m)
        assert after.get("read", 0) == before.get("read", 0), (before, after)
        assert after.get("open", 0) - before.get("open", 0) == len(rest)
        handed = stats_after["opens_handed"] - stats_before["opens_handed"]
        assert handed == len(rest)
        assert stats_after["bytes_handed"] - stats_before["bytes_handed"] == sum(len(files[n]) for n in rest)
        # handed bytes count as delivered, from the cache; nothing more came from the source
        assert stats_after["bytes_requested"] - stats_before["bytes_requested"] == sum(len(files[n]) for n in rest)
        assert stats_after["preads"] == stats_before["preads"]
        # a second pass: the kernel's page cache still, no READ and no second handover
        for name in rest:
            assert read_fd(mnt / "d" / name) == (files[name], len(files[name]))
        assert requests(m).get("read", 0) == before.get("read", 0)
        assert counters(m)["opens_handed"] == stats_after["opens_handed"]
        text = m.stats()
        assert text["counters"]["bytes_handed"] > 0


def test_a_name_replaced_while_its_old_version_is_open_opens_the_new_version(src: Path, mnt: Path) -> None:
    """The rebound case: an open file's name is replaced by rename (another size); opened again, the name
    gives the new version's bytes and fstat size, while the old descriptor keeps its own version, bytes
    and fstat size (no handover may put one version's pages or size under the other's inode)."""
    files = make_files(src)
    with mounted(src, mnt, options=[SERVED, f"fuse.attr_timeout={TRUST}"]) as m:
        scanned(src, mnt, m, files)
        time.sleep(PAST)  # the scan's metadata no longer answers opens: each open checks the source
        name = sorted(files)[10]
        path = mnt / "d" / name
        old_fd = os.open(path, os.O_RDONLY)
        try:
            old = files[name]
            assert os.read(old_fd, 1 << 20) == old
            new = version_bytes(900, len(old) + 2 * PAGE + 5)
            tmp = src / "d" / (name + ".tmp")
            tmp.write_bytes(new)
            os.replace(tmp, src / "d" / name)
            for _ in range(3):
                assert read_fd(path) == (new, len(new))
            assert os.stat(path).st_size == len(new)
            # the old descriptor: its own version, also once its cached attributes expired (fstat
            # asks without a handle: answered ESTALE before, which failed fstat)
            assert os.pread(old_fd, 1 << 20, 0) == old
            assert os.fstat(old_fd).st_size == len(old)
            time.sleep(PAST)
            assert os.fstat(old_fd).st_size == len(old)
            assert os.pread(old_fd, 1 << 20, 0) == old
            assert os.stat(path).st_size == len(new)
            assert read_fd(path) == (new, len(new))
        finally:
            os.close(old_fd)


def test_a_name_replaced_after_its_lookup_rebinds_without_a_handover(src: Path, mnt: Path) -> None:
    """A name looked up (stat) but never opened, then replaced by a smaller and a larger version: the
    open rebinds the node to the new version (its old attributes dropped from the kernel); bytes and
    fstat size are the new version's. (That a rebound node is never handed over, with its new version
    in RAM, is tests/ops/test_ops.py's test_a_rebound_node_is_not_handed_over.)"""
    files = make_files(src)
    # fuse.revalidate=0: every open asks the source. Within the bound the open may be answered by the
    # metadata of the lookup just before it, which the replace below may follow (the documented
    # close-to-open bound, tests/engine/test_revalidate.py); this test is about the rebinding.
    options = [SERVED, f"fuse.attr_timeout={TRUST}", "fuse.revalidate=0"]
    with mounted(src, mnt, options=options) as m:
        scanned(src, mnt, m, files)
        time.sleep(PAST)  # the scan's metadata no longer answers lookups and opens
        for i, delta in ((20, -1000), (21, 3 * PAGE)):
            name = sorted(files)[i]
            path = mnt / "d" / name
            assert os.stat(path).st_size == len(files[name])
            new = version_bytes(500 + i, len(files[name]) + delta)
            tmp = src / "d" / (name + ".tmp")
            tmp.write_bytes(new)
            os.replace(tmp, src / "d" / name)
            assert read_fd(path) == (new, len(new))
            assert read_fd(path) == (new, len(new))
            assert os.stat(path).st_size == len(new)


def test_a_fast_local_source_hands_each_file_over_at_its_open_without_a_scan(src: Path, mnt: Path) -> None:
    """The default on a local source that answers small reads from memory (tmpfs here) when files are
    served: no scan; each open reads its small file from the source itself and hands it to the kernel,
    so no READ reaches the daemon. Failed before: the first opens' reads came as READs and a scan
    fetched the rest on the pool's threads (its fetches cost the daemon more than the opens)."""
    files = make_files(src)
    with mounted(src, mnt, options=["fuse.passthrough=off", f"fuse.attr_timeout={TRUST}"]) as m:
        before = requests(m)
        for name in sorted(files):
            assert read_fd(mnt / "d" / name) == (files[name], len(files[name]))
        after, c = requests(m), counters(m)
        assert after.get("read", 0) == before.get("read", 0), (before, after)
        assert c["opens_handed"] == len(files)
        assert c["bytes_handed"] == sum(len(v) for v in files.values())
        assert c["small_file_scans"] == 0 and c["small_file_scan_files"] == 0
        # the second pass: the kernel's pages, no READ and no second handover
        for name in sorted(files):
            assert read_fd(mnt / "d" / name) == (files[name], len(files[name]))
        assert requests(m).get("read", 0) == before.get("read", 0)
        assert counters(m)["opens_handed"] == len(files)
        # a name replaced (another size): the open after the kernel's attributes expired reads the new
        # version at the open, and hands it over whole
        name = sorted(files)[5]
        new = version_bytes(700, len(files[name]) + PAGE + 3)
        tmp = src / "d" / (name + ".tmp")
        tmp.write_bytes(new)
        os.replace(tmp, src / "d" / name)
        time.sleep(PAST)
        assert read_fd(mnt / "d" / name) == (new, len(new))
        assert counters(m)["opens_handed"] == len(files) + 1


def test_local_scans_on_scans_a_fast_local_source(src: Path, mnt: Path) -> None:
    """``readahead.local_scans`` brings the scans back on such a source (what the other tests here use)."""
    files = make_files(src)
    with mounted(src, mnt, options=["fuse.passthrough=off", "readahead.local_scans=true"]) as m:
        scanned(src, mnt, m, files)
        assert counters(m)["small_file_scans"] >= 1
        for name in sorted(files):
            assert read_fd(mnt / "d" / name) == (files[name], len(files[name]))
