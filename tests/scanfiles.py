"""Helpers of the engine tests of small-file scans: a directory of numbered small files, an engine
over it without a mount, and waits on the scan's counters."""

from __future__ import annotations

import time
from pathlib import Path

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.stats import Stats

SIZE = 100


def body(i: int, size: int = SIZE, tag: str = "") -> bytes:
    """The bytes of file *i* (of directory *tag*): every file different."""
    unit = f"{tag}{i:08d}|"
    return (unit * (size // len(unit) + 1)).encode()[:size]


def make_files(directory: Path, count: int, size: int = SIZE, tag: str = "") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (directory / f"f{i:05d}").write_bytes(body(i, size, tag))


def scan_engine(tmp_path: Path, **overrides: str) -> Engine:
    """An engine over ``tmp_path/src`` serving every read (no passthrough), learning off unless asked,
    and a shuffled reader's scan at a fixed 32 fetches in flight unless asked (``readahead.scan_window``:
    fetches from tmpfs wait on each other for the interpreter, as on a source answering one at a time,
    where a measured window stops such a scan; test_scan_window.py measures it)."""
    opts = {
        "state.dir": str(tmp_path / "state"),
        "cache.budget": "256M",
        "fuse.passthrough": "off",
        "readahead.learn": "false",
        "readahead.scan_window": "32",
        **overrides,
    }
    return Engine(str(tmp_path / "src"), load_config(overrides=opts, use_default_path=False), Stats())


def read(engine: Engine, path: str, expected: bytes) -> None:
    """Open, read whole and release *path*, asserting its bytes."""
    r = engine.open(path)
    try:
        assert engine.read(r.fh, 0, len(expected)) == expected
    finally:
        engine.release(r.fh)


def counter(engine: Engine, name: str) -> int:
    return int(engine.snapshot()["counters"].get(name, 0))


def settle(engine: Engine, seconds: float = 0.5, timeout: float = 30.0) -> int:
    """The count of files the scans fetched once it stopped moving for *seconds*."""
    last, since = -1, time.monotonic()
    deadline = since + timeout
    while time.monotonic() < deadline:
        now = counter(engine, m.SCAN_FILES)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return now
        time.sleep(0.02)
    raise AssertionError("the scan never settled")
