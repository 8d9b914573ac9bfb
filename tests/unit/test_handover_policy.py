"""The handover decision at open (fastfs.fsio.handover.decide), as a table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastfs.fsio.handover import (
    HANDOVER_MAX,
    INLINE_MAX,
    LOCAL_SLOW_READ,
    Handover,
    OpenFacts,
    ReadSpeed,
    decide,
    scans_wanted,
)
from fastfs.fsio.policy import ROUTE_PASSTHROUGH, ROUTE_SERVED

S = 3000
# (route, size, in_ram, kernel_size, kernel_pages, rebound) -> bytes handed over (0: none)
CASES = [
    ((ROUTE_SERVED, S, S, S, False, False), S),  # whole in RAM, the kernel's size agrees: handed over
    ((ROUTE_SERVED, S, 4 * 1024 * 1024, S, False, False), S),  # the block holds more than the file: its size
    ((ROUTE_PASSTHROUGH, S, S, S, False, False), 0),  # the kernel reads the backing file
    ((ROUTE_SERVED, S, S - 1, S, False, False), 0),  # not whole in RAM
    ((ROUTE_SERVED, S, 0, S, False, False), 0),
    ((ROUTE_SERVED, S, S, S + 1, False, False), 0),  # the kernel's cached size is another version's
    ((ROUTE_SERVED, S, S, S - 1, False, False), 0),
    ((ROUTE_SERVED, S, S, -1, False, False), 0),  # the kernel was told to drop its attributes
    ((ROUTE_SERVED, S, S, S, True, False), 0),  # opened before: the kernel may hold its pages already
    ((ROUTE_SERVED, S, S, S, False, True), 0),  # rebound by this open
    ((ROUTE_SERVED, 0, 0, 0, False, False), 0),  # empty: nothing to hand over
    ((ROUTE_SERVED, HANDOVER_MAX, HANDOVER_MAX, HANDOVER_MAX, False, False), HANDOVER_MAX),  # the limit itself
    ((ROUTE_SERVED, HANDOVER_MAX + 1, HANDOVER_MAX + 1, HANDOVER_MAX + 1, False, False), 0),  # beyond it
]


@pytest.mark.parametrize(("facts", "handed"), CASES)
def test_decide(facts: tuple, handed: int) -> None:
    plan = decide(OpenFacts(*facts))
    assert plan == (Handover(0, handed) if handed else None)


def test_a_named_limit_below_the_size_refuses() -> None:
    assert decide(OpenFacts(ROUTE_SERVED, S, S, S, False, False, limit=S - 1)) is None
    assert decide(OpenFacts(ROUTE_SERVED, S, S, S, False, False, limit=S)) == Handover(0, S)


# (route, size, in_ram, kernel_size, kernel_pages, rebound), fast_local -> the plan
INLINE_CASES = [
    ((ROUTE_SERVED, S, 0, S, False, False), True, Handover(0, S, from_source=True)),  # read at the open
    ((ROUTE_SERVED, S, S - 1, S, False, False), True, Handover(0, S, from_source=True)),  # RAM holds part
    ((ROUTE_SERVED, S, S, S, False, False), True, Handover(0, S)),  # RAM holds it whole: from RAM
    ((ROUTE_SERVED, S, 0, S, False, False), False, None),  # not a fast local source: the READ fetches it
    ((ROUTE_SERVED, INLINE_MAX, 0, INLINE_MAX, False, False), True, Handover(0, INLINE_MAX, from_source=True)),
    ((ROUTE_SERVED, INLINE_MAX + 1, 0, INLINE_MAX + 1, False, False), True, None),  # beyond the inline limit
    ((ROUTE_PASSTHROUGH, S, 0, S, False, False), True, None),  # the kernel reads the backing file
    ((ROUTE_SERVED, S, 0, S, True, False), True, None),  # the kernel may hold its pages already
    ((ROUTE_SERVED, S, 0, S, False, True), True, None),  # rebound by this open
    ((ROUTE_SERVED, S, 0, -1, False, False), True, None),  # the kernel's size unknown
    ((ROUTE_SERVED, 0, 0, 0, False, False), True, None),  # empty
]


@pytest.mark.parametrize(("facts", "fast_local", "plan"), INLINE_CASES)
def test_a_fast_local_source_is_read_at_the_open(facts: tuple, fast_local: bool, plan: Handover | None) -> None:
    assert decide(OpenFacts(*facts, fast_local=fast_local)) == plan


@given(
    size=st.integers(0, 2 * HANDOVER_MAX),
    in_ram=st.integers(0, 2 * HANDOVER_MAX),
    fast_local=st.booleans(),
    kernel_pages=st.booleans(),
    rebound=st.booleans(),
)
def test_a_plan_covers_the_version_exactly(
    size: int, in_ram: int, fast_local: bool, kernel_pages: bool, rebound: bool
) -> None:
    plan = decide(OpenFacts(ROUTE_SERVED, size, in_ram, size, kernel_pages, rebound, fast_local=fast_local))
    if plan is None:
        return
    assert (plan.offset, plan.length) == (0, size) and size > 0 and not kernel_pages and not rebound
    assert plan.from_source == (in_ram < size)  # from RAM whenever RAM holds it whole
    assert fast_local or not plan.from_source


# (local, slow, local_scans) -> scans wanted
SCAN_CASES = [
    ((False, False, False), True),  # a network source: scans hide its latency
    ((False, True, False), True),
    ((True, False, False), False),  # a fast local source: each open reads its file itself
    ((True, True, False), True),  # a slow local source (a cold disk): scans fetch in parallel
    ((True, False, True), True),  # asked for by the setting
]


@pytest.mark.parametrize(("inputs", "wanted"), SCAN_CASES)
def test_scans_wanted(inputs: tuple[bool, bool, bool], wanted: bool) -> None:
    assert scans_wanted(*inputs) is wanted


def test_read_speed_a_few_reads_timed_across_a_wait_do_not_make_a_source_slow() -> None:
    speed = ReadSpeed()
    assert not speed.slow
    for i in range(200):  # one read in 8 waits milliseconds for the interpreter lock
        speed.note(0.005 if i % 8 == 0 else 3e-6, 3000)
        assert not speed.slow


def test_read_speed_a_cold_disk_is_slow_and_a_warm_one_fast_again() -> None:
    speed = ReadSpeed()
    slow_after = None
    for i in range(40):
        speed.note(2 * LOCAL_SLOW_READ, 3000)
        if speed.slow and slow_after is None:
            slow_after = i + 1
    assert slow_after == 11  # (from no sample: 11 slow reads in a row)
    for _ in range(40):
        speed.note(LOCAL_SLOW_READ / 10, 3000)
    assert not speed.slow


def test_read_speed_samples_small_reads_only() -> None:
    speed = ReadSpeed()
    for _ in range(40):
        speed.note(1.0, INLINE_MAX + 1)  # a large read measures bandwidth
    assert not speed.slow
