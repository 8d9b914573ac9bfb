"""The closer (fsio/closer.py): closes run off the caller's thread, one stuck close holds up no other,
slow closes run side by side, quick ones in batches on one thread, drain and close are bounded."""

from __future__ import annotations

import itertools
import os
import threading
import time

from fastfs.fsio.closer import SLOW_CLOSE, Closer

BOUND = 5.0


def test_a_close_runs_off_the_caller_s_thread_and_drain_waits_for_it() -> None:
    closer = Closer()
    r, w = os.pipe()
    ran_on: list[int] = []
    try:
        gate = threading.Event()

        def close() -> None:
            gate.wait(BOUND)
            ran_on.append(threading.get_ident())
            os.close(w)

        closer.submit(close)
        assert closer.pending() == 1 and not closer.drain(0.05)  # the caller did not wait
        gate.set()
        assert closer.drain(BOUND) and closer.pending() == 0
        assert ran_on and ran_on[0] != threading.get_ident()
        assert os.read(r, 1) == b""  # the write end is closed
    finally:
        os.close(r)
        closer.close()


def test_a_stuck_close_holds_up_no_other() -> None:
    closer = Closer(max_threads=3)
    stuck = threading.Event()
    done: list[int] = []
    try:
        closer.submit(lambda: stuck.wait(BOUND))
        closer.submit(lambda: stuck.wait(BOUND))
        for i in range(20):
            closer.submit(lambda i=i: done.append(i))
        deadline = time.monotonic() + BOUND
        while len(done) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(done) == list(range(20))
        assert closer.pending() == 2  # the two stuck ones
    finally:
        stuck.set()
        assert closer.close(BOUND)


def test_close_is_bounded_by_a_stuck_close_and_later_calls_run_inline() -> None:
    closer = Closer(max_threads=1)
    stuck = threading.Event()
    try:
        closer.submit(lambda: stuck.wait(BOUND))
        t0 = time.monotonic()
        assert not closer.close(0.2)  # left behind
        assert time.monotonic() - t0 < BOUND / 2
        ran: list[int] = []
        closer.submit(lambda: ran.append(threading.get_ident()))
        assert ran == [threading.get_ident()]  # after close: on the caller's thread
    finally:
        stuck.set()


def test_a_failing_close_is_logged_and_the_thread_goes_on(caplog) -> None:
    closer = Closer(max_threads=1)
    ran: list[bool] = []

    def fail() -> None:
        raise OSError(5, "EIO")

    try:
        closer.submit(fail)
        closer.submit(lambda: ran.append(True))
        assert closer.drain(BOUND) and ran == [True]
        assert "deferred close failed" in caplog.text
    finally:
        closer.close()


def test_quick_closes_coming_one_by_one_run_in_batches_on_one_thread() -> None:
    """A close submitted while a thread is on duty wakes nobody: 200 quick closes submitted 0.1 ms
    apart run in batches, far fewer batches than closes."""
    closer = Closer()
    starts: list[float] = []
    try:
        for _ in range(200):
            closer.submit(lambda: starts.append(time.monotonic()))
            time.sleep(0.0001)
        assert closer.drain(BOUND)
        closer.check()
        assert len(starts) == 200
        # a batch: calls started back to back (submits came 0.1 ms apart); a wake-up per close makes 200
        batches = 1 + sum(1 for a, b in itertools.pairwise(starts) if b - a > 0.00003)
        assert batches < 100, batches
    finally:
        closer.close()


def test_slow_closes_run_side_by_side() -> None:
    """Closes that each take a round trip (50 ms here) hand the queue on: 8 of them end in about
    the time of a few, not of 8 in a row."""
    closer = Closer(max_threads=8)
    t0 = time.monotonic()
    try:
        for _ in range(8):
            closer.submit(lambda: time.sleep(0.05))
        assert closer.drain(BOUND)
        assert time.monotonic() - t0 < 0.05 * 8 * 0.6
        assert closer.threads() > 1
        closer.check()
    finally:
        closer.close()


def test_a_call_queued_behind_a_stuck_one_runs_with_nothing_submitted_after_it() -> None:
    """The watcher: with one thread on duty stuck in a call and one call behind it, and no submit
    after, the call behind runs within a few SLOW_CLOSE periods."""
    closer = Closer(max_threads=2)
    stuck = threading.Event()
    ran = threading.Event()
    try:
        closer.submit(lambda: stuck.wait(BOUND))
        time.sleep(SLOW_CLOSE / 4)  # (the first call is running: the second queues behind it)
        closer.submit(ran.set)
        assert ran.wait(BOUND / 5)
        assert closer.pending() == 1
        closer.check()
    finally:
        stuck.set()
        assert closer.close(BOUND)
