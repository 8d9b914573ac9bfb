"""The configuration schema: one frozen dataclass per section, one docstring per field.

Every tunable of fastfs lives here, with its default and its valid range. The loader
(:mod:`fastfs.config.loader`) builds these from YAML plus command-line overrides and calls
:meth:`validate` on each section, so an out-of-range value is rejected before anything mounts.
Sizes are bytes; YAML may write them as ``64M``, ``4GiB`` etc.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# Default cache budget: a quarter of available memory leaves the rest to the training job.
DEFAULT_BUDGET_FRACTION = 0.25
# Cap on the default budget: enough for several 1 GiB checkpoints in flight, small enough for shared hosts.
DEFAULT_BUDGET_CAP = 4 * GIB
# Smallest budget accepted: below two maximum windows prefetch would thrash.
MIN_BUDGET = 16 * MIB


class ConfigValueError(ValueError):
    """A value out of range; the message names the key (``section.field: why``)."""


def _check(cond: bool, key: str, why: str) -> None:
    if not cond:
        raise ConfigValueError(f"{key}: {why}")


@dataclass(frozen=True)
class FuseConfig:
    """Kernel-facing options of the mount."""

    entry_timeout: float = 60.0
    """Seconds the kernel may cache a name lookup (read-mostly data: long saves lookup round trips)."""
    attr_timeout: float = 60.0
    """Seconds the kernel may cache file attributes; a deleted source file vanishes within this."""
    negative_timeout: float = 10.0
    """Seconds the kernel may cache a failed lookup (a file created in SRC later appears within this)."""
    read_ahead_kb: int = 1024
    """Written to the mount's /sys/class/bdi read_ahead_kb so the kernel sends 1 MiB requests (0: leave)."""
    allow_other: bool = False
    """Let other users use the mount; then the kernel enforces source permissions (default_permissions)."""
    no_open: bool = False
    """Answer open with ENOSYS so the kernel skips OPEN/RELEASE (faster small-file re-reads, but no
    close-to-open revalidation: a changed source file is seen only after attr_timeout)."""
    threads: int = 16
    """FUSE worker threads (libfuse max_threads and max_idle_threads)."""
    request_timeout: float = 120.0
    """Seconds a metadata request (lookup, getattr, open, readdir) may wait for the source before it
    fails with EIO (0: wait forever). Enforced by the kernel protocol layer's watchdog; the libfuse
    binding does not enforce it yet (reads have their own bound, readahead.read_timeout)."""

    def validate(self) -> None:
        _check(0 <= self.request_timeout <= 86400, "fuse.request_timeout", "must be between 0 and 86400 seconds")
        for name in ("entry_timeout", "attr_timeout", "negative_timeout"):
            _check(0 <= getattr(self, name) <= 86400, f"fuse.{name}", "must be between 0 and 86400 seconds")
        _check(0 <= self.read_ahead_kb <= 65536, "fuse.read_ahead_kb", "must be between 0 and 65536")
        _check(1 <= self.threads <= 256, "fuse.threads", "must be between 1 and 256")


@dataclass(frozen=True)
class CacheConfig:
    """The RAM block cache."""

    budget: int = 0
    """Hard byte budget of cached and in-flight blocks; 0 picks min(25% of available memory, 4 GiB)."""
    block_size: int = 4 * MIB
    """Unit of caching and of source preads; a power of two between 64 KiB and 64 MiB."""
    workers: int = 16
    """Threads issuing parallel preads to the source (16 overlaps 1.5 ms requests at ~400 MB/s each)."""
    file_workers: int = 12
    """Source reads of one file that may run at once on each kind of pool worker (demand, prefetch):
    a file whose source hangs holds at most this many, the rest stay for the other files."""

    def validate(self) -> None:
        _check(self.budget == 0 or self.budget >= MIN_BUDGET, "cache.budget", f"must be 0 (auto) or >= {MIN_BUDGET}")
        bs = self.block_size
        _check(
            64 * KIB <= bs <= 64 * MIB and bs & (bs - 1) == 0,
            "cache.block_size",
            "must be a power of two between 64K and 64M",
        )
        _check(1 <= self.workers <= 256, "cache.workers", "must be between 1 and 256")
        _check(1 <= self.file_workers <= 256, "cache.file_workers", "must be between 1 and 256")


@dataclass(frozen=True)
class ReadaheadConfig:
    """Pattern detection and prefetch."""

    enabled: bool = True
    """Master switch: off makes fastfs a plain pass-through mirror."""
    initial_window: int = 8 * MIB
    """Prefetch window when a stream is first found sequential."""
    max_window: int = 64 * MIB
    """Largest prefetch window of one stream (doubles from initial_window while the stream stays sequential)."""
    small_file_max: int = 1 * MIB
    """Files up to this size are fetched whole by a small-file scan."""
    scan_trigger: int = 3
    """Distinct files opened in one directory, in a short span, that start a small-file scan."""
    scan_max_files: int = 100_000
    """Most files one scan plans (bounds the plan's memory on huge directories)."""
    formats: bool = True
    """Parse .npy / safetensors / torch zip / pickle headers on open and prefetch what the loader will read."""
    learn: bool = True
    """Record per-directory access sets (and which checkpoints were loaded whole) under state.dir and
    prefetch them on the next epoch or mount."""
    source_direct_io: bool = True
    """Read the source with O_DIRECT where supported (avoids double caching; falls back silently)."""
    source_streams: int = 4
    """Descriptors opened per large source file for block reads, used in turn: network filesystems
    and object-store mounts serve each open handle as its own stream."""
    read_timeout: float = 120.0
    """Seconds a read may wait for the source before failing with EIO (0: wait forever)."""

    def validate(self) -> None:
        _check(
            64 * 1024 <= self.initial_window <= self.max_window,
            "readahead.initial_window",
            "must be >= 64K and <= readahead.max_window",
        )
        _check(self.max_window <= 1 * GIB, "readahead.max_window", "must be <= 1G")
        _check(0 <= self.small_file_max <= 64 * MIB, "readahead.small_file_max", "must be between 0 and 64M")
        _check(2 <= self.scan_trigger <= 1000, "readahead.scan_trigger", "must be between 2 and 1000")
        _check(1 <= self.scan_max_files <= 10_000_000, "readahead.scan_max_files", "must be between 1 and 10000000")
        _check(0 <= self.read_timeout <= 86400, "readahead.read_timeout", "must be between 0 and 86400 seconds")
        _check(1 <= self.source_streams <= 64, "readahead.source_streams", "must be between 1 and 64")


LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class LogConfig:
    """Logging."""

    level: str = "info"
    """One of debug, info, warning, error."""
    file: str = ""
    """Log file; empty logs to stderr (journald-friendly under systemd)."""

    def validate(self) -> None:
        _check(self.level in LOG_LEVELS, "log.level", f"must be one of {', '.join(LOG_LEVELS)}")


@dataclass(frozen=True)
class StatsConfig:
    """Statistics export."""

    metrics: str = ""
    """Prometheus endpoint ``[HOST:]PORT`` (empty: off; HOST defaults to 127.0.0.1)."""
    status_interval: float = 10.0
    """Seconds between systemd STATUS= updates."""

    def validate(self) -> None:
        _check(0.5 <= self.status_interval <= 3600, "stats.status_interval", "must be between 0.5 and 3600")
        if self.metrics:
            from fastfs.config.loader import parse_listen_address

            parse_listen_address(self.metrics, "stats.metrics")


@dataclass(frozen=True)
class StateConfig:
    """Persistent state (learned access sets and whole-file loads)."""

    dir: str = ""
    """Directory for learned access sets; empty uses $STATE_DIRECTORY, else /var/lib/fastfs."""
    max_bytes: int = 16 * MIB
    """Upper bound of the state kept per mount (oldest entries dropped first)."""

    def validate(self) -> None:
        _check(64 * KIB <= self.max_bytes <= 1 * GIB, "state.max_bytes", "must be between 64K and 1G")


@dataclass(frozen=True)
class Config:
    """Whole configuration of one mount."""

    source: str = ""
    """Directory to mirror (a config used by the systemd unit names it; the CLI argument overrides)."""
    mountpoint: str = ""
    """Where to mount (as for source)."""
    fuse: FuseConfig = field(default_factory=FuseConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    readahead: ReadaheadConfig = field(default_factory=ReadaheadConfig)
    log: LogConfig = field(default_factory=LogConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    state: StateConfig = field(default_factory=StateConfig)

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                value.validate()
        _check(self.readahead.max_window <= 1 * GIB, "readahead.max_window", "must be <= 1G")


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}
