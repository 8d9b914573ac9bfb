"""Workload profiles and the effective-config YAML (``fastfs mount --profile X --print-config``)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import yaml
from conftest import mounted, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from fastfs.config import Config, ConfigError, load_config
from fastfs.config.loader import COMMAND_LINE, load_with_origins, schema_keys
from fastfs.config.profiles import CHECKPOINT_BUDGET_CAP, PROFILES
from fastfs.config.render import render
from fastfs.config.schema import MIB, MIN_BUDGET


def _value(config: Config, dotted: str):
    section, _, name = dotted.rpartition(".")
    return getattr(getattr(config, section) if section else config, name)


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_setting_is_a_real_key_with_a_reason_and_takes_effect(name):
    profile = PROFILES[name]
    keys = schema_keys()
    config = load_config(overrides={"profile": name}, use_default_path=False)
    assert config.profile == name
    assert profile.summary
    for setting in profile.settings:
        assert setting.key in keys, setting.key
        assert setting.why and "\n" not in setting.why
        assert _value(config, setting.key) == setting.resolve() or setting.key == "cache.budget"
    assert len({s.key for s in profile.settings}) == len(profile.settings)


def test_profiles_choose_documented_settings():
    training = load_config(overrides={"profile": "training"}, use_default_path=False)
    assert training.readahead.learn and training.readahead.scan_trigger == 2
    assert training.fuse.attr_timeout == training.fuse.entry_timeout == 3600
    checkpoint = load_config(overrides={"profile": "checkpoint"}, use_default_path=False)
    assert checkpoint.readahead.formats and checkpoint.readahead.max_window == 256 * MIB
    assert MIN_BUDGET <= checkpoint.cache.budget <= CHECKPOINT_BUDGET_CAP and checkpoint.cache.budget % MIB == 0
    serving = load_config(overrides={"profile": "serving"}, use_default_path=False)
    assert serving.readahead.read_timeout == 30 and serving.fuse.attr_timeout == 3600


def test_file_and_command_line_override_the_profile(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("profile: checkpoint\nreadahead:\n  max_window: 32M\ncache:\n  workers: 4\n")
    config = load_config(str(path), {"cache.workers": "6"})
    assert config.profile == "checkpoint"
    assert config.readahead.max_window == 32 * MIB  # file over profile
    assert config.cache.workers == 6  # command line over file and profile
    assert config.readahead.initial_window == 32 * MIB  # from the profile
    # the command line's profile replaces the file's
    assert load_config(str(path), {"profile": "serving"}).readahead.read_timeout == 30


def test_unknown_profile_is_a_one_line_error_with_a_suggestion(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"profile": "trainig"}, use_default_path=False)
    assert "did you mean training?" in str(e.value) and "\n" not in str(e.value)
    path = tmp_path / "c.yaml"
    path.write_text("cache:\n  workers: 4\nprofile: servin\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert str(e.value).startswith(f"{path}:3: profile: unknown profile 'servin'; did you mean serving?")


def test_origins_name_profile_file_line_and_command_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("profile: training\ncache:\n  workers: 4\n")
    _, origins = load_with_origins(str(path), {"readahead.max_window": "16M"})
    assert origins["readahead.scan_trigger"].startswith("profile training: ")
    assert origins["cache.workers"] == f"{path}:3"  # the file wins over the profile's 32
    assert origins["readahead.max_window"] == COMMAND_LINE


def _roundtrip(config: Config, tmp_path) -> Config:
    path = tmp_path / "printed.yaml"
    path.write_text(render(config, {}, "header line"))
    return load_config(str(path))


@pytest.mark.parametrize("name", ["", *PROFILES])
def test_rendered_yaml_loads_back_to_the_same_config(tmp_path, name):
    config = load_config(overrides={"profile": name} if name else {}, use_default_path=False)
    config = dataclasses.replace(
        config,
        source="/data/with space/and \"quote\" and 'apostrophe' and ü",
        fuse=dataclasses.replace(config.fuse, uid=1000, gid=0, umask=0o22, file_mode=0o644, dir_mode=0o750),
    )
    assert _roundtrip(config, tmp_path) == config


@settings(max_examples=60, deadline=None)
@given(
    budget=st.sampled_from([0, 16 * MIB, 3 * 1024 * MIB, 17 * MIB + 5]),
    umask=st.integers(0, 0o777),
    mode=st.integers(-1, 0o777),
    timeout=st.floats(0, 86400, allow_nan=False),
    level=st.sampled_from(["debug", "info", "warning", "error"]),
    text=st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=20),
)
def test_rendered_yaml_roundtrips_arbitrary_values(tmp_path_factory, budget, umask, mode, timeout, level, text):
    base = Config()
    config = dataclasses.replace(
        base,
        mountpoint=text,
        cache=dataclasses.replace(base.cache, budget=budget),
        fuse=dataclasses.replace(base.fuse, umask=umask, file_mode=mode, attr_timeout=timeout),
        log=dataclasses.replace(base.log, level=level),
    )
    assert _roundtrip(config, tmp_path_factory.mktemp("rt")) == config


# -- the command line ----------------------------------------------------------------------------
def test_print_config_shows_the_profile_with_reasons_and_exits(tmp_path):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    result = run_cli("mount", src, mnt, "--profile", "checkpoint", "-o", "workers=8", "--print-config")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert out.startswith("# fastfs effective configuration (defaults < profile checkpoint")
    assert "  max_window: 256M  # profile checkpoint: " in out
    assert "  workers: 8  # command line" in out
    data = yaml.safe_load(out)
    assert data["source"] == str(src) and data["profile"] == "checkpoint"
    assert not any(line.startswith("fastfs: mounted") for line in out.splitlines())
    with open("/proc/self/mountinfo") as f:
        assert str(mnt) not in f.read()  # nothing was mounted


def test_print_config_validates_a_config_file(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("fuse:\n  umask: 022\n")
    result = run_cli("mount", "--config", good, "--print-config")
    assert result.returncode == 0 and "  umask: '0022'  # " in result.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("fuse:\n  umask: 022\ncache:\n  bugdet: 1G\n")
    result = run_cli("mount", "--config", bad, "--print-config")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == (
        f"fastfs: error: {bad}:4: cache.bugdet: unknown key; did you mean budget? "
        "(known: block_size, budget, check_invariants, disk_budget, disk_dir, disk_free_floor, file_workers, workers)"
    )


def test_print_config_needs_no_paths_and_rejects_unknown_profiles():
    result = run_cli("mount", "--print-config")
    assert result.returncode == 0 and 'profile: ""' in result.stdout
    result = run_cli("mount", "--profile", "trainig", "--print-config")
    assert result.returncode == 2 and "invalid choice" in result.stderr and len(result.stderr.splitlines()) == 1


def test_training_profile_mounts_without_open_and_reads_the_bytes(src: Path, mnt: Path) -> None:
    """--profile training sets fuse.no_open: a pass over small files sends no OPEN (past the first,
    whose ENOSYS turns them off) or RELEASE, and no file passes through (the first pass is read through
    fastfs); every byte is the file's, and a second pass comes from the kernel's page cache without a
    READ. (Failed before the profile set no_open: one OPEN and one RELEASE per file.)"""
    files = {f"s{i:02d}.bin": bytes([i]) * (3000 + i) for i in range(24)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    assert load_config(overrides={"profile": "training"}, use_default_path=False).fuse.no_open
    counts = []
    with mounted(src, mnt, config_text="profile: training\n") as m:
        counts.append(dict(m.stats()["kernel"]["requests"]))
        for _ in range(2):
            for name, data in files.items():  # os.open: Python's open() also asks isatty (an IOCTL)
                fd = os.open(mnt / name, os.O_RDONLY)
                try:
                    assert os.read(fd, 8192) == data
                    assert os.fstat(fd).st_size == len(data)
                finally:
                    os.close(fd)
            counts.append(dict(m.stats()["kernel"]["requests"]))
    before, first, second = counts
    # one OPEN at most: the first, answered ENOSYS, after which the kernel sends none
    assert second.get("open", 0) - before.get("open", 0) <= 1, (before, second)
    assert second.get("release", 0) == before.get("release", 0), (before, second)
    assert first.get("read", 0) >= 1  # the first pass was served: no passthrough without an open
    assert second.get("read", 0) == first.get("read", 0), (first, second)
