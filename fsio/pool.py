"""Parallel pread pool: worker threads running source reads, demand before prefetch.

Each job is a callable doing one ``os.preadv`` (the GIL is released during the syscall, so N
workers keep N requests in flight). Two queues: demand jobs (a reader is waiting) are always taken
first; prefetch jobs wait behind them and their queue is bounded, so a burst of plans cannot pile
up unbounded work (the submitter treats a full queue as backpressure). A few workers take only
demand jobs, so a reader never waits behind prefetches that occupy every general worker.

Concurrency: ``_lock`` guards both deques, the idle counts and ``_stopping``; ``_general`` and
``_demand_cv`` are conditions on it for the two kinds of worker (a wakeup always goes to a worker
that can take the job). Jobs run without the lock.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

# Workers reserved for demand jobs (readers waiting) on top of the general ones.
DEMAND_ONLY_WORKERS = 4
# Queued prefetch jobs per general worker before submissions are declined (bounds queued work).
PREFETCH_QUEUE_PER_WORKER = 64

Job = Callable[[], None]


class PreadPool:
    """Fixed set of worker threads with a demand queue and a bounded prefetch queue."""

    def __init__(self, workers: int, name: str = "fastfs-pread") -> None:
        self._lock = threading.Lock()
        self._general = threading.Condition(self._lock)
        self._demand_cv = threading.Condition(self._lock)
        self._idle_general = 0
        self._idle_demand = 0
        self._demand: deque[Job] = deque()
        self._prefetch: deque[Job] = deque()
        self._stopping = False
        self.workers = workers
        self.prefetch_limit = PREFETCH_QUEUE_PER_WORKER * workers
        self._threads = [
            threading.Thread(target=self._run, args=(False,), name=f"{name}-{i}", daemon=True) for i in range(workers)
        ] + [
            threading.Thread(target=self._run, args=(True,), name=f"{name}-d{i}", daemon=True)
            for i in range(DEMAND_ONLY_WORKERS)
        ]
        for t in self._threads:
            t.start()

    def submit_demand(self, job: Job) -> None:
        with self._lock:
            self._demand.append(job)
            if self._idle_demand:
                self._demand_cv.notify()
            else:
                self._general.notify()

    def submit_prefetch(self, job: Job) -> bool:
        """Queue a prefetch job; False (declined) when the prefetch queue is full."""
        with self._lock:
            if len(self._prefetch) >= self.prefetch_limit or self._stopping:
                return False
            self._prefetch.append(job)
            self._general.notify()
            return True

    def promote(self, job: Job) -> bool:
        """Move a queued prefetch job to the demand queue (a reader now waits for it)."""
        with self._lock:
            try:
                self._prefetch.remove(job)
            except ValueError:
                return False  # already running or done
            self._demand.appendleft(job)
            if self._idle_demand:
                self._demand_cv.notify()
            else:
                self._general.notify()
            return True

    def queued(self) -> tuple[int, int]:
        return len(self._demand), len(self._prefetch)

    def _run(self, demand_only: bool) -> None:
        cond = self._demand_cv if demand_only else self._general
        while True:
            with self._lock:
                while True:
                    if self._demand:
                        job = self._demand.popleft()
                        break
                    if not demand_only and self._prefetch:
                        job = self._prefetch.popleft()
                        break
                    if self._stopping:
                        return
                    if demand_only:
                        self._idle_demand += 1
                        cond.wait()
                        self._idle_demand -= 1
                    else:
                        self._idle_general += 1
                        cond.wait()
                        self._idle_general -= 1
            try:
                job()
            except Exception:  # a job reports its own errors; this guards the worker
                log.exception("pread job failed")

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting prefetch, drop queued prefetch, let workers finish demand jobs and exit."""
        with self._lock:
            self._stopping = True
            self._prefetch.clear()
            self._general.notify_all()
            self._demand_cv.notify_all()
        for t in self._threads:
            t.join(timeout)
