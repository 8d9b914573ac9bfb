"""The native loop's queue of late releases (``_loop.Later``) without a mount: what it keeps, in what
order, its bounds, and its wait."""

from __future__ import annotations

import struct
import threading
import time

import pytest

from fastfs.daemon.kernel import abi, session
from fastfs.daemon.kernel.abi import Op

if session.native_loop is None:  # pragma: no cover - depends on the install
    pytest.skip("the native request loop is not built (no C compiler at install)", allow_module_level=True)
_loop = session.native_loop


def release_request(unique: int, fh: int, nodeid: int = 5) -> bytes:
    body = abi.RELEASE_IN.pack(fh, 0, 0, 0)
    return abi.IN_HEADER.pack(abi.IN_HEADER.size + len(body), Op.RELEASE, unique, nodeid, 1, 2, 3, 0, 0) + body


def test_a_release_request_is_one_record() -> None:
    assert len(release_request(1, 2)) == _loop.LATER_RECORD


def test_kept_requests_come_back_whole_in_order_and_once() -> None:
    later = _loop.Later(8)
    requests = [release_request(u, 100 + u) for u in range(1, 6)]
    for r in requests:
        assert later.keep(r)
    assert len(later) == 5
    assert later.take() == requests
    assert len(later) == 0 and later.take() == []


def test_a_short_request_comes_back_at_its_length_and_a_long_one_is_not_kept() -> None:
    later = _loop.Later(4)
    short = struct.pack("<I", 48) + bytes(range(4, 48))
    assert later.keep(short) and later.take() == [short]
    assert not later.keep(b"\0" * (_loop.LATER_RECORD + 1))


def test_a_full_or_closed_queue_keeps_nothing_more_and_keeps_what_it_had() -> None:
    later = _loop.Later(2)
    assert later.keep(release_request(1, 1)) and later.keep(release_request(2, 2))
    assert not later.keep(release_request(3, 3))
    later.close()
    assert [abi.IN_HEADER.unpack_from(r)[2] for r in later.take()] == [1, 2]
    assert not later.keep(release_request(4, 4)) and len(later) == 0


def test_wait_returns_when_a_request_comes_when_closed_or_at_its_timeout() -> None:
    later = _loop.Later(4)
    start = time.monotonic()
    assert later.wait(0.05) is False and time.monotonic() - start >= 0.04
    assert later.wait(0) is False
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(later.wait(None)))
    waiter.start()
    time.sleep(0.05)
    later.keep(release_request(1, 1))
    waiter.join(5)
    assert woke == [True] and later.wait(None) is True  # (kept ones wait: no block)
    later.take()
    waiter = threading.Thread(target=lambda: woke.append(later.wait(None)))
    waiter.start()
    time.sleep(0.05)
    later.close()
    waiter.join(5)
    assert woke == [True, False]


@pytest.mark.parametrize("cap", [0, -1])
def test_a_queue_holds_at_least_one(cap: int) -> None:
    with pytest.raises(ValueError):
        _loop.Later(cap)
