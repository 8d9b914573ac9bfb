"""The close-to-open bound ``fuse.revalidate`` and the metadata economy of listings (issues 21, 22) on
real mounts: a file a scan fetched and that changed at the source is read in its new version by a new
open within the bound although ``attr_timeout`` is 60 s; a listing of a network source asks the
source no stat per entry (the emulator counts what it is asked)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from conftest import SERVED, mounted, wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from latency_fs import Behaviour, emulated  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")

N = 24
SIZE = 3000
# A new open this long after the change must see it (fuse.revalidate 1 s, the default).
AFTER = 1.5


def body(i: int, version: int = 0) -> bytes:
    return bytes([(i * 7 + version * 31 + k) % 251 for k in range(SIZE)])


def route_option(route: str) -> str:
    return "fuse.passthrough=on" if route == "passthrough" else SERVED


@pytest.mark.parametrize("route", ["passthrough", "served"])
@pytest.mark.parametrize("change", ["replaced", "in_place"])
def test_a_changed_file_is_read_anew_within_the_bound_not_attr_timeout(
    src: Path, mnt: Path, route: str, change: str
) -> None:
    """``replaced``: a new file renamed over it (its directory changes: seen with the default
    settings); ``in_place``: the same inode rewritten with a new mtime (its directory does not
    change: seen with ``fuse.trust_unchanged_dirs`` off, the setting's documented trade)."""
    d = src / "d"
    d.mkdir()
    for i in range(N):
        (d / f"f{i:02d}").write_bytes(body(i))
    options = [route_option(route), "fuse.attr_timeout=60,fuse.entry_timeout=60"]
    if change == "in_place":
        options.append("fuse.trust_unchanged_dirs=false")
    target = d / f"f{N - 1:02d}"
    with mounted(src, mnt, options=options) as m:
        for i in range(4):  # a scan of the directory starts and fetches the rest
            assert (mnt / "d" / f"f{i:02d}").read_bytes() == body(i)
        if route == "served":
            scanned = lambda: m.stats()["counters"].get("small_file_scan_files", 0) >= N - 4  # noqa: E731
            assert wait_for(scanned, 30)
        assert (mnt / "d" / target.name).stat().st_size == SIZE  # the kernel holds the name now
        if change == "replaced":
            tmp = d / ".tmp"
            tmp.write_bytes(body(N - 1, version=1))
            os.rename(tmp, target)
        else:
            st = os.stat(target)
            with open(target, "r+b") as f:
                f.write(body(N - 1, version=1))
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        time.sleep(AFTER)
        assert (mnt / "d" / target.name).read_bytes() == body(N - 1, version=1)
        for i in range(4, N - 1):  # the others: their versions, unchanged
            assert (mnt / "d" / f"f{i:02d}").read_bytes() == body(i)


def test_a_listing_of_a_network_source_asks_no_stat_per_entry(tmp_path: Path) -> None:
    """os.listdir through fastfs over the emulator (a FUSE source: not local): plain listings, so
    the source is asked its listing and a stat of the directory, not a stat of each of its files."""
    data = tmp_path / "data"
    (data / "d").mkdir(parents=True)
    names = {f"file-{i:04d}" for i in range(300)}
    for name in names:
        (data / "d" / name).write_bytes(b"x")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with (
        emulated(str(data), str(tmp_path / "emu"), behaviour=Behaviour.parse("lat=0.2")) as emu,
        mounted(emu.mnt, mnt, options=[SERVED]) as m,
    ):
        before = emu.counters()
        assert set(os.listdir(mnt / "d")) == names
        after = emu.counters()
        stats = m.stats()
    getattrs = after["getattrs"] - before["getattrs"]
    assert getattrs <= 5, (getattrs, after)
    assert after["readdirs"] > before["readdirs"]
    counters = stats["counters"]
    assert counters["source_stats"] < 10 and counters["source_listings"] >= 1, counters
    requests = stats.get("kernel", {}).get("requests", {})
    assert requests.get("readdirplus", 0) == 0 and requests.get("readdir", 0) >= 1, requests
