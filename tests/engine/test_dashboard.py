"""contrib/grafana/fastfs.json, README.md and docs/ use only metric and label names the daemon exports.

The exported names come from a real scrape: an engine with a disk tier reads a few files (so every
family, the histograms and the disk tier's included, has samples), its snapshot goes through the
daemon's registry, and the text
is parsed with prometheus-client's parser. Every metric name in a panel's query, and every label
the queries select, group or template on, must be among them; so must every ``fastfs_*`` name the
user documentation mentions (README.md and docs/*.md: the metrics and alert examples of
docs/operations.md, the disk tier's names in docs/disk-tier.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fastfs.config import load_config
from fastfs.daemon import metrics
from fastfs.fsio.engine import Engine

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "contrib" / "grafana" / "fastfs.json"
# The user documentation whose metric names must exist.
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# fastfs_* words of the documentation that are not metric names.
NOT_METRICS = {"fastfs_stats"}  # a key of `fastfs bench --json`
MIB = 1 << 20
METRIC_RE = re.compile(r"\b(fastfs_[a-z0-9_]+|process_[a-z0-9_]+)\b")
SELECTOR_LABEL_RE = re.compile(r"\{([^}]*)\}")
GROUP_RE = re.compile(r"\bby \(([^)]*)\)")
# Labels Prometheus adds to every scraped sample (the target's), not exported by the daemon.
SCRAPE_LABELS = {"instance", "job"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], set[str]]:
    """(sample names, label names) of a real scrape."""
    tmp = tmp_path_factory.mktemp("dash")
    src = tmp / "src"
    src.mkdir()
    (src / "big").write_bytes(bytes(range(256)) * (12 * MIB // 256))
    for i in range(6):
        (src / f"s{i}").write_bytes(b"x" * 3000)
    config = load_config(
        overrides={"cache.budget": "64M", "state.dir": str(tmp / "state"), "cache.disk_dir": str(tmp / "disk")},
        use_default_path=False,
    )
    engine = Engine(str(src), config)
    try:
        for name in ("big", *(f"s{i}" for i in range(6))):
            fh = engine.open("/" + name).fh
            offset = 0
            while chunk := engine.read(fh, offset, MIB):
                offset += len(chunk)
            engine.release(fh)
        engine.stats.error("EIO")  # what a failed source read counts: the errors family gets a sample
        text = generate_latest(metrics.make_registry(lambda: engine.snapshot(10), "/mnt/x")).decode()
    finally:
        engine.close()
    names, labels = set(), set()
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            names.add(sample.name)
            labels.update(sample.labels)
    return names, labels


def _strings(node: object, key: str) -> list[str]:
    """Every string value stored under *key* anywhere in a JSON document."""
    found: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, str):
                found.append(v)
            found += _strings(v, key)
    elif isinstance(node, list):
        for v in node:
            found += _strings(v, key)
    return found


def _queries(dashboard: dict) -> list[str]:
    return _strings(dashboard.get("panels", []), "expr") + _strings(dashboard.get("templating", {}), "query")


def test_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    panels = dashboard["panels"]
    assert len(panels) >= 8 and len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["title"] and panel["targets"] and panel["gridPos"]["w"] <= 24
        assert all(t["expr"] and t["refId"] for t in panel["targets"])
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance", "mount"} <= variables


def test_every_query_selects_and_groups_by_host() -> None:
    """Without an instance variable, `sum by (mount)` merged every host that mounts /mnt/fast (issue 26)."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = _strings(dashboard.get("panels", []), "expr")
    assert panels
    for query in panels:
        for selector in SELECTOR_LABEL_RE.findall(query):
            assert 'instance=~"$instance"' in selector and 'mount=~"$mount"' in selector, query
        for group in GROUP_RE.findall(query):
            assert "instance" in [x.strip() for x in group.split(",")], query
    for legend in _strings(dashboard["panels"], "legendFormat"):
        assert "{{instance}}" in legend, legend
    (mount,) = [v for v in dashboard["templating"]["list"] if v["name"] == "mount"]
    assert 'instance=~"$instance"' in mount["query"]["query"]


def test_dashboard_uses_only_exported_metric_names(exported: tuple[set[str], set[str]]) -> None:
    names, _ = exported
    dashboard = json.loads(DASHBOARD.read_text())
    used = {m for q in _queries(dashboard) for m in METRIC_RE.findall(q)}
    assert used, "the dashboard queries no fastfs metric"
    unknown = used - names
    assert not unknown, f"not exported by the daemon: {sorted(unknown)}"
    # the main families are all shown
    for family in (
        "fastfs_requested_bytes_total",
        "fastfs_fetched_bytes_total",
        "fastfs_cache_bytes",
        "fastfs_cache_budget_bytes",
        "fastfs_source_read_duration_seconds_bucket",
        "fastfs_patterns_total",
        "fastfs_source_errors_total",
        "fastfs_disk_cache_bytes",
        "fastfs_disk_cache_budget_bytes",
        "fastfs_disk_hit_bytes_total",
        "fastfs_disk_written_bytes_total",
        "fastfs_disk_evictions_total",
    ):
        assert family in used, family


def test_dashboard_uses_only_exported_labels(exported: tuple[set[str], set[str]]) -> None:
    _, labels = exported
    labels = labels | {"le"} | SCRAPE_LABELS
    dashboard = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    for query in _queries(dashboard):
        for selector in SELECTOR_LABEL_RE.findall(query):
            used.update(m.group(1) for m in re.finditer(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", selector))
        for group in GROUP_RE.findall(query):
            used.update(x.strip() for x in group.split(",") if x.strip())
        used.update(re.findall(r"label_values\(\s*[a-z_]+\s*,\s*([a-z_]+)\s*\)", query))
    legends = {m for f in _strings(dashboard["panels"], "legendFormat") for m in re.findall(r"\{\{(\w+)\}\}", f)}
    assert "mount" in used
    unknown = (used | legends) - labels
    assert not unknown, f"labels the daemon does not export: {sorted(unknown)}"


def test_the_name_check_catches_a_typo(exported: tuple[set[str], set[str]]) -> None:
    names, _ = exported
    assert "fastfs_requested_bytes_total" in names
    assert not {m for m in METRIC_RE.findall("rate(fastfs_requested_byts_total[5m])")} <= names


def test_docs_name_only_exported_metrics(exported: tuple[set[str], set[str]]) -> None:
    names, _ = exported
    # a histogram is also named by its family (fastfs_x_seconds for fastfs_x_seconds_bucket)
    families = names | {n.rsplit("_", 1)[0] for n in names if n.endswith(("_bucket", "_sum", "_count"))}
    mentioned = {
        (doc.name, m)
        for doc in DOCS
        for m in METRIC_RE.findall(doc.read_text())
        if m not in NOT_METRICS and not m.endswith("_")  # fastfs_disk_* names a family of names
    }
    assert {m for _, m in mentioned} >= {"fastfs_opens_total", "fastfs_read_timeouts_total"}, "docs lost their names"
    unknown = sorted((doc, m) for doc, m in mentioned if m not in families)
    assert not unknown, f"documented but not exported: {unknown}"
