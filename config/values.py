"""The value layer of the configuration: units, the two error types and the parsers of sizes and
listen addresses.

Both :mod:`fastfs.config.schema` (validating a built Config) and :mod:`fastfs.config.loader`
(building one from YAML and ``-o``) need these, and so does :mod:`fastfs.config.profiles`; keeping
them here, below all three, is what lets the three import each other in one direction only
(values < schema, profiles < loader) with no import hidden inside a function.
"""

from __future__ import annotations

import re
from typing import Any

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# A size: a number, an optional binary unit letter (K, M, G, T), an optional "iB" / "B".
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class ConfigError(Exception):
    """A configuration problem, with a one-line message naming the key (also as ``.key`` when known)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ConfigValueError(ValueError):
    """A value out of range; the message names the key (``section.field: why``), also as ``.key``."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def human_size(n: int) -> str:
    """16777216 -> '16 MiB' (whole units where exact, else one decimal), for messages."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            return f"{n // size} {unit}" if n % size == 0 else f"{n / size:.1f} {unit}"
    return f"{n} B"


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
