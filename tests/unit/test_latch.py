"""fastfs.fsio.latch.Latch: the one-shot event of cache blocks and scan fetches."""

from __future__ import annotations

import threading
import time

from fastfs.fsio.latch import Latch


def test_unset_waits_time_out_and_say_so() -> None:
    latch = Latch()
    assert not latch.is_set()
    assert latch.wait(0) is False and latch.wait(-1) is False
    start = time.monotonic()
    assert latch.wait(0.05) is False and time.monotonic() - start >= 0.04


def test_set_once_passes_every_waiter_now_and_later_and_a_second_set_changes_nothing() -> None:
    latch = Latch()
    passed: list[bool] = []
    waiters = [threading.Thread(target=lambda: passed.append(latch.wait(10))) for _ in range(8)]
    waiters += [threading.Thread(target=lambda: passed.append(latch.wait())) for _ in range(8)]
    for t in waiters:
        t.start()
    time.sleep(0.05)
    assert not passed
    latch.set()
    latch.set()  # (no second release: it would raise, or let a waiter's gate go twice)
    for t in waiters:
        t.join(5)
    assert passed == [True] * 16
    assert latch.is_set() and latch.wait(0) and latch.wait(0.01) and latch.wait()


def test_setters_racing_open_the_gate_once() -> None:
    for _ in range(200):
        latch = Latch()
        errors: list[BaseException] = []

        def setter(latch: Latch = latch, errors: list[BaseException] = errors) -> None:
            try:
                latch.set()
            except BaseException as e:  # noqa: BLE001 - a double release would raise here
                errors.append(e)

        setters = [threading.Thread(target=setter) for _ in range(4)]
        for t in setters:
            t.start()
        for t in setters:
            t.join(5)
        assert not errors and latch.wait(0)
