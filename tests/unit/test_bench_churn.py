"""The churn benchmark's own checks (benchmarks/bench_churn.py), without a mount: a read is judged
by its stamps alone, so a wrong verdict would hide wrong bytes."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import bench_churn  # noqa: E402
from bench_churn import PAGE, check_stamped, stamped  # noqa: E402


def test_one_version_whole_is_right() -> None:
    for size in (100, PAGE, 3 * PAGE + 7, 400_000):  # (the last page shorter than the stamp, too)
        assert check_stamped("d1/f2.bin", stamped("d1/f2.bin", 7, size)) is None


def test_a_read_cut_short_is_wrong() -> None:
    data = stamped("d1/f2.bin", 7, 400_000)
    assert check_stamped("d1/f2.bin", data[:3000]) == "3000 bytes of a version of 400000"


def test_a_mix_of_two_versions_of_one_size_is_wrong() -> None:
    old, new = stamped("d1/f2.bin", 7, 5 * PAGE), stamped("d1/f2.bin", 8, 5 * PAGE)
    assert check_stamped("d1/f2.bin", new[: 2 * PAGE] + old[2 * PAGE :]) == "a mix of versions"


def test_another_files_bytes_are_wrong() -> None:
    assert check_stamped("d1/f2.bin", stamped("d1/f3.bin", 7, 9000)) == "the stamp of d1/f3.bin"
    assert check_stamped("d1/f2.bin", b"") == "empty"


def test_the_tree_writer_renames_whole_files_into_place(tmp_path) -> None:
    writer = bench_churn.TreeWriter(str(tmp_path), 3)
    writer.fill("d0")
    for _ in range(20):
        writer.step()
    assert writer.errors == []
    for d, _dirs, files in os.walk(tmp_path):
        for f in files:
            path = os.path.join(d, f)
            rel = os.path.relpath(path, tmp_path).replace(".old/", "/", 1)
            assert not f.startswith(".")  # no temporary name left behind
            with open(path, "rb") as fh:
                assert check_stamped(rel, fh.read()) is None


def test_a_mapped_read_is_made_apart_and_returns_the_whole_file(tmp_path) -> None:
    path = tmp_path / "f"
    data = stamped("f", 1, 3 * PAGE + 5)
    path.write_bytes(data)
    with open(path, "rb") as f:
        assert bench_churn.read_open(f, True) == data
    path.write_bytes(b"")
    with open(path, "rb") as f:
        assert bench_churn.read_open(f, True) == b""
