"""Render a :class:`~fastfs.config.schema.Config` as YAML (``fastfs mount --print-config``).

The output lists every setting in schema order and loads back into an equal Config (tested), so
it can be saved as a config file. Sizes that are whole MiB or GiB are written ``64M`` / ``4G``;
octal fields (:data:`~fastfs.config.schema.Mode`) as quoted octal (``'0644'``); strings as YAML
double-quoted scalars. A value that is not a schema default carries a comment saying where it
came from (a profile and its reason, ``FILE:LINE``, or the command line).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import yaml

from fastfs.config.schema import GIB, MIB, Config


def format_value(value: Any, type_name: str) -> str:
    """One YAML scalar that the loader parses back to *value*."""
    if type_name == "bool":
        return "true" if value else "false"
    if type_name == "float":
        return repr(float(value))
    if type_name == "Mode":
        return "-1" if value < 0 else f"'{value:04o}'"
    if type_name == "int" and value and value % MIB == 0:
        return f"{value // GIB}G" if value % GIB == 0 else f"{value // MIB}M"
    if type_name == "str":
        return yaml.safe_dump(str(value), default_style='"', width=float("inf"), allow_unicode=True).rstrip("\n")
    return str(value)


def _line(indent: str, name: str, value: Any, type_name: str, origin: str | None) -> str:
    text = f"{indent}{name}: {format_value(value, type_name)}"
    return f"{text}  # {origin}" if origin else text


def render(config: Config, origins: Mapping[str, str] | None = None, header: str = "") -> str:
    """YAML text of *config*; *origins* maps dotted keys to where their value came from."""
    origins = origins or {}
    defaults = Config()
    lines = [f"# {h}" for h in header.splitlines()] if header else []
    sections = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            sections.append((f.name, value, getattr(defaults, f.name)))
        else:
            changed = value != getattr(defaults, f.name)
            lines.append(_line("", f.name, value, str(f.type), origins.get(f.name) if changed else None))
    for name, section, default in sections:
        lines.append(f"{name}:")
        for g in dataclasses.fields(section):
            key = f"{name}.{g.name}"
            value = getattr(section, g.name)
            changed = value != getattr(default, g.name)
            lines.append(_line("  ", g.name, value, str(g.type), origins.get(key) if changed else None))
    return "\n".join(lines) + "\n"
