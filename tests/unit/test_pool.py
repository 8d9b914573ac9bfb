"""The pread pool (fsio/pool.py) on its own: priorities, promotion, backpressure, close, hung jobs.

Jobs here are plain callables that record what ran and, to hold a worker, wait on a
``threading.Event`` with a bounded timeout, so a failing test cannot hang; every pool is closed in
a ``finally``.
"""

from __future__ import annotations

import threading
import time

import pytest

from fastfs.fsio.pool import DEMAND, GENERAL, PREFETCH_QUEUE_PER_WORKER, FileGroup, PreadPool

HOLD = 10.0  # longest a held job waits for its release (the tests release it well before)


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


class Job:
    """Records its name in *log* when it runs; with *hold*, first waits for that event (bounded)."""

    def __init__(self, log: list[str], name: str, hold: threading.Event | None = None, group=None) -> None:
        self.log, self.name, self.hold = log, name, hold
        self.started = threading.Event()
        if group is not None:
            self.group = group

    def __call__(self) -> None:
        self.started.set()
        if self.hold is not None:
            self.hold.wait(HOLD)
        self.log.append(self.name)


@pytest.fixture
def release():
    event = threading.Event()
    yield event
    event.set()  # whatever happened, no job stays held


def test_demand_runs_while_prefetch_work_is_queued_and_the_general_worker_is_busy(release):
    pool = PreadPool(1, demand_workers=1)
    log: list[str] = []
    try:
        busy = Job(log, "prefetch-busy", release)
        assert pool.submit_prefetch(busy)
        assert busy.started.wait(5)
        for i in range(10):
            assert pool.submit_prefetch(Job(log, f"prefetch-{i}"))
        demand = Job(log, "demand")
        pool.submit_demand(demand)
        assert wait_until(lambda: "demand" in log)
        assert log == ["demand"]  # no prefetch ran before it (the general worker is still held)
        assert pool.queued() == (0, 10)
        release.set()
        assert wait_until(lambda: len(log) == 12)
        assert log[1:] == ["prefetch-busy"] + [f"prefetch-{i}" for i in range(10)]  # prefetch in queue order
    finally:
        release.set()
        pool.close()


def test_a_queued_prefetch_promoted_to_demand_runs_next_and_once(release):
    pool = PreadPool(1, demand_workers=1)
    log: list[str] = []
    try:
        assert pool.submit_prefetch(Job(log, "busy", release))
        assert wait_until(lambda: pool.queued() == (0, 0))  # the general worker took it
        jobs = [Job(log, f"p{i}") for i in range(5)]
        assert pool.submit_prefetch_all(jobs)
        assert pool.promote(jobs[3])
        assert wait_until(lambda: log == ["p3"])  # ahead of p0..p2, while the general worker is held
        assert pool.queued() == (0, 4)
        assert not pool.promote(jobs[3])  # no longer queued
        assert not pool.promote(Job(log, "never-queued"))
        release.set()
        assert wait_until(lambda: len(log) == 6)
        assert log == ["p3", "busy", "p0", "p1", "p2", "p4"]  # p3 ran once
    finally:
        release.set()
        pool.close()


def test_a_parked_prefetch_of_a_busy_file_can_be_promoted(release):
    """A job parked on its file's group (the file already runs its share) is promoted out of the group."""
    pool = PreadPool(2, demand_workers=1, file_workers=1)
    group = FileGroup()
    log: list[str] = []
    try:
        assert pool.submit_prefetch(Job(log, "running", release, group))
        assert wait_until(lambda: group.running[GENERAL] == 1)
        parked = Job(log, "parked", group=group)
        assert pool.submit_prefetch(parked)
        assert wait_until(lambda: len(group.parked[GENERAL]) == 1)
        assert pool.promote(parked)
        assert wait_until(lambda: log == ["parked"])  # ran on the demand worker, the file's general one still held
        assert not group.parked[GENERAL]
        release.set()
        assert wait_until(lambda: log == ["parked", "running"])
        assert wait_until(lambda: group.running == [0, 0])
        time.sleep(0.05)
        assert log == ["parked", "running"]  # not run a second time from the group
    finally:
        release.set()
        pool.close()


def test_prefetch_is_declined_at_the_queue_limit(release):
    pool = PreadPool(1, demand_workers=1)
    log: list[str] = []
    try:
        assert pool.prefetch_limit == PREFETCH_QUEUE_PER_WORKER
        assert pool.submit_prefetch(Job(log, "busy", release))
        assert wait_until(lambda: pool.queued() == (0, 0))
        accepted = 0
        while pool.submit_prefetch(Job(log, f"q{accepted}")):
            accepted += 1
            assert accepted <= pool.prefetch_limit
        assert accepted == pool.prefetch_limit
        assert pool.queued() == (0, pool.prefetch_limit)
        assert not pool.submit_prefetch_all([Job(log, "all")])  # all or nothing: no room for one
        pool.submit_demand(Job(log, "demand"))  # demand is never declined
        assert wait_until(lambda: log == ["demand"])
        release.set()
        assert wait_until(lambda: len(log) == 2 + pool.prefetch_limit)
        assert "all" not in log
    finally:
        release.set()
        pool.close()


def test_submit_prefetch_all_queues_all_or_none(release):
    pool = PreadPool(1, demand_workers=1)
    log: list[str] = []
    try:
        assert pool.submit_prefetch(Job(log, "busy", release))
        assert wait_until(lambda: pool.queued() == (0, 0))
        room = pool.prefetch_limit
        assert not pool.submit_prefetch_all([Job(log, f"x{i}") for i in range(room + 1)])
        assert pool.queued() == (0, 0)
        assert pool.submit_prefetch_all([Job(log, f"y{i}") for i in range(room - 1)])
        assert not pool.submit_prefetch_all([Job(log, "z0"), Job(log, "z1")])
        assert pool.submit_prefetch_all([Job(log, "w")])
        assert pool.queued() == (0, room)
        release.set()
        assert wait_until(lambda: len(log) == room + 1)
        assert log == ["busy"] + [f"y{i}" for i in range(room - 1)] + ["w"]
    finally:
        release.set()
        pool.close()


def test_close_drops_queued_prefetch_declines_new_work_and_releases_idle_workers(release):
    pool = PreadPool(2, demand_workers=2)
    log: list[str] = []
    held = Job(log, "held", release)
    try:
        assert pool.submit_prefetch(held)
        assert held.started.wait(5)
        assert pool.submit_prefetch(Job(log, "running-too", release))
        assert wait_until(lambda: pool.queued() == (0, 0))
        assert pool.submit_prefetch_all([Job(log, f"q{i}") for i in range(5)])
        t0 = time.monotonic()
        pool.close(timeout=0.5)  # two general workers are held: close waits at most its timeout
        assert time.monotonic() - t0 < 2.0
        assert pool.queued() == (0, 0)  # the queued prefetch was dropped
        assert not pool.submit_prefetch(Job(log, "late"))
        assert not pool.submit_prefetch_all([Job(log, "late-all")])
        alive = [t for t in pool._threads if t.is_alive()]
        assert len(alive) == 2 and all(not t.name.rsplit("-", 1)[-1].startswith("d") for t in alive)
        release.set()  # the held jobs finish; their workers see the stop and exit without taking more
        assert wait_until(lambda: not any(t.is_alive() for t in pool._threads))
        assert sorted(log) == ["held", "running-too"]
    finally:
        release.set()
        pool.close()


def test_close_of_an_idle_pool_joins_every_worker():
    pool = PreadPool(3, demand_workers=3)
    pool.close()
    assert not any(t.is_alive() for t in pool._threads)


def test_a_hung_job_does_not_stall_other_work(release):
    """One file's reads hanging hold at most its share of workers; other files' reads still run."""
    pool = PreadPool(2, demand_workers=2, file_workers=1)
    hung, other = FileGroup(), FileGroup()
    log: list[str] = []
    try:
        for i in range(4):
            pool.submit_demand(Job(log, f"hung-d{i}", release, hung))
        assert pool.submit_prefetch_all([Job(log, f"hung-p{i}", release, hung) for i in range(4)])
        assert wait_until(lambda: hung.running == [1, 1])
        assert wait_until(lambda: len(hung.parked[DEMAND]) == 3 and len(hung.parked[GENERAL]) == 3)
        for i in range(5):
            pool.submit_demand(Job(log, f"other-d{i}", group=other))
            assert pool.submit_prefetch(Job(log, f"other-p{i}", group=other))
        pool.submit_demand(Job(log, "ungrouped"))
        assert wait_until(lambda: len(log) == 11)
        assert all(not name.startswith("hung") for name in log)
        release.set()
        assert wait_until(lambda: len(log) == 19)
        assert hung.running == [0, 0] and not hung.parked[DEMAND] and not hung.parked[GENERAL]
    finally:
        release.set()
        pool.close()


def test_a_failing_job_does_not_kill_its_worker():
    pool = PreadPool(1, demand_workers=1)
    log: list[str] = []

    def boom() -> None:
        raise OSError(5, "boom")

    try:
        pool.submit_demand(boom)
        assert pool.submit_prefetch(boom)
        pool.submit_demand(Job(log, "after-d"))
        assert pool.submit_prefetch(Job(log, "after-p"))
        assert wait_until(lambda: sorted(log) == ["after-d", "after-p"])
    finally:
        pool.close()
