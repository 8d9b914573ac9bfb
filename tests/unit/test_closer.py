"""The closer (fsio/closer.py): closes run off the caller's thread, one stuck close holds up no other,
drain and close are bounded."""

from __future__ import annotations

import os
import threading
import time

from fastfs.fsio.closer import Closer

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
