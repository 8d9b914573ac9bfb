"""Load a :class:`~fastfs.config.schema.Config` from YAML and ``key=value`` overrides.

Order of precedence: schema defaults < YAML file (``--config`` or ``/etc/fastfs/fastfs.yaml`` when it
exists) < command-line overrides (``-o section.key=value`` or a short alias such as ``budget=2G``).
Every problem (missing file, bad YAML, unknown key, wrong type, out-of-range value) raises
:class:`ConfigError` whose message is one line naming the key.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from fastfs.config.schema import Config, ConfigValueError

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
    "negative_timeout": "fuse.negative_timeout",
    "read_ahead_kb": "fuse.read_ahead_kb",
    "allow_other": "fuse.allow_other",
    "no_open": "fuse.no_open",
    "threads": "fuse.threads",
    "log_level": "log.level",
    "log_file": "log.file",
    "metrics": "stats.metrics",
    "state_dir": "state.dir",
}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(Exception):
    """A configuration problem, with a one-line message naming the key."""


def one_line(text: object) -> str:
    """Collapse a message to one line (YAML errors span several)."""
    return " ".join(str(text).split())


def parse_size(value: Any, key: str) -> int:
    """``64M``, ``4GiB``, ``1048576`` or an int -> bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size such as 512M, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    m = _SIZE_RE.match(str(value))
    if not m:
        raise ConfigError(f"{key}: expected a size such as 512M or 4G, got {value!r}")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


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
    if type_name == "str":
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__}")
        return "" if value is None else str(value)
    raise ConfigError(f"{key}: unsupported type {type_name}")  # pragma: no cover - schema bug


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if not isinstance(name, str) or name not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{key}: unknown key (known: {known})")
        ftype = fields[name].type
        sub = _section_class(ftype)
        if sub is not None:
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key}: expected a mapping of settings, got {type(value).__name__}")
            kwargs[name] = _build(sub, value, f"{key}.")
        else:
            kwargs[name] = _convert(value, str(ftype), key)
    return cls(**kwargs)


def _section_class(type_name: Any) -> type | None:
    from fastfs.config import schema

    obj = getattr(schema, str(type_name), None)
    return obj if isinstance(obj, type) and dataclasses.is_dataclass(obj) else None


def parse_overrides(items: list[str] | str | None) -> dict[str, str]:
    """``["budget=2G,workers=8", "log.level=debug"]`` -> ``{"cache.budget": "2G", ...}``."""
    if not items:
        return {}
    if isinstance(items, str):
        items = [items]
    result: dict[str, str] = {}
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep:
                value = "true"
            if key.startswith("no") and not sep and ALIASES.get(key[2:]) and key != "no_open":
                key, value = key[2:], "false"
            result[ALIASES.get(key, key)] = value.strip()
    return result


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{key}: {part} is not a section")
            node = child
        node[parts[-1]] = value
    return nested


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def read_yaml(path: str) -> dict[str, Any]:
    """Parse a config file into a mapping (empty file: ``{}``)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path}: is a directory") from None
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(one_line(f"config file {path}: invalid YAML: {e}")) from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path}: top level must be a mapping of sections")
    return dict(data)


def load_config(
    path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    use_default_path: bool = True,
) -> Config:
    """Build and validate a Config; raises :class:`ConfigError` with a one-line message."""
    data: dict[str, Any] = {}
    if path:
        data = read_yaml(path)
    elif use_default_path and os.path.isfile(DEFAULT_PATH):
        data = read_yaml(DEFAULT_PATH)
    if overrides:
        data = _merge(data, _nest(overrides))
    try:
        config = _build(Config, data, "")
        config.validate()
    except ConfigValueError as e:
        raise ConfigError(one_line(e)) from None
    return config


def parse_listen_address(text: str, key: str = "stats.metrics") -> tuple[str, int]:
    """``9100`` / ``:9100`` / ``0.0.0.0:9100`` / ``[::1]:9100`` -> (host, port); loopback by default."""
    host, _, port_text = str(text).strip().rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigValueError(f"{key}: expected [HOST:]PORT, got {text!r}") from None
    if not 0 < port < 65536:
        raise ConfigValueError(f"{key}: port must be between 1 and 65535, got {port}")
    return host, port


def replace(config: Config, **sections: Any) -> Config:
    """Copy of *config* with whole sections replaced (used by reload)."""
    return dataclasses.replace(config, **sections)
