"""``fastfs stats MNT``: read a mount's ``.fastfs/stats`` snapshot and present it.

Default: a readable summary (hit ratio, amplification, prefetch accuracy, cache use, patterns,
source latency, errors). ``--json`` prints the raw snapshot; ``--top N`` lists files by bytes
fetched; ``--watch [S]`` prints one line of per-interval rates every S seconds until Ctrl-C.
The formatting helpers are also used by the daemon for ``STATUS=`` lines and log summaries.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from typing import Any

from fastfs.daemon.control import STATS_RELPATH, STATS_TOP_FILES, XATTR_STATS
from fastfs.daemon.mounttable import containing_mount, is_fastfs
from fastfs.daemon.summary import duration, fetched, human_bytes, ms, pct, ratio

# Smallest --watch interval accepted (two rows a second are still readable; faster is noise and load).
MIN_WATCH_INTERVAL = 0.5
# --watch repeats its header after this many lines.
WATCH_HEADER_EVERY = 20


class StatsError(Exception):
    """One-line reason the stats cannot be read."""


def _disk_lines(c: dict[str, Any], g: dict[str, Any]) -> list[str]:
    """The disk tier's lines of the summary (none without a disk tier)."""
    if "disk_cache_budget" not in g:
        return []
    return [
        f"  disk tier          {human_bytes(g.get('disk_cache_bytes', 0))} of"
        f" {human_bytes(g.get('disk_cache_budget', 0))} budget ({g.get('disk_cache_files', 0)} files),"
        f" {human_bytes(g.get('disk_free_bytes', 0))} free (floor {human_bytes(g.get('disk_free_floor', 0))})",
        f"  disk hits          {human_bytes(c.get('disk_hit_bytes', 0))} in {c.get('disk_hits', 0)} reads",
        f"  disk writes        {human_bytes(c.get('disk_bytes_written', 0))} in {c.get('disk_writes', 0)} writes,"
        f" dropped {c.get('disk_writes_dropped', 0)} (queue full), {c.get('disk_writes_no_room', 0)} (no room),"
        f" {c.get('disk_write_errors', 0)} errors; {c.get('disk_evictions', 0)} evictions"
        f" ({human_bytes(c.get('disk_evicted_bytes', 0))}), {c.get('disk_corrupt_dropped', 0)} corrupt entries dropped",
    ]


def _route_lines(c: dict[str, Any], g: dict[str, Any]) -> list[str]:
    """Opens and bytes by route: served by fastfs (its bytes are "requested"), and handed to the kernel
    by passthrough to the source file or to the disk tier's copy (those reads never reach fastfs)."""
    lines = [
        f"  opens served       {c.get('opens', 0)}, {human_bytes(c.get('bytes_requested', 0))} read through fastfs",
        f"  opens passthrough  {c.get('opens_passthrough', 0)}, files of"
        f" {human_bytes(c.get('bytes_passthrough_opened', 0))} (the kernel reads them from the source; not in"
        " requested)",
    ]
    lines.append(
        f"  handed over        {c.get('opens_handed', 0)} opens, {human_bytes(c.get('bytes_handed', 0))} put into the"
        " kernel's page cache at open (read there without a request; in requested)"
    )
    if "disk_cache_budget" in g or c.get("opens_disk", 0):
        lines.append(
            f"  opens disk         {c.get('opens_disk', 0)}, files of {human_bytes(c.get('bytes_disk_opened', 0))}"
            " (the kernel reads them from the disk tier)"
        )
    streamed, mapped = c.get("stream_route_passthrough", 0), c.get("stream_route_served", 0)
    if streamed or mapped:
        lines.append(
            f"  stream routes      {streamed} opens of large files passed through (their loader reads in order),"
            f" {mapped} served (their loader maps them, or opened again: RAM keeps them)"
        )
    return lines


def _source_line(source: dict[str, Any] | None) -> list[str]:
    """The source's access shape and why (the snapshot's ``source`` section; none from older daemons)."""
    if not source:
        return []
    probe = source.get("probe", "?")
    if probe == "recheck":  # a stream verdict, probed again at another large file's open
        probe = f"recheck (found a stream {source.get('probes', '?')}x; probed again at another large file's open)"
    return [
        f"  source shape       {source.get('shape', '?')} ({source.get('reason', '?')});"
        f" mount type {source.get('mount_type') or 'unknown'}, jump probe {probe}"
        + (
            "; directory times not kept: listings made anew after fuse.revalidate"
            if source.get("dir_times_kept") is False
            else ""
        )
    ]


def format_summary(snap: dict[str, Any]) -> str:
    """Multi-line human summary of one snapshot."""
    c = snap.get("counters", {})
    d = snap.get("derived", {})
    g = snap.get("gauges", {})
    lat = snap.get("pread_latency", {})
    mount = snap.get("mount", {})
    uptime = float(snap.get("uptime_seconds", 0))
    requested = int(c.get("bytes_requested", 0))
    prefetched = int(c.get("bytes_fetched_prefetch", 0))
    errors = snap.get("errors", {})
    # ratios of nothing are shown as "-", not as 0
    hit = d.get("hit_ratio", 0) if requested else None
    amplification = d.get("amplification", 0) if requested else None
    accuracy = d.get("prefetch_accuracy", 0) if requested and prefetched else None
    lines = [
        f"fastfs mount {mount.get('mountpoint', '?')} (source {mount.get('source', '?')}, pid {mount.get('pid', '?')}),"
        f" up {duration(uptime)}",
        f"  requested          {human_bytes(requested)} in {c.get('read_requests', 0)} reads"
        f" ({human_bytes(requested / uptime if uptime > 0 else 0)}/s average)",
        f"  served from cache  {human_bytes(c.get('bytes_served_from_cache', 0))} (hit ratio {pct(hit)})",
        *_route_lines(c, g),
        f"  fetched            {human_bytes(fetched(c))}: demand {human_bytes(c.get('bytes_fetched_demand', 0))},"
        f" prefetch {human_bytes(prefetched)}; {c.get('reads_direct', 0)} random reads answered by the"
        " request loop itself",
        f"  warm               {human_bytes(c.get('bytes_fetched_warm', 0))} fetched by fastfs warm,"
        f" {human_bytes(c.get('bytes_evicted_on_request', 0))} evicted on request (neither counts in"
        " amplification, accuracy or wasted)",
        f"  amplification      {ratio(amplification)} (fetched / requested)",
        f"  prefetch accuracy  {pct(accuracy)}"
        f" (used {human_bytes(c.get('bytes_prefetch_used', 0))}),"
        f" wasted {human_bytes(c.get('bytes_prefetch_wasted', 0))}",
        f"  cache              {human_bytes(g.get('cache_bytes', 0))} of {human_bytes(g.get('cache_budget', 0))}"
        f" budget ({g.get('cache_blocks', 0)} blocks), {g.get('open_files', 0)} open files,"
        f" {c.get('evictions', 0)} evictions",
        *_disk_lines(c, g),
        f"  backpressure       {c.get('prefetch_declined', 0)} prefetches declined (budget full)",
        f"  patterns           {c.get('sequential_streams', 0)} sequential streams"
        f" ({c.get('sequential_resets', 0)} reset), {c.get('random_streams', 0)} random,"
        f" {c.get('small_file_scans', 0)} small-file scans ({c.get('small_file_scan_files', 0)} files,"
        f" {c.get('small_file_scan_skipped', 0)} left to a reader that opened them first,"
        f" {c.get('small_file_scans_held', 0)} held: their reader skipped names,"
        f" {c.get('small_file_scans_serial', 0)} stopped: the source answered one fetch at a time,"
        f" {c.get('small_file_scans_unlisted', 0)} not started: the source's listing asks about every entry"
        " and the reader did not list;"
        f" {c.get('walk_ahead_scans', 0)} directories scanned ahead of a walk),"
        f" {c.get('format_plans', 0)} format plans, {c.get('mmap_streams', 0)} mmap,"
        f" {c.get('program_files', 0)} programs or libraries,"
        f" {c.get('learned_plans', 0)} learned plans ({c.get('learned_files_used', 0)} files used),"
        f" {c.get('learned_whole_plans', 0)} files loaded whole as last time",
        f"  source preads      {lat.get('count', c.get('preads', 0))}, latency p50 {ms(lat.get('p50'))},"
        f" p95 {ms(lat.get('p95'))}, p99 {ms(lat.get('p99'))}",
        f"  source requests    {c.get('source_opens', 0)} opens ({c.get('source_open_retries', 0)} made again:"
        " the source said EBADFD),"
        f" {c.get('source_stats', 0)} stats,"
        f" {c.get('source_listings', 0)} listings, {c.get('source_reattached', 0)} times its root opened"
        " again (its mount's connection was gone); opens without a source open:"
        f" {c.get('opens_from_metadata', 0)} fresh, {c.get('opens_revalidated', 0)} revalidated by a stat,"
        f" {c.get('opens_dir_verified', 0)} by their directory",
        *_source_line(snap.get("source")),
        "  errors             "
        + (", ".join(f"{k} {v}" for k, v in sorted(errors.items())) if errors else "none")
        + f" ({c.get('read_timeouts', 0)} read timeouts)",
    ]
    return "\n".join(lines)


def top_rows(snap: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The *n* rows of the snapshot's top files with the most bytes fetched, most first."""
    return sorted(snap.get("top_files", []), key=lambda r: r.get("fetched", 0), reverse=True)[: max(0, n)]


def format_top(snap: dict[str, Any], n: int) -> str:
    """Files by bytes fetched from the source, with their amplification."""
    rows = top_rows(snap, n)
    if not rows:
        return "no file has been fetched yet"
    out = [f"{'fetched':>12} {'delivered':>12} {'amp':>6}  path"]
    for r in rows:
        amp = r.get("amplification")
        out.append(
            f"{human_bytes(r.get('fetched', 0)):>12} {human_bytes(r.get('delivered', 0)):>12}"
            f" {('-' if amp is None else f'{amp:.2f}'):>6}  {r.get('path', '?')}"
        )
    return "\n".join(out)


def read_snapshot(path: str) -> dict[str, Any]:
    """The snapshot of the fastfs mount at or holding *path* (a file or directory inside it works too,
    as for ``fastfs warm``); :class:`StatsError` otherwise."""
    try:
        os.stat(path)
    except FileNotFoundError:
        raise StatsError(f"{path} does not exist") from None
    except OSError:
        pass  # a dead mount (ENOTCONN) is reported below, with the command that recovers it
    try:
        entry = containing_mount(path)
    except OSError as e:
        raise StatsError(f"cannot read the mount table: {e.strerror}") from None
    if not is_fastfs(entry):
        raise StatsError(f"{path} is not a fastfs mount nor inside one")
    assert entry is not None  # is_fastfs says so
    mountpoint = entry.mountpoint
    path = os.path.join(mountpoint, STATS_RELPATH)
    try:
        # the xattr is one consistent snapshot in every mode (with fuse.no_open there is no open
        # to take the file's snapshot at); the file is the fallback
        try:
            data = os.getxattr(mountpoint, XATTR_STATS)
        except OSError as e:
            if e.errno == errno.ENOTCONN:
                raise
            with open(path, "rb") as f:
                data = f.read()
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            hint = f"run: fastfs umount {mountpoint}"
            raise StatsError(f"{mountpoint}: the fastfs daemon is not running ({hint})") from None
        if e.errno == errno.ENOENT:
            raise StatsError(f"{mountpoint} is not a fastfs mount") from None
        raise StatsError(f"{path}: {e.strerror}") from None
    try:
        snap = json.loads(data)
    except ValueError:
        raise StatsError(f"{path}: not a valid stats snapshot") from None
    if not isinstance(snap, dict) or "counters" not in snap:
        raise StatsError(f"{path}: not a valid stats snapshot")
    return snap


def _bucket_quantile(buckets: dict[str, int], q: float) -> float | None:
    items = sorted(((float("inf") if k == "+Inf" else float(k)), v) for k, v in buckets.items())
    total = sum(v for _, v in items)
    if total <= 0:
        return None
    running = 0
    finite = [b for b, _ in items if b != float("inf")]
    for bound, count in items:
        running += count
        if running >= q * total:
            return bound if bound != float("inf") else (finite[-1] if finite else None)
    return None  # pragma: no cover


WATCH_COLUMNS = (
    ("time", 8),
    ("req/s", 11),
    ("hit", 6),
    ("fetch/s", 11),
    ("demand/s", 11),
    ("prefetch/s", 11),
    ("amp", 5),
    ("reads/s", 8),
    ("preads/s", 8),
    ("p95", 8),
    ("cache", 10),
    ("err", 4),
)


def _watch_header() -> str:
    return " ".join(f"{name:>{width}}" for name, width in WATCH_COLUMNS)


def watch_line(prev: dict[str, Any], cur: dict[str, Any], seconds: float) -> str:
    """Per-interval rates between two snapshots."""
    pc, cc = prev.get("counters", {}), cur.get("counters", {})

    def delta(key: str) -> float:
        return max(0.0, float(cc.get(key, 0)) - float(pc.get(key, 0)))

    dt = seconds if seconds > 0 else 1.0
    req = delta("bytes_requested")
    demand, prefetch = delta("bytes_fetched_demand"), delta("bytes_fetched_prefetch")
    hit = delta("bytes_served_from_cache") / req if req else None
    amp = (demand + prefetch) / req if req else None
    pb = prev.get("pread_latency", {}).get("buckets", {})
    cb = cur.get("pread_latency", {}).get("buckets", {})
    p95 = _bucket_quantile({k: max(0, v - pb.get(k, 0)) for k, v in cb.items()}, 0.95)
    errors = sum(cur.get("errors", {}).values()) - sum(prev.get("errors", {}).values())
    values = (
        time.strftime("%H:%M:%S"),
        f"{human_bytes(req / dt)}/s",
        pct(hit),
        f"{human_bytes((demand + prefetch) / dt)}/s",
        f"{human_bytes(demand / dt)}/s",
        f"{human_bytes(prefetch / dt)}/s",
        "-" if amp is None else f"{amp:.2f}",
        f"{delta('read_requests') / dt:.0f}",
        f"{delta('preads') / dt:.0f}",
        ms(p95),
        human_bytes(cur.get("gauges", {}).get("cache_bytes", 0)),
        str(max(0, errors)),
    )
    return " ".join(f"{v:>{w}}" for v, (_, w) in zip(values, WATCH_COLUMNS, strict=True))


def watch(mountpoint: str, interval: float, out: Any = None) -> int:
    """Print per-interval rates until Ctrl-C (exit 0) or the mount goes away (exit 1)."""
    out = out or sys.stdout
    if not interval >= MIN_WATCH_INTERVAL:  # the parser refuses these; also NaN
        raise StatsError(f"--watch needs an interval of at least {MIN_WATCH_INTERVAL:g} seconds, got {interval:g}")
    prev = read_snapshot(mountpoint)
    prev_t = time.monotonic()
    lines = 0
    try:
        while True:
            time.sleep(interval)
            cur = read_snapshot(mountpoint)
            now = time.monotonic()
            if lines % WATCH_HEADER_EVERY == 0:
                print(_watch_header(), file=out)
            print(watch_line(prev, cur, now - prev_t), file=out, flush=True)
            lines += 1
            prev, prev_t = cur, now
    except KeyboardInterrupt:
        return 0


def main(args: Any) -> int:
    """Entry of ``fastfs stats`` (args: mountpoint, json, watch, top). Raises StatsError."""
    if args.watch is not None:
        return watch(args.mountpoint, args.watch)
    snap = read_snapshot(args.mountpoint)
    if args.top is not None and args.top > STATS_TOP_FILES:
        print(f"fastfs stats: the daemon lists at most {STATS_TOP_FILES} files; showing those", file=sys.stderr)
    if args.json:
        if args.top is not None:
            snap["top_files"] = top_rows(snap, args.top)
        print(json.dumps(snap, indent=2))
    elif args.top is not None:
        print(format_top(snap, args.top))
    else:
        print(format_summary(snap))
    return 0
