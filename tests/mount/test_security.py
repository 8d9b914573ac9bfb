"""What another user of an ``allow_other`` mount may warm and see (issue 12 findings 3 and 5).

The mount is made by root in a directory every user can traverse (:func:`asuser.shared_dir`); the
unprivileged side runs as ``nobody`` in a forked child (:func:`asuser.run_as`). The tree mixes
files and directories that user may and may not read; what the daemon fetched on the user's
behalf is checked by root afterwards, byte counts and the cache's own report per file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from asuser import NOBODY, NOGROUP, ChildError, run_as, shared_dir
from conftest import SERVED, mounted, rand_bytes, run_cli

KIB = 1024
GROUP = 4242  # a group nobody is given as a supplementary group in some cases
# Bound on a warm job finishing (the tree is small and local).
JOB_BOUND = 60.0

# relative path -> (size, mode, uid, gid); directories have size None
TREE: dict[str, tuple[int | None, int, int, int]] = {
    "public": (None, 0o755, 0, 0),
    "public/a.bin": (100 * KIB, 0o644, 0, 0),
    "public/closed.bin": (50 * KIB, 0o600, 0, 0),
    "secret": (None, 0o700, 0, 0),
    "secret/s.bin": (200 * KIB, 0o644, 0, 0),
    "group": (None, 0o750, 0, GROUP),
    "group/g.bin": (30 * KIB, 0o640, 0, GROUP),
    "search_only": (None, 0o711, 0, 0),
    "search_only/hidden.bin": (40 * KIB, 0o644, 0, 0),
    "mine.bin": (10 * KIB, 0o600, NOBODY, NOGROUP),
}


def _readable(with_group: bool) -> set[str]:
    base = {"public/a.bin", "mine.bin"}
    return base | {"group/g.bin"} if with_group else base


@pytest.fixture
def shared_mount() -> Iterator[tuple[Path, object, dict[str, bytes]]]:
    with shared_dir() as base:
        src, mnt = base / "src", base / "mnt"
        src.mkdir(mode=0o755)
        mnt.mkdir(mode=0o755)
        data: dict[str, bytes] = {}
        for i, (rel, (size, _mode, _uid, _gid)) in enumerate(TREE.items()):
            path = src / rel
            if size is None:
                path.mkdir()
            else:
                data[rel] = rand_bytes(size, 700 + i)
                path.write_bytes(data[rel])
        for rel, (_size, mode, uid, gid) in sorted(TREE.items(), key=lambda kv: -kv[0].count("/")):
            os.chown(src / rel, uid, gid)
            os.chmod(src / rel, mode)
        with mounted(src, mnt, options=["allow_other", "readahead.learn=false", SERVED]) as m:
            yield mnt, m, data


def _warm_as(mnt: Path, target: Path, groups: tuple[int, ...] = ()) -> dict:
    """As nobody: ask for a warm of *target* and wait for its final report (an older daemon answered
    synchronously with its summary: that answer is returned as it is)."""

    def warm() -> dict:
        answer = json.loads(os.getxattr(target, "user.fastfs.warm"))
        if "job" not in answer:
            return answer
        deadline = time.monotonic() + JOB_BOUND
        while time.monotonic() < deadline:
            report = json.loads(os.getxattr(mnt, f"user.fastfs.warm.{answer['job']}"))
            if report["done"]:
                return report
            time.sleep(0.02)
        raise TimeoutError("warm job did not finish")

    return run_as(warm, groups=groups, timeout=JOB_BOUND + 30)


def _fetched(m) -> int:
    c = m.stats()["counters"]
    return c["bytes_fetched_prefetch"] + c["bytes_fetched_demand"] + c["bytes_fetched_warm"]


def _cached(mnt: Path, rel: str) -> int:
    return json.loads(os.getxattr(mnt / rel, "user.fastfs.cached"))["cached"]


@pytest.mark.parametrize("with_group", [False, True], ids=["no-group", "supplementary-group"])
def test_warm_by_another_user_touches_only_what_it_may_read(shared_mount, with_group: bool) -> None:
    mnt, m, data = shared_mount
    readable = _readable(with_group)
    before = _fetched(m)
    report = _warm_as(mnt, mnt, groups=(GROUP,) if with_group else ())
    fetched = _fetched(m) - before
    # nothing the user could not read was fetched on its behalf (the daemon reads as root)
    assert fetched == sum(len(data[r]) for r in readable), (fetched, report)
    for rel in data:
        assert _cached(mnt, rel) == (len(data[rel]) if rel in readable else 0), rel
    # the report counts only those files: no count or size of the others
    assert report["files_total"] == report["files_done"] == len(readable), report
    assert report["bytes_total"] == report["bytes_done"] == sum(len(data[r]) for r in readable)
    # closed.bin, secret/, search_only/ (and group/ without the group) were seen and skipped
    assert report["skipped"] == (3 if with_group else 4), report
    assert report["failed"] == 0 and report["done"]
    # what it may read is now served from RAM, byte-exact
    for rel in readable:
        if rel != "mine.bin":
            assert (mnt / rel).read_bytes() == data[rel]


def test_warm_of_a_path_the_user_may_not_read_is_refused(shared_mount) -> None:
    mnt, m, _data = shared_mount
    for target in (mnt / "secret", mnt / "public" / "closed.bin", mnt / "search_only"):
        before = _fetched(m)
        with pytest.raises(ChildError) as info:
            _warm_as(mnt, target)
        assert info.value.errno == 13, info.value  # EACCES
        assert _fetched(m) == before
    # a file in a directory it may search but not list can still be warmed by name, like an open
    report = _warm_as(mnt, mnt / "search_only" / "hidden.bin")
    assert report["files_done"] == 1 and report["bytes_done"] == 40 * KIB


def test_cache_report_and_evict_follow_the_same_rules(shared_mount) -> None:
    mnt, _m, data = shared_mount
    r = run_cli("warm", mnt, timeout=120)
    assert r.returncode == 0, r.stderr

    def ask(rel: str, name: str):
        try:
            return json.loads(os.getxattr(mnt / rel, name))
        except OSError as e:
            return e.errno

    assert run_as(lambda: ask("public/a.bin", "user.fastfs.cached")) == {"size": 100 * KIB, "cached": 100 * KIB}
    assert run_as(lambda: ask("public/closed.bin", "user.fastfs.cached")) == 13
    assert run_as(lambda: ask("public/closed.bin", "user.fastfs.evict")) == 13
    assert _cached(mnt, "public/closed.bin") == len(data["public/closed.bin"])  # not evicted
    assert run_as(lambda: ask("mine.bin", "user.fastfs.evict")) == {"size": 10 * KIB, "evicted": 10 * KIB}
    assert _cached(mnt, "mine.bin") == 0


def test_warm_jobs_are_private_to_their_caller(shared_mount) -> None:
    mnt, _m, _data = shared_mount
    job = json.loads(os.getxattr(mnt / "secret", "user.fastfs.warm"))["job"]

    def peek() -> int:
        try:
            os.getxattr(mnt, f"user.fastfs.warm.{job}")
        except OSError as e:
            return e.errno
        return 0

    assert run_as(peek) == 61  # ENODATA: no such job for this user
    assert json.loads(os.getxattr(mnt, f"user.fastfs.warm.{job}"))["job"] == job


def test_stats_show_other_users_no_paths(shared_mount) -> None:
    """Issue 12 finding 5: the stats file and xattr listed the top files' paths and the source path
    to every user; now only the mounting user and root see them."""
    mnt, m, data = shared_mount
    assert run_cli("warm", mnt, timeout=120).returncode == 0  # every file is now in the top table
    full = m.stats()
    assert any(row["path"] == "/secret/s.bin" for row in full["top_files"]), full["top_files"]
    assert full["mount"]["source"] == str(m.src)

    def look() -> list[str]:
        with open(mnt / ".fastfs" / "stats", "rb") as f:
            by_file = f.read().decode()
        return [by_file, os.getxattr(mnt, "user.fastfs.stats").decode()]

    for text in run_as(look):
        snap = json.loads(text)
        assert snap["redacted"] is True and snap["top_files"] == []
        assert "source" not in snap["mount"] and snap["mount"]["mountpoint"] == str(mnt)
        assert snap["counters"]["bytes_fetched_warm"] >= sum(len(d) for d in data.values())  # warmed before
        for rel in data:
            assert os.path.basename(rel) not in text, rel
        assert str(m.src) not in text
    result = run_cli("stats", mnt, "--top", "3")
    assert "/secret/s.bin" in result.stdout  # root still sees everything
