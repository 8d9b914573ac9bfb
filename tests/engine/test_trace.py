"""``--log-level debug``: each open and each pattern decision logged, rate-limited, never per read."""

from __future__ import annotations

import io
import logging
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_for

from fastfs.config import load_config
from fastfs.fsio.engine import Engine
from fastfs.fsio.trace import DecisionLog

MIB = 1024 * 1024
ENGINE_LOG = "fastfs.fsio.engine"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _logger(name: str) -> tuple[logging.Logger, io.StringIO]:
    logger = logging.getLogger(name)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, out


def test_rate_limit_counts_what_it_suppressed() -> None:
    logger, out = _logger("fastfs.test.trace.rate")
    clock = FakeClock()
    trace = DecisionLog(logger, burst=3, interval=1.0, clock=clock)
    for i in range(10):
        trace("line %d", i)
    assert out.getvalue().splitlines() == ["line 0", "line 1", "line 2"]
    clock.now += 1.0
    trace("after")
    assert out.getvalue().splitlines()[3:] == ["(7 decision lines suppressed by the rate limit)", "after"]


def test_once_and_disabled() -> None:
    logger, out = _logger("fastfs.test.trace.once")
    trace = DecisionLog(logger, clock=FakeClock())
    for _ in range(5):
        trace.once(("k", 1), "first %s", "x")
    trace.once(("k", 2), "second")
    assert out.getvalue().splitlines() == ["first x", "second"]
    logger.setLevel(logging.INFO)
    assert not trace.enabled
    trace("not shown")
    trace.once("new", "not shown either")
    assert out.getvalue().splitlines() == ["first x", "second"]


@pytest.fixture
def engine_log():
    logger = logging.getLogger(ENGINE_LOG)
    saved = (logger.level, logger.handlers, logger.propagate)
    _, out = _logger(ENGINE_LOG)
    try:
        yield out
    finally:
        logger.setLevel(saved[0])
        logger.handlers = saved[1]
        logger.propagate = saved[2]


def _engine(src: Path, tmp_path: Path, **extra: str) -> Engine:
    opts = {"cache.budget": "64M", "cache.block_size": "1M", "state.dir": str(tmp_path / "state"), **extra}
    return Engine(str(src), load_config(overrides=opts, use_default_path=False))


def _read(engine: Engine, fh: int, offset: int, size: int) -> bytes:
    return engine.read(fh, offset, size)


def test_engine_logs_opens_and_decisions_not_reads(tmp_path: Path, engine_log: io.StringIO) -> None:
    src = tmp_path / "src"
    src.mkdir()
    array = np.arange(3 * MIB // 4, dtype=np.float32)
    np.save(src / "a.npy", array)
    blob = random.Random(1).randbytes(8 * MIB)
    (src / "blob.bin").write_bytes(blob)
    (src / "small").mkdir()
    for i in range(20):
        (src / "small" / f"{i:02d}").write_bytes(bytes([i]) * 3000)
    engine = _engine(src, tmp_path)
    try:
        # a known format: the plan is logged once, whatever the number of reads
        fh = engine.open("/a.npy").fh
        assert wait_for(lambda: "format plan" in engine_log.getvalue(), timeout=10)
        size = (src / "a.npy").stat().st_size
        data = b"".join(_read(engine, fh, off, 64 * 1024) for off in range(0, size, 64 * 1024))
        assert data == (src / "a.npy").read_bytes()
        engine.release(fh)
        # an unknown format read sequentially: one "no known format" and one "sequential" line
        fh = engine.open("/blob.bin").fh
        assert wait_for(lambda: "no known format" in engine_log.getvalue(), timeout=10)
        data = b"".join(_read(engine, fh, off, 128 * 1024) for off in range(0, len(blob), 128 * 1024))
        assert data == blob
        # random reads: one line for the file, not one per read
        rng = random.Random(2)
        for _ in range(200):
            off = rng.randrange(0, len(blob) - 4096) // 4096 * 4096
            assert _read(engine, fh, off, 4096) == blob[off : off + 4096]
        engine.release(fh)
        # a small-file scan
        for i in range(5):
            fh = engine.open(f"/small/{i:02d}").fh
            assert _read(engine, fh, 0, 4096) == bytes([i]) * 3000
            engine.release(fh)
        assert wait_for(lambda: "small-file scan" in engine_log.getvalue(), timeout=10)
    finally:
        engine.close()
    lines = engine_log.getvalue().splitlines()
    # the mount's first line: the source's access shape and why
    assert lines[0].startswith("source ") and "read parallel (local filesystem)" in lines[0], lines[0]
    assert "open /a.npy: " in lines[1]
    assert any(line.startswith("/a.npy: npy format plan of ") for line in lines)
    assert sum(line.startswith("open ") for line in lines) == 7
    assert sum("/blob.bin: sequential reads at offset" in line for line in lines) >= 1
    assert sum("/blob.bin: read at offset" in line and "continues no stream" in line for line in lines) == 1
    assert any(line.startswith("/small: small-file scan") for line in lines)
    reads = 48 + 64 + 200 + 5
    assert len(lines) < 21 < reads  # decisions, not reads (the source line included)


def test_nothing_is_logged_at_info(tmp_path: Path, engine_log: io.StringIO) -> None:
    logging.getLogger(ENGINE_LOG).setLevel(logging.INFO)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x" * 100_000)
    engine = _engine(src, tmp_path)
    try:
        fh = engine.open("/f").fh
        assert _read(engine, fh, 0, 100_000) == b"x" * 100_000
        engine.release(fh)
    finally:
        engine.close()
    assert engine_log.getvalue() == ""
