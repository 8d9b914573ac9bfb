"""Config loading and validation without FUSE: defaults, YAML, overrides, one-line errors."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastfs.config import Config, ConfigError, load_config, loader, parse_overrides, schema
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
        ("fuse:\n  negative_timeout: -2\n", "fuse.negative_timeout: must be -1 (as dir_timeout) or"),
        ("fuse:\n  dir_timeout: 0\n", "fuse.dir_timeout: must be between 0.1 and 86400"),
        ("log:\n  level: loud\n", "log.level: must be one of"),
        ("stats:\n  metrics: 'host:notaport'\n", "stats.metrics"),
        ("cache: 5\n", "cache: expected a mapping"),
        ("cache:\n  disk_budget: lots\n", "cache.disk_budget: expected a size such as 100G or a share such as 50%"),
        ("cache:\n  disk_budget: 10M\n", "cache.disk_budget: must be a size >= 64 MiB or a share above 0%"),
        ("cache:\n  disk_budget: 0\n", "cache.disk_budget: must be a size >= 64 MiB"),
        ("cache:\n  disk_budget: 0%\n", "cache.disk_budget: must be a size >= 64 MiB or a share above 0%"),
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


# -- messages that say what to do (issue 17) ----------------------------------------------------
@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["budgt=1G"], "-o budgt=1G: unknown option; did you mean budget?"),
        (["cache.bugdet=1G"], "did you mean cache.budget?"),
        (["frobnicate=1"], "-o frobnicate=1: unknown option"),
        (["budget"], "-o budget: missing a value (write budget=VALUE)"),
        (["workers,budget=1G"], "-o workers: missing a value"),
        (["nobudget"], "unknown option"),
    ],
)
def test_bad_option_names_and_missing_values(options, needle):
    with pytest.raises(ConfigError) as e:
        parse_overrides(options)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bare_boolean_options_still_mean_true_and_no_prefix_false():
    assert parse_overrides(["allow_other,noformats,no_open"]) == {
        "fuse.allow_other": "true",
        "readahead.formats": "false",
        "fuse.no_open": "true",
    }


def test_budget_error_is_in_human_units():
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"cache.budget": "1M"}, use_default_path=False)
    assert str(e.value) == "cache.budget: must be 0 (auto) or >= 16 MiB (got 1 MiB)"


@pytest.mark.parametrize(
    ("text", "prefix", "needle"),
    [
        ("cache:\n  budget: 1G\n  bugdet: 2\n", ":3: ", "cache.bugdet: unknown key; did you mean budget?"),
        ("fuse:\n  attr_timeout: 1\n\nreadahead:\n  enabld: false\n", ":5: ", "did you mean enabled?"),
        ("cache:\n  workers: 0\n", ":2: ", "cache.workers: must be between 1 and 256"),
        ("nosuch: 1\n", ":1: ", "nosuch: unknown key"),
        ("cache: 5\n", ":1: ", "cache: expected a mapping"),
        ("fuse:\n  umask: 999\n", ":2: ", "fuse.umask: expected octal"),
    ],
)
def test_bad_key_in_a_file_names_file_and_line(tmp_path, text, prefix, needle):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert message.startswith(path + prefix), message
    assert needle in message and "\n" not in message


def test_a_bad_value_overridden_on_the_command_line_is_not_blamed_on_the_file(tmp_path):
    path = write(tmp_path, "cache:\n  workers: 8\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, {"cache.workers": "0"})
    assert str(e.value).startswith("cache.workers: ")


# -- ownership settings ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("yaml_value", "expected"),
    [("022", 0o22), ("22", 0o22), ("'0022'", 0o22), ("0o022", 0o22), ("0", 0), ("'077'", 0o77), ("777", 0o777)],
)
def test_modes_in_yaml_are_octal_as_written(tmp_path, yaml_value, expected):
    config = load_config(write(tmp_path, f"fuse:\n  umask: {yaml_value}\n  file_mode: 644\n  dir_mode: 0755\n"))
    assert config.fuse.umask == expected
    assert config.fuse.file_mode == 0o644 and config.fuse.dir_mode == 0o755


def test_ownership_options_on_the_command_line():
    config = load_config(
        overrides=parse_overrides(["uid=1234,gid=root,umask=027,file_mode=0640,dir_mode=750"]), use_default_path=False
    )
    fc = config.fuse
    assert (fc.uid, fc.gid, fc.umask, fc.file_mode, fc.dir_mode) == (1234, 0, 0o27, 0o640, 0o750)
    assert load_config(overrides={"fuse.uid": "root"}, use_default_path=False).fuse.uid == 0
    defaults = load_config(use_default_path=False).fuse
    assert (defaults.uid, defaults.gid, defaults.file_mode, defaults.dir_mode, defaults.umask) == (-1, -1, -1, -1, 0)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"fuse.umask": "8"}, "fuse.umask: expected octal"),
        ({"fuse.file_mode": "1777"}, "fuse.file_mode: must be"),
        ({"fuse.file_mode": "rw-r--r--"}, "fuse.file_mode: expected octal"),
        ({"fuse.uid": "no-such-user-here"}, "fuse.uid: no user named"),
        ({"fuse.gid": "no-such-group-here"}, "fuse.gid: no group named"),
        ({"fuse.uid": "\x00"}, "fuse.uid: no user named"),  # (a NUL byte: getpwnam raised ValueError)
        ({"fuse.gid": "a\x00b"}, "fuse.gid: no group named"),
        ({"fuse.uid": "-2"}, "fuse.uid: must be"),
        ({"fuse.gid": str(2**32)}, "fuse.gid: must be"),
    ],
)
def test_bad_ownership_values(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_config(overrides=overrides, use_default_path=False)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('state:\n  dir: "/tmp/a\\0b"\n', "state.dir"),
        ('log:\n  file: "/tmp/l\\0g"\n', "log.file"),
        ('source: "/data/s\\0rc"\n', "source"),
    ],
)
def test_a_nul_byte_in_a_string_setting_is_a_one_line_error(tmp_path, text, key):
    """YAML can spell a NUL byte ("\\0"); every os call given such a path raised ValueError, and the
    mount command died with a traceback instead."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert f"{key}: contains a NUL byte" in str(e.value) and "\n" not in str(e.value)


def test_memory_problems_of_the_budget() -> None:
    """A budget above the machine's memory is an error, one above 3/4 of it a warning (issue 24 item 6)."""
    gib = 1 << 30
    total = 23 * gib + 512 * (1 << 20)

    def problems(budget: str) -> tuple[str | None, str | None]:
        return loader.memory_problems(load_config(overrides={"cache.budget": budget}, use_default_path=False), total)

    error, warning = problems("1T")
    assert warning is None and error == (
        "cache.budget: 1024 GiB is more than this machine's memory (23.5 GiB): the job reading the data would be"
        " killed for it; use at most half, e.g. budget=11G, or 0 (auto)"
    )
    assert problems("20G") == (
        None,
        "cache.budget 20 GiB is 85% of this machine's memory (23.5 GiB): leave room for the job that reads the data",
    )
    assert problems("4G") == (None, None)
    assert problems("0") == (None, None)


def test_negative_entries_follow_dir_timeout_unless_set(tmp_path):
    assert Config().fuse.dir_timeout == 1.0 and Config().fuse.negative_ttl == 1.0
    assert load_config(overrides={"fuse.dir_timeout": "3"}, use_default_path=False).fuse.negative_ttl == 3.0
    config = load_config(overrides={"fuse.dir_timeout": "3", "fuse.negative_timeout": "0"}, use_default_path=False)
    assert config.fuse.negative_ttl == 0.0  # set: its own (0: not cached)


def test_revalidate_defaults_alias_range_and_bound():
    """fuse.revalidate: 1 s by default, ``-o revalidate=`` and ``-o notrust_unchanged_dirs``, 0..86400,
    and the bound fastfs answers with is never above attr_timeout."""
    fc = Config().fuse
    assert (fc.revalidate, fc.trust_unchanged_dirs, fc.revalidate_bound) == (1.0, True, 1.0)
    config = load_config(None, parse_overrides(["revalidate=0.25,notrust_unchanged_dirs"]), use_default_path=False)
    assert (config.fuse.revalidate, config.fuse.trust_unchanged_dirs) == (0.25, False)
    assert load_config(None, parse_overrides(["revalidate=0"]), use_default_path=False).fuse.revalidate_bound == 0
    lowered = load_config(None, parse_overrides(["attr_timeout=0.5"]), use_default_path=False)
    assert lowered.fuse.revalidate == 1.0 and lowered.fuse.revalidate_bound == 0.5  # at most attr_timeout
    for bad in ("-1", "86401", "soon"):
        with pytest.raises(ConfigError, match="fuse.revalidate"):
            load_config(None, parse_overrides([f"revalidate={bad}"]), use_default_path=False)


def test_static_data_profiles_raise_revalidate_with_their_timeouts():
    from fastfs.config.profiles import PROFILES, STATIC_DATA_TIMEOUT

    for name in ("training", "serving"):
        profile = PROFILES[name]
        assert profile.values()["fuse.revalidate"] == STATIC_DATA_TIMEOUT == profile.values()["fuse.attr_timeout"]
        assert "1 h" in profile.reasons()["fuse.revalidate"]
    assert "fuse.revalidate" not in PROFILES["checkpoint"].values()
