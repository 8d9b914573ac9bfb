"""The handover decision at open (fastfs.fsio.handover.decide), as a table."""

from __future__ import annotations

import pytest

from fastfs.fsio.handover import HANDOVER_MAX, Handover, OpenFacts, decide
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
