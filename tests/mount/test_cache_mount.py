"""Real-mount tests of the block cache's invariant checks (the unit tests are tests/unit/test_cache.py)."""

from __future__ import annotations

import threading

import pytest

from fastfs.fsio.cache import CHECK_ENV

MIB = 1024 * 1024


@pytest.mark.parametrize("switch", ["option", "environment"])
def test_mount_with_checks_serves_exact_bytes_and_finds_nothing(tmp_path, switch):
    """A served mount whose cache checks itself after every change (config option or environment),
    read by threads with a budget small enough to evict all the time: bytes exact, no check failed
    (a failure answers EIO and is logged)."""
    from conftest import SERVED, evict_page_cache, mounted, rand_bytes

    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    data = {f"f{i}": rand_bytes(9 * MIB + 4097 * i, 40 + i) for i in range(4)}
    for name, payload in data.items():
        (src / name).write_bytes(payload)
    options = [SERVED, "cache.budget=16M", "cache.block_size=1M"]
    env = {}
    if switch == "option":
        options.append("cache.check_invariants")
    else:
        env[CHECK_ENV] = "1"
    with mounted(src, mnt, options=options, env=env) as m:
        got: dict[str, bytes] = {}

        def read(name: str) -> None:
            with open(m.mnt / name, "rb") as f:
                got[name] = f.read()

        for _ in range(2):
            threads = [threading.Thread(target=read, args=(name,)) for name in data]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert got == data
            for name in data:
                evict_page_cache(m.mnt / name)
        log = m.log()
        assert "AssertionError" not in log and "answered EIO" not in log, log[-2000:]
