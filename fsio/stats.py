"""Counters of what the engine did, recorded where each event happens.

Design: every thread writes into its own shard (a plain list found by the thread's identifier), so
counting takes no lock and costs one dict lookup and a list update; a snapshot sums the shards
under the registry lock. Shards are keyed by ``threading.get_ident()`` in the registry rather than
held in a ``threading.local``: a shard must outlive its thread (the session's workers are replaced
when the watchdog abandons one, pool and warm threads come and go), or the counts of every thread
that ended would drop out of the totals; a thread-local dies with its thread. Metric
names are the constants below, in one place, used by the engine, the stats file, the CLI and the
Prometheus exporter alike.

Concurrency: ``_lock`` guards ``_shards`` (thread id -> that thread's list) and ``_files``; a shard is
written only by its own thread and read (racily but safely: ints are replaced atomically under the
GIL) by snapshots.
"""

from __future__ import annotations

import bisect
import heapq
import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

# Byte counters.
BYTES_REQUESTED = "bytes_requested"  # delivered to applications (read requests, clipped at EOF)
BYTES_SERVED_CACHE = "bytes_served_from_cache"  # of those, copied from RAM blocks already present
BYTES_FETCHED_DEMAND = "bytes_fetched_demand"  # read from the source because a reader waited for them
BYTES_FETCHED_PREFETCH = "bytes_fetched_prefetch"  # read from the source ahead of any reader
BYTES_PREFETCH_USED = "bytes_prefetch_used"  # prefetched bytes later delivered to a reader
BYTES_PREFETCH_WASTED = "bytes_prefetch_wasted"  # prefetched bytes evicted or invalidated before any use
BYTES_DISK_PREFETCH = "bytes_disk_prefetch"  # read ahead of any reader from the disk tier instead of the source
BYTES_FETCHED_WARM = "bytes_fetched_warm"  # read from the source for fastfs warm (asked for, not a guess)
BYTES_EVICTED_ON_REQUEST = "bytes_evicted_on_request"  # cached bytes dropped by fastfs warm --evict
# Event counters.
READ_REQUESTS = "read_requests"
PREADS = "preads"
PREAD_ERRORS = "pread_errors"
EVICTIONS = "evictions"
BACKPRESSURE = "prefetch_declined"  # prefetch refused because the budget was full
SEQ_STREAMS = "sequential_streams"  # streams that became sequential
SEQ_RESETS = "sequential_resets"  # sequential streams that collapsed on a seek
RANDOM_STREAMS = "random_streams"
SCANS = "small_file_scans"
SCAN_FILES = "small_file_scan_files"  # files fetched whole by scans
WALK_AHEAD = "walk_ahead_scans"  # directories scanned ahead of a walk of their parent (readahead.walk_ahead)
SCAN_SKIPPED = "small_file_scan_skipped"  # queued scan fetches not made: the reader opened the file first
# scans in name order that stopped fetching ahead: their reader skipped more than a fifth of the names it passed
SCAN_HELD = "small_file_scans_held"
# scans of a shuffled reader stopped: the source answered their fetches one at a time (ScanWindow)
SCAN_SERIAL = "small_file_scans_serial"
SCAN_UNLISTED = "small_file_scans_unlisted"  # scans not started: the source lists per entry, the reader did not list
SCAN_AWAITED = "opens_awaited_scan"  # opens that waited for the scan's fetch of their file under way
SCAN_AWAIT_TIMEOUTS = "opens_awaited_scan_timeouts"  # ... and gave up waiting (the open then asked the source)
FORMAT_PLANS = "format_plans"  # opens whose header gave a prefetch plan
MMAP_STREAMS = "mmap_streams"  # files read out of order inside a planned range (mmap page faults)
PROGRAMS = "program_files"  # files found to be programs or shared libraries (ELF): windows of one block
LEARNED_PLANS = "learned_plans"  # learned access sets replayed
LEARNED_FILES_USED = "learned_files_used"  # files of a replayed set that were then read
LEARNED_WHOLE = "learned_whole_plans"  # format plans released whole at open: the last load read it all
OPENS = "opens"  # opens served by the engine (route "served")
OPENS_PASSTHROUGH = "opens_passthrough"  # opens handed to the kernel as passthrough to the source file
BYTES_PASSTHROUGH_OPENED = "bytes_passthrough_opened"  # sizes of the files opened by passthrough
BYTES_PASSTHROUGH_WARMED = "bytes_passthrough_warmed"  # page cache filled by warms of passthrough files
OPENS_HANDED = "opens_handed"  # served opens whose file was put into the kernel's page cache (fsio.handover)
BYTES_HANDED = "bytes_handed"  # bytes put there (also counted as requested and served from cache)
OPENS_DISK = "opens_disk"  # opens handed to the kernel as passthrough to a complete file of the disk tier
BYTES_DISK_OPENED = "bytes_disk_opened"  # sizes of the files opened that way
STREAM_FILLS = "stream_fills"  # block fills read on a file's one source stream (the sequential shape)
STREAM_JUMPS = "stream_jumps"  # of those, fills that did not continue where the stream stood (a restart)
# Opens of large files of a stream-read source routed by their loader (policy.stream_file_route):
STREAM_ROUTE_PASSTHROUGH = "stream_route_passthrough"  # ... read in order (or jumps waste nothing): to the kernel
STREAM_ROUTE_SERVED = "stream_route_served"  # ... mapped by their loader, opened again, or an unreadable head
TIMEOUTS = "read_timeouts"
# What fastfs asked the source (counted in fsio/source.py, the one place that talks to it).
SOURCE_OPENS = "source_opens"  # files opened (an open's revalidation, scan fetches, extra block-read streams)
SOURCE_STATS = "source_stats"  # lstat / fstat of a file or directory (lookups, revalidations, listing checks)
SOURCE_LISTINGS = "source_listings"  # directories listed
SOURCE_OPEN_RETRIES = "source_open_retries"  # opens made again: the source answered EBADFD (Source.open_file)
SOURCE_REATTACHED = "source_reattached"  # source root opened again by its path: its mount's connection was gone
# Opens answered without opening the source (small versions fastfs or the kernel holds).
OPENS_FROM_META = "opens_from_metadata"  # metadata younger than fuse.revalidate: no source request
OPENS_REVALIDATED = "opens_revalidated"  # older: one stat of the file showed the version unchanged
OPENS_DIR_VERIFIED = "opens_dir_verified"  # older: its directory verified unchanged (fuse.trust_unchanged_dirs)
FAST_FAILS = "reads_failed_fast"  # reads answered EIO at once: earlier reads of the file were stuck
DIRECT_READS = "reads_direct"  # reads the kernel layer answered by pread itself (readpath.direct_offer)

COUNTERS = (
    BYTES_REQUESTED,
    BYTES_SERVED_CACHE,
    BYTES_FETCHED_DEMAND,
    BYTES_FETCHED_PREFETCH,
    BYTES_PREFETCH_USED,
    BYTES_PREFETCH_WASTED,
    BYTES_DISK_PREFETCH,
    BYTES_FETCHED_WARM,
    BYTES_EVICTED_ON_REQUEST,
    READ_REQUESTS,
    PREADS,
    PREAD_ERRORS,
    EVICTIONS,
    BACKPRESSURE,
    SEQ_STREAMS,
    SEQ_RESETS,
    RANDOM_STREAMS,
    SCANS,
    SCAN_FILES,
    SCAN_SKIPPED,
    SCAN_HELD,
    SCAN_SERIAL,
    SCAN_UNLISTED,
    WALK_AHEAD,
    SCAN_AWAITED,
    SCAN_AWAIT_TIMEOUTS,
    FORMAT_PLANS,
    MMAP_STREAMS,
    PROGRAMS,
    LEARNED_PLANS,
    LEARNED_FILES_USED,
    LEARNED_WHOLE,
    OPENS,
    OPENS_PASSTHROUGH,
    BYTES_PASSTHROUGH_OPENED,
    BYTES_PASSTHROUGH_WARMED,
    OPENS_HANDED,
    BYTES_HANDED,
    OPENS_DISK,
    BYTES_DISK_OPENED,
    STREAM_FILLS,
    STREAM_JUMPS,
    STREAM_ROUTE_PASSTHROUGH,
    STREAM_ROUTE_SERVED,
    TIMEOUTS,
    SOURCE_OPENS,
    SOURCE_STATS,
    SOURCE_LISTINGS,
    SOURCE_OPEN_RETRIES,
    SOURCE_REATTACHED,
    OPENS_FROM_META,
    OPENS_REVALIDATED,
    OPENS_DIR_VERIFIED,
    FAST_FAILS,
    DIRECT_READS,
)

# Upper bounds (bytes) of the request-size histogram: 4K pages, 128K default read-ahead, 1M FUSE max.
REQUEST_SIZE_BUCKETS = (4096, 16384, 65536, 131072, 262144, 1048576)
# Upper bounds (seconds) of the pread latency histogram: 50 us (RAM) .. 10 s (stalled network).
LATENCY_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0, 10.0)
# Files tracked for the top-N table; reaching it drops the least-fetched half in one sort (amortised
# O(log n) per new file: a scan per new file, as before, cost 4,096 comparisons under the lock for
# every file after the 4,096th and held a 10,000-file pass of 16 readers to 0.6x direct).
MAX_TRACKED_FILES = 4096
# Entries kept when the table is full (the most-fetched): half, so a prune runs once per 2,048 new files.
TRACKED_FILES_KEPT = MAX_TRACKED_FILES // 2

_SIZE_KEYS = tuple(f"size_le_{b}" for b in REQUEST_SIZE_BUCKETS) + ("size_gt_1048576",)
_LAT_KEYS = tuple(f"lat_le_{b}" for b in LATENCY_BUCKETS) + ("lat_inf",)
# A shard is a list; these are its slots (lists index faster than dicts on the read path).
_KEYS = COUNTERS + _SIZE_KEYS + _LAT_KEYS + ("lat_sum",)
_INDEX = {name: i for i, name in enumerate(_KEYS)}
_I_REQUESTS, _I_REQUESTED, _I_SERVED = _INDEX[READ_REQUESTS], _INDEX[BYTES_REQUESTED], _INDEX[BYTES_SERVED_CACHE]
_I_PREADS, _I_LAT_SUM = _INDEX[PREADS], _INDEX["lat_sum"]
# Size slot by (size - 1).bit_length(): the bounds are powers of two, so no search per request.
_SIZE_SLOT_BY_BITS = tuple(
    _INDEX[_SIZE_KEYS[bisect.bisect_left(REQUEST_SIZE_BUCKETS, 1 << bits)]]
    for bits in range(REQUEST_SIZE_BUCKETS[-1].bit_length())
)
_SIZE_SLOT_LARGE = _INDEX[_SIZE_KEYS[-1]]
_get_ident = threading.get_ident


def _fetched_of(item: tuple[str, list[int]]) -> int:
    """Sort key of a tracked file: its fetched bytes."""
    return item[1][0]


class Stats:
    """Per-mount counters; cheap to update from any thread, summed on :meth:`snapshot`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shards: dict[int, list[float]] = {}
        self._files: dict[str, list[int]] = {}  # path -> [fetched, delivered]
        self._errors: dict[str, int] = {}
        self.started = time.time()
        self._monotonic_start = time.monotonic()
        self.gauges: dict[str, Any] = {}  # filled by the engine's snapshot hook
        self.enabled = True

    def _shard(self) -> list[float]:
        return self._shards.get(_get_ident()) or self._new_shard()

    def _new_shard(self) -> list[float]:
        shard: list[float] = [0] * len(_KEYS)
        with self._lock:
            self._shards[_get_ident()] = shard
        return shard

    def add(self, name: str, value: int = 1) -> None:
        """Add *value* to counter *name* (the shard's lookup inlined: every request counts something)."""
        if self.enabled:
            (self._shards.get(_get_ident()) or self._new_shard())[_INDEX[name]] += value

    def request(self, size: int, served_from_cache: int) -> None:
        """One application read that delivered *size* bytes, *served_from_cache* of them from RAM blocks."""
        if not self.enabled:
            return
        shard = self._shards.get(_get_ident()) or self._new_shard()
        shard[_I_REQUESTS] += 1
        shard[_I_REQUESTED] += size
        shard[_I_SERVED] += served_from_cache
        bits = (size - 1).bit_length() if size > 0 else 0
        shard[_SIZE_SLOT_BY_BITS[bits] if bits < len(_SIZE_SLOT_BY_BITS) else _SIZE_SLOT_LARGE] += 1

    def pread(self, seconds: float) -> None:
        """One source pread that took *seconds*."""
        if not self.enabled:
            return
        shard = self._shard()
        shard[_I_PREADS] += 1
        shard[_I_LAT_SUM] += seconds
        shard[_INDEX[_LAT_KEYS[bisect.bisect_left(LATENCY_BUCKETS, seconds)]]] += 1

    def direct(self, reads: int, nbytes: int, seconds: float, latency: Sequence[int], sizes: Mapping[int, int]) -> None:
        """Reads the kernel layer answered itself, each one request and one pread (see
        :meth:`fastfs.fsio.readpath.ReadPath.direct_served`): *latency* counts them by
        :data:`LATENCY_BUCKETS` (one more for beyond the last), *sizes* by ``(size - 1).bit_length()``."""
        if not self.enabled:
            return
        shard = self._shard()
        shard[_I_REQUESTS] += reads
        shard[_I_REQUESTED] += nbytes
        shard[_I_PREADS] += reads
        shard[_I_LAT_SUM] += seconds
        shard[_INDEX[DIRECT_READS]] += reads
        shard[_INDEX[BYTES_FETCHED_DEMAND]] += nbytes
        for key, n in zip(_LAT_KEYS, latency, strict=True):
            shard[_INDEX[key]] += n
        for bits, n in sizes.items():
            shard[_SIZE_SLOT_BY_BITS[bits] if bits < len(_SIZE_SLOT_BY_BITS) else _SIZE_SLOT_LARGE] += n

    def error(self, errno_name: str) -> None:
        """A source error, counted by errno name (EIO, ETIMEDOUT, ...)."""
        with self._lock:
            self._errors[errno_name] = self._errors.get(errno_name, 0) + 1
        self.add(PREAD_ERRORS)

    def file_bytes(self, path: str, fetched: int = 0, delivered: int = 0) -> None:
        """Per-file fetched/delivered bytes for the top-N table (amplification per file)."""
        if not self.enabled:
            return
        with self._lock:
            entry = self._files.get(path)
            if entry is None:
                if len(self._files) >= MAX_TRACKED_FILES:
                    self._prune_files()
                entry = self._files[path] = [0, 0]
            entry[0] += fetched
            entry[1] += delivered

    def _prune_files(self) -> None:
        """Keep the TRACKED_FILES_KEPT most-fetched files (caller holds ``_lock``)."""
        kept = heapq.nlargest(TRACKED_FILES_KEPT, self._files.items(), key=_fetched_of)
        self._files = dict(kept)

    def counters(self) -> dict[str, float]:
        """Sum of all shards, by name."""
        with self._lock:
            shards = list(self._shards.values())
        total = [0.0] * len(_KEYS)
        for shard in shards:
            for i, value in enumerate(list(shard)):
                total[i] += value
        return dict(zip(_KEYS, total, strict=True))

    def snapshot(self, top: int = 10) -> dict[str, Any]:
        """JSON-ready view: counters, histograms, derived ratios, gauges and the top files."""
        c = self.counters()
        with self._lock:
            errors = dict(self._errors)
            files = sorted(self._files.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
        requested = c[BYTES_REQUESTED]
        fetched = c[BYTES_FETCHED_DEMAND] + c[BYTES_FETCHED_PREFETCH]
        prefetched = c[BYTES_FETCHED_PREFETCH] + c[BYTES_DISK_PREFETCH]  # read ahead, from the source or disk
        lat_counts = [int(c[k]) for k in _LAT_KEYS]
        return {
            "version": 1,
            "uptime_seconds": round(time.monotonic() - self._monotonic_start, 3),
            "started": self.started,
            "counters": {k: int(c[k]) for k in COUNTERS},
            "request_sizes": dict(
                zip([str(b) for b in REQUEST_SIZE_BUCKETS] + ["+Inf"], [int(c[k]) for k in _SIZE_KEYS], strict=False)
            ),
            "pread_latency": {
                "buckets": dict(zip([str(b) for b in LATENCY_BUCKETS] + ["+Inf"], lat_counts, strict=False)),
                "sum_seconds": c["lat_sum"],
                "count": int(c[PREADS]),
                "p50": _quantile(lat_counts, 0.50),
                "p95": _quantile(lat_counts, 0.95),
                "p99": _quantile(lat_counts, 0.99),
            },
            "errors": errors,
            "derived": {
                "hit_ratio": c[BYTES_SERVED_CACHE] / requested if requested else 0.0,
                "amplification": fetched / requested if requested else 0.0,
                "prefetch_accuracy": c[BYTES_PREFETCH_USED] / prefetched if prefetched else 0.0,
                "bytes_fetched": int(fetched),
            },
            "gauges": dict(self.gauges),
            "top_files": [
                {"path": p, "fetched": f, "delivered": d, "amplification": (f / d if d else None)}
                for p, (f, d) in files
            ],
        }


# Keys of a snapshot's "mount" section shown to callers who see only the redacted view.
REDACTED_MOUNT_KEYS = ("mountpoint", "pid")


def redact(snap: dict[str, Any]) -> dict[str, Any]:
    """The snapshot a caller other than the mounting user and root may see: every counter, ratio,
    histogram, gauge and error count, but no path (no top-files table, no source directory; only the
    mount point the caller itself used, and the daemon's pid)."""
    out = {key: value for key, value in snap.items() if key not in ("top_files", "top_files_dropped", "mount")}
    out["top_files"] = []
    if "mount" in snap:
        out["mount"] = {key: snap["mount"][key] for key in REDACTED_MOUNT_KEYS if key in snap["mount"]}
    out["redacted"] = True
    return out


def encode_bounded(snap: dict[str, Any], limit: int) -> bytes:
    """Compact JSON of *snap* in at most *limit* bytes: rows of ``top_files`` are dropped from the end
    (the least fetched first) until it fits, and ``top_files_dropped`` says how many were (long paths
    would otherwise make a snapshot too large for one extended attribute)."""
    data = json.dumps(snap, separators=(",", ":")).encode()
    rows = snap.get("top_files")
    if len(data) <= limit or not rows:
        return data
    lo, hi = 0, len(rows) - 1  # the most rows that fit lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        trial = json.dumps(
            {**snap, "top_files": rows[:mid], "top_files_dropped": len(rows) - mid}, separators=(",", ":")
        )
        if len(trial.encode()) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return json.dumps(
        {**snap, "top_files": rows[:lo], "top_files_dropped": len(rows) - lo}, separators=(",", ":")
    ).encode()


def _quantile(counts: list[int], q: float) -> float | None:
    """Upper bound of the latency bucket holding quantile *q* (None when empty)."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    running = 0
    for bound, n in zip(LATENCY_BUCKETS + (float("inf"),), counts, strict=False):
        running += n
        if running >= rank:
            return bound if bound != float("inf") else LATENCY_BUCKETS[-1]
    return LATENCY_BUCKETS[-1]  # pragma: no cover
