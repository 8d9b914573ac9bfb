"""``fastfs completion bash|zsh|fish``: the generated scripts complete commands, options, choices and keys.

bash and fish are driven for real (bash through ``COMP_WORDS``, fish through ``complete -C``); the zsh
function is checked for syntax, loaded by ``compinit``, and must name every command and option.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_cli

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
needs_zsh = pytest.mark.skipif(shutil.which("zsh") is None, reason="needs zsh (make system-deps installs it)")
needs_fish = pytest.mark.skipif(shutil.which("fish") is None, reason="needs fish (make system-deps installs it)")
COMMANDS = ["mount", "umount", "stats", "warm", "install-service", "uninstall-service", "status", "bench", "completion"]


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


@needs_bash
def test_script_is_valid_bash(script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    assert script.read_text().rstrip().endswith("complete -o filenames -F _fastfs fastfs")


@needs_bash
def test_commands_options_and_choices(script: Path) -> None:
    assert complete(script, "fastfs ") == [*COMMANDS, "-h", "--help", "--version"]
    assert complete(script, "fastfs st") == ["stats", "status"]
    assert complete(script, "fastfs mount --pro") == ["--profile"]
    assert complete(script, "fastfs mount --print") == ["--print-config"]
    assert complete(script, "fastfs mount --profile ") == ["training", "checkpoint", "serving"]
    assert complete(script, "fastfs mount --log-level d") == ["debug"]
    assert complete(script, "fastfs status --j") == ["--json"]
    assert complete(script, "fastfs completion ") == ["bash", "zsh", "fish"]
    assert complete(script, "fastfs bench /x --small") == ["--small-files"]


@needs_bash
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
    result = run_cli("completion", "powershell")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and "invalid choice" in result.stderr


# -- zsh ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def zsh_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = run_cli("completion", "zsh")
    assert result.returncode == 0 and result.stderr == ""
    path = tmp_path_factory.mktemp("zsh") / "_fastfs"
    path.write_text(result.stdout)
    return path


@needs_zsh
def test_zsh_function_is_valid_and_loads_with_compinit(zsh_script: Path, tmp_path: Path) -> None:
    assert zsh_script.read_text().startswith("#compdef fastfs\n")
    assert subprocess.run(["zsh", "-n", str(zsh_script)], timeout=30).returncode == 0
    program = (
        f"fpath=({zsh_script.parent} $fpath); autoload -Uz compinit; compinit -u -d {tmp_path}/zcompdump; "
        "print -r -- ${_comps[fastfs]}"
    )
    done = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "_fastfs", (done.stdout, done.stderr)


@needs_zsh
def test_zsh_function_names_every_command_option_and_choice(zsh_script: Path) -> None:
    from fastfs.daemon.cli import completion
    from fastfs.daemon.cli.parser import build_parser

    text = zsh_script.read_text()
    commands, _ = completion.model(build_parser())
    assert [c.name for c in commands] == COMMANDS
    for command in commands:
        assert f"'{command.name}:" in text and f"                {command.name})" in text
        for option in command.options:
            for string in option.strings:
                assert string in text, (command.name, string)
            for choice in option.choices:
                assert choice in text
    assert "'budget'" in text and "'cache.budget'" in text and "compadd -S =" in text


# -- fish ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fish_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = run_cli("completion", "fish")
    assert result.returncode == 0 and result.stderr == ""
    path = tmp_path_factory.mktemp("fish") / "fastfs.fish"
    path.write_text(result.stdout)
    return path


def fish_complete(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """The candidates fish offers for *line* (without their descriptions)."""
    program = f"source {script}; complete -C {shlex.quote(line)}"
    done = subprocess.run(["fish", "--no-config", "-c", program], capture_output=True, text=True, timeout=30, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return [x.split("\t")[0] for x in done.stdout.splitlines() if x]


@needs_fish
def test_fish_completes_commands_options_choices_and_keys(fish_script: Path, tmp_path: Path) -> None:
    assert subprocess.run(["fish", "--no-execute", str(fish_script)], timeout=30).returncode == 0
    assert sorted(fish_complete(fish_script, "fastfs ")) == sorted(COMMANDS)
    assert fish_complete(fish_script, "fastfs st") == ["stats", "status"]
    assert fish_complete(fish_script, "fastfs mount --pro") == ["--profile"]
    assert sorted(fish_complete(fish_script, "fastfs mount --profile ")) == ["checkpoint", "serving", "training"]
    assert fish_complete(fish_script, "fastfs mount --log-level d") == ["debug"]
    assert fish_complete(fish_script, "fastfs status --j") == ["--json"]
    assert sorted(fish_complete(fish_script, "fastfs completion ")) == ["bash", "fish", "zsh"]
    assert fish_complete(fish_script, "fastfs mount -o budg") == ["budget="]
    assert "cache.budget=" in fish_complete(fish_script, "fastfs mount -o cache.")
    (tmp_path / "dir1").mkdir()
    (tmp_path / "file1").write_text("x")
    assert fish_complete(fish_script, "fastfs mount ", cwd=tmp_path) == ["dir1/"]
    assert sorted(fish_complete(fish_script, "fastfs bench ", cwd=tmp_path)) == ["dir1/", "file1"]
    assert fish_complete(fish_script, "fastfs mount --config fi", cwd=tmp_path) == ["file1"]
