"""The typed engine interface (fsio/api.py): the real Engine satisfies it, and the daemon uses
nothing of the engine outside it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from fastfs.config.loader import load_config
from fastfs.fsio.api import EngineAPI
from fastfs.fsio.engine import Engine

DAEMON = Path(__file__).resolve().parents[2] / "daemon"


def _protocol_members() -> tuple[list[str], list[str]]:
    methods = [n for n, v in vars(EngineAPI).items() if callable(v) and not n.startswith("_")]
    attributes = list(EngineAPI.__annotations__)
    return methods, attributes


def test_a_real_engine_is_an_engine_api(tmp_path):
    engine = Engine(str(tmp_path), load_config(overrides={"state.dir": str(tmp_path / "s")}, use_default_path=False))
    try:
        assert isinstance(engine, EngineAPI)
        for name in _protocol_members()[1]:
            assert hasattr(engine, name), name
    finally:
        engine.close()


def test_every_protocol_method_has_engine_s_signature():
    methods, _ = _protocol_members()
    assert {"open", "read_into", "release", "reconfigure", "snapshot"} <= set(methods)
    for name in methods:
        assert hasattr(Engine, name), f"Engine has no {name}"
        want = inspect.signature(getattr(EngineAPI, name))
        got = inspect.signature(getattr(Engine, name))
        shape = [(p.name, p.kind, p.default) for p in want.parameters.values()]
        assert shape == [(p.name, p.kind, p.default) for p in got.parameters.values()], (name, want, got)
        for p in want.parameters.values():
            assert p.annotation == got.parameters[p.name].annotation, (name, p.name)
        assert want.return_annotation == got.return_annotation or name == "snapshot", (name, want, got)


def test_the_daemon_uses_only_the_protocol():
    """Every ``engine.NAME`` under daemon/ is a member of EngineAPI, and nothing probes the engine
    with getattr."""
    methods, attributes = _protocol_members()
    members = set(methods) | set(attributes)
    used: set[str] = set()
    for path in DAEMON.rglob("*.py"):
        text = path.read_text()
        used |= set(re.findall(r"\bengine\.([A-Za-z_]\w*)", text))
        assert not re.search(r"getattr\([^)]*engine", text), path
    assert used, "no engine use found under daemon/"
    assert used <= members, sorted(used - members)
