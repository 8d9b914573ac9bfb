"""benchmarks/figure.py turns a bench_matrix.py JSON into a valid SVG naming every storage and bar."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import figure  # noqa: E402

NS = {"svg": "http://www.w3.org/2000/svg"}
SVG = "{http://www.w3.org/2000/svg}"


def cell(storage: str, workload: str, direct: float | None, fastfs: float | None, error: str | None = None) -> dict:
    return {
        "workload": workload,
        "behaviour": storage,
        "direct": {"median": direct, "error": error},
        "fastfs": {"median": fastfs, "error": None},
    }


DOC = {
    "command": "python benchmarks/bench_matrix.py --scale 0.05 --runs 3 --json out.json",
    "scale": 0.05,
    "runs": 3,
    "storages": {"nfs": "emulator: 1.5 ms <&> per request", "s3": "emulator: 5 ms"},
    "cells": [
        cell("nfs", "npy", 2.0, 1.0),
        cell("nfs", "small_shuffled", 6.0, 1.0),
        cell("s3", "npy", 1.0, 2.0),
        cell("s3", "small_shuffled", None, None, error="storage: OSError: gone"),
    ],
}


def bars(root: ET.Element) -> dict[tuple[str, str], ET.Element]:
    return {(g.get("data-storage"), g.get("data-workload")): g for g in root.iter(SVG + "g") if g.get("data-workload")}


def texts(element: ET.Element) -> list[str]:
    return [t.text or "" for t in element.iter(SVG + "text")]


def test_a_small_json_makes_a_valid_svg_naming_each_row():
    root = ET.fromstring(figure.render_svg(DOC))
    assert root.tag == SVG + "svg"
    every = texts(root)
    assert "nfs" in every and "s3" in every  # one titled group per storage
    assert "emulator: 1.5 ms <&> per request" in every  # escaped, parsed back
    found = bars(root)
    assert set(found) == {("nfs", "npy"), ("nfs", "small_shuffled"), ("s3", "npy"), ("s3", "small_shuffled")}
    for (_, workload), g in found.items():
        assert workload in texts(g)
    assert "2.0x" in texts(found["nfs", "npy"]) and "6.0x" in texts(found["nfs", "small_shuffled"])
    assert "0.5x" in texts(found["s3", "npy"])
    failed = found["s3", "small_shuffled"]
    assert "failed" in texts(failed) and failed.find("svg:rect", NS) is None
    assert any(DOC["command"] in t for t in every)  # the caption names the command


def test_a_long_command_is_wrapped_never_cut():
    command = "python benchmarks/bench_matrix.py " + " ".join(f"--option-{i} value-{i}" for i in range(40))
    root = ET.fromstring(figure.render_svg({**DOC, "command": command}))
    lines = [t.text for t in root.iter(SVG + "text") if t.get("class") == "caption"]
    assert len(lines) > 1 and " ".join(lines) == f"data: {command}"
    assert float(root.get("height")) >= max(float(t.get("y")) for t in root.iter(SVG + "text"))


def test_bars_grow_with_the_speedup_on_both_sides_of_one():
    root = ET.fromstring(figure.render_svg(DOC))
    found = bars(root)

    def rect(key):
        r = found[key].find("svg:rect", NS)
        return float(r.get("x")), float(r.get("width"))

    (x2, w2), (x6, w6), (xh, wh) = rect(("nfs", "npy")), rect(("nfs", "small_shuffled")), rect(("s3", "npy"))
    one = figure.Axis.around([2.0, 6.0, 0.5]).x(1)
    assert x2 == pytest.approx(one, abs=0.1) and x6 == pytest.approx(one, abs=0.1)
    assert w6 > w2 > 0
    assert xh + wh == pytest.approx(one, abs=0.1)  # a slowdown is drawn left of 1x
    assert wh == pytest.approx(w2, abs=0.2)  # log scale: 0.5x as long as 2x


def test_order_labels_and_unknown_names():
    svg = figure.render_svg(DOC, storages=["s3", "nfs"], workloads=["small_shuffled"], labels={"nfs": "NFS-like"})
    root = ET.fromstring(svg)
    assert set(bars(root)) == {("s3", "small_shuffled"), ("nfs", "small_shuffled")}
    every = texts(root)
    assert "NFS-like" in every and every.index("s3") < every.index("NFS-like")
    with pytest.raises(SystemExit, match="no storage gcs"):
        figure.render_svg(DOC, storages=["gcs"])
    with pytest.raises(SystemExit, match="no cells"):
        figure.render_svg({"cells": []})


def test_the_command_line_writes_the_file(tmp_path):
    results, out = tmp_path / "r.json", tmp_path / "speedup.svg"
    results.write_text(json.dumps(DOC))
    script = ROOT / "benchmarks" / "figure.py"
    help_text = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, check=True).stdout
    assert "bench_matrix.py --json" in help_text and "docs/speedup.svg" in help_text
    subprocess.run([sys.executable, script, results, "-o", out], check=True)
    assert set(bars(ET.parse(out).getroot())) == set(bars(ET.fromstring(figure.render_svg(DOC))))


def test_the_committed_figure_parses_and_names_its_data():
    root = ET.parse(ROOT / "docs" / "speedup.svg").getroot()
    assert bars(root), "docs/speedup.svg has no bars"
    assert any("bench_matrix.py" in t for t in texts(root))
