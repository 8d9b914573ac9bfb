"""Messages that say what to do: the command line's one-line errors for options and config files."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import is_mounted, run_cli


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path]:
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    return src, mnt


def _error(result) -> str:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastfs: error: "), result.stderr
    return lines[0].removeprefix("fastfs: error: ")


@pytest.mark.parametrize("foreground", [[], ["--foreground"]], ids=["background", "foreground"])
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["-o", "budgt=1G"], "-o budgt=1G: unknown option; did you mean budget?"),
        (["-o", "budget"], "-o budget: missing a value (write budget=VALUE)"),
        (["-o", "budget=1M"], "cache.budget: must be 0 (auto) or >= 16 MiB (got 1 MiB)"),
        (["-o", "readahed.max_window=8M"],
         "-o readahed.max_window=8M: unknown option; did you mean readahead.max_window?"),
        (["-o", "uid=no-such-user-x"], "fuse.uid: no user named 'no-such-user-x'"),
        (["-o", "umask=9"], "fuse.umask: expected octal permission bits such as 0644, got '9'"),
        (["-o", "profile=servng"],
         "profile: unknown profile 'servng'; did you mean serving? (known: training, checkpoint, serving)"),
    ],
)  # fmt: skip
def test_option_errors(paths: tuple[Path, Path], options: list[str], expected: str, foreground: list[str]) -> None:
    src, mnt = paths
    assert _error(run_cli("mount", src, mnt, *options, *foreground)) == expected
    assert not is_mounted(mnt)


def test_config_file_errors_name_file_and_line(paths: tuple[Path, Path], tmp_path: Path) -> None:
    src, mnt = paths
    config = tmp_path / "c.yaml"
    config.write_text("cache:\n  budget: 1G\n\nreadahead:\n  max_windw: 8M\n")
    assert _error(run_cli("mount", src, mnt, "--config", config)) == (
        f"{config}:5: readahead.max_windw: unknown key; did you mean max_window? (known: enabled, formats, "
        "initial_window, learn, max_window, read_timeout, scan_max_files, scan_trigger, small_file_max, "
        "source_direct_io, source_shape, source_streams)"
    )
    config.write_text("fuse:\n  threads: 999\n")
    assert _error(run_cli("mount", src, mnt, "--config", config)) == (
        f"{config}:2: fuse.threads: must be between 1 and 256"
    )
    assert not is_mounted(mnt)


def test_help_lists_the_new_commands_and_options() -> None:
    top = run_cli("--help")
    assert top.returncode == 0
    for command in ("status", "bench", "completion"):
        assert command in top.stdout
    mount = run_cli("mount", "--help")
    assert "--profile" in mount.stdout and "--print-config" in mount.stdout
