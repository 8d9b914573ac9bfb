"""``GET /healthz`` of the metrics listener: does the mount answer, and is its disk tier usable?

A health check must say what a user of the mount would see, so :class:`HealthCheck` asks the mount
itself: one ``statfs`` of the mount point from inside the daemon travels through the kernel to a
serving thread and back, like any request of a reader. The answer is

* **200** with ``ok: MNT answers`` when the daemon serves and that round trip came back within
  :data:`HEALTH_TIMEOUT`;
* **503** with ``unavailable: ...`` and the reason otherwise (not mounted yet or any more, the
  request failed, or it did not come back in time).

A second line reports the disk tier (``cache.disk_dir``) when there is one: ``usable`` with its use,
budget and free space, or ``unusable`` with why (its directory is gone or not writable, or the
free-space floor leaves it no room). An unusable tier does not make the mount unhealthy: reads go
to the source instead.

A probe whose ``statfs`` is stuck (a hung mount) is never started twice: later checks answer 503
at once until it returns, so health checks cannot pile up threads.

Concurrency: ``_lock`` guards ``_pending`` (the probe in flight); everything else is read-only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from fastfs.daemon.summary import human_bytes

# Seconds the mount may take to answer the health probe's statfs before the check says 503.
HEALTH_TIMEOUT = 2.0
# Snapshot gauges of the disk tier (present only on mounts that have one).
DISK_BUDGET, DISK_USE, DISK_FREE = "disk_cache_budget", "disk_cache_bytes", "disk_free_bytes"


class HealthCheck:
    """Health of one mount; :meth:`check` returns (HTTP status, short text body)."""

    def __init__(
        self,
        mountpoint: str,
        serving: Callable[[], bool],
        snapshot: Callable[[], dict[str, Any]],
        disk_dir: str = "",
        timeout: float = HEALTH_TIMEOUT,
    ) -> None:
        self.mountpoint = mountpoint
        self.serving = serving  # True while the daemon's connection to the kernel is live
        self.snapshot = snapshot
        self.disk_dir = disk_dir
        self.timeout = timeout
        self._lock = threading.Lock()
        self._pending: threading.Event | None = None  # set when the probe in flight returns

    def check(self) -> tuple[int, str]:
        mount_ok, mount_line = self._mount()
        lines = [mount_line]
        if self.disk_dir:
            lines.append(self._disk())
        return (200 if mount_ok else 503), "\n".join(lines) + "\n"

    def _mount(self) -> tuple[bool, str]:
        if not self.serving():
            return False, f"unavailable: {self.mountpoint} is not mounted (starting, or its connection ended)"
        with self._lock:
            if self._pending is not None and not self._pending.is_set():
                return False, f"unavailable: {self.mountpoint} has not answered an earlier health probe yet"
            done = self._pending = threading.Event()
        outcome: list[str] = []

        def probe() -> None:
            try:
                os.statvfs(self.mountpoint)
            except OSError as e:
                outcome.append(e.strerror or str(e))
            finally:
                done.set()

        threading.Thread(target=probe, name="fastfs-health", daemon=True).start()
        if not done.wait(self.timeout):
            return False, f"unavailable: {self.mountpoint} did not answer within {self.timeout:g} s"
        if outcome:
            return False, f"unavailable: {self.mountpoint}: {outcome[0]}"
        return True, f"ok: {self.mountpoint} answers"

    def _disk(self) -> str:
        if not os.path.isdir(self.disk_dir) or not os.access(self.disk_dir, os.W_OK | os.X_OK):
            return f"disk tier: unusable: {self.disk_dir} is missing or not writable"
        try:
            gauges = self.snapshot().get("gauges", {})
        except Exception as e:  # noqa: BLE001 - the check reports, never raises
            return f"disk tier: unknown: {e}"
        budget, use, free = (int(gauges.get(k, 0)) for k in (DISK_BUDGET, DISK_USE, DISK_FREE))
        if DISK_BUDGET in gauges and budget <= 0:
            return f"disk tier: unusable: no room above the free-space floor ({human_bytes(free)} free)"
        return f"disk tier: usable ({human_bytes(use)} of {human_bytes(budget)} budget, {human_bytes(free)} free)"
