"""Parallel pread pool: worker threads running source reads, demand before prefetch.

Each job is a callable doing one ``os.preadv`` (the GIL is released during the syscall, so N
workers keep N requests in flight). Two kinds of work:

* demand jobs (a reader is waiting) go to a C-implemented ``queue.SimpleQueue`` served by their own
  workers, so a reader never waits behind prefetches and a hand-off costs one C-level wakeup;
* prefetch jobs go to a bounded deque served by the general workers; a full deque declines the
  submission (the caller counts it as backpressure). A queued prefetch that a reader starts to
  wait for is promoted to the demand queue.

One file cannot hold the pool. A job may name its file's :class:`FileGroup` (attribute ``group``);
at most ``file_workers`` jobs of one group run at once on each kind of worker. A worker that takes
a job of a group already at that bound parks it on the group instead of running it, and the worker
that finishes a job of the group runs the next parked one. So a file whose source reads hang holds
at most ``file_workers`` workers of each kind; its other reads wait without holding any, and every
other file keeps the rest.

Concurrency: ``_lock`` guards the prefetch deque and ``_stopping``; ``_general`` is a condition on
it that idle general workers wait on. The demand queue is internally synchronised. ``_group_lock``
guards the ``running`` and ``parked`` fields of every group. Jobs run without any lock. Read
without a lock, on purpose: ``_stopping`` in :meth:`PreadPool._run` (a bool that only goes True; a
stale False runs one more parked job of a closing pool) and the deque length in
:meth:`PreadPool.queued` (a gauge). ``workers``, ``file_limit`` and ``prefetch_limit`` never change.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

# Workers serving demand reads: one per FUSE thread that may be waiting, so demand never queues.
DEMAND_WORKERS = 16
# Queued prefetch jobs per general worker before submissions are declined (bounds queued work).
PREFETCH_QUEUE_PER_WORKER = 64

Job = Callable[[], None]
_STOP = None
# Worker kinds (index into FileGroup.running / parked).
DEMAND, GENERAL = 0, 1


class FileGroup:
    """The jobs of one file version in the pool: how many run per worker kind, and those parked
    (waiting for one of them to finish). Fields guarded by the pool's ``_group_lock``."""

    __slots__ = ("running", "parked")

    def __init__(self) -> None:
        self.running = [0, 0]
        self.parked: tuple[deque[Job], deque[Job]] = (deque(), deque())


class PreadPool:
    """Demand workers on a SimpleQueue plus general workers on a bounded prefetch deque."""

    def __init__(
        self,
        workers: int,
        name: str = "fastfs-pread",
        demand_workers: int = DEMAND_WORKERS,
        file_workers: int | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._group_lock = threading.Lock()
        per_file = file_workers or max(workers, demand_workers)
        self.file_limit = (max(1, min(per_file, demand_workers)), max(1, min(per_file, workers)))
        self._general = threading.Condition(self._lock)
        self._demand: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._prefetch: deque[Job] = deque()  # guarded by _lock
        self._stopping = False  # guarded by _lock (written); see the module docstring for unlocked reads
        self.workers = workers
        self.prefetch_limit = PREFETCH_QUEUE_PER_WORKER * workers
        self._threads = [
            threading.Thread(target=self._run_prefetch, name=f"{name}-{i}", daemon=True) for i in range(workers)
        ] + [threading.Thread(target=self._run_demand, name=f"{name}-d{i}", daemon=True) for i in range(demand_workers)]
        for t in self._threads:
            t.start()

    def submit_demand(self, job: Job) -> None:
        self._demand.put(job)

    def submit_prefetch(self, job: Job) -> bool:
        """Queue a prefetch job; False (declined) when the prefetch queue is full."""
        with self._lock:
            if len(self._prefetch) >= self.prefetch_limit or self._stopping:
                return False
            self._prefetch.append(job)
            self._general.notify()
            return True

    def submit_prefetch_all(self, jobs: Sequence[Job]) -> bool:
        """Queue several prefetch jobs together, or none of them (False: the queue has no room)."""
        with self._lock:
            if len(self._prefetch) + len(jobs) > self.prefetch_limit or self._stopping:
                return False
            self._prefetch.extend(jobs)
            if len(jobs) == 1:
                self._general.notify()
            else:
                self._general.notify(len(jobs))
            return True

    def promote(self, job: Job) -> bool:
        """Move a queued (or parked) prefetch job to the demand queue (a reader now waits for it)."""
        with self._lock:
            try:
                self._prefetch.remove(job)
                found = True
            except ValueError:
                found = False
        if not found:
            group = getattr(job, "group", None)
            if group is None:
                return False
            with self._group_lock:
                try:
                    group.parked[GENERAL].remove(job)
                except ValueError:
                    return False  # already running or done
        self._demand.put(job)
        return True

    def _run(self, job: Job, kind: int) -> None:
        """Run *job* on a worker of *kind*, or park it when its file already runs its share there;
        then run the parked jobs of the same file while there are any."""
        group: FileGroup | None = getattr(job, "group", None)
        if group is None:
            self._call(job)
            return
        with self._group_lock:
            if group.running[kind] >= self.file_limit[kind]:
                group.parked[kind].append(job)
                return
            group.running[kind] += 1
        while True:
            self._call(job)
            with self._group_lock:
                parked = group.parked[kind]
                if not parked or self._stopping:
                    group.running[kind] -= 1
                    return
                job = parked.popleft()

    @staticmethod
    def _call(job: Job) -> None:
        try:
            job()
        except Exception:  # a job reports its own errors; this guards the worker
            log.exception("pread job failed")

    def queued(self) -> tuple[int, int]:
        return self._demand.qsize(), len(self._prefetch)

    def _run_demand(self) -> None:
        get = self._demand.get
        while True:
            job = get()
            if job is _STOP:
                return
            self._run(job, DEMAND)

    def _run_prefetch(self) -> None:
        while True:
            with self._lock:
                while not self._prefetch:
                    if self._stopping:
                        return
                    self._general.wait()
                job = self._prefetch.popleft()
            self._run(job, GENERAL)

    def close(self, timeout: float = 5.0) -> None:
        """Drop queued prefetch, let workers finish running jobs and exit."""
        with self._lock:
            self._stopping = True
            self._prefetch.clear()
            self._general.notify_all()
        for t in self._threads:
            if t.name.rsplit("-", 1)[-1].startswith("d"):
                self._demand.put(_STOP)
        deadline = time.monotonic() + timeout  # one deadline: workers stuck on a hung source are daemons
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
