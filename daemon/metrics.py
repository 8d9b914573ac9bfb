"""Prometheus ``/metrics`` and ``/healthz`` endpoint of one mount.

Design: nothing is counted twice. The engine already keeps every counter (see
:mod:`fastfs.fsio.stats`), so the exporter holds no metric objects of its own: a custom collector
calls the engine's ``snapshot()`` on each scrape and translates that dict into metric families. A
scrape therefore costs one snapshot (summing the per-thread shards), and the read path pays nothing
for the exporter whether or not anyone scrapes.

Names follow the Prometheus conventions, and ``tests/mount/test_metrics.py`` checks them on a real
scrape: the ``fastfs_`` prefix, base units as suffixes (``_bytes``, ``_seconds``), ``_total`` on
every counter and on nothing else, ``_ratio`` on shares between 0 and 1, one HELP text per family
that says what is counted, and labels for the dimensions of one quantity (``kind`` of fetched bytes,
``route`` of opens, ``pattern``, ``errno``, ``reason``). Every counter and gauge of the snapshot is
in one of the tables below; a key the engine adds later is not exported until it is named here (it
is logged once), because a made-up name and HELP text would become an interface by accident. The
``mount`` label on every sample tells the mounts of one host apart; Prometheus adds ``instance`` to
tell hosts apart.

The endpoint uses its own :class:`~prometheus_client.CollectorRegistry` (never the process-global
one) holding this collector plus the standard process collector (RSS, open fds, CPU), served by a
small threading HTTP server in a daemon thread: ``GET /metrics`` is the exposition (text, or
OpenMetrics when asked for; gzip when accepted), ``GET /healthz`` the mount's health
(:mod:`fastfs.daemon.health`: 200 or 503 with a short text body), anything else 404.
:func:`serve` returns a handle whose ``shutdown()`` stops the thread and closes the socket. The
listen address comes from ``stats.metrics`` through :func:`fastfs.config.loader.parse_listen_address`,
which defaults to loopback: the numbers reveal file names only through the daemon's logs, but there
is no reason to expose them beyond the host unless asked.
"""

from __future__ import annotations

import gzip
import http.server
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from fastfs import __version__
from fastfs.fsio import stats as fstats

log = logging.getLogger(__name__)

PREFIX = "fastfs_"
LABEL = "mount"
# Seconds shutdown() waits for the server thread; serve_forever polls every 0.5 s, so 5 s is ample.
SHUTDOWN_JOIN_TIMEOUT = 5.0
# Paths of the listener.
METRICS_PATH = "/metrics"
HEALTH_PATH = "/healthz"

Snapshot = Mapping[str, Any]

# The disk tier's snapshot keys (fsio's disk store names them; written out here so the exporter does
# not depend on the store's module layout; the real-scrape test catches a key renamed there).
DISK_HITS, DISK_HIT_BYTES, DISK_MISSES = "disk_hits", "disk_hit_bytes", "disk_misses"
DISK_WRITES, DISK_BYTES_WRITTEN, DISK_WRITE_ERRORS = "disk_writes", "disk_bytes_written", "disk_write_errors"
DISK_WRITES_DROPPED, DISK_WRITES_NO_ROOM = "disk_writes_dropped", "disk_writes_no_room"
DISK_WRITES_SKIPPED, DISK_COMPLETED = "disk_writes_skipped", "disk_files_completed"
DISK_EVICTIONS, DISK_EVICTED_BYTES, DISK_CORRUPT = "disk_evictions", "disk_evicted_bytes", "disk_corrupt_dropped"
DISK_VERIFIED, DISK_COMPLETE_FDS, DISK_CLEARED = "disk_verified_files", "disk_complete_fds", "disk_cleared"

# Counters without labels: (snapshot counter, exported name (ends in _total), HELP).
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (fstats.BYTES_REQUESTED, "requested_bytes_total", "Bytes read through the mount by applications (served opens)."),
    (fstats.BYTES_SERVED_CACHE, "cache_hit_bytes_total", "Requested bytes answered from RAM blocks already present."),
    (fstats.BYTES_PREFETCH_USED, "prefetch_used_bytes_total", "Prefetched bytes later delivered to a reader."),
    (
        fstats.BYTES_PREFETCH_WASTED,
        "prefetch_wasted_bytes_total",
        "Prefetched bytes evicted or invalidated before any use.",
    ),
    (
        fstats.BYTES_DISK_PREFETCH,
        "disk_prefetched_bytes_total",
        "Bytes read ahead of any reader from the disk tier instead of the source.",
    ),
    (
        fstats.BYTES_EVICTED_ON_REQUEST,
        "evicted_on_request_bytes_total",
        "Cached bytes dropped because a user asked (fastfs warm --evict).",
    ),
    (fstats.READ_REQUESTS, "read_requests_total", "Read requests received from the kernel."),
    (
        fstats.OPENS_HANDED,
        "handed_over_opens_total",
        "Served opens whose small file was put into the kernel's page cache before the reply.",
    ),
    (
        fstats.BYTES_HANDED,
        "handed_over_bytes_total",
        "Bytes put into the kernel's page cache at open (read there without a READ; also in requested).",
    ),
    (fstats.PREADS, "source_reads_total", "Reads issued to the source."),
    (fstats.PREAD_ERRORS, "source_read_errors_total", "Reads from the source that failed."),
    (
        fstats.SOURCE_REATTACHED,
        "source_reattached_total",
        "Times the source root was opened again by its path: its mount's connection was gone (a restarted client).",
    ),
    (fstats.EVICTIONS, "cache_evictions_total", "RAM cache blocks evicted to stay within the budget."),
    (fstats.BACKPRESSURE, "prefetch_declined_total", "Prefetches refused because the cache budget was full."),
    (fstats.SEQ_RESETS, "sequential_resets_total", "Sequential streams that collapsed on a seek."),
    (fstats.SCAN_FILES, "scan_files_total", "Files fetched whole by small-file scans."),
    (
        fstats.SCAN_SKIPPED,
        "scan_skipped_files_total",
        "Scan fetches not made because the reader opened the file first (its own read fetched it).",
    ),
    (
        fstats.SCAN_HELD,
        "scans_held_total",
        "Scans in name order that stopped fetching ahead: their reader skipped names it passed.",
    ),
    (
        fstats.SCAN_SERIAL,
        "scans_serial_total",
        "Scans of a shuffled reader stopped: the source answered their fetches one at a time.",
    ),
    (
        fstats.SCAN_UNLISTED,
        "scans_unlisted_total",
        "Scans not started: the source's listing asks about every entry and the reader did not list the directory.",
    ),
    (
        fstats.SCAN_AWAITED,
        "opens_awaited_scan_total",
        "Opens that waited for the scan's fetch of their file under way instead of opening the source again.",
    ),
    (
        fstats.SCAN_AWAIT_TIMEOUTS,
        "opens_awaited_scan_timeouts_total",
        "Opens that gave up waiting for a scan's fetch of their file (the source was slow) and opened it.",
    ),
    (fstats.LEARNED_FILES_USED, "learned_files_used_total", "Files of replayed learned access sets later read."),
    (
        fstats.BYTES_PASSTHROUGH_WARMED,
        "passthrough_warmed_bytes_total",
        "Bytes of passthrough files asked into the source's page cache ahead of the reader.",
    ),
    (
        fstats.STREAM_FILLS,
        "stream_fills_total",
        "Block fills read on a file's one source stream (the sequential shape).",
    ),
    (
        fstats.STREAM_JUMPS,
        "stream_jumps_total",
        "Sequential-shape block fills that did not continue where the file's stream stood.",
    ),
    (fstats.TIMEOUTS, "read_timeouts_total", "Reads that failed: the source did not answer within read_timeout."),
    (fstats.FAST_FAILS, "reads_failed_fast_total", "Reads failed at once because earlier reads of the file hung."),
    (fstats.DIRECT_READS, "reads_direct_total", "Random reads the request loop answered by one pread itself."),
    # the disk cache tier (cache.disk_dir): present only on mounts that have one
    (DISK_HITS, "disk_hits_total", "Block fills and scan fetches served from the disk tier."),
    (DISK_HIT_BYTES, "disk_hit_bytes_total", "Bytes read from the disk tier instead of the source."),
    (DISK_MISSES, "disk_misses_total", "Disk tier reads of ranges it did not hold."),
    (DISK_WRITES, "disk_writes_total", "Writes of fetched data to the disk tier."),
    (DISK_BYTES_WRITTEN, "disk_written_bytes_total", "Bytes written to the disk tier."),
    (DISK_COMPLETED, "disk_completed_files_total", "Files the disk tier came to hold whole (all written, journalled)."),
    (DISK_WRITE_ERRORS, "disk_write_errors_total", "Writes to the disk tier that failed with an OS error."),
    (DISK_EVICTIONS, "disk_evictions_total", "Files evicted from the disk tier (LRU, budget, free-space floor)."),
    (DISK_EVICTED_BYTES, "disk_evicted_bytes_total", "Bytes evicted from the disk tier."),
    (DISK_CORRUPT, "disk_corrupt_entries_total", "Disk tier entries dropped because a check failed (never served)."),
    (DISK_VERIFIED, "disk_verified_files_total", "Complete disk tier files read back and verified before an open."),
    (DISK_COMPLETE_FDS, "disk_backing_files_total", "Disk tier files handed to the kernel as passthrough backing."),
)
# Labelled counter families: exported name -> (HELP, label, ((snapshot counter, label value), ...)).
_LABELLED: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    "fetched_bytes_total": (
        "Bytes read from the source, by why: a reader waited (demand), read-ahead's guess (prefetch), fastfs warm.",
        "kind",
        (
            (fstats.BYTES_FETCHED_DEMAND, "demand"),
            (fstats.BYTES_FETCHED_PREFETCH, "prefetch"),
            (fstats.BYTES_FETCHED_WARM, "warm"),
        ),
    ),
    "opens_total": (
        "Files opened through the mount, by route: served by fastfs, passthrough to the source file, or to the "
        "disk tier's copy.",
        "route",
        ((fstats.OPENS, "served"), (fstats.OPENS_PASSTHROUGH, "passthrough"), (fstats.OPENS_DISK, "disk")),
    ),
    "stream_routes_total": (
        "Opens of large files of a source read as one stream per file, routed by their loader: passthrough "
        "(read in order, or a client whose jumps waste nothing), served (mapped by the loader, or an unreadable head).",
        "route",
        ((fstats.STREAM_ROUTE_PASSTHROUGH, "passthrough"), (fstats.STREAM_ROUTE_SERVED, "served")),
    ),
    "source_requests_total": (
        "Requests fastfs made to the source, by kind: files opened, stats (files and directories), directories "
        "listed, opens made again after the source answered EBADFD (reads are fastfs_source_reads_total).",
        "kind",
        (
            (fstats.SOURCE_OPENS, "open"),
            (fstats.SOURCE_STATS, "stat"),
            (fstats.SOURCE_LISTINGS, "listing"),
            (fstats.SOURCE_OPEN_RETRIES, "open_retry"),
        ),
    ),
    "opens_from_metadata_total": (
        "Served opens answered without opening the source, by how its metadata was trusted: younger than "
        "fuse.revalidate (fresh), one stat of the file (revalidated), its directory verified unchanged "
        "(dir_verified).",
        "how",
        (
            (fstats.OPENS_FROM_META, "fresh"),
            (fstats.OPENS_REVALIDATED, "revalidated"),
            (fstats.OPENS_DIR_VERIFIED, "dir_verified"),
        ),
    ),
    "opened_file_bytes_total": (
        "Sizes of the files opened by passthrough (their reads never reach fastfs), by route.",
        "route",
        ((fstats.BYTES_PASSTHROUGH_OPENED, "passthrough"), (fstats.BYTES_DISK_OPENED, "disk")),
    ),
    "patterns_total": (
        "Access patterns recognised, by kind.",
        "pattern",
        (
            (fstats.SEQ_STREAMS, "sequential"),
            (fstats.RANDOM_STREAMS, "random"),
            (fstats.SCANS, "small_file_scan"),
            (fstats.WALK_AHEAD, "walk_ahead"),
            (fstats.FORMAT_PLANS, "format"),
            (fstats.MMAP_STREAMS, "mmap"),
            (fstats.PROGRAMS, "program"),
            (fstats.LEARNED_PLANS, "learned"),
            (fstats.LEARNED_WHOLE, "learned_whole_file"),
        ),
    ),
    "disk_writes_refused_total": (
        "Writes to the disk tier not made, by reason: its write queue was full, no room under the budget or "
        "free-space floor, or skipped (already held, unaligned, closing).",
        "reason",
        ((DISK_WRITES_DROPPED, "queue_full"), (DISK_WRITES_NO_ROOM, "no_room"), (DISK_WRITES_SKIPPED, "skipped")),
    ),
}
# Families that are exported only when the snapshot has one of their keys (the disk tier's).
_OPTIONAL_LABELLED = {"disk_writes_refused_total"}
# Gauges without labels: (snapshot gauge, exported name, HELP).
_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("cache_bytes", "cache_bytes", "Bytes held by the RAM cache (cached and in-flight blocks)."),
    ("cache_data_bytes", "cache_data_bytes", "Bytes of complete blocks in the RAM cache."),
    ("cache_budget", "cache_budget_bytes", "Byte budget of the RAM cache."),
    ("cache_blocks", "cache_blocks", "Blocks held by the RAM cache."),
    ("inflight_blocks", "cache_inflight_blocks", "RAM cache blocks being filled."),
    ("free_buffers", "cache_free_buffers", "Block buffers kept for reuse."),
    (
        "cache_unused_prefetch_bytes",
        "cache_unused_prefetch_bytes",
        "Capacity of prefetched RAM cache blocks not read yet (in flight too).",
    ),
    ("open_files", "open_files", "Files currently open through the mount."),
    ("file_versions", "file_versions", "Source file versions the engine tracks (open, or cached)."),
    ("streams", "streams", "Read streams currently tracked by the pattern detector."),
    ("sequential_streams_active", "sequential_streams", "Tracked read streams that are sequential now."),
    ("active_scans", "active_scans", "Small-file scans in progress."),
    ("pool_workers", "pool_workers", "Threads reading from the source."),
    ("closes_pending", "closes_pending", "Source descriptors of released files not closed yet (a hung source's stay)."),
    ("learned_planned_files", "learned_planned_files", "Files planned by replayed learned access sets."),
    (
        "learned_accuracy",
        "learned_accuracy_ratio",
        "Share of the files planned by learned access sets that were then read (0 to 1).",
    ),
    ("disk_cache_bytes", "disk_cache_bytes", "Bytes the disk tier uses (data files, journal, directories)."),
    ("disk_cache_budget", "disk_cache_budget_bytes", "Byte budget of the disk tier now."),
    ("disk_free_bytes", "disk_free_bytes", "Free bytes of the disk tier's filesystem at its last check."),
    ("disk_free_floor", "disk_free_floor_bytes", "Free bytes of the disk tier's filesystem it never uses."),
    ("disk_cache_files", "disk_cache_files", "Files (versions) the disk tier holds."),
    ("disk_queue_bytes", "disk_queue_bytes", "Bytes waiting in the disk tier's write queue."),
)
# Snapshot counters exported as gauges: (key, exported name, HELP).
_COUNTER_GAUGES: tuple[tuple[str, str, str], ...] = (
    (DISK_CLEARED, "disk_cleared_at_start", "1 when the disk tier's directory was unusable at start and was cleared."),
)
# Labelled gauges: exported name -> (HELP, label, ((snapshot gauge, label value), ...)).
_LABELLED_GAUGES: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    "queued_reads": (
        "Source reads waiting for a pool thread, by priority.",
        "kind",
        (("queued_demand", "demand"), ("queued_prefetch", "prefetch")),
    ),
}
MAPPED_COUNTERS = (
    {c[0] for c in _COUNTERS}
    | {key for _, _, pairs in _LABELLED.values() for key, _ in pairs}
    | {c[0] for c in _COUNTER_GAUGES}
)
MAPPED_GAUGES = {g[0] for g in _GAUGES} | {key for _, _, pairs in _LABELLED_GAUGES.values() for key, _ in pairs}


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
        self._unnamed: set[str] = set()  # snapshot keys without an exported name, logged once each

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

    def _plain(self, family: Any, table: Any, values: Mapping[str, Any]) -> Iterator[Metric]:
        for key, name, doc in table:
            if (v := _number(values.get(key))) is not None:
                fam = family(PREFIX + name, doc, labels=[LABEL])
                fam.add_metric([self._label], v)
                yield fam

    def _labelled(self, family: Any, table: Any, values: Mapping[str, Any], optional: Any = ()) -> Iterator[Metric]:
        for name, (doc, label, pairs) in table.items():
            if name in optional and not any(key in values for key, _ in pairs):
                continue
            fam = family(PREFIX + name, doc, labels=[LABEL, label])
            for key, value in pairs:
                fam.add_metric([self._label, value], _number(values.get(key)) or 0.0)
            yield fam

    def _note_unnamed(self, values: Mapping[str, Any], mapped: set[str], kind: str) -> None:
        for key in sorted(set(values) - mapped - self._unnamed):
            if _number(values[key]) is not None:
                self._unnamed.add(key)
                log.info("metrics: snapshot %s %s has no exported name yet; not exported", kind, key)

    def families(self, snap: Snapshot) -> Iterable[Metric]:
        """All metric families of *snap* (separate from :meth:`collect` for tests)."""
        lbl = [LABEL]
        val = [self._label]
        counters: Mapping[str, Any] = snap.get("counters") or {}
        gauges: Mapping[str, Any] = snap.get("gauges") or {}
        self._note_unnamed(counters, MAPPED_COUNTERS, "counter")
        self._note_unnamed(gauges, MAPPED_GAUGES, "gauge")

        yield from self._plain(CounterMetricFamily, _COUNTERS, counters)
        yield from self._labelled(CounterMetricFamily, _LABELLED, counters, _OPTIONAL_LABELLED)
        fam = CounterMetricFamily(
            PREFIX + "source_errors_total", "Errors returned by the source, by errno name.", labels=[LABEL, "errno"]
        )
        for name, n in sorted((snap.get("errors") or {}).items()):
            fam.add_metric([self._label, str(name)], _number(n) or 0.0)
        yield fam

        lat = snap.get("pread_latency") or {}
        if lat.get("buckets"):
            hist = HistogramMetricFamily(
                PREFIX + "source_read_duration_seconds", "Duration of reads from the source.", labels=lbl
            )
            hist.add_metric(val, _cumulative(lat["buckets"]), _number(lat.get("sum_seconds")) or 0.0)
            yield hist
        sizes = snap.get("request_sizes") or {}
        if sizes:
            # The sum of request sizes is the bytes_requested counter.
            hist = HistogramMetricFamily(
                PREFIX + "read_request_size_bytes", "Size of read requests from the kernel.", labels=lbl
            )
            hist.add_metric(val, _cumulative(sizes), _number(counters.get(fstats.BYTES_REQUESTED)))
            yield hist

        yield from self._plain(GaugeMetricFamily, _GAUGES, gauges)
        yield from self._plain(GaugeMetricFamily, _COUNTER_GAUGES, counters)
        yield from self._labelled(GaugeMetricFamily, _LABELLED_GAUGES, gauges)

        if (v := _number(snap.get("uptime_seconds"))) is not None:
            gauge = GaugeMetricFamily(PREFIX + "uptime_seconds", "Seconds since the mount started.", labels=lbl)
            gauge.add_metric(val, v)
            yield gauge
        if (v := _number(snap.get("started"))) is not None:
            gauge = GaugeMetricFamily(PREFIX + "start_time_seconds", "Unix time the mount started.", labels=lbl)
            gauge.add_metric(val, v)
            yield gauge
        gauge = GaugeMetricFamily(
            PREFIX + "build_info", "Version of fastfs serving the mount (always 1).", labels=[LABEL, "version"]
        )
        gauge.add_metric([self._label, __version__], 1.0)
        yield gauge
        if source := snap.get("source"):
            gauge = GaugeMetricFamily(
                PREFIX + "source_info",
                "The source's mount type and the access shape chosen for it (always 1).",
                labels=[LABEL, "mount_type", "shape"],
            )
            gauge.add_metric([self._label, str(source.get("mount_type", "")), str(source.get("shape", ""))], 1.0)
            yield gauge


def make_registry(snapshot_fn: Callable[[], Snapshot], mount_label: str) -> CollectorRegistry:
    """A dedicated registry with the snapshot collector and the process collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot_fn, mount_label))
    ProcessCollector(registry=registry)
    return registry


# -- the HTTP listener ------------------------------------------------------------------------------
HealthFn = Callable[[], tuple[int, str]]


class _Handler(http.server.BaseHTTPRequestHandler):
    """``/metrics``, ``/healthz`` and 404; the server carries the registry and the health function."""

    server: _Server

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        path = urlsplit(self.path).path
        if path == METRICS_PATH:
            try:
                encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
                body = encoder(self.server.registry)
            except Exception as e:  # noqa: BLE001 - a failed scrape is a 500, never a dead listener
                self._send(500, f"metrics unavailable: {e}\n".encode(), "text/plain; charset=utf-8")
                return
            gzipped = gzip_accepted(self.headers.get("Accept-Encoding", ""))
            self._send(200, gzip.compress(body) if gzipped else body, content_type, gzipped)
        elif path == HEALTH_PATH:
            try:
                status, text = self.server.health()
            except Exception as e:  # noqa: BLE001
                status, text = 503, f"unavailable: the health check failed: {e}\n"
            self._send(status, text.encode(), "text/plain; charset=utf-8")
        else:
            text = f"not found: this listener serves {METRICS_PATH} and {HEALTH_PATH}\n"
            self._send(404, text.encode(), "text/plain; charset=utf-8")

    def _send(self, status: int, body: bytes, content_type: str, gzipped: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        """Scrapes are not logged (one line per scrape would flood the daemon's log)."""


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], family: int, registry: CollectorRegistry, health: HealthFn) -> None:
        self.address_family = family
        self.registry = registry
        self.health = health
        super().__init__(address, _Handler)


def _always_ok() -> tuple[int, str]:
    return 200, "ok\n"


class MetricsServer:
    """Handle of a running endpoint: ``.host``, ``.port`` (the bound one) and ``.shutdown()``."""

    def __init__(self, httpd: _Server, thread: threading.Thread, host: str) -> None:
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


def serve(
    snapshot_fn: Callable[[], Snapshot],
    host: str,
    port: int,
    mount_label: str,
    health: HealthFn | None = None,
) -> MetricsServer:
    """Serve ``http://HOST:PORT/metrics`` from *snapshot_fn* and ``/healthz`` from *health* (status,
    body) in a daemon thread.

    Raises ``OSError`` naming the address when it cannot listen (port taken, unknown host).
    """
    registry = make_registry(snapshot_fn, mount_label)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        httpd = _Server((host, port), family, registry, health or _always_ok)
    except (OSError, socket.gaierror) as e:
        raise OSError(e.errno, f"stats.metrics: cannot listen on {host}:{port}: {e.strerror or e}") from None
    thread = threading.Thread(target=httpd.serve_forever, name="fastfs-metrics", daemon=True)
    thread.start()
    server = MetricsServer(httpd, thread, host)
    shown = host if ":" not in host else f"[{host}]"
    log.info("metrics: serving http://%s:%d%s and %s", shown, server.port, METRICS_PATH, HEALTH_PATH)
    return server
