"""The test command works wherever the repository is cloned (issue 17).

The repository root doubles as the package ``fastfs`` (``package-dir`` in pyproject.toml), so a
tool that derives module names from folders sees the clone's folder name. These tests copy the
repository's files (as they are in the working tree) into a folder named ``fastfs-main`` and run
the lint of ``make test`` there, and collect a test module there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Seconds the lint of the whole tree may take.
LINT_TIMEOUT = 300


def _copy_repository(dest: Path) -> None:
    """The tracked files (working-tree contents) of the repository, or the whole tree without git."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=60
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", "__pycache__", ".*_cache", "*.egg-info"))
        return
    for rel in filter(None, listed.split("\0")):
        source = ROOT / rel
        if source.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


@pytest.fixture(scope="module")
def hyphenated_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    clone = tmp_path_factory.mktemp("clone") / "fastfs-main"
    _copy_repository(clone)
    assert (clone / "pyproject.toml").is_file() and (clone / "__init__.py").is_file()
    return clone


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_lint_passes_in_a_clone_whose_folder_is_not_an_identifier(hyphenated_clone: Path, command: list[str]) -> None:
    pytest.importorskip("ruff")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--no-cache"],
        cwd=hyphenated_clone,
        capture_output=True,
        text=True,
        timeout=LINT_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "N999" not in result.stdout


def test_invalid_module_names_are_still_reported(hyphenated_clone: Path, tmp_path: Path) -> None:
    """The lint exemption covers package files only: a badly named module still fails."""
    pytest.importorskip("ruff")
    bad = hyphenated_clone / "fsio" / "Bad-Name.py"
    bad.write_text('"""A module nobody can import."""\n')
    try:
        result = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--no-cache", "fsio"],
            cwd=hyphenated_clone,
            capture_output=True,
            text=True,
            timeout=LINT_TIMEOUT,
        )
    finally:
        bad.unlink()
    assert result.returncode != 0
    assert "N999" in result.stdout and "Bad-Name" in result.stdout


def test_tests_collect_in_a_hyphenated_clone(hyphenated_clone: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/unit/test_config.py"],
        cwd=hyphenated_clone,
        capture_output=True,
        text=True,
        timeout=LINT_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_config.py::test_defaults_are_valid_and_frozen" in result.stdout
