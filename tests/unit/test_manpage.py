"""``make man``: the fastfs(1) page is generated from the parser, names every command and option, and
renders without warnings (issue 26)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastfs.daemon.cli import manpage
from fastfs.daemon.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    out = tmp_path_factory.mktemp("man")
    done = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "man", f"MAN_DIR={out}", f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}/fastfs.1" in done.stdout
    return (out / "fastfs.1").read_text()


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    return dict(manpage._subcommands(build_parser()))


def test_the_page_is_generated_and_names_every_command_and_option(page: str) -> None:
    assert page == manpage.render()  # what make writes is the parser's page, nothing kept from before
    commands = _subcommands()
    assert {"mount", "umount", "stats", "warm", "status", "bench", "install-service", "uninstall-service",
            "completion"} <= set(commands)  # fmt: skip
    for name, sub in commands.items():
        assert f'.SS "{manpage.escape(name)}"' in page, name
        for action in sub._actions:
            for option in action.option_strings:
                assert f"\\fB{manpage.escape(option)}\\fR" in page, (name, option)
            if action.help:
                assert manpage.escape(action.help.replace("%(default)s", str(action.default))) in page, (name, action)
    for section in ("NAME", "SYNOPSIS", "COMMANDS", "ENVIRONMENT", "SIGNALS", "FILES", "EXIT STATUS"):
        assert f".SH {section}" in page
    assert "FASTFS_OPTIONS" in page and "SIGUSR2" in page


def test_the_page_renders_without_warnings(page: str, tmp_path: Path) -> None:
    if shutil.which("groff") is None:
        pytest.skip("needs groff")
    path = tmp_path / "fastfs.1"
    path.write_text(page)
    env = {**os.environ, "LC_ALL": "C.UTF-8", "MANWIDTH": "100"}
    done = subprocess.run(
        ["groff", "-man", "-Tutf8", "-P-cbu", "-ww", str(path)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    text = done.stdout
    assert "fastfs - read-ahead FUSE mirror" in text.replace("\u2010", "-").replace("\u2212", "-")
    for name in _subcommands():
        assert name in text
