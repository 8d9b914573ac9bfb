"""Config loading and validation without FUSE: defaults, YAML, overrides, one-line errors."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastfs.config import Config, ConfigError, load_config, parse_overrides, schema
from fastfs.config.loader import ALIASES, parse_listen_address, parse_size
from fastfs.config.schema import ConfigValueError

MIB = 1024 * 1024


def write(tmp_path, text: str) -> str:
    path = tmp_path / "fastfs.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_are_valid_and_frozen():
    config = load_config(use_default_path=False)
    assert config == Config()
    assert config.cache.block_size == 4 * MIB and config.readahead.max_window == 64 * MIB
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.cache.workers = 3  # type: ignore[misc]


def test_every_field_has_a_docstring():
    source = inspect.getsource(schema)
    for section in dataclasses.fields(Config):
        value = getattr(Config(), section.name)
        if dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                marker = f"    {f.name}: "
                after = source.split(marker, 1)[1].split("\n", 2)[1]
                assert after.strip().startswith('"""'), f"{section.name}.{f.name} has no docstring"


def test_yaml_values_sizes_and_bools(tmp_path):
    path = write(tmp_path, "cache:\n  budget: 512M\n  workers: 8\nreadahead:\n  formats: no\n  max_window: 32MiB\n")
    config = load_config(path)
    assert config.cache.budget == 512 * MIB and config.cache.workers == 8
    assert config.readahead.formats is False and config.readahead.max_window == 32 * MIB


def test_cli_overrides_win_over_yaml(tmp_path):
    path = write(tmp_path, "cache:\n  budget: 512M\n")
    config = load_config(path, parse_overrides(["budget=1G,workers=4", "log.level=debug", "no_open"]))
    assert config.cache.budget == 1024 * MIB and config.cache.workers == 4
    assert config.log.level == "debug" and config.fuse.no_open is True


def test_aliases_all_name_real_keys():
    for alias, key in ALIASES.items():
        section, _, name = key.rpartition(".")
        target = getattr(Config(), section) if section else Config()
        assert hasattr(target, name), alias


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("cache:\n  bugdet: 1G\n", "cache.bugdet: unknown key"),
        ("nosuch: 1\n", "nosuch: unknown key"),
        ("cache:\n  budget: lots\n", "cache.budget: expected a size"),
        ("cache:\n  budget: 1M\n", "cache.budget: must be"),
        ("cache:\n  block_size: 3M\n", "cache.block_size: must be a power of two"),
        ("cache:\n  workers: 0\n", "cache.workers"),
        ("readahead:\n  enabled: maybe\n", "readahead.enabled: expected true or false"),
        ("readahead:\n  initial_window: 128M\n", "readahead.initial_window"),
        ("fuse:\n  attr_timeout: -1\n", "fuse.attr_timeout"),
        ("fuse:\n  attr_timeout: .nan\n", "fuse.attr_timeout: expected a finite number"),
        ("log:\n  level: loud\n", "log.level: must be one of"),
        ("stats:\n  metrics: 'host:notaport'\n", "stats.metrics"),
        ("cache: 5\n", "cache: expected a mapping"),
        ("cache:\n  disk_budget: lots\n", "cache.disk_budget: expected a size such as 100G or a share such as 50%"),
        ("cache:\n  disk_budget: 10M\n", "cache.disk_budget: must be a size >= 64M or a share above 0%"),
        ("cache:\n  disk_budget: 0\n", "cache.disk_budget: must be a size >= 64M"),
        ("cache:\n  disk_budget: 0%\n", "cache.disk_budget: must be a size >= 64M or a share above 0%"),
        ("cache:\n  disk_budget: 150%\n", "cache.disk_budget: expected a share between 0% and 100%"),
        ("cache:\n  disk_budget: -5%\n", "cache.disk_budget: expected a share between 0% and 100%"),
        ("cache:\n  disk_budget: nan%\n", "cache.disk_budget: expected a share between 0% and 100%"),
        ("cache:\n  disk_budget: '%'\n", "cache.disk_budget: expected a share"),
        ("cache:\n  disk_free_floor: 95%\n", "cache.disk_free_floor: must be a size or a share of at most 90%"),
        ("cache:\n  disk_free_floor: -1G\n", "cache.disk_free_floor: expected a size"),
        ("cache:\n  disk_dir: relative/dir\n", "cache.disk_dir: must be an absolute path"),
        ("cache:\n  disk_dir: [a, b]\n", "cache.disk_dir: expected a string"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("cache: [\n", "invalid YAML"),
    ],
)
def test_bad_config_is_one_line_error_naming_the_key(tmp_path, text, needle):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    message = str(e.value)
    assert needle in message
    assert "\n" not in message


def test_disk_tier_settings(tmp_path):
    config = load_config(use_default_path=False)
    assert (config.cache.disk_dir, config.cache.disk_budget, config.cache.disk_free_floor) == ("", "50%", "10%")
    path = write(tmp_path, "cache:\n  disk_dir: /scratch/fastfs\n  disk_budget: 100G\n  disk_free_floor: 2.5%\n")
    config = load_config(path)
    assert config.cache.disk_dir == "/scratch/fastfs"
    assert schema.parse_amount(config.cache.disk_budget, "k") == schema.Amount(bytes=100 * 1024 * MIB)
    assert schema.parse_amount(config.cache.disk_free_floor, "k") == schema.Amount(share=0.025)
    config = load_config(path, parse_overrides(["disk_budget=30%,disk_free_floor=20G,disk_dir=/nvme/c"]))
    assert (config.cache.disk_dir, config.cache.disk_budget, config.cache.disk_free_floor) == ("/nvme/c", "30%", "20G")
    assert load_config(write(tmp_path, "cache:\n  disk_budget: 1073741824\n")).cache.disk_budget == "1073741824"


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "nope.yaml"))


def test_empty_file_gives_defaults(tmp_path):
    assert load_config(write(tmp_path, "")) == Config()


def test_listen_address():
    assert parse_listen_address("9100") == ("127.0.0.1", 9100)
    assert parse_listen_address("0.0.0.0:9100") == ("0.0.0.0", 9100)
    assert parse_listen_address("[::1]:9100") == ("::1", 9100)
    with pytest.raises(ConfigValueError):
        parse_listen_address("70000")


def test_parse_size():
    assert parse_size("4k", "k") == 4096 and parse_size("1.5G", "k") == 3 * 512 * MIB and parse_size(7, "k") == 7
    with pytest.raises(ConfigError):
        parse_size(True, "k")


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(sorted(ALIASES) + ["cache.budget", "x.y", "fuse"]),
        st.one_of(
            st.text(max_size=12), st.integers(-(10**12), 10**12), st.booleans(), st.none(), st.floats(allow_nan=True)
        ),
    )
)
def test_arbitrary_overrides_give_config_or_one_line_error(overrides):
    try:
        config = load_config(overrides={ALIASES.get(k, k): v for k, v in overrides.items()}, use_default_path=False)
    except ConfigError as e:
        assert "\n" not in str(e)
    else:
        config.validate()


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_yaml_text_gives_config_or_one_line_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text(text)
    try:
        load_config(str(path))
    except ConfigError as e:
        assert "\n" not in str(e)
