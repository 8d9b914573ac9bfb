"""``fastfs completion bash``: the generated script completes commands, options, choices and keys."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = run_cli("completion", "bash")
    assert result.returncode == 0 and result.stderr == ""
    path = tmp_path_factory.mktemp("completion") / "fastfs.bash"
    path.write_text(result.stdout)
    return path


def complete(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """The completions bash offers for *line* (the cursor at its end)."""
    words = line.split(" ")
    array = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (
        f"source {script}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _fastfs; "
        "printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return [x for x in result.stdout.splitlines() if x]


def test_script_is_valid_bash(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    assert script.read_text().rstrip().endswith("complete -o filenames -F _fastfs fastfs")


def test_commands_options_and_choices(script: Path) -> None:
    assert complete(script, "fastfs ") == [
        "mount", "umount", "stats", "warm", "install-service", "status", "bench", "completion", "-h", "--help",
        "--version",
    ]  # fmt: skip
    assert complete(script, "fastfs st") == ["stats", "status"]
    assert complete(script, "fastfs mount --pro") == ["--profile"]
    assert complete(script, "fastfs mount --print") == ["--print-config"]
    assert complete(script, "fastfs mount --profile ") == ["training", "checkpoint", "serving"]
    assert complete(script, "fastfs mount --log-level d") == ["debug"]
    assert complete(script, "fastfs status --j") == ["--json"]
    assert complete(script, "fastfs completion ") == ["bash"]
    assert complete(script, "fastfs bench /x --small") == ["--small-files"]


def test_option_keys_and_paths(script: Path, tmp_path: Path) -> None:
    assert complete(script, "fastfs mount -o budg") == ["budget="]
    assert "cache.budget=" in complete(script, "fastfs mount -o cache.")
    assert "uid=" in complete(script, "fastfs mount -o ui")
    (tmp_path / "dir1").mkdir()
    (tmp_path / "file1").write_text("x")
    assert complete(script, "fastfs mount ", cwd=tmp_path) == ["dir1"]  # directories for SRC and MNT
    assert sorted(complete(script, "fastfs bench ", cwd=tmp_path)) == ["dir1", "file1"]
    assert complete(script, "fastfs mount --config fi", cwd=tmp_path) == ["file1"]


def test_unknown_shell_is_a_usage_error() -> None:
    result = run_cli("completion", "fish")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and "invalid choice" in result.stderr
