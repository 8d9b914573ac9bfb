"""Closing source descriptors off the release path: a RELEASE never waits on the source.

Why: on a FUSE source (sshfs, s3fs, rclone, NFS through another daemon) closing a descriptor is a
round trip (the kernel's FLUSH), and on a hung source one that never ends. The daemon answers the
kernel's RELEASEs at once and runs their handler on one thread, in batches
(:mod:`fastfs.daemon.kernel.session`); a close made there held every later release behind it. Over
s3fs (2 ms delay), 4 readers of 2,000 small files had their handles released 1.3 s (median) to 5 s
after they closed them, at about 20 ms a close; meanwhile the refresher took the handles still
counted for open files and checked them for growth, one more source stat each (a HEAD on s3fs, for
a third of the files); and a close stuck on one hung file held up every release after it, and
``fastfs stats``, which first runs the releases answered so far.

How: the release does its bookkeeping (the handle's count, the version's last handle) on its own
thread and hands the close to :meth:`Closer.submit`: a call that closes (a source file's last
reference given back, a direct-read table's duplicate descriptor). Daemon threads run the calls, at
most :data:`MAX_CLOSERS` at once, one started when a call finds none idle: a close stuck on a hung
file keeps its thread and leaves the others to the rest. With every thread stuck, later calls wait in
the queue (their descriptors stay open; no request waits for them). :meth:`Closer.close` runs what is
queued and waits for it, at most a bound: a close stuck for good is left behind with its thread.

Concurrency: ``_lock`` guards every field; ``_work`` (on it) wakes an idle thread for a call, ``_done``
(on it) wakes :meth:`Closer.drain` when the last call ended. Calls run without it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["CLOSE_WAIT", "MAX_CLOSERS", "Closer"]

log = logging.getLogger(__name__)

# Closes running at once, at most: each one FLUSH round trip on a FUSE source (10-20 ms over s3fs
# under load), several so that a close stuck on a hung file leaves the others going.
MAX_CLOSERS = 8
# Seconds Closer.close waits for the queued closes (an unmount): a close stuck on a hung source is
# left behind (its thread is a daemon thread), the unmount goes on.
CLOSE_WAIT = 5.0


class Closer:
    """Runs close calls on a few daemon threads (see the module docstring)."""

    def __init__(self, max_threads: int = MAX_CLOSERS, name: str = "fastfs-close") -> None:
        self.max_threads = max_threads
        self.name = name
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._done = threading.Condition(self._lock)
        self._queue: deque[Callable[[], object]] = deque()  # calls not started yet
        self._threads = 0  # threads started and not ended
        self._idle = 0  # of those, waiting for a call and not yet woken for one
        self._running = 0  # calls running now
        self._closed = False

    def submit(self, call: Callable[[], object]) -> None:
        """Run *call* on a closer thread (at once on the caller's after :meth:`close`)."""
        with self._lock:
            if not self._closed:
                self._queue.append(call)
                if self._idle:
                    self._idle -= 1  # (the woken thread is no longer counted idle)
                    self._work.notify()
                elif self._threads < self.max_threads:
                    self._threads += 1
                    threading.Thread(target=self._run, name=self.name, daemon=True).start()
                return
        self._call(call)

    def pending(self) -> int:
        """Calls queued or running (reports and tests)."""
        with self._lock:
            return len(self._queue) + self._running

    def drain(self, timeout: float) -> bool:
        """Wait until no call is queued or running, at most *timeout* seconds; True when none is."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queue or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._done.wait(left)
            return True

    def close(self, timeout: float = CLOSE_WAIT) -> bool:
        """Run what is queued, wait for it at most *timeout* seconds, and run later calls inline;
        True when every call ended."""
        done = self.drain(timeout)
        with self._lock:
            self._closed = True
            self._work.notify_all()
        return done

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    if self._closed:
                        self._threads -= 1
                        return
                    self._idle += 1
                    self._work.wait()
                call = self._queue.popleft()
                self._running += 1
            try:
                self._call(call)
            finally:
                with self._lock:
                    self._running -= 1
                    if not self._queue and not self._running:
                        self._done.notify_all()

    @staticmethod
    def _call(call: Callable[[], object]) -> None:
        try:
            call()
        except Exception:  # noqa: BLE001 - a failed close must not end the thread
            log.exception("deferred close failed")
