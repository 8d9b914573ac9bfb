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
most :data:`MAX_CLOSERS`, started when needed:

* **One thread on duty takes the queue, in batches.** A call submitted while a thread is on duty
  wakes nobody: the duty thread takes it after the call it runs, or after its batch wait
  (:data:`BATCH_WAIT`): having emptied the queue it waits that long for more before it leaves duty.
  Closes come every 50-100 us on a busy mount, and waking a thread for each one cost more than the
  close (16 threads over 10,000 small files on emulated storage: 78,000 context switches of the
  closer's threads, about 8 a file, and 0.57 s of CPU, a seventh of the daemon's).
* **A slow close hands duty on.** A call that has run :data:`SLOW_CLOSE` or longer (a FLUSH round
  trip over s3fs under load, or a hung source) leaves the queue to another thread: the next submit, or
  the watcher, sees it and puts another thread on duty (an idle one, else a new one). So closes that
  each take a round trip run several at once, and a close stuck on a hung file holds up no other.
* **The watcher.** While the duty thread runs a call and calls wait behind it, one idle thread waits
  with a timeout of :data:`SLOW_CLOSE` instead of for good, and takes duty when that call turns out
  slow: the queue moves even if nothing is submitted after a stuck call.

With every thread stuck, later calls wait in the queue (their descriptors stay open; no request waits
for them). :meth:`Closer.close` runs what is queued and waits for it, at most a bound: a close stuck
for good is left behind with its thread.

Concurrency: ``_lock`` guards every field; idle threads and the watcher wait on ``_work`` (on it),
``_done`` (on it) wakes :meth:`Closer.drain` when the last call ended. Calls, and the duty thread's
batch wait, run without it. Invariants (:meth:`Closer.check`): ``0 <= _idle <= _threads <=
max_threads``; every thread in ``_running`` is counted in ``_threads``; at most one watcher.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["BATCH_WAIT", "CLOSE_WAIT", "MAX_CLOSERS", "SLOW_CLOSE", "Closer"]

log = logging.getLogger(__name__)

# Closes running at once, at most: each one FLUSH round trip on a FUSE source (10-20 ms over s3fs
# under load), several so that a close stuck on a hung file leaves the others going.
MAX_CLOSERS = 8
# Seconds Closer.close waits for the queued closes (an unmount): a close stuck on a hung source is
# left behind (its thread is a daemon thread), the unmount goes on.
CLOSE_WAIT = 5.0
# Seconds the duty thread waits for more calls once it has emptied the queue, before it leaves duty:
# one wake-up a batch instead of one a close (a descriptor closes that much later; nothing waits on it).
BATCH_WAIT = 0.005
# A call running this long (seconds) is slow or stuck: the queue goes to another thread. A close of a
# local file or of a FUSE source that answers no FLUSH takes microseconds; a FLUSH round trip, ms.
SLOW_CLOSE = 0.002

# _duty's value while a thread has been woken or started to take duty and has not taken it yet.
_PENDING = -1


class Closer:
    """Runs close calls on a few daemon threads (see the module docstring)."""

    def __init__(
        self,
        max_threads: int = MAX_CLOSERS,
        name: str = "fastfs-close",
        batch_wait: float = BATCH_WAIT,
        slow: float = SLOW_CLOSE,
    ) -> None:
        self.max_threads = max_threads
        self.name = name
        self.batch_wait = batch_wait
        self.slow = slow
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._done = threading.Condition(self._lock)
        self._queue: deque[Callable[[], object]] = deque()  # calls not started yet
        self._running: dict[int, float] = {}  # thread ident -> monotonic start of the call it runs
        self._threads = 0  # threads started and not ended
        self._idle = 0  # of those, waiting on _work (the watcher too)
        self._duty: int | None = None  # ident of the thread on duty, _PENDING, or None
        self._watching = False  # an idle thread waits with a timeout (the watcher)
        self._watch_called = False  # an idle thread was woken to become the watcher
        self._closed = False

    def submit(self, call: Callable[[], object]) -> None:
        """Run *call* on a closer thread (at once on the caller's after :meth:`close`)."""
        with self._lock:
            if not self._closed:
                self._queue.append(call)
                self._assign(time.monotonic())
                return
        self._call(call)

    def pending(self) -> int:
        """Calls queued or running (reports and tests)."""
        with self._lock:
            return len(self._queue) + len(self._running)

    def threads(self) -> int:
        """Threads started and not ended (tests)."""
        with self._lock:
            return self._threads

    def check(self) -> None:
        """Assert the invariants of the module docstring (tests)."""
        with self._lock:
            assert 0 <= self._idle <= self._threads <= self.max_threads, (self._idle, self._threads)
            assert len(self._running) <= self._threads, (self._running, self._threads)

    def drain(self, timeout: float) -> bool:
        """Wait until no call is queued or running, at most *timeout* seconds; True when none is."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._queue or self._running:
                now = time.monotonic()
                left = deadline - now
                if left <= 0:
                    return False
                self._assign(now)
                self._done.wait(min(left, max(self.slow, 0.001)))
            return True

    def close(self, timeout: float = CLOSE_WAIT) -> bool:
        """Run what is queued, wait for it at most *timeout* seconds, and run later calls inline;
        True when every call ended."""
        done = self.drain(timeout)
        with self._lock:
            self._closed = True
            self._work.notify_all()
        return done

    # -- the threads (every method below is called with _lock held) -----------------------------------
    def _assign(self, now: float) -> None:
        """See that the queue has a thread on duty, or one watching the duty thread's call."""
        if not self._queue:
            return
        duty = self._duty
        if duty == _PENDING:
            return
        if duty is not None:
            started = self._running.get(duty)
            if started is None:
                return  # in its batch wait: it takes the queue next
            if now - started < self.slow:
                if not self._watching and not self._watch_called:
                    self._watch_called = True  # a thread to watch that call, in case it hangs
                    self._summon()
                return
            self._duty = None  # its call is slow or stuck: the queue goes to another thread
        self._duty = _PENDING
        self._summon()

    def _summon(self) -> None:
        """Wake an idle thread, else start one (none when every thread runs a call)."""
        if self._idle:
            self._work.notify()
        elif self._threads < self.max_threads:
            self._threads += 1
            threading.Thread(target=self._run, name=self.name, daemon=True).start()

    def _take_over(self, me: int, now: float) -> None:
        """Take duty if it is pending, or if the duty thread's call is slow and calls wait."""
        duty = self._duty
        if duty == _PENDING:
            self._duty = me
        elif duty is not None and duty != me and self._queue:
            started = self._running.get(duty)
            if started is not None and now - started >= self.slow:
                self._duty = me

    def _run(self) -> None:
        me = threading.get_ident()
        batched = False  # on duty: the batch wait after the queue was emptied has been taken
        with self._lock:
            while True:
                self._take_over(me, time.monotonic())
                self._watch_called = False  # (whoever was woken to watch: this thread decides now)
                if self._duty == me:
                    if self._queue:
                        self._run_one(me)
                        batched = False
                        continue
                    if not batched and not self._closed:
                        batched = True
                        self._lock.release()  # the batch wait, without the lock (nothing wakes it)
                        try:
                            time.sleep(self.batch_wait)
                        finally:
                            self._lock.acquire()
                        continue
                    self._duty = None
                    batched = False
                if self._closed and not self._queue:
                    self._threads -= 1
                    return
                self._wait()

    def _run_one(self, me: int) -> None:
        """Run the next call (on duty), without the lock."""
        call = self._queue.popleft()
        self._running[me] = time.monotonic()
        if self._queue:
            self._assign(self._running[me])  # calls wait behind this one: a watcher
        self._lock.release()
        try:
            self._call(call)
        finally:
            self._lock.acquire()
            del self._running[me]
            if not self._queue and not self._running:
                self._done.notify_all()

    def _wait(self) -> None:
        """Wait idle: for good, or as the watcher while calls wait behind the duty thread's call."""
        duty = self._duty
        watch = (
            not self._watching and bool(self._queue) and duty is not None and duty != _PENDING and duty in self._running
        )
        if watch:
            self._watching = True
        self._idle += 1
        try:
            if watch:
                self._work.wait(self.slow)
            else:
                self._work.wait()
        finally:
            self._idle -= 1
            if watch:
                self._watching = False

    @staticmethod
    def _call(call: Callable[[], object]) -> None:
        try:
            call()
        except Exception:  # noqa: BLE001 - a failed close must not end the thread
            log.exception("deferred close failed")
