"""Real-mount tests of the decision log (the engine side is tests/engine/test_trace.py)."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import mounted, wait_for

MIB = 1024 * 1024
ENGINE_LOG = "fastfs.fsio.engine"


def test_mount_with_log_level_debug_logs_opens(tmp_path: Path) -> None:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "x.bin").write_bytes(b"y" * 5000)
    with mounted(src, mnt, options=["log_level=debug"]) as m:
        assert (mnt / "x.bin").read_bytes() == b"y" * 5000
        assert wait_for(lambda: "open /x.bin: 5000 bytes" in m.log(), timeout=10), m.log()
    with mounted(src, mnt) as m:
        assert (mnt / "x.bin").read_bytes() == b"y" * 5000
        time.sleep(0.2)
        assert "open /x.bin" not in m.log()
