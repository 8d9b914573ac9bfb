"""Which settings a reload (SIGHUP) applies to a running mount: the one definition.

A setting is named by its field path (``cache.budget``, ``readahead.max_window``; ``source`` and
``mountpoint`` at the top). :data:`LIVE` lists the paths a reload applies at once; every other
setting keeps its running value until the next mount, and a reload names it in its report
("needs restart: ..."). Both sides of a reload consult this table: the engine
(``Engine.reconfigure``) takes the live settings of the new configuration and keeps the rest, and
the daemon (``Daemon.reload``) does the same for its own settings and logs what did not apply.

A path belongs in :data:`LIVE` only when everything that reads it reads the current configuration
each time (or is told of the change by the reload): a value copied into an object built at mount
(the pread pool's workers, the source's streams, the source's access shape
``readahead.source_shape``, chosen once per mount with its probe, the learned-set store's size
bound, the disk tier) needs a remount.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastfs.config.schema import Config

# Not live, on purpose: the kernel's timeouts (fuse.entry_timeout, attr_timeout, negative_timeout,
# dir_timeout) travel in every reply, built from values fixed at mount; dir_timeout also sets the
# period of the engine's directory re-checks, which must agree with what the kernel was told.
LIVE: frozenset[str] = frozenset(
    {
        "profile",  # a label; the settings it implies are compared one by one
        "cache.budget",  # BlockCache.set_budget (evicts down to a lower budget where it can)
        "readahead.enabled",
        "readahead.initial_window",  # open files' stream policies get the new windows
        "readahead.max_window",
        "readahead.small_file_max",
        "readahead.scan_trigger",  # directory scans started after the reload
        "readahead.scan_max_files",
        "readahead.walk_ahead",  # walks entering a directory after the reload
        "readahead.formats",  # files opened after the reload
        "readahead.read_timeout",  # the engine's waits and the session watchdog's deadline
        # (not readahead.source_shape: chosen once per mount, with its probe; a remount changes it)
        "log.level",
        "stats.status_interval",
    }
)


def field_paths(config: Config | None = None) -> list[str]:
    """Every setting's field path, in schema order."""
    config = config or Config()
    paths = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            paths += [f"{f.name}.{sub.name}" for sub in dataclasses.fields(value)]
        else:
            paths.append(f.name)
    return paths


def get(config: Config, path: str) -> Any:
    """The value of the setting at *path*."""
    value: Any = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def changed(old: Config, new: Config) -> list[str]:
    """Paths of the settings whose values differ, in schema order."""
    return [path for path in field_paths(old) if get(old, path) != get(new, path)]


def needs_remount(old: Config, new: Config) -> list[str]:
    """Paths of the settings that changed but a reload does not apply (they wait for a remount)."""
    return [path for path in changed(old, new) if path not in LIVE]


def apply_live(old: Config, new: Config) -> Config:
    """*old* with the :data:`LIVE` settings of *new*: the configuration a reloaded mount runs with."""
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for path in changed(old, new):
        if path not in LIVE:
            continue
        section, _, name = path.partition(".")
        if name:
            sections.setdefault(section, {})[name] = get(new, path)
        else:
            top[section] = get(new, path)
    for section, values in sections.items():
        top[section] = dataclasses.replace(getattr(old, section), **values)
    return dataclasses.replace(old, **top) if top else old
