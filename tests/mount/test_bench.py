"""``fastfs bench PATH``: file choice and verdict (pure), and real runs on a tiny tree, root and not."""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import tempfile
from pathlib import Path

import pytest
from conftest import fuse_mounts, mounted, rand_bytes, run_cli, tree_digest

from fastfs.daemon.cli import bench

MIB = 1 << 20
SMALL_MAX = MIB
PASS_KEYS = {"seconds", "per_second"}


# -- pure parts ------------------------------------------------------------------------------------
def test_choose_takes_the_largest_file_and_the_fullest_small_directory() -> None:
    files = [
        ("a/big", 50 * MIB),
        ("b/bigger", 80 * MIB),
        ("b/medium", 2 * MIB),
        *[(f"imgs/{i:03d}", 1000 + i) for i in range(30)],
        *[(f"few/{i}", 10) for i in range(10)],
        ("imgs/empty", 0),
    ]
    choice = bench.choose(files, SMALL_MAX, large_bytes=64 * MIB, small_files=20)
    assert choice.large == "b/bigger" and choice.large_bytes == 64 * MIB  # capped by --large-bytes
    assert choice.small_dir == "imgs" and choice.small == tuple(f"imgs/{i:03d}" for i in range(20))
    assert choice.small_bytes == sum(1000 + i for i in range(20))
    assert bench.choose(files, SMALL_MAX, 10**12, 5).large_bytes == 80 * MIB


def test_choose_without_candidates() -> None:
    empty = bench.choose([], SMALL_MAX, MIB, 10)
    assert (empty.large, empty.small_dir, empty.small) == (None, None, ())
    few = bench.choose([(f"d/{i}", 5) for i in range(bench.MIN_SMALL_FILES - 1)], SMALL_MAX, MIB, 10)
    assert few.small == () and few.large is None


@pytest.mark.parametrize(
    ("large", "small", "cold", "expected"),
    [
        (4.1, 6.0, True, "fastfs is 4.1x faster on large files and 6.0x on small files here"),
        (0.8, 0.3, True,
         "this storage is fast locally: fastfs gains nothing here (large files 0.80x, small files 0.30x)"),
        (2.5, 0.9, True, "fastfs is 2.5x faster on large files here; small files: no gain (0.90x)"),
        (None, 3.0, True, "fastfs is 3.0x faster on small files here"),
        (0.5, None, False, "caches were not dropped (--drop-caches, as root, runs the cold passes that decide; "
                           "it empties the page cache of the whole machine); hot passes only: large files 0.50x"),
        (None, None, True, "nothing to compare: no file of a measurable size was found"),
    ],
)  # fmt: skip
def test_verdict(large: float | None, small: float | None, cold: bool, expected: str) -> None:
    assert bench.verdict(large, small, cold) == expected


def test_walk_does_not_follow_symlinks_and_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for i in range(5):
        (tmp_path / "d" / f"f{i}").write_bytes(b"x" * i)
    os.symlink("/etc/passwd", tmp_path / "d" / "link")
    os.symlink("/usr", tmp_path / "dirlink")
    found = dict(bench.walk(str(tmp_path)))
    assert found == {f"d/f{i}": i for i in range(5)}
    assert len(list(bench.walk(str(tmp_path), limit=3))) <= 3


# -- real runs -------------------------------------------------------------------------------------
@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "shards").mkdir(parents=True)
    (root / "shards" / "big.bin").write_bytes(rand_bytes(6 * MIB + 5, 1))
    (root / "images").mkdir()
    for i in range(40):
        (root / "images" / f"{i:03d}.jpg").write_bytes(rand_bytes(3000 + i, 100 + i))
    (root / "README").write_text("a few words\n")
    return root


def _bench_temp_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), bench.TEMP_PREFIX + "*")))


def _check_doc(doc: dict, tree: Path, cold: bool) -> None:
    assert set(doc) == {"path", "root", "caches_dropped", "large", "small", "verdict", "fastfs_stats"}
    assert doc["path"] == str(tree) and doc["caches_dropped"] is cold
    large, small = doc["large"], doc["small"]
    assert large["file"] == "shards/big.bin" and large["unit"] == "bytes" and large["amount"] == 4 * MIB
    assert small["dir"] == "images" and small["unit"] == "files" and small["amount"] == 25
    assert small["bytes"] == sum(3000 + i for i in range(25))
    for entry in (large, small):
        assert set(entry["speedup"]) == {"cold", "hot"}
        for side in ("direct", "fastfs"):
            assert set(entry[side]) == {"cold", "hot"}
            assert set(entry[side]["hot"]) == PASS_KEYS and entry[side]["hot"]["seconds"] > 0
            if cold:
                assert set(entry[side]["cold"]) == PASS_KEYS and entry[side]["cold"]["per_second"] > 0
            else:
                assert entry[side]["cold"] is None
        assert entry["speedup"]["hot"] > 0
        assert (entry["speedup"]["cold"] is not None) is cold
    assert isinstance(doc["verdict"], str) and "\n" not in doc["verdict"]
    assert doc["fastfs_stats"].startswith("requested ")


@pytest.mark.skipif(os.geteuid() != 0, reason="cold passes need root")
def test_bench_on_a_tiny_tree_as_root(tree: Path) -> None:
    before, temps = tree_digest(tree), _bench_temp_dirs()
    result = run_cli(
        "bench", tree, "--json", "--drop-caches", "--large-bytes", "4M", "--small-files", "25", timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # --json: no progress lines
    doc = json.loads(result.stdout)
    _check_doc(doc, tree, cold=True)
    assert doc["root"] is True
    v = doc["verdict"]
    assert v.startswith("fastfs is ") or v.startswith("this storage is fast locally"), v
    assert tree_digest(tree) == before  # nothing under PATH changed
    assert _bench_temp_dirs() == temps  # the temporary mount point, state and log are gone
    assert not any(bench.TEMP_PREFIX in mp for mp, _ in fuse_mounts())


def test_bench_never_drops_caches_unless_asked(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As root too (it dropped the page cache of the whole machine without asking): no cold passes, a
    warm-up, hot passes only, and a verdict that says how to get the cold ones."""

    def no_drop() -> None:
        raise AssertionError("caches must not be dropped")

    monkeypatch.setattr(bench, "drop_caches", no_drop)
    before = tree_digest(tree)
    doc = bench.run(str(tree), large_bytes=4 * MIB, small_files=25)
    _check_doc(doc, tree, cold=False)
    assert doc["verdict"].startswith("caches were not dropped (--drop-caches, as root, runs the cold passes")
    table = bench.format_table(doc)
    assert "caches were not dropped (no --drop-caches)" in table and ", cold" not in table
    assert "large file, hot" in table and "small files, hot" in table
    assert tree_digest(tree) == before
    assert not any(bench.TEMP_PREFIX in mp for mp, _ in fuse_mounts())


def test_bench_table_output_and_a_single_file(tree: Path) -> None:
    target = tree / "shards" / "big.bin"
    doc = bench.run(str(target), large_bytes=2 * MIB)
    assert doc["small"] is None and doc["large"]["file"] == "big.bin" and doc["large"]["amount"] == 2 * MIB
    out = bench.format_table(doc).splitlines()
    assert out[0] == f"fastfs bench {target}"
    assert ["direct", "fastfs", "speedup"] in [line.split() for line in out]
    assert any(line.startswith("large file, hot ") and line.endswith("x") for line in out)
    assert not any(line.startswith("small files") for line in out)
    assert out[-1] == f"verdict: {doc['verdict']}"


def _one_line_error(result, code: int = 1) -> str:
    assert result.returncode == code, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastfs: error: ") and "Traceback" not in result.stderr
    return lines[0]


def test_bench_errors(tmp_path: Path) -> None:
    assert _one_line_error(run_cli("bench", tmp_path / "missing")).endswith("missing does not exist")
    (tmp_path / "empty").mkdir()
    assert "has no file to measure" in _one_line_error(run_cli("bench", tmp_path / "empty"))
    assert "did you mean budget" in _one_line_error(run_cli("bench", tmp_path, "-o", "budgt=1G"))
    assert "expected a size" in _one_line_error(run_cli("bench", tmp_path, "--large-bytes", "lots"), code=2)
    assert "positive" in _one_line_error(run_cli("bench", tmp_path, "--small-files", "0"), code=2)


def test_bench_mount_failure_is_one_line_and_cleans_up(tree: Path) -> None:
    temps = _bench_temp_dirs()
    with pytest.raises(bench.BenchError, match="fastfs mount failed: "):
        bench.run(str(tree), large_bytes=MIB, small_files=10, mount_args=["-o", "cache.block_size=3M"])
    assert _bench_temp_dirs() == temps


def test_cli_main_passes_options_to_the_mount(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_run(path, large_bytes, small_files, mount_args, small_max, progress, drop):
        seen.update(path=path, mount_args=mount_args, small_max=small_max, drop=drop)
        return {"path": path}

    monkeypatch.setattr(bench, "run", fake_run)
    monkeypatch.setattr(bench, "format_table", lambda doc: "table")
    args = argparse.Namespace(
        path=str(tree), large_bytes=MIB, small_files=5, json=False, config=None, profile="training",
        options=["small_file_max=2M"], drop_caches=False,
    )  # fmt: skip
    assert bench.main(args) == 0
    assert seen["mount_args"] == ["--profile", "training", "-o", "small_file_max=2M"] and seen["drop"] is False
    assert seen["small_max"] == 2 * MIB  # the split between the workloads follows the mount's config


def test_bench_shows_progress_per_pass_and_keeps_caches(tree: Path) -> None:
    """The CLI as the user runs it (root here): one line per pass, hot only, caches left alone."""
    result = run_cli("bench", tree, "--large-bytes", "4M", "--small-files", "25", timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    labels = [re.match(r"fastfs bench: \[(\d+)/10\] ([^:]+): (.+)$", line) for line in lines]
    assert all(labels) and [int(m.group(1)) for m in labels] == list(range(1, 11)), lines
    assert [m.group(2) for m in labels] == [
        "direct, large file, warm-up", "direct, large file, hot", "direct, small files, warm-up",
        "direct, small files, hot", "mounting fastfs", "fastfs, large file, warm-up", "fastfs, large file, hot",
        "fastfs, small files, warm-up", "fastfs, small files, hot", "verifying the bytes read through fastfs",
    ]  # fmt: skip
    assert re.fullmatch(r"\d+\.\d\d s, [\d.]+ (B|KiB|MiB|GiB)/s", labels[1].group(3))
    assert re.fullmatch(r"\d+\.\d\d s, [\d,]+ files/s", labels[3].group(3))
    assert "caches were not dropped (no --drop-caches)" in result.stdout


def test_bench_refuses_a_path_on_a_fastfs_mount(tree: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(tree, mnt):
        for path in (mnt, mnt / "images"):
            line = _one_line_error(run_cli("bench", path))
            assert line == (
                f"fastfs: error: {path} is on the fastfs mount {mnt}: fastfs over fastfs measures nothing; bench the"
                f" storage under it ({tree})"
            )


def test_drop_caches_needs_root() -> None:
    from asuser import run_as, shared_dir

    with shared_dir() as base:
        (base / "f.bin").write_bytes(b"x" * 4096)

        def as_nobody() -> str:
            try:
                bench.run(str(base), drop=True)
            except bench.BenchError as e:
                return str(e)
            return "ran"

        assert run_as(as_nobody) == "--drop-caches needs root (it writes /proc/sys/vm/drop_caches)"
