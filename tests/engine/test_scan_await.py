"""An open of a file whose scan fetch is under way waits for it instead of opening the source again
(issue 21: 16 readers keeping pace with a scan over 10,000 files opened nearly every file twice at
a source answering lookups one at a time, 19,100 source opens; the reader's open now takes the
scan's block and metadata)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from fastfs.config import load_config
from fastfs.fsio import stats as m
from fastfs.fsio.engine import Engine
from fastfs.fsio.stats import Stats

FILES = 40
SIZE = 300


def body(i: int) -> bytes:
    return (f"{i:05d}-" * (SIZE // 6 + 1)).encode()[:SIZE]


def make(tmp_path: Path) -> Engine:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for i in range(FILES):
        (src / "d" / f"f{i:03d}").write_bytes(body(i))
    opts = {
        "state.dir": str(tmp_path / "state"),
        "fuse.passthrough": "off",
        "readahead.learn": "false",
        "readahead.scan_trigger": "2",
    }
    return Engine(str(src), load_config(overrides=opts, use_default_path=False), Stats())


def test_an_open_waits_for_the_scan_fetch_of_its_file_under_way(tmp_path: Path) -> None:
    engine = make(tmp_path)
    target = "/d/f010"
    opens: list[str] = []  # who opened the target at the source: "scan" or "reader"
    release = threading.Event()
    real_open = engine.source.open_file

    def open_file(path: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        if path == target:
            scan = threading.current_thread() is not reader
            opens.append("scan" if scan else "reader")
            if scan:
                assert release.wait(30)  # the scan's fetch of the target stays under way until released
            else:
                release.set()  # (the code before: the reader opens it itself, at once)
        return real_open(path, *args, **kwargs)

    engine.source.open_file = open_file  # type: ignore[method-assign]
    result: dict[str, bytes] = {}

    def read_target() -> None:
        engine.lstat(target)  # the kernel's LOOKUP before the open
        r = engine.open(target)
        result["data"] = engine.read(r.fh, 0, SIZE)
        engine.release(r.fh)

    reader = threading.Thread(target=read_target)
    try:
        for i in (0, 1):  # two opens start the scan
            r = engine.open(f"/d/f{i:03d}")
            assert engine.read(r.fh, 0, SIZE) == body(i)
            engine.release(r.fh)
        deadline = time.monotonic() + 30
        while opens != ["scan"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert opens == ["scan"], opens
        reader.start()
        time.sleep(0.2)  # the reader's open is waiting for the scan's fetch (it waits up to 0.5 s)
        release.set()
        reader.join(30)
        assert result["data"] == body(10)
        assert opens == ["scan"], f"the target was opened at the source by {opens}"
        counters = engine.snapshot()["counters"]
        assert counters.get(m.SCAN_AWAITED, 0) >= 1 or counters.get(m.OPENS_FROM_META, 0) >= 1
    finally:
        release.set()
        engine.close()


def test_a_scan_fetch_of_a_file_the_reader_opened_first_is_not_made(tmp_path: Path) -> None:
    engine = make(tmp_path)
    source_opens: list[str] = []
    gate = threading.Event()
    real_open = engine.source.open_file

    def open_file(path: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        source_opens.append(path)
        return real_open(path, *args, **kwargs)

    engine.source.open_file = open_file  # type: ignore[method-assign]

    real_submit = engine.pool.submit_prefetch
    held: list[object] = []

    def submit_prefetch(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not gate.is_set():  # the scan's fetches wait for a worker (held back here) ...
            held.append(fn)
            return True
        return real_submit(fn, *args, **kwargs)

    engine.pool.submit_prefetch = submit_prefetch  # type: ignore[method-assign]
    try:
        for i in (0, 1):
            r = engine.open(f"/d/f{i:03d}")
            engine.release(r.fh)
        start = held.pop(0)  # the scan's start (its listing), run now: it queues the fetches
        start()  # type: ignore[operator]
        assert held, "the scan queued no fetch"
        for i in range(2, 12):  # ... while the reader opens the first ten itself
            r = engine.open(f"/d/f{i:03d}")
            assert engine.read(r.fh, 0, SIZE) == body(i)
            engine.release(r.fh)
        gate.set()
        for fn in held:
            fn()  # type: ignore[operator]
        twice = sorted(p for p in set(source_opens) if source_opens.count(p) > 1)
        assert not twice, f"opened at the source by the reader and again by the scan: {twice}"
        assert engine.snapshot()["counters"].get(m.SCAN_SKIPPED, 0) >= 1
    finally:
        gate.set()
        engine.close()
