"""Debug trace of the engine's decisions (``--log-level debug``): why a file was or was not prefetched.

The engine writes one line per open and one per pattern decision (a stream found sequential,
reset by a seek or found random; a format plan made or not; a small-file scan started; a learned
access set replayed), never one per read: a decision is taken once per stream, file version or
directory. A burst (a scan opening thousands of files) is still rate-limited: at most
:data:`TRACE_BURST` lines per :data:`TRACE_INTERVAL` seconds, the rest counted and reported with
the next line allowed.

When debug logging is off the engine pays one ``enabled`` check per decision point (the logging
module caches the level lookup). A decision that can repeat on every read of a file (reads that
continue no stream) is logged :meth:`~DecisionLog.once` per file version. Concurrency: ``_lock``
guards the window start, its line count, the suppressed count and the once-keys; lines are
logged outside the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

# Lines allowed per interval: enough to follow one loader, few enough not to flood a log file.
TRACE_BURST = 50
# Seconds of one rate-limit window.
TRACE_INTERVAL = 1.0
# Keys remembered by :meth:`DecisionLog.once` (oldest forgotten first).
ONCE_KEYS = 10_000


class DecisionLog:
    """Rate-limited debug lines of one engine."""

    def __init__(
        self,
        logger: logging.Logger,
        burst: int = TRACE_BURST,
        interval: float = TRACE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._burst = burst
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start = -interval
        self._lines = 0
        self._suppressed = 0
        self._once: OrderedDict[Hashable, None] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self._log.isEnabledFor(logging.DEBUG)

    def __call__(self, message: str, *args: object) -> None:
        """Log ``message % args`` at debug level unless this window's lines are used up."""
        if not self.enabled:
            return
        now = self._clock()
        with self._lock:
            if now - self._window_start >= self._interval:
                self._window_start, self._lines = now, 0
            if self._lines >= self._burst:
                self._suppressed += 1
                return
            self._lines += 1
            suppressed, self._suppressed = self._suppressed, 0
        if suppressed:
            self._log.debug("(%d decision lines suppressed by the rate limit)", suppressed)
        self._log.debug(message, *args)

    def once(self, key: Hashable, message: str, *args: object) -> None:
        """Like calling the log, but only the first time for *key* (among the last :data:`ONCE_KEYS`)."""
        if not self.enabled:
            return
        with self._lock:
            if key in self._once:
                return
            self._once[key] = None
            if len(self._once) > ONCE_KEYS:
                self._once.popitem(last=False)
        self(message, *args)
