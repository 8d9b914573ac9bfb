"""bench_floor.py and its helpers: request counts per operation, the libfuse reference, one whole run.

The reference daemon (libfuse's ``passthrough_ll`` example) is built at run time from the system's
libfuse3-dev; where that package or gcc is missing the tests that need it are skipped (``make
system-deps`` installs them). The build goes to a temporary cache directory, never the default one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import bench_floor  # noqa: E402
from benchkit import libfuse  # noqa: E402
from benchkit.fsstats import fmt_requests, requests_per_op  # noqa: E402
from benchkit.perop import PAGE, page_offsets  # noqa: E402
from benchkit.system import MOUNT_ROOT, is_mounted  # noqa: E402

needs_fuse = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")


def _reference(cache: str) -> str:
    try:
        return libfuse.reference_binary(None, None, cache)[0]
    except libfuse.ReferenceUnavailableError as e:
        pytest.skip(str(e))


def test_requests_per_op_diffs_orders_and_leaves_out_the_probe():
    before = {"open": 10, "getxattr": 3, "read": 4}
    after = {"open": 30, "release": 20, "getxattr": 5, "lookup": 10, "read": 4, "forget": 2}
    per_op = requests_per_op(before, after, 20)
    assert per_op == {"lookup": 0.5, "open": 1.0, "release": 1.0, "forget": 0.1}
    assert list(per_op) == ["lookup", "open", "release", "forget"]  # a file's life first, then by name
    assert fmt_requests(per_op) == "lookup 0.5, open 1, release 1, forget 0.1"
    assert fmt_requests({"read": 10.0, "open": 0.004}) == "read 10, open <0.01"
    assert fmt_requests({}) == "none"
    assert fmt_requests(None) == "-"


def test_page_offsets_are_distinct_aligned_pages():
    offsets = page_offsets(64 * PAGE, 64)
    assert sorted(offsets) == [i * PAGE for i in range(64)]
    assert offsets != sorted(offsets)  # random order
    assert page_offsets(64 * PAGE, 10) == page_offsets(64 * PAGE, 10)  # seeded
    with pytest.raises(ValueError):
        page_offsets(64 * PAGE, 65)


def test_bad_reference_options_are_one_line_errors(tmp_path):
    with pytest.raises(libfuse.ReferenceUnavailableError, match="no passthrough_ll.c"):
        libfuse.reference_binary(None, str(tmp_path), str(tmp_path / "cache"))
    (tmp_path / "x").write_text("")
    with pytest.raises(libfuse.ReferenceUnavailableError, match="not an executable"):
        libfuse.reference_binary(str(tmp_path / "x"), None, str(tmp_path / "cache"))
    with pytest.raises(SystemExit, match="bench_floor: --libfuse-src"):
        bench_floor.main(["--libfuse-src", str(tmp_path), "--cache-dir", str(tmp_path / "cache")])


@needs_fuse
def test_reference_mount_serves_the_source_and_goes_away(tmp_path):
    binary = _reference(str(tmp_path / "cache"))
    assert _reference(str(tmp_path / "cache")) == binary  # cached by the hash of source and flags
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    (src / "d").mkdir(parents=True)
    data = os.urandom(300_000)
    (src / "d" / "f").write_bytes(data)
    with libfuse.reference_mount(binary, str(src), str(mnt)) as root:
        assert is_mounted(root)
        assert (mnt / "d" / "f").read_bytes() == data
        assert os.listdir(mnt / "d") == ["f"]
    assert not is_mounted(str(mnt))
    assert os.listdir(mnt) == []


@needs_fuse
def test_one_round_measures_every_contender(tmp_path, capsys):
    cache = str(tmp_path / "cache")
    _reference(cache)
    out = tmp_path / "floor.json"
    args = ["--runs", "1", "--files", "20", "--stream-mib", "4", "--dir", str(tmp_path / "data")]
    rc = bench_floor.main([*args, "--cache-dir", cache, "--label", "rev", "--json", str(out)])
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert (rc, doc["errors"]) == (0, [])
    for key, title in doc["contenders"].items():
        rows = ("pass1", "pass2") if key == "training" else ("open", "pass1", "pass2", "read4k", "stream")
        assert set(doc["medians"][key]) == set(rows), key
        assert all(v is not None and v > 0 for v in doc["medians"][key].values()), (key, doc["medians"][key])
        if key in ("default", "served", "training"):
            assert title.startswith("rev "), title
            assert set(doc["requests"][key]) == set(rows), key  # counted through the stats xattr
    assert "| first pass over 20 files of 3 KiB (open, read, close) |" in printed
    assert "libfuse C example (`-o cache=always`)" in printed
    with open("/proc/self/mountinfo") as f:
        assert MOUNT_ROOT not in f.read()  # every contender unmounted


def _probe_hop(tmp_path):
    """probe_hop (imported) and a built reference's cache directory; skips without sshfs."""
    from benchkit import netsources

    if any(shutil.which(t) is None and not os.path.exists(t) for t in ("sshfs", netsources.SSHD, "unshare")):
        pytest.skip("sshfs is not installed (make bench-deps)")
    cache = str(tmp_path / "cache")
    _reference(cache)
    import probe_hop

    return probe_hop, cache


@needs_fuse
def test_probe_hop_reads_over_sshfs_through_the_reference_and_fastfs(tmp_path, capsys):
    """probe_hop.py's whole run, small: sshfs to a loopback sshd, libfuse's example and fastfs over it;
    it prints a time per contender and how many reads fastfs's loop answered, and leaves no mount."""
    probe_hop, cache = _probe_hop(tmp_path)
    assert probe_hop.main(["--count", "40", "--rounds", "1", "--mib", "4", "--cache-dir", cache]) == 0
    out = capsys.readouterr().out
    for name in ("direct", "libfuse", "fastfs"):
        assert f"  {name} " in out, out
    assert "answered" in out and "of 40 reads itself" in out, out
    with open("/proc/self/mounts") as f:
        assert "probe-hop." not in f.read()  # its three mounts are gone


@needs_fuse
def test_probe_hop_small_files_reads_them_through_every_contender(tmp_path, capsys):
    """probe_hop.py --small: a parallel cold pass over small files on sshfs, libfuse's example and
    fastfs; each prints its time and the requests sftp-server answered, and no mount is left."""
    probe_hop, cache = _probe_hop(tmp_path)
    assert probe_hop.main(["--small", "30", "--threads", "4", "--rounds", "1", "--cache-dir", cache]) == 0
    out = capsys.readouterr().out
    assert "4 threads over 30 files of 3 KiB" in out, out
    for name in ("direct", "libfuse", "fastfs"):
        line = next(x for x in out.splitlines() if x.startswith(f"  {name} "))
        requests = int(line.rsplit("sftp requests ", 1)[1])
        assert 30 <= requests < 200, line  # every file reached the server, through every contender
    with open("/proc/self/mounts") as f:
        assert "probe-hop." not in f.read()
