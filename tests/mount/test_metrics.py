"""The Prometheus endpoint: the collector on fake snapshots, the server, and a real mount's /metrics.

Scrapes are parsed with prometheus-client's own text parser, so the tests check what Prometheus
would ingest (names, types, labels, cumulative histogram buckets), not the text layout.
"""

from __future__ import annotations

import os
import random
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import SERVED, mounted, wait_for
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fastfs.daemon import health, metrics
from fastfs.fsio import stats as fstats

MIB = 1 << 20
# Bound on one scrape.
SCRAPE_TIMEOUT = 30


def _parse(text: str) -> dict[str, list]:
    """Family name -> samples (``Sample(name, labels, value, ...)``)."""
    return {fam.name: fam.samples for fam in text_string_to_metric_families(text)}


def _value(fams: dict[str, list], sample_name: str, **labels: str) -> float:
    family = sample_name.removesuffix("_total").removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
    found = [s.value for s in fams[family] if s.name == sample_name and all(s.labels.get(k) == v
                                                                            for k, v in labels.items())]  # fmt: skip
    assert len(found) == 1, (sample_name, labels, fams.get(family))
    return found[0]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT) as r:
        assert r.status == 200
        return r.read().decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FAKE = {
    "version": 1,
    "uptime_seconds": 12.5,
    "started": 1_700_000_000.0,
    "counters": {
        **dict.fromkeys(fstats.COUNTERS, 0),
        fstats.BYTES_REQUESTED: 10 * MIB,
        fstats.BYTES_SERVED_CACHE: 8 * MIB,
        fstats.BYTES_FETCHED_DEMAND: 2 * MIB,
        fstats.BYTES_FETCHED_PREFETCH: 12 * MIB,
        fstats.BYTES_PREFETCH_USED: 8 * MIB,
        fstats.BYTES_PREFETCH_WASTED: 1 * MIB,
        fstats.READ_REQUESTS: 10,
        fstats.PREADS: 7,
        fstats.EVICTIONS: 3,
        fstats.BACKPRESSURE: 2,
        fstats.SEQ_STREAMS: 4,
        fstats.SCANS: 1,
        "future_counter": 5,
    },
    "request_sizes": {"4096": 1, "131072": 0, "1048576": 9, "+Inf": 0},
    "pread_latency": {
        "buckets": {"0.0001": 2, "0.001": 3, "0.01": 0, "1.0": 1, "+Inf": 1},
        "sum_seconds": 3.25,
        "count": 7,
        "p50": 0.001,
        "p95": 1.0,
        "p99": 1.0,
    },
    "errors": {"EIO": 2, "ETIMEDOUT": 1},
    "derived": {"hit_ratio": 0.8, "amplification": 1.4, "prefetch_accuracy": 0.66, "bytes_fetched": 14 * MIB},
    "gauges": {"cache_bytes": 32 * MIB, "cache_budget": 64 * MIB, "open_files": 3, "streams": 2,
               "label_text": "not a number", "flag": True},
    "top_files": [{"path": "/a", "fetched": 1, "delivered": 1, "amplification": 1.0}],
}  # fmt: skip


def test_collector_on_fake_snapshot() -> None:
    text = generate_latest(metrics.make_registry(lambda: FAKE, "/data/x")).decode()
    fams = _parse(text)
    assert _value(fams, "fastfs_requested_bytes_total") == 10 * MIB
    assert _value(fams, "fastfs_cache_hit_bytes_total") == 8 * MIB
    assert _value(fams, "fastfs_fetched_bytes_total", kind="demand") == 2 * MIB
    assert _value(fams, "fastfs_fetched_bytes_total", kind="prefetch") == 12 * MIB
    assert _value(fams, "fastfs_prefetch_used_bytes_total") == 8 * MIB
    assert _value(fams, "fastfs_prefetch_wasted_bytes_total") == 1 * MIB
    assert _value(fams, "fastfs_read_requests_total") == 10
    assert _value(fams, "fastfs_source_reads_total") == 7
    assert _value(fams, "fastfs_cache_evictions_total") == 3
    assert _value(fams, "fastfs_prefetch_declined_total") == 2
    assert _value(fams, "fastfs_patterns_total", pattern="sequential") == 4
    assert _value(fams, "fastfs_patterns_total", pattern="small_file_scan") == 1
    assert _value(fams, "fastfs_patterns_total", pattern="random") == 0
    assert _value(fams, "fastfs_source_errors_total", errno="EIO") == 2
    assert _value(fams, "fastfs_source_errors_total", errno="ETIMEDOUT") == 1
    assert {_value(fams, "fastfs_opens_total", route=r) for r in ("served", "passthrough", "disk")} == {0}
    # a counter without an exported name is not exported under a made-up one (it is logged once)
    assert not any("future_counter" in name for name in fams)
    # Histogram buckets are cumulative; +Inf equals the count.
    buckets = {
        s.labels["le"]: s.value for s in fams["fastfs_source_read_duration_seconds"] if s.name.endswith("_bucket")
    }
    assert buckets == {"0.0001": 2, "0.001": 5, "0.01": 5, "1.0": 6, "+Inf": 7}
    assert _value(fams, "fastfs_source_read_duration_seconds_count") == 7
    assert _value(fams, "fastfs_source_read_duration_seconds_sum") == 3.25
    sizes = {s.labels["le"]: s.value for s in fams["fastfs_read_request_size_bytes"] if s.name.endswith("_bucket")}
    assert sizes == {"4096.0": 1, "131072.0": 1, "1.048576e+06": 10, "+Inf": 10}
    assert _value(fams, "fastfs_cache_bytes") == 32 * MIB
    assert _value(fams, "fastfs_cache_budget_bytes") == 64 * MIB
    assert _value(fams, "fastfs_open_files") == 3
    assert _value(fams, "fastfs_streams") == 2
    assert _value(fams, "fastfs_uptime_seconds") == 12.5
    assert _value(fams, "fastfs_start_time_seconds") == 1_700_000_000.0
    assert "fastfs_label_text" not in fams and "fastfs_flag" not in fams
    # Every fastfs sample carries the mount label; the process collector is there too.
    fastfs_samples = [s for name, ss in fams.items() if name.startswith("fastfs_") for s in ss]
    assert fastfs_samples and all(s.labels.get("mount") == "/data/x" for s in fastfs_samples)
    assert "process_resident_memory_bytes" in fams


def test_collector_on_real_stats_and_sparse_snapshot() -> None:
    st = fstats.Stats()
    for size in (4096, MIB, MIB):
        st.request(size, served_from_cache=size // 2)
    for seconds in (2e-5, 3e-3, 20.0):
        st.pread(seconds)
    st.error("EIO")
    fams = _parse(generate_latest(metrics.make_registry(st.snapshot, "m")).decode())
    assert _value(fams, "fastfs_requested_bytes_total") == 4096 + 2 * MIB
    assert _value(fams, "fastfs_cache_hit_bytes_total") == 2048 + MIB
    assert _value(fams, "fastfs_read_requests_total") == 3
    assert _value(fams, "fastfs_source_errors_total", errno="EIO") == 1
    buckets = [s.value for s in fams["fastfs_source_read_duration_seconds"] if s.name.endswith("_bucket")]
    assert buckets == sorted(buckets) and buckets[0] == 1 and buckets[-1] == 3
    assert _value(fams, "fastfs_source_read_duration_seconds_bucket", le="10.0") == 2
    # No gauges in the snapshot: none exported rather than invented zeros.
    assert "fastfs_cache_budget_bytes" not in fams
    # A near-empty snapshot still scrapes.
    fams = _parse(generate_latest(metrics.make_registry(lambda: {"counters": {}}, "m")).decode())
    assert _value(fams, "fastfs_fetched_bytes_total", kind="demand") == 0
    assert "fastfs_source_read_duration_seconds" not in fams


def test_serve_scrape_and_shutdown() -> None:
    calls = []

    def snap() -> dict:
        calls.append(1)
        return FAKE

    server = metrics.serve(snap, "127.0.0.1", 0, "/mnt/y")
    try:
        assert not calls  # nothing is collected before the first scrape
        fams = _parse(_scrape(server.port))
        assert _value(fams, "fastfs_requested_bytes_total", mount="/mnt/y") == 10 * MIB
        _scrape(server.port)
        assert len(calls) == 2  # one snapshot per scrape
    finally:
        server.shutdown()
    server.shutdown()  # idempotent
    with pytest.raises(urllib.error.URLError):
        _scrape(server.port)


def test_serve_port_taken_names_the_setting() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(OSError, match=f"stats.metrics: cannot listen on 127.0.0.1:{port}"):
            metrics.serve(lambda: FAKE, "127.0.0.1", port, "m")


def test_metrics_of_a_real_mount(src: Path, mnt: Path) -> None:
    size = 4 * MIB  # whole pages and FUSE requests: the kernel asks for exactly the file's bytes
    data = random.Random(5).randbytes(size)
    (src / "m.bin").write_bytes(data)
    port = _free_port()
    with mounted(src, mnt, options=[f"stats.metrics=127.0.0.1:{port}", SERVED]) as m:
        before = _parse(_scrape(port))
        assert (mnt / "m.bin").read_bytes() == data
        after = _parse(_scrape(port))
        labels = {s.labels.get("mount") for ss in after.values() for s in ss if s.name.startswith("fastfs_")}
        assert len(labels) == 1 and labels <= {str(mnt), str(Path(mnt).resolve())}, labels
        requested = _value(after, "fastfs_requested_bytes_total") - _value(before, "fastfs_requested_bytes_total")
        assert requested == size
        fetched = sum(_value(after, "fastfs_fetched_bytes_total", kind=k) for k in ("demand", "prefetch"))
        assert fetched >= size
        assert _value(after, "fastfs_read_requests_total") > _value(before, "fastfs_read_requests_total")
        assert _value(after, "fastfs_cache_budget_bytes") > 0
        assert _value(after, "fastfs_source_read_duration_seconds_count") >= 1
        # Same numbers as the stats file (one source of truth).
        assert m.stats()["counters"]["bytes_requested"] == _value(after, "fastfs_requested_bytes_total")
    with pytest.raises(urllib.error.URLError):
        _scrape(port)  # the endpoint stops with the mount


# -- conventions, checked on a real scrape ---------------------------------------------------------------
NAME_RE = re.compile(r"^fastfs_[a-z][a-z0-9_]*[a-z0-9]$")
# Base units: a name that mentions one ends with it (before _total on counters).
UNITS = ("bytes", "seconds")


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=SCRAPE_TIMEOUT) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_every_metric_name_follows_the_prometheus_conventions(src: Path, mnt: Path, tmp_path: Path) -> None:
    """A mount with a disk tier and learned state reads large and small files; every family of its scrape
    has a conventional name and a real HELP text, and every counter and gauge of its snapshot is exported."""
    (src / "big.bin").write_bytes(random.Random(6).randbytes(6 * MIB))
    (src / "small").mkdir()
    for i in range(12):
        (src / "small" / f"{i:02d}.bin").write_bytes(random.Random(i).randbytes(3000))
    port = _free_port()
    options = [f"stats.metrics=127.0.0.1:{port}", SERVED, f"cache.disk_dir={tmp_path / 'disk'}", "readahead.learn=true"]
    with mounted(src, mnt, options=options) as m:
        for path in [mnt / "big.bin", *sorted((mnt / "small").iterdir())]:
            path.read_bytes()
        text = _scrape(port)
        snap = m.stats()
    families = list(text_string_to_metric_families(text))
    ours = [f for f in families if f.name.startswith("fastfs_")]
    assert len(ours) >= 30 and {f.name for f in families} - {f.name for f in ours} <= {
        f.name for f in families if f.name.startswith("process_")
    }
    helps = set()
    for fam in ours:
        name = fam.name
        assert NAME_RE.match(name), name
        assert fam.documentation and not fam.documentation.startswith("Engine "), (name, fam.documentation)
        assert fam.documentation not in helps, f"{name}: HELP copied from another family"
        helps.add(fam.documentation)
        if fam.type == "counter":
            assert not name.endswith("_total")  # the parser's family name; samples carry the suffix
            assert all(sample.name == name + "_total" for sample in fam.samples if sample.name.startswith(name)), name
        else:
            assert not name.endswith("_total"), f"{name}: _total on a {fam.type}"
        for unit in UNITS:
            if f"_{unit}_" in f"{name}_":
                assert name.endswith(f"_{unit}"), f"{name}: the unit {unit} is not the suffix"
        if re.search(r"(^|_)(ratio|accuracy|share)(_|$)", name):
            assert name.endswith("_ratio"), name
        if name.endswith("_ratio"):
            assert all(0 <= sample.value <= 1 for sample in fam.samples), name
    names = {f.name for f in ours}
    for family in ("fastfs_requested_bytes", "fastfs_fetched_bytes", "fastfs_prefetch_used_bytes",
                   "fastfs_learned_accuracy_ratio", "fastfs_opens", "fastfs_opened_file_bytes",
                   "fastfs_disk_writes_refused"):  # fmt: skip
        assert family in names, family
    # nothing of the snapshot is left without a name
    numeric = {k for k, v in snap["counters"].items() if isinstance(v, (int, float))}
    assert numeric <= metrics.MAPPED_COUNTERS, sorted(numeric - metrics.MAPPED_COUNTERS)
    numeric = {k for k, v in snap["gauges"].items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert numeric <= metrics.MAPPED_GAUGES, sorted(numeric - metrics.MAPPED_GAUGES)


def test_healthz_answers_while_the_mount_serves_and_other_urls_are_404(src: Path, mnt: Path, tmp_path: Path) -> None:
    (src / "f").write_bytes(b"x" * 1000)
    port = _free_port()
    disk = tmp_path / "disk"
    with mounted(src, mnt, options=[f"stats.metrics=127.0.0.1:{port}", f"cache.disk_dir={disk}"]):
        # the mount answers a moment before the daemon has marked it live (the root's stat, read-ahead tuning)
        assert wait_for(lambda: _get(port, "/healthz")[0] == 200, timeout=10)
        status, body = _get(port, "/healthz")
        assert status == 200
        lines = body.splitlines()
        assert lines[0] == f"ok: {mnt} answers" and len(lines) == 2
        assert lines[1].startswith("disk tier: usable (") and "budget" in lines[1]
        for path in ("/", "/metricsx", "/healthz/x", "/favicon.ico"):
            status, body = _get(port, path)
            assert status == 404 and body == "not found: this listener serves /metrics and /healthz\n", path
        assert _get(port, "/metrics?name[]=x")[0] == 200
        os.chmod(disk, 0o500)  # root ignores modes: make the directory unusable for real
        os.rename(disk, tmp_path / "gone")
        try:
            status, body = _get(port, "/healthz")
            assert status == 200 and body.splitlines()[1] == f"disk tier: unusable: {disk} is missing or not writable"
        finally:
            os.rename(tmp_path / "gone", disk)
    with pytest.raises(urllib.error.URLError):
        _get(port, "/healthz")


def test_healthz_is_503_when_the_mount_does_not_answer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    release = threading.Event()
    calls = []
    real_statvfs = os.statvfs

    def hung_statvfs(path: str) -> os.statvfs_result:
        calls.append(path)
        release.wait(30)
        raise OSError(5, "Input/output error")

    serving = [False]
    check = health.HealthCheck("/m", lambda: serving[0], lambda: {}, timeout=0.2)
    server = metrics.serve(lambda: FAKE, "127.0.0.1", 0, "/m", check.check)
    try:
        assert _get(server.port, "/healthz") == (
            503,
            "unavailable: /m is not mounted (starting, or its connection ended)\n",
        )
        serving[0] = True
        monkeypatch.setattr(health.os, "statvfs", hung_statvfs)
        start = time.monotonic()
        assert _get(server.port, "/healthz") == (503, "unavailable: /m did not answer within 0.2 s\n")
        assert _get(server.port, "/healthz") == (503, "unavailable: /m has not answered an earlier health probe yet\n")
        assert time.monotonic() - start < 5 and len(calls) == 1  # no second probe piled up
        release.set()
        deadline = time.monotonic() + 10
        while _get(server.port, "/healthz")[1].startswith("unavailable: /m has not") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _get(server.port, "/healthz") == (503, "unavailable: /m: Input/output error\n")
        monkeypatch.setattr(health.os, "statvfs", lambda path: real_statvfs(tmp_path))
        assert _get(server.port, "/healthz") == (200, "ok: /m answers\n")
        assert _get(server.port, "/metrics")[0] == 200
    finally:
        release.set()
        server.shutdown()
