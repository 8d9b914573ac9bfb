"""Prometheus ``/metrics`` endpoint of one mount.

Design: nothing is counted twice. The engine already keeps every counter (see
:mod:`fastfs.fsio.stats`), so the exporter holds no metric objects of its own: a custom collector
calls the engine's ``snapshot()`` on each scrape and translates that dict into metric families with
conventional names (``fastfs_*_total`` counters, ``_bytes`` / ``_seconds`` units, one ``mount``
label on every sample). A scrape therefore costs one snapshot (summing the per-thread shards), and
the read path pays nothing for the exporter whether or not anyone scrapes.

The endpoint uses its own :class:`~prometheus_client.CollectorRegistry` (never the process-global
one) holding this collector plus the standard process collector (RSS, open fds, CPU), and the
HTTP server of prometheus-client in a daemon thread. :func:`serve` returns a small handle whose
``shutdown()`` stops the thread and closes the listening socket. The listen address comes from
``stats.metrics`` through :func:`fastfs.config.loader.parse_listen_address`, which defaults to
loopback: the numbers reveal file names only through the daemon's logs, but there is no reason to
expose them beyond the host unless asked.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from fastfs import __version__
from fastfs.fsio import stats as fstats
from fastfs.fsio.disk import store as fdisk

log = logging.getLogger(__name__)

PREFIX = "fastfs_"
LABEL = "mount"
# Seconds shutdown() waits for the server thread; serve_forever polls every 0.5 s, so 5 s is ample.
SHUTDOWN_JOIN_TIMEOUT = 5.0

Snapshot = Mapping[str, Any]

# Plain counters: (snapshot counter name, exported name without _total, help text).
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (fstats.BYTES_REQUESTED, "bytes_requested", "Bytes applications asked to read through the mount."),
    (fstats.BYTES_SERVED_CACHE, "bytes_served_from_cache", "Requested bytes copied from RAM blocks already present."),
    (fstats.BYTES_PREFETCH_USED, "prefetch_used_bytes", "Prefetched bytes later delivered to a reader."),
    (fstats.BYTES_PREFETCH_WASTED, "prefetch_wasted_bytes", "Prefetched bytes evicted or invalidated before any use."),
    (fstats.READ_REQUESTS, "read_requests", "Read requests received from the kernel."),
    (fstats.PREADS, "preads", "Reads issued to the source."),
    (fstats.PREAD_ERRORS, "pread_errors", "Reads from the source that failed."),
    (fstats.EVICTIONS, "evictions", "Cache blocks evicted to stay within the budget."),
    (fstats.BACKPRESSURE, "prefetch_declined", "Prefetches refused because the cache budget was full."),
    (fstats.SEQ_RESETS, "sequential_resets", "Sequential streams that collapsed on a seek."),
    (fstats.SCAN_FILES, "small_file_scan_files", "Files fetched whole by small-file scans."),
    (fstats.LEARNED_FILES_USED, "learned_files_used", "Files of replayed learned access sets that were then read."),
    (fstats.OPENS, "opens", "Files opened through the mount and served by fastfs."),
    (fstats.OPENS_PASSTHROUGH, "opens_passthrough", "Files opened by passthrough to the source file."),
    (fstats.BYTES_PASSTHROUGH_OPENED, "passthrough_opened_bytes", "Sizes of the files opened by passthrough."),
    (
        fstats.BYTES_PASSTHROUGH_WARMED,
        "passthrough_warmed_bytes",
        "Bytes of passthrough files asked into the source's page cache ahead of the reader.",
    ),
    (fstats.TIMEOUTS, "read_timeouts", "Reads that failed because the source did not answer within read_timeout."),
    (fstats.FAST_FAILS, "reads_failed_fast", "Reads failed at once because earlier reads of the file were stuck."),
    # the disk cache tier (cache.disk_dir): present only on mounts that have one
    (fdisk.HITS, "disk_hits", "Block fills and scan fetches served from the disk tier."),
    (fdisk.HIT_BYTES, "disk_hit_bytes", "Bytes read from the disk tier instead of the source."),
    (fdisk.MISSES, "disk_misses", "Disk tier reads of ranges it did not hold."),
    (fdisk.WRITES, "disk_writes", "Writes of fetched data to the disk tier."),
    (fdisk.BYTES_WRITTEN, "disk_written_bytes", "Bytes written to the disk tier."),
    (fdisk.WRITES_DROPPED, "disk_writes_dropped", "Writes to the disk tier dropped: its write queue was full."),
    (fdisk.WRITES_NO_ROOM, "disk_writes_no_room", "Writes to the disk tier not made: budget or free-space floor."),
    (fdisk.WRITE_ERRORS, "disk_write_errors", "Writes to the disk tier that failed with an OS error."),
    (fdisk.EVICTIONS, "disk_evictions", "Files evicted from the disk tier (LRU, budget, free-space floor)."),
    (fdisk.EVICTED_BYTES, "disk_evicted_bytes", "Bytes evicted from the disk tier."),
    (fdisk.CORRUPT, "disk_corrupt_entries", "Disk tier entries dropped because a check failed (never served)."),
    (fstats.OPENS_DISK, "opens_disk", "Files opened by passthrough to their complete file in the disk tier."),
    (fstats.BYTES_DISK_OPENED, "disk_opened_bytes", "Sizes of the files opened by passthrough to the disk tier."),
)
# Source bytes by why they were read: fastfs_bytes_fetched_total{kind=...}.
_FETCHED_KINDS: tuple[tuple[str, str], ...] = (
    (fstats.BYTES_FETCHED_DEMAND, "demand"),
    (fstats.BYTES_FETCHED_PREFETCH, "prefetch"),
)
# Access patterns recognised: fastfs_patterns_total{pattern=...}.
_PATTERNS: tuple[tuple[str, str], ...] = (
    (fstats.SEQ_STREAMS, "sequential"),
    (fstats.RANDOM_STREAMS, "random"),
    (fstats.SCANS, "small_file_scan"),
    (fstats.FORMAT_PLANS, "format"),
    (fstats.MMAP_STREAMS, "mmap"),
    (fstats.LEARNED_PLANS, "learned"),
    (fstats.LEARNED_WHOLE, "learned_whole_file"),
)
# Gauges: (snapshot gauges key, exported name, help text).
_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("cache_bytes", "cache_bytes", "Bytes held by the cache (cached and in-flight blocks)."),
    ("cache_budget", "cache_budget_bytes", "Byte budget of the cache."),
    ("cache_blocks", "cache_blocks", "Blocks held by the cache."),
    ("open_files", "open_files", "Files currently open through the mount."),
    ("streams", "streams", "Read streams currently tracked by the pattern detector."),
    (fdisk.USE, "disk_cache_bytes", "Bytes the disk tier uses (data files, journal, directories)."),
    (fdisk.BUDGET, "disk_cache_budget_bytes", "Byte budget of the disk tier now."),
    (fdisk.FREE, "disk_free_bytes", "Free bytes of the disk tier's filesystem at its last check."),
    (fdisk.FLOOR, "disk_free_floor_bytes", "Free bytes of the disk tier's filesystem it never uses."),
    (fdisk.FILES, "disk_cache_files", "Files (versions) the disk tier holds."),
)
_MAPPED_COUNTERS = {c[0] for c in _COUNTERS} | {k for k, _ in _FETCHED_KINDS} | {k for k, _ in _PATTERNS}
_MAPPED_GAUGES = {g[0] for g in _GAUGES}
_NAME_OK = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _number(value: Any) -> float | None:
    """A finite float for numeric snapshot values (bools and None are not metrics)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _cumulative(buckets: Mapping[str, Any]) -> list[tuple[str, float]]:
    """Per-bucket counts keyed by upper bound (``"0.001"``, ``"+Inf"``) -> sorted cumulative buckets."""
    bounds = sorted((float(k), _number(v) or 0.0) for k, v in buckets.items())
    running = 0.0
    out: list[tuple[str, float]] = []
    for bound, count in bounds:
        running += count
        out.append((floatToGoString(bound), running))
    if not out or out[-1][0] != "+Inf":
        out.append(("+Inf", running))
    return out


class SnapshotCollector(Collector):
    """Translates one engine snapshot per scrape into Prometheus metric families."""

    def __init__(self, snapshot_fn: Callable[[], Snapshot], mount_label: str) -> None:
        self._snapshot_fn = snapshot_fn
        self._label = str(mount_label)
        self._failed = False  # log a failing snapshot once, not on every scrape

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self._snapshot_fn()
        except Exception:
            if not self._failed:
                log.exception("metrics: engine snapshot failed; scrapes will fail until it works again")
                self._failed = True
            raise
        self._failed = False
        yield from self.families(snap)

    def _simple(self, family: Any, table: Any, mapped: Any, values: Mapping[str, Any], kind: str) -> Iterator[Any]:
        """One unlabelled-by-kind family per known key of *table*; keys the engine added later are
        exported under their own name rather than dropped."""
        for key, name, doc in table:
            if (v := _number(values.get(key))) is not None:
                fam = family(PREFIX + name, doc, labels=[LABEL])
                fam.add_metric([self._label], v)
                yield fam
        for key in sorted(set(values) - mapped):
            if _NAME_OK.match(key) and (v := _number(values[key])) is not None:
                fam = family(PREFIX + key, f"Engine {kind} {key}.", labels=[LABEL])
                fam.add_metric([self._label], v)
                yield fam

    def families(self, snap: Snapshot) -> Iterable[Metric]:
        """All metric families of *snap* (separate from :meth:`collect` for tests)."""
        lbl = [LABEL]
        val = [self._label]
        counters: Mapping[str, Any] = snap.get("counters") or {}
        gauges: Mapping[str, Any] = snap.get("gauges") or {}

        yield from self._simple(CounterMetricFamily, _COUNTERS, _MAPPED_COUNTERS, counters, "counter")

        fam = CounterMetricFamily(
            PREFIX + "bytes_fetched", "Bytes read from the source, by reason.", labels=[LABEL, "kind"]
        )
        for key, kind in _FETCHED_KINDS:
            fam.add_metric([self._label, kind], _number(counters.get(key)) or 0.0)
        yield fam

        fam = CounterMetricFamily(
            PREFIX + "patterns", "Access patterns recognised, by kind.", labels=[LABEL, "pattern"]
        )
        for key, pattern in _PATTERNS:
            fam.add_metric([self._label, pattern], _number(counters.get(key)) or 0.0)
        yield fam

        fam = CounterMetricFamily(
            PREFIX + "source_errors", "Errors returned by the source, by errno name.", labels=[LABEL, "errno"]
        )
        for name, n in sorted((snap.get("errors") or {}).items()):
            fam.add_metric([self._label, str(name)], _number(n) or 0.0)
        yield fam

        lat = snap.get("pread_latency") or {}
        if lat.get("buckets"):
            fam = HistogramMetricFamily(
                PREFIX + "pread_duration_seconds", "Duration of reads from the source.", labels=lbl
            )
            fam.add_metric(val, _cumulative(lat["buckets"]), _number(lat.get("sum_seconds")) or 0.0)
            yield fam
        sizes = snap.get("request_sizes") or {}
        if sizes:
            # The sum of request sizes is the bytes_requested counter.
            fam = HistogramMetricFamily(
                PREFIX + "read_request_size_bytes", "Size of read requests from the kernel.", labels=lbl
            )
            fam.add_metric(val, _cumulative(sizes), _number(counters.get(fstats.BYTES_REQUESTED)))
            yield fam

        yield from self._simple(GaugeMetricFamily, _GAUGES, _MAPPED_GAUGES, gauges, "gauge")

        if (v := _number(snap.get("uptime_seconds"))) is not None:
            fam = GaugeMetricFamily(PREFIX + "uptime_seconds", "Seconds since the mount started.", labels=lbl)
            fam.add_metric(val, v)
            yield fam
        if (v := _number(snap.get("started"))) is not None:
            fam = GaugeMetricFamily(PREFIX + "start_time_seconds", "Unix time the mount started.", labels=lbl)
            fam.add_metric(val, v)
            yield fam
        fam = GaugeMetricFamily(
            PREFIX + "build_info", "Version of fastfs serving the mount (always 1).", labels=[LABEL, "version"]
        )
        fam.add_metric([self._label, __version__], 1.0)
        yield fam
        if source := snap.get("source"):
            fam = GaugeMetricFamily(
                PREFIX + "source_info",
                "The source's mount type and the access shape chosen for it (always 1).",
                labels=[LABEL, "mount_type", "shape"],
            )
            fam.add_metric([self._label, str(source.get("mount_type", "")), str(source.get("shape", ""))], 1.0)
            yield fam


def make_registry(snapshot_fn: Callable[[], Snapshot], mount_label: str) -> CollectorRegistry:
    """A dedicated registry with the snapshot collector and the process collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot_fn, mount_label))
    ProcessCollector(registry=registry)
    return registry


class MetricsServer:
    """Handle of a running endpoint: ``.host``, ``.port`` (the bound one) and ``.shutdown()``."""

    def __init__(self, httpd: Any, thread: threading.Thread, host: str) -> None:
        self._httpd = httpd
        self._thread = thread
        self.host = host
        self.port: int = httpd.server_address[1]
        self._closed = False

    def shutdown(self) -> None:
        """Stop serving and close the listening socket (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(SHUTDOWN_JOIN_TIMEOUT)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def serve(snapshot_fn: Callable[[], Snapshot], host: str, port: int, mount_label: str) -> MetricsServer:
    """Serve ``http://HOST:PORT/metrics`` from *snapshot_fn* in a daemon thread.

    Raises ``OSError`` naming the address when it cannot listen (port taken, unknown host).
    """
    registry = make_registry(snapshot_fn, mount_label)
    try:
        httpd, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise OSError(e.errno, f"stats.metrics: cannot listen on {host}:{port}: {e.strerror or e}") from None
    server = MetricsServer(httpd, thread, host)
    log.info("metrics: serving http://%s:%d/metrics", host if ":" not in host else f"[{host}]", server.port)
    return server
