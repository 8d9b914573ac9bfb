"""Load a :class:`~fastfs.config.schema.Config` from YAML and ``key=value`` overrides.

Order of precedence: schema defaults < YAML file (``--config`` or ``/etc/fastfs/fastfs.yaml`` when it
exists) < command-line overrides (``-o section.key=value`` or a short alias such as ``budget=2G``).
A ``profile`` (config file key, ``-o profile=NAME`` or ``--profile``) adds the settings of
:mod:`fastfs.config.profiles` as a layer between the defaults and the file.
Every problem (missing file, bad YAML, unknown key, wrong type, out-of-range value) raises
:class:`ConfigError` whose message is one line naming the key; a key set in the config file is
located as ``FILE:LINE:``, and an unknown key or option gets the closest known name suggested.
"""

from __future__ import annotations

import dataclasses
import difflib
import grp
import os
import pwd
import re
from collections.abc import Iterable, Mapping
from typing import Any

import psutil
import yaml

from fastfs.config import schema
from fastfs.config.profiles import PROFILES
from fastfs.config.schema import Config
from fastfs.config.values import (  # noqa: F401 - the loader's public names
    GIB,
    MIB,
    ConfigError,
    ConfigValueError,
    human_size,
    one_line,
    parse_listen_address,
    parse_size,
)

DEFAULT_PATH = "/etc/fastfs/fastfs.yaml"

# Short names accepted by -o and by mount(8) option strings, mapped onto schema keys.
ALIASES = {
    "budget": "cache.budget",
    "cache_size": "cache.budget",
    "block_size": "cache.block_size",
    "workers": "cache.workers",
    "disk_dir": "cache.disk_dir",
    "disk_budget": "cache.disk_budget",
    "disk_free_floor": "cache.disk_free_floor",
    "readahead": "readahead.enabled",
    "max_window": "readahead.max_window",
    "initial_window": "readahead.initial_window",
    "small_file_max": "readahead.small_file_max",
    "scan_trigger": "readahead.scan_trigger",
    "formats": "readahead.formats",
    "learn": "readahead.learn",
    "direct_io_source": "readahead.source_direct_io",
    "source_streams": "readahead.source_streams",
    "read_timeout": "readahead.read_timeout",
    "entry_timeout": "fuse.entry_timeout",
    "attr_timeout": "fuse.attr_timeout",
    "revalidate": "fuse.revalidate",
    "trust_unchanged_dirs": "fuse.trust_unchanged_dirs",
    "negative_timeout": "fuse.negative_timeout",
    "read_ahead_kb": "fuse.read_ahead_kb",
    "allow_other": "fuse.allow_other",
    "no_open": "fuse.no_open",
    "threads": "fuse.threads",
    "passthrough": "fuse.passthrough",
    "request_timeout": "fuse.request_timeout",
    "max_pages": "fuse.max_pages",
    "readdirplus": "fuse.readdirplus",
    "log_level": "log.level",
    "log_file": "log.file",
    "metrics": "stats.metrics",
    "state_dir": "state.dir",
    "uid": "fuse.uid",
    "gid": "fuse.gid",
    "umask": "fuse.umask",
    "file_mode": "fuse.file_mode",
    "dir_mode": "fuse.dir_mode",
    # the standard FUSE / mount(8) options, with their usual meaning
    "fsname": "fuse.fsname",
    "subtype": "fuse.subtype",
    "default_permissions": "fuse.default_permissions",
    "allow_root": "fuse.allow_root",
    "noatime": "fuse.noatime",
    "nonempty": "fuse.nonempty",
}
# Standard mount options that fastfs always honours (a read-only mount without devices or setuid
# files): accepted by -o, FASTFS_OPTIONS and the mount helper, and change nothing.
NO_OP_OPTIONS = {
    "ro": "fastfs mounts are always read-only",
    "nosuid": "fastfs mounts are always nosuid",
    "nodev": "fastfs mounts are always nodev",
}
# Standard mount options fastfs cannot honour: (option, the one-line reason and what to do).
REFUSED_OPTIONS = {
    "rw": "fastfs mounts are read-only (drop rw; ro is implied)",
}
# Share of the machine's memory above which a cache budget gets a warning (the job needs memory too).
BUDGET_WARN_SHARE = 0.75
# Environment variable holding options as -o takes them, under the command line's -o.
ENV_OPTIONS = "FASTFS_OPTIONS"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_MODE_RE = re.compile(r"^(?:0o)?([0-7]{1,4})$", re.IGNORECASE)
# How close a misspelt key must be to a known one to be suggested (difflib ratio).
SUGGEST_CUTOFF = 0.6
# Where the origin of a value set on the command line is shown as (by --print-config).
COMMAND_LINE = "command line"


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``"; did you mean budget?"`` for the closest candidate, or ``""``."""
    match = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=SUGGEST_CUTOFF)
    return f"; did you mean {match[0]}?" if match else ""


def schema_keys() -> dict[str, str]:
    """Every settable dotted key (``cache.budget``, ``source``) -> its type name (``int``, ``Mode``...)."""
    keys: dict[str, str] = {}
    for f in dataclasses.fields(Config):
        sub = _section_class(f.type)
        if sub is None:
            keys[f.name] = str(f.type)
        else:
            keys.update({f"{f.name}.{g.name}": str(g.type) for g in dataclasses.fields(sub)})
    return keys


def option_type(key: str) -> str | None:
    """Type name of an ``-o`` key (alias or dotted), or None when it names no setting."""
    return schema_keys().get(ALIASES.get(key, key))


def parse_mode(value: Any, key: str) -> int:
    """Octal permission bits: ``"0644"``, ``"644"``, ``"0o644"``, ``-1`` (unset) or an int -> int."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected octal permission bits such as 0644, got {value!r}", key)
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if text == "-1":
        return -1
    m = _MODE_RE.match(text)
    if not m:
        raise ConfigError(f"{key}: expected octal permission bits such as 0644, got {value!r}", key)
    return int(m.group(1), 8)


def parse_id(value: Any, key: str, user: bool) -> int:
    """A numeric uid/gid, ``-1`` (unset), or a user / group name looked up now."""
    kind = "user" if user else "group"
    if isinstance(value, (bool, float, dict, list)):
        raise ConfigError(f"{key}: expected a {kind} id or name, got {value!r}", key)
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        return pwd.getpwnam(text).pw_uid if user else grp.getgrnam(text).gr_gid
    except (KeyError, ValueError):  # (ValueError: a name with a NUL byte, which no name has)
        raise ConfigError(f"{key}: no {kind} named {text!r}", key) from None


def _convert(value: Any, type_name: str, key: str) -> Any:
    if type_name == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if type_name == "int":
        return parse_size(value, key)
    if type_name == "float":
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            result = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if result != result or result in (float("inf"), float("-inf")):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return result
    if type_name == "Mode":
        return parse_mode(value, key)
    if type_name in ("Uid", "Gid"):
        return parse_id(value, key, user=type_name == "Uid")
    if type_name == "str":
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__}")
        text = "" if value is None else str(value)
        if "\0" in text:  # (YAML can say "\0"; no path, name or address holds one, and os calls raise on it)
            raise ConfigError(f"{key}: contains a NUL byte: {text!r}", key)
        return text
    raise ConfigError(f"{key}: unsupported type {type_name}")  # pragma: no cover - schema bug


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if not isinstance(name, str) or name not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{key}: unknown key{did_you_mean(name, fields)} (known: {known})", key)
        ftype = fields[name].type
        sub = _section_class(ftype)
        if sub is not None:
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key}: expected a mapping of settings, got {type(value).__name__}", key)
            kwargs[name] = _build(sub, value, f"{key}.")
        else:
            kwargs[name] = _convert(value, str(ftype), key)
    return cls(**kwargs)


def _section_class(type_name: Any) -> type | None:
    obj = getattr(schema, str(type_name), None)
    return obj if isinstance(obj, type) and dataclasses.is_dataclass(obj) else None


def parse_overrides(items: list[str] | str | None, where: str = "-o") -> dict[str, str]:
    """``["budget=2G,workers=8", "log.level=debug"]`` -> ``{"cache.budget": "2G", ...}``.

    ``NAME`` alone means ``NAME=true`` and ``noNAME`` ``NAME=false``, for boolean settings only. The
    standard mount options are accepted with their usual meaning (:data:`NO_OP_OPTIONS` change
    nothing, :data:`REFUSED_OPTIONS` are errors). An option that names no setting (the closest is
    suggested) or a non-boolean one without a value is a :class:`ConfigError` starting with *where*
    (``-o`` or ``FASTFS_OPTIONS``); values are checked by :func:`load_config`.
    """
    if not items:
        return {}
    if isinstance(items, str):
        items = [items]
    keys = schema_keys()
    result: dict[str, str] = {}
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            key = key.strip()
            if key in REFUSED_OPTIONS:
                raise ConfigError(f"{where} {key}: {REFUSED_OPTIONS[key]}", key)
            if key in NO_OP_OPTIONS and not sep:
                continue
            if not sep and key.startswith("no") and key != "no_open" and option_type(key[2:]) == "bool":
                key, value, sep = key[2:], "false", "="
            dotted = ALIASES.get(key, key)
            type_name = keys.get(dotted)
            if type_name is None:
                hint = did_you_mean(key, [*ALIASES, *keys, *NO_OP_OPTIONS])
                raise ConfigError(f"{where} {part}: unknown option{hint}", dotted)
            if not sep:
                if type_name != "bool":
                    raise ConfigError(f"{where} {key}: missing a value (write {key}=VALUE)", dotted)
                value = "true"
            result[dotted] = value.strip()
    return result


def environment_overrides(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The options of ``$FASTFS_OPTIONS`` (the syntax of ``-o``), as :func:`parse_overrides` returns them."""
    text = (os.environ if environ is None else environ).get(ENV_OPTIONS, "")
    return parse_overrides(text, ENV_OPTIONS) if text.strip() else {}


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{key}: {part} is not a section", key)
            node = child
        node[parts[-1]] = value
    return nested


def _merge_nested(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """*base* with the settings of *extra* laid over it, section by section (nested dicts merged)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge_nested(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path}: is a directory") from None
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(one_line(f"config file {path}: invalid YAML: {e}")) from None


def _parse_yaml(text: str, path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(yaml_error_line(path, e)) from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path}: top level must be a mapping of sections")
    return dict(data)


def yaml_error_line(path: str, error: yaml.YAMLError) -> str:
    """One line ``FILE:LINE: invalid YAML: problem (context from line N): ...`` for a parser error."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if mark is None or not problem:
        return one_line(f"config file {path}: invalid YAML: {error}; correct its syntax")
    context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
    where = ""
    if context:
        where = f" ({context}" + (f" from line {context_mark.line + 1}" if context_mark is not None else "") + ")"
    return one_line(f"{path}:{mark.line + 1}: invalid YAML: {problem}{where}; correct the syntax at that line")


def read_yaml(path: str) -> dict[str, Any]:
    """Parse a config file into a mapping (empty file: ``{}``)."""
    return _parse_yaml(_read_text(path), path)


def _positions(text: str) -> dict[str, tuple[int, str | None]]:
    """Dotted key -> (1-based line of the key, raw text of its value when a scalar) of a YAML mapping."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:  # pragma: no cover - safe_load accepted the same text
        return {}
    out: dict[str, tuple[int, str | None]] = {}

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for knode, vnode in node.value:
            if isinstance(knode, yaml.ScalarNode):
                key = prefix + str(knode.value)
                raw = vnode.value if isinstance(vnode, yaml.ScalarNode) else None
                out[key] = (knode.start_mark.line + 1, raw)
                walk(vnode, key + ".")

    walk(root, "")
    return out


def _read_file(path: str) -> tuple[dict[str, Any], dict[str, tuple[int, str | None]]]:
    """The file's mapping and key positions; octal-typed values are taken as written (``644``, ``022``)."""
    text = _read_text(path)
    data = _parse_yaml(text, path)
    positions = _positions(text)
    keys = schema_keys()
    for key, (_, raw) in positions.items():
        section, _, name = key.rpartition(".")
        node = data.get(section) if section else data
        if keys.get(key) == "Mode" and raw is not None and isinstance(node, dict) and isinstance(node.get(name), int):
            node[name] = raw
    return data, positions


def _apply_profile(data: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """*data* over the settings of the profile it names (if any); returns it and the profile name."""
    name = data.get("profile")
    if name is None or name == "":
        return data, None
    if not isinstance(name, str) or name not in PROFILES:
        known = ", ".join(PROFILES)
        hint = did_you_mean(str(name), PROFILES)
        raise ConfigError(f"profile: unknown profile {name!r}{hint} (known: {known})", "profile")
    return _merge_nested(_nest(PROFILES[name].values()), data), name


def load_with_origins(
    path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    use_default_path: bool = True,
    override_origins: Mapping[str, str] | None = None,
) -> tuple[Config, dict[str, str]]:
    """:func:`load_config` plus where each value not left at its default came from:
    ``{dotted key: "profile NAME: why" | "FILE:LINE" | "command line"}`` (an override's origin is
    ``override_origins[key]`` when given, e.g. ``FASTFS_OPTIONS``)."""
    data: dict[str, Any] = {}
    positions: dict[str, tuple[int, str | None]] = {}
    file = path or (DEFAULT_PATH if use_default_path and os.path.isfile(DEFAULT_PATH) else None)
    if file:
        data, positions = _read_file(file)
    if overrides:
        data = _merge_nested(data, _nest(overrides))
    overridden = set(overrides or ())
    try:
        data, profile = _apply_profile(data)
        config = _build(Config, data, "")
        config.validate()
    except (ConfigError, ConfigValueError) as e:
        message, key = one_line(e), getattr(e, "key", None)
        if file and key in positions and key not in overridden:
            message = f"{file}:{positions[key][0]}: {message}"
        raise ConfigError(message, key) from None
    origins: dict[str, str] = {}
    if profile is not None:
        origins.update({k: f"profile {profile}: {why}" for k, why in PROFILES[profile].reasons().items()})
    keys = schema_keys()
    origins.update({k: f"{file}:{line}" for k, (line, _) in positions.items() if k in keys})
    origins.update({k: (override_origins or {}).get(k, COMMAND_LINE) for k in overridden})
    return config, origins


def load_config(
    path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    use_default_path: bool = True,
) -> Config:
    """Build and validate a Config; raises :class:`ConfigError` with a one-line message."""
    return load_with_origins(path, overrides, use_default_path)[0]


def memory_problems(config: Config, total: int | None = None) -> tuple[str | None, str | None]:
    """(error, warning) of ``cache.budget`` against this machine's memory (*total* bytes; default:
    psutil's). The budget is a hard bound of the daemon's cache, and the service unit protects the
    daemon from the OOM killer: a budget above the machine's memory would have the kernel kill the job
    reading the data instead. Above the memory: an error; above :data:`BUDGET_WARN_SHARE` of it: a
    warning. 0 (auto) sizes itself from the available memory and is always fine."""
    budget = config.cache.budget
    if not budget:
        return None, None
    if total is None:
        total = int(psutil.virtual_memory().total)
    if budget > total:
        half = total // 2
        suggestion = f"{half // GIB}G" if half >= GIB else f"{half // MIB}M"  # as -o takes it
        return (
            f"cache.budget: {human_size(budget)} is more than this machine's memory ({human_size(total)}):"
            f" the job reading the data would be killed for it; use at most half, e.g. budget={suggestion},"
            " or 0 (auto)"
        ), None
    if budget > total * BUDGET_WARN_SHARE:
        share = round(100 * budget / total)
        return None, (
            f"cache.budget {human_size(budget)} is {share}% of this machine's memory ({human_size(total)}):"
            " leave room for the job that reads the data"
        )
    return None, None


def replace(config: Config, **sections: Any) -> Config:
    """Copy of *config* with whole sections replaced (used by reload)."""
    return dataclasses.replace(config, **sections)
