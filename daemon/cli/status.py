"""``fastfs status [MNT...]``: every fastfs mount on this machine, its health and its cache.

The mounts are the fastfs entries of ``/proc/self/mountinfo``. Each is asked for its stats
snapshot through the root's ``user.fastfs.stats`` extended attribute (what ``fastfs stats`` reads),
all in parallel and each in its own thread, and the whole command (the mount table included) runs
under one deadline of :data:`PROBE_TIMEOUT` seconds, so no hung or dead daemon can hang the listing,
and no mount point is touched but by those bounded requests. A mount is

* ``ok``: the daemon answered (source, pid, uptime, cache use and hit ratio come from its snapshot);
* ``dead``: the daemon is gone: the process it recorded (:mod:`fastfs.daemon.mounttable`) no longer
  runs, or was killed and only waits to exit (then no request is sent to it at all), or the kernel
  says so (ENOTCONN); the command that recovers it is shown;
* ``unresponsive``: no answer within :data:`PROBE_TIMEOUT`;
* ``inaccessible``: another user's mount without ``allow_other`` (EACCES / EPERM).

Exit status: 0 when no listed mount is dead or unresponsive, else 1. ``--json`` prints
``{"mounts": [...]}`` with the fields of :class:`MountStatus`.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import threading
import time
from typing import Any

from fastfs.daemon.control import XATTR_STATS
from fastfs.daemon.mounttable import (
    MountEntry,
    MountRecord,
    bounded,
    canonical,
    daemon_alive,
    is_fastfs,
    mount_record,
    mounts,
)
from fastfs.daemon.summary import duration, human_bytes, pct

# Seconds a mount may take to answer its stats request before it is reported unresponsive.
PROBE_TIMEOUT = 5.0
# Prefix of the fsname fastfs gives its mounts (mountinfo's source field).
FSNAME_PREFIX = "fastfs:"
STATES_FAILED = ("dead", "unresponsive")


class StatusError(Exception):
    """One-line reason the status cannot be listed."""


@dataclasses.dataclass
class MountStatus:
    """One fastfs mount as ``fastfs status`` reports it (also the ``--json`` schema)."""

    mountpoint: str
    source: str
    state: str  # ok | dead | unresponsive | inaccessible
    pid: int | None = None
    uptime_seconds: float | None = None
    started: float | None = None  # Unix time the mount started
    cache_bytes: int | None = None
    cache_budget: int | None = None
    hit_ratio: float | None = None
    recover: str | None = None  # command that recovers a dead or hung mount
    error: str | None = None


def _source_of(entry: MountEntry) -> str:
    src = entry.source
    return src[len(FSNAME_PREFIX) :] if src.startswith(FSNAME_PREFIX) else src


def from_snapshot(entry: MountEntry, snap: dict[str, Any]) -> MountStatus:
    """The status of a mount that answered with *snap*."""
    mount = snap.get("mount") or {}
    gauges = snap.get("gauges") or {}
    derived = snap.get("derived") or {}
    return MountStatus(
        mountpoint=entry.mountpoint,
        source=mount.get("source") or _source_of(entry),
        state="ok",
        pid=mount.get("pid"),
        uptime_seconds=snap.get("uptime_seconds"),
        started=snap.get("started"),
        cache_bytes=gauges.get("cache_bytes"),
        cache_budget=gauges.get("cache_budget"),
        hit_ratio=derived.get("hit_ratio"),
    )


def from_error(entry: MountEntry, error: OSError | None, timeout: float = PROBE_TIMEOUT) -> MountStatus:
    """The status of a mount whose stats request failed (*error*) or timed out (None)."""
    mnt = entry.mountpoint
    status = MountStatus(mountpoint=mnt, source=_source_of(entry), state="unresponsive")
    if error is None:
        status.error = f"no answer within {timeout:.0f}s"
        status.recover = f"fastfs umount --lazy {mnt}"
    elif error.errno in (errno.ENOTCONN, errno.ECONNABORTED):
        status.state, status.error = "dead", "the fastfs daemon is not running"
        status.recover = f"fastfs umount {mnt}"
    elif error.errno in (errno.EACCES, errno.EPERM):
        status.state, status.error = "inaccessible", "mounted by another user without allow_other"
    else:
        status.state, status.error = "unresponsive", error.strerror or str(error)
        status.recover = f"fastfs umount --lazy {mnt}"
    return status


def probe(entries: list[MountEntry], timeout: float = PROBE_TIMEOUT) -> list[MountStatus]:
    """Ask every mount for its snapshot in parallel; one deadline for all.

    A mount whose recorded daemon is gone is ``dead`` at once, without a request to it: the
    connection of a daemon killed while a thread waits in a hung source's read stays open, and a
    request to it would only wait."""
    results: dict[int, dict[str, Any] | OSError] = {}
    dead: dict[int, MountRecord] = {}

    def ask(i: int, mnt: str) -> None:
        try:
            results[i] = json.loads(os.getxattr(mnt, XATTR_STATS))
        except OSError as e:
            results[i] = e
        except ValueError:
            results[i] = OSError(errno.EBADMSG, "not a valid stats snapshot")

    threads = []
    for i, entry in enumerate(entries):
        record = mount_record(entry)
        if record is not None and not daemon_alive(record):
            dead[i] = record
            continue
        t = threading.Thread(target=ask, args=(i, entry.mountpoint), name="fastfs-status", daemon=True)
        t.start()
        threads.append(t)
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    out = []
    for i, entry in enumerate(entries):
        result = results.get(i)
        if i in dead:
            out.append(from_dead_daemon(entry, dead[i]))
        elif isinstance(result, dict):
            out.append(from_snapshot(entry, result))
        else:
            out.append(from_error(entry, result, timeout))
    return out


def from_dead_daemon(entry: MountEntry, record: MountRecord) -> MountStatus:
    """The status of a mount whose recorded daemon process is gone (or killed, waiting to exit)."""
    return MountStatus(
        mountpoint=entry.mountpoint,
        source=record.source or _source_of(entry),
        state="dead",
        error=f"the fastfs daemon (pid {record.pid}) is gone",
        recover=f"fastfs umount {entry.mountpoint}",
    )


def fastfs_mounts(paths: list[str] | None = None) -> list[MountEntry]:
    """The fastfs mounts of the mount table (only those at *paths* when given). No mount point is
    touched: a path is compared in its :func:`~fastfs.daemon.mounttable.canonical` form."""
    try:
        entries = [e for e in mounts() if is_fastfs(e)]
    except OSError as e:
        raise StatusError(f"cannot read the mount table: {e.strerror}") from None
    if not paths:
        return entries
    by_point = {e.mountpoint: e for e in entries}  # the topmost mount of a point wins
    chosen = []
    for path in paths:
        entry = by_point.get(canonical(path)) or by_point.get(os.path.realpath(path))
        if entry is None:
            raise StatusError(f"{path} is not a fastfs mount")
        chosen.append(entry)
    return chosen


def format_table(statuses: list[MountStatus]) -> str:
    """Aligned columns, one line per mount; failed mounts followed by their recovery command."""
    if not statuses:
        return "no fastfs mounts"
    header = ("MOUNTPOINT", "SOURCE", "STATE", "PID", "UPTIME", "CACHE", "HIT")
    rows = []
    for s in statuses:
        ok = s.state == "ok"
        rows.append(
            (
                s.mountpoint,
                s.source,
                s.state,
                str(s.pid) if s.pid is not None else "-",
                duration(s.uptime_seconds) if ok and s.uptime_seconds is not None else "-",
                f"{human_bytes(s.cache_bytes or 0)} / {human_bytes(s.cache_budget or 0)}" if ok else "-",
                pct(s.hit_ratio) if ok else "-",
            )
        )
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    for s, row in zip(statuses, rows, strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if s.state != "ok":
            lines.append(f"  {s.error}" + (f"; recover with: {s.recover}" if s.recover else ""))
    return "\n".join(lines)


def main(args: Any) -> int:
    """Entry of ``fastfs status`` (args: mountpoints, json). Raises StatusError.

    Everything runs under one deadline of :data:`PROBE_TIMEOUT` seconds: the mount table and the
    paths are read in a bounded thread too, so no dead or hung mount can hold the command."""
    deadline = time.monotonic() + PROBE_TIMEOUT
    finished, found = bounded(lambda: fastfs_mounts(args.mountpoints), PROBE_TIMEOUT)
    if not finished:
        raise StatusError(f"the mount table did not answer within {PROBE_TIMEOUT:.0f}s")
    if isinstance(found, BaseException):
        raise found
    assert isinstance(found, list)
    statuses = probe(found, timeout=max(0.0, deadline - time.monotonic()))
    if args.json:
        print(json.dumps({"mounts": [dataclasses.asdict(s) for s in statuses]}, indent=2))
    else:
        print(format_table(statuses))
    return 1 if any(s.state in STATES_FAILED for s in statuses) else 0
