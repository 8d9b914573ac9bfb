"""The one table of settings a reload applies live (config/reload.py), and both users of it."""

from __future__ import annotations

import dataclasses

from fastfs.config import reload
from fastfs.config.loader import load_config
from fastfs.config.schema import Config
from fastfs.fsio.engine import Engine

MIB = 1024 * 1024


def test_every_live_path_names_a_setting():
    assert set(reload.field_paths()) >= reload.LIVE, reload.LIVE - set(reload.field_paths())
    assert "cache.budget" in reload.LIVE and "cache.workers" not in reload.LIVE


def test_apply_live_takes_only_live_settings():
    old = Config()
    new = dataclasses.replace(
        old,
        cache=dataclasses.replace(old.cache, budget=64 * MIB, workers=3),
        readahead=dataclasses.replace(old.readahead, max_window=32 * MIB, learn=False),
        log=dataclasses.replace(old.log, level="debug", file="/tmp/x.log"),
    )
    assert reload.changed(old, new) == [
        "cache.budget",
        "cache.workers",
        "readahead.max_window",
        "readahead.learn",
        "log.level",
        "log.file",
    ]
    assert reload.needs_remount(old, new) == ["cache.workers", "readahead.learn", "log.file"]
    live = reload.apply_live(old, new)
    assert live.cache.budget == 64 * MIB and live.cache.workers == old.cache.workers
    assert live.readahead.max_window == 32 * MIB and live.readahead.learn is True
    assert live.log.level == "debug" and live.log.file == ""
    assert reload.apply_live(old, old) is old


def test_engine_reports_settings_it_cannot_apply_live(tmp_path):
    """readahead.learn and state.max_bytes are read once at mount (the learned-set store is built
    then): a reload must say they wait for a remount and keep running with the old values."""
    (tmp_path / "src").mkdir()
    base = {"cache.budget": "32M", "state.dir": str(tmp_path / "state")}
    engine = Engine(str(tmp_path / "src"), load_config(overrides=base, use_default_path=False))
    try:
        learn_was = engine.learn is not None
        new = load_config(
            overrides={**base, "cache.budget": "24M", "readahead.learn": "false", "state.max_bytes": "1M"},
            use_default_path=False,
        )
        restart = engine.reconfigure(new)
        assert restart == ["readahead.learn", "state.max_bytes"]
        assert engine.cache.budget == 24 * MIB and engine.config.cache.budget == 24 * MIB
        assert engine.config.readahead.learn is True and engine.config.state.max_bytes == Config().state.max_bytes
        assert (engine.learn is not None) == learn_was
    finally:
        engine.close()
