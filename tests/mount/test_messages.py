"""Messages that say what to do: the command line's one-line errors for options, config files, paths and
the FUSE device."""

from __future__ import annotations

import grp
import os
import signal
from pathlib import Path

import psutil
import pytest
from conftest import force_unmount, is_mounted, mounted, run_cli, wait_for

from fastfs.config.values import MIB, human_size


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
        "initial_window, learn, local_scans, max_window, read_timeout, scan_max_files, scan_trigger, "
        "scan_window, small_file_max, source_direct_io, source_shape, source_streams, walk_ahead)"
    )
    config.write_text("fuse:\n  threads: 999\n")
    assert _error(run_cli("mount", src, mnt, "--config", config)) == (
        f"{config}:2: fuse.threads: must be between 1 and 256"
    )
    assert not is_mounted(mnt)


def test_a_nul_byte_in_a_config_path_is_a_one_line_error(paths: tuple[Path, Path], tmp_path: Path) -> None:
    """A YAML "\\0" in a path setting: the mount command printed a ValueError traceback."""
    _src, mnt = paths
    config = tmp_path / "c.yaml"
    config.write_text(f'source: "/data/s\\0rc"\nmountpoint: {mnt}\n')
    assert _error(run_cli("mount", "--config", config)) == f"{config}:1: source: contains a NUL byte: '/data/s\\x00rc'"
    assert not is_mounted(mnt)


def test_help_lists_the_new_commands_and_options() -> None:
    top = run_cli("--help")
    assert top.returncode == 0
    for command in ("status", "bench", "completion"):
        assert command in top.stdout
    mount = run_cli("mount", "--help")
    assert "--profile" in mount.stdout and "--print-config" in mount.stdout


# -- the messages of a first mount: each one line naming the problem and the fix (issue 26) ----------
def test_mountpoint_that_is_the_source_says_so(paths: tuple[Path, Path]) -> None:
    src, _ = paths
    (src / "data.bin").write_bytes(b"x")  # a source with files: it used to say "is not empty"
    for extra in ([], ["--foreground"]):
        assert _error(run_cli("mount", src, src, *extra)) == (
            f"mountpoint {src} is the source itself: fastfs mirrors SRC on another, empty directory"
            " (e.g. mkdir /mnt/src and mount there)"
        )
    assert not is_mounted(src)


def test_bad_yaml_names_file_and_line(paths: tuple[Path, Path], tmp_path: Path) -> None:
    src, mnt = paths
    config = tmp_path / "c.yaml"
    config.write_text("cache:\n  budget: 1G\nreadahead: [unclosed\n")
    assert _error(run_cli("mount", src, mnt, "--config", config)) == (
        f"{config}:4: invalid YAML: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence"
        " from line 3); correct the syntax at that line"
    )
    config.write_text("cache:\n  budget: 1G\n workers: 2\n")
    assert _error(run_cli("mount", src, mnt, "--config", config, "--print-config")) == (
        f"{config}:3: invalid YAML: expected <block end>, but found '<block mapping start>' (while parsing a"
        " block mapping from line 1); correct the syntax at that line"
    )
    assert not is_mounted(mnt)


def _nobody_can_open_fuse_device() -> bool:
    from asuser import run_as

    def probe() -> bool:
        try:
            os.close(os.open("/dev/fuse", os.O_RDWR))
        except OSError:
            return False
        return True

    return run_as(probe)


def _mount_as_nobody(*options: str) -> str:
    """The one line `fastfs mount SRC MNT *options` prints as nobody (exit status 1 checked)."""
    from asuser import NOBODY, NOGROUP, run_as, shared_dir

    # imported here: the child, as nobody, cannot read the interpreter's files under /root
    from fastfs.daemon import logsetup, mount, ops  # noqa: F401
    from fastfs.daemon.cli import main as cli
    from fastfs.fsio import engine, learn  # noqa: F401

    with shared_dir() as base:
        for name in ("src", "mnt", "state"):
            (base / name).mkdir()
            os.chown(base / name, NOBODY, NOGROUP)
        log = base / "state" / "log"

        def mount_as_nobody() -> int:
            os.environ["STATE_DIRECTORY"] = str(base / "state")
            return cli.main(["mount", str(base / "src"), str(base / "mnt"), "--log-file", str(log), *options])

        try:
            result = run_as(mount_as_nobody, capture=True, timeout=90)
        finally:
            force_unmount(base / "mnt")
    assert result["value"] == 1
    lines = result["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastfs: error: "), result["stderr"]
    return lines[0].removeprefix("fastfs: error: ")


def test_a_user_without_access_to_the_fuse_device_is_told_what_to_do() -> None:
    """A background mount by such a user said only "libfuse failed (status 4)", later only the errno."""
    if _nobody_can_open_fuse_device():
        pytest.skip("/dev/fuse is open to every user here")
    group = grp.getgrgid(os.stat("/dev/fuse").st_gid).gr_name
    fix = (
        f"add this user to group {group} (usermod -aG {group} USER) and log in again, or mount as root"
        if group != "root"
        else "ask root to make it usable by users (chmod 0666 /dev/fuse, its usual mode) or mount as root"
    )
    assert _mount_as_nobody() == f"cannot open /dev/fuse: Permission denied: {fix}"


def test_allow_other_without_user_allow_other_is_told_what_to_do() -> None:
    with open("/etc/fuse.conf", encoding="utf-8", errors="replace") as f:
        if any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f):
            pytest.skip("/etc/fuse.conf allows allow_other for every user here")
    expected = (
        "allow_other: a mount by a user other than root needs the line user_allow_other in /etc/fuse.conf"
        " (ask root to add it), or mount as root"
    )
    assert _mount_as_nobody("-o", "allow_other") == expected
    assert _mount_as_nobody("--allow-other") == expected
    assert _mount_as_nobody("-o", "allow_root").startswith("allow_root: only a mount by root can grant it")


# -- a RAM budget above the machine's memory (issue 24 item 6) ------------------------------------------
def test_a_budget_above_the_machines_memory_is_refused(paths: tuple[Path, Path]) -> None:
    """-o budget=1T on a 23 GiB machine mounted and reported a 1 TiB budget."""
    src, mnt = paths
    total = psutil.virtual_memory().total
    budget = 2 * total // MIB * MIB
    for extra in ([], ["--foreground"]):
        line = _error(run_cli("mount", src, mnt, "-o", f"budget={budget}", *extra))
        half = f"{total // 2 >> 30}G" if total // 2 >= 1 << 30 else f"{total // 2 >> 20}M"
        assert line == (
            f"cache.budget: {human_size(budget)} is more than this machine's memory ({human_size(total)}): the job"
            f" reading the data would be killed for it; use at most half, e.g. budget={half}, or 0 (auto)"
        )
    assert not is_mounted(mnt)


def test_a_reload_to_a_budget_above_the_machines_memory_keeps_the_running_one(paths: tuple[Path, Path]) -> None:
    src, mnt = paths
    with mounted(src, mnt, config_text="cache:\n  budget: 64M\n") as m:
        config = next(p for p in Path(m.log_path).parent.iterdir() if p.suffix == ".yaml")
        config.write_text(f"cache:\n  budget: {2 * psutil.virtual_memory().total}\n")
        m.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "reload failed" in m.log()), m.log()
        assert "more than this machine's memory" in m.log()
        assert m.stats()["gauges"]["cache_budget"] == 64 * MIB
