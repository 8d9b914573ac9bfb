"""Workload presets: ``--profile training | checkpoint | serving`` (or ``profile:`` in a config file).

A profile is a named set of settings, each with the reason it is chosen. The loader applies it as a
layer between the schema defaults and the config file: defaults < profile < YAML file < ``-o`` /
command line, so anything written explicitly still wins. ``fastfs mount --profile X --print-config``
shows the effect, each profile setting marked with its reason.

Values are plain config values, or a callable evaluated when the config is loaded (a budget sized
from this machine's memory); every key must name a schema field (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psutil

from fastfs.config.values import GIB, MIB

# Share of available memory and cap of the checkpoint profile's cache budget: checkpoints are large and
# loaded one or a few at a time, so the cache may take more than the default quarter (up to 4 GiB).
CHECKPOINT_BUDGET_FRACTION = 0.5
CHECKPOINT_BUDGET_CAP = 16 * GIB
# Metadata timeouts of the profiles whose data does not change while it is used (seconds).
STATIC_DATA_TIMEOUT = 3600.0


@dataclass(frozen=True)
class Setting:
    """One setting of a profile: dotted config key, value (or a callable giving it), reason."""

    key: str
    value: Any
    why: str

    def resolve(self) -> Any:
        return self.value() if callable(self.value) else self.value


def _checkpoint_budget() -> int:
    """Half of the available memory, at most 16 GiB, whole MiB."""
    available = psutil.virtual_memory().available
    return int(min(available * CHECKPOINT_BUDGET_FRACTION, CHECKPOINT_BUDGET_CAP)) // MIB * MIB


@dataclass(frozen=True)
class Profile:
    """A named preset: what it is for, and its settings."""

    name: str
    summary: str
    settings: tuple[Setting, ...]

    def values(self) -> dict[str, Any]:
        """``{dotted key: value}`` with callables evaluated."""
        return {s.key: s.resolve() for s in self.settings}

    def reasons(self) -> dict[str, str]:
        return {s.key: s.why for s in self.settings}


_STATIC_METADATA: tuple[Setting, ...] = (
    Setting("fuse.entry_timeout", STATIC_DATA_TIMEOUT, "the data does not change while used: lookups cached 1 h"),
    Setting("fuse.attr_timeout", STATIC_DATA_TIMEOUT, "attributes (and files fetched by a scan) trusted for 1 h"),
    Setting(
        "fuse.revalidate",
        STATIC_DATA_TIMEOUT,
        "opens trust fetched metadata for 1 h too (no stat per file): a file replaced meanwhile shows within 1 h",
    ),
)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "training",
            "data sets of many files read epoch after epoch (images, audio clips, shards)",
            (
                *_STATIC_METADATA,
                Setting("fuse.negative_timeout", 60.0, "a missing file stays missing during a run"),
                Setting("readahead.scan_trigger", 2, "fetch a directory's files from its second opened file on"),
                Setting("readahead.small_file_max", 4 * MIB, "samples up to 4 MiB (large JPEGs, clips) fetched whole"),
                Setting("readahead.learn", True, "replay each directory's access set from the next epoch's first open"),
                Setting("cache.workers", 32, "many small reads in flight hide per-file round trips"),
                Setting(
                    "fuse.no_open",
                    True,
                    "no OPEN/RELEASE round trips: re-reads come from the page cache; opens are not"
                    " revalidated, so a changed file is seen after attr_timeout (no passthrough: reads are served)",
                ),
            ),
        ),
        Profile(
            "checkpoint",
            "large checkpoints (torch, safetensors, .npy, paddle) written once and loaded whole",
            (
                Setting("readahead.formats", True, "plan the loader's reads from the file's header at open"),
                Setting("readahead.learn", True, "a checkpoint loaded whole last time is released whole at open"),
                Setting("readahead.initial_window", 32 * MIB, "stream with a large window from the first read"),
                Setting("readahead.max_window", 256 * MIB, "and keep up to 256 MiB in flight per stream"),
                Setting("readahead.source_streams", 8, "more handles per file: network storage streams each"),
                Setting("cache.workers", 32, "more block reads in flight"),
                Setting("cache.budget", _checkpoint_budget, "half of available memory, up to 16 GiB: room for windows"),
            ),
        ),
        Profile(
            "serving",
            "model weights loaded by each replica at start-up, then left alone",
            (
                *_STATIC_METADATA,
                Setting("readahead.formats", True, "plan the loader's reads from the file's header at open"),
                Setting("readahead.learn", True, "a restarted replica's load is released whole at open"),
                Setting("readahead.max_window", 128 * MIB, "keep up to 128 MiB in flight per stream"),
                Setting("readahead.read_timeout", 30.0, "reads of a hung source fail in 30 s (not 120 s)"),
            ),
        ),
    )
}
