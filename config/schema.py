"""The configuration schema: one frozen dataclass per section, one docstring per field.

Every tunable of fastfs lives here, with its default and its valid range. The loader
(:mod:`fastfs.config.loader`) builds these from YAML plus command-line overrides and calls
:meth:`validate` on each section, so an out-of-range value is rejected before anything mounts.
Sizes are bytes; YAML may write them as ``64M``, ``4GiB`` etc. Fields typed :data:`Mode` are
permission bits written in octal (``0644``, ``"644"``, ``0o644``); :data:`Uid` / :data:`Gid` are
numeric ids or user / group names, resolved at load.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Protocol, cast

from fastfs.config.profiles import PROFILES
from fastfs.config.values import (
    GIB,
    KIB,
    MIB,
    ConfigError,
    ConfigValueError,
    human_size,
    parse_listen_address,
    parse_size,
)

# Default cache budget: a quarter of available memory leaves the rest to the training job.
DEFAULT_BUDGET_FRACTION = 0.25
# Cap on the default budget: enough for several 1 GiB checkpoints in flight, small enough for shared hosts.
DEFAULT_BUDGET_CAP = 4 * GIB
# Smallest budget accepted: below two maximum windows prefetch would thrash.
MIN_BUDGET = 16 * MIB
# Largest uid / gid (2**32 - 1 is the kernel's "no id").
MAX_ID = 2**32 - 2

# Field types the loader parses specially (annotations are strings under postponed evaluation).
Mode = int
"""Permission bits, written in octal."""
Uid = int
"""A user id or user name; -1 where allowed means "as in the source"."""
Gid = int
"""A group id or group name; -1 where allowed means "as in the source"."""
# Smallest disk-tier budget in bytes: below a few blocks per file the tier would only churn.
MIN_DISK_BUDGET = 64 * MIB
# Largest free-space floor share: a floor above this would leave the tier (almost) nothing.
MAX_DISK_FLOOR_SHARE = 0.9


def _check(cond: bool, key: str, why: str) -> None:
    if not cond:
        raise ConfigValueError(f"{key}: {why}", key)


@dataclass(frozen=True)
class Amount:
    """A disk amount: ``bytes`` (a size) or ``share`` (a fraction in (0, 1] of something); one is 0."""

    bytes: int = 0
    share: float = 0.0


def parse_amount(value: object, key: str) -> Amount:
    """``100G`` / ``1073741824`` -> Amount(bytes=...); ``50%`` -> Amount(share=0.5); else ConfigValueError."""
    text = str(value).strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            pct = float("nan")
        if not 0 <= pct <= 100:  # also rejects nan
            raise ConfigValueError(f"{key}: expected a share between 0% and 100%, got {value!r}")
        return Amount(share=pct / 100)
    try:
        return Amount(bytes=parse_size(text, key))
    except ConfigError as e:
        raise ConfigValueError(f"{key}: expected a size such as 100G or a share such as 50%, got {value!r}") from e


# fuse.fsname: what the kernel keeps in the mount table's source field (no separators of mount options).
FSNAME_RE = re.compile(r"[^\s,\\]+")
# fuse.subtype: the part of the type "fuse.SUBTYPE" after the dot.
SUBTYPE_RE = re.compile(r"[A-Za-z0-9_.-]+")
# Values of fuse.passthrough (see its docstring).
PASSTHROUGH_MODES = ("auto", "on", "off")
# Shortest fuse.dir_timeout: it is also the period of fastfs's re-checks of the directories in use,
# which must not spin.
MIN_DIR_TIMEOUT = 0.1
# readahead.source_shape values (fastfs.fsio.shape: AUTO, PARALLEL, SEQUENTIAL).
SOURCE_SHAPES = ("auto", "parallel", "sequential")
# Most sibling directories a walk may be scanned ahead by (each one's small files take RAM ahead).
MAX_WALK_AHEAD = 8
# Fetches one small-file scan keeps in flight at most (the scanner's SCAN_PARALLEL): enough to overlap
# 1.5 ms round trips; readahead.scan_window may fix a shuffled reader's scan at any number up to it.
MAX_SCAN_WINDOW = 32


@dataclass(frozen=True)
class FuseConfig:
    """Kernel-facing options of the mount."""

    entry_timeout: float = 60.0
    """Seconds the kernel may cache a name lookup (read-mostly data: long saves lookup round trips)."""
    attr_timeout: float = 60.0
    """Seconds the kernel may cache file attributes; a deleted source file vanishes within this."""
    revalidate: float = 1.0
    """Close-to-open bound, in seconds: an open (and a lookup) never trusts source metadata fastfs
    fetched longer ago than this (nor longer ago than ``attr_timeout``, whichever is shorter); older
    metadata of a version fastfs holds (RAM, disk tier, the kernel's pages) is revalidated by one stat
    of the file, never a reopen. 0: every open asks the source. The kernel's own caches keep
    ``attr_timeout`` / ``entry_timeout``; this bounds what fastfs itself answers."""
    trust_unchanged_dirs: bool = True
    """A file's metadata older than ``revalidate`` (but younger than ``attr_timeout``) is trusted
    without a stat of the file while its directory is verified unchanged within ``revalidate`` (one
    stat of the directory per period, shared by every open in it): this keeps a first pass over a
    large directory at one request per file on storage that answers lookups one at a time. The
    trade: a file rewritten in place (no rename, the directory does not change) may be served in its
    old version for up to ``attr_timeout``; renames, creates and deletes (checkpoint rotation) change
    the directory and are seen within ``revalidate``. Off: every such open stats its file."""
    negative_timeout: float = -1.0
    """Seconds the kernel may cache a failed lookup (a file created in SRC later appears within this;
    sooner when fastfs sees the directory change); -1: as ``dir_timeout``."""
    dir_timeout: float = 1.0
    """Seconds the kernel may cache a directory's attributes, and how often fastfs re-checks the
    directories used in the last minutes: a name created, deleted or renamed in SRC shows within this
    (every listing is checked against SRC anyway), like a network filesystem's own client."""
    read_ahead_kb: int = 1024
    """Written to the mount's /sys/class/bdi read_ahead_kb so the kernel sends 1 MiB requests (0: leave)."""
    allow_other: bool = False
    """Let other users use the mount; then the kernel enforces the permissions shown (default_permissions):
    the source's, or those set by uid, gid, file_mode, dir_mode and umask."""
    uid: Uid = -1
    """Owner shown for every file and directory (id or user name; -1: the source's owner). With
    allow_other the kernel checks access against the shown owner and modes."""
    gid: Gid = -1
    """Group shown for every file and directory (id or group name; -1: the source's group)."""
    file_mode: Mode = -1
    """Permission bits shown for every non-directory, e.g. 0644 (-1: the source's bits; symlinks keep 0777)."""
    dir_mode: Mode = -1
    """Permission bits shown for every directory, e.g. 0755 (-1: the source's bits)."""
    umask: Mode = 0
    """Bits cleared from every shown mode after file_mode / dir_mode, e.g. 022 or 077 (0: none)."""
    no_open: bool = False
    """Answer open with ENOSYS so the kernel skips OPEN/RELEASE for good (``--profile training`` sets
    it). Gains: a re-read of a file whose pages the kernel holds makes no request at all (the kernel
    keeps its page cache, as with keep_cache), but for the ioctl Python's ``open()`` sends for every
    file it opens (whether it is a terminal), which the kernel passes to any FUSE daemon. Trade: opens
    are not revalidated (no close-to-open: a changed source file is seen only after attr_timeout, when
    the kernel asks for its attributes again), and without an open there is no passthrough: every read
    the kernel does not answer from its page cache is served by fastfs."""
    threads: int = 16
    """Threads serving kernel requests, each on its own clone of the connection."""
    passthrough: str = "auto"
    """auto | on | off: hand open files to the kernel to read the source file directly (FUSE
    passthrough, Linux 6.9+, mounts by root). auto: local block-device filesystems and tmpfs, and on a
    source read as one stream per file (rclone, s3fs and the like: see readahead.source_shape) the
    files above readahead.small_file_max whose loader reads them in order (np.load, torch.load,
    pickle, unknown formats; safetensors, which its loader maps, stays served, and so does a file
    opened again, so RAM keeps it for the reloads; with a disk tier all stay served, so it keeps
    copies); other network and FUSE sources stay served with prefetch; on: every source; off: never."""
    direct_reads: bool = True
    """The request loop answers random reads of a served file itself, one pread each, without the
    engine's Python (the native loop only; reads near a stream, of files with a format plan, head
    windows, a disk tier copy or stuck reads still go through the engine, which decides per handle).
    Off: every read goes through the engine (a comparison, or a fault in the native path)."""
    late_release: bool = True
    """The request loop answers RELEASE (a close) at once and the daemon does its bookkeeping a few
    milliseconds later, in batches: the kernel never waits for that answer, but the reader's next open
    waited for the thread doing it (the native loop only). A closed file's handle is then given back
    up to fastfs.daemon.kernel.session.LATER_BATCH later; stats wait for it. Off: each RELEASE is
    served by its handler at once."""
    spin_us: int = 30
    """Microseconds a worker of the request loop keeps reading for the next request before it sleeps,
    while requests come one at a time and close together (within a millisecond, no other request being
    served) and after a request it answered within 100 us (not one that waited on a network source,
    where a spin took CPU that source's client needed): a sleeping worker is woken by the kernel, on a
    VM the wake-up of an idle CPU, on the path of every request of a reader that waits for each answer
    (first pass over 10,000 small files on tmpfs, 2-core VM: 161-192 against 202-219 us a file). Costs
    that CPU time per request while it lasts; parallel readers keep other workers busy, and then no
    worker spins. 0: never (the native loop only; a worker sharing the connection's descriptor never
    spins)."""
    request_timeout: float = 60.0
    """Seconds a metadata request (lookup, getattr, open, readdir, xattr) may wait for the source
    before it fails with EIO and its thread is replaced, so a hung source cannot stall the mount
    (reads have readahead.read_timeout; 0: wait forever)."""
    max_pages: int = 256
    """Largest kernel request in 4 KiB pages (256 = 1 MiB, the kernel's default limit in
    /proc/sys/fs/fuse/max_pages_limit; larger values only help where that limit was raised)."""
    readdirplus: bool = True
    """Answer directory listings with attributes when the kernel asks for them (saves a lookup per
    entry of a tree walk), on local sources only: on network and FUSE sources each attribute is a
    source round trip the kernel mostly does not keep, so their listings are always plain."""
    fsname: str = ""
    """Source field of the mount table (/proc/mounts, df); empty: fastfs:SRC."""
    subtype: str = "fastfs"
    """The mount's type is fuse.SUBTYPE; fastfs's commands know a mount of another subtype by the
    record the daemon keeps in its runtime directory."""
    default_permissions: bool = False
    """The kernel checks the shown mode bits against every caller, also the mounting user (always on
    with allow_other)."""
    allow_root: bool = False
    """Let root in besides the mounting user. A mount made by root already is: accepted there and
    changes nothing; other users need allow_other (which includes root)."""
    noatime: bool = False
    """Mount with noatime (shown in /proc/mounts); fastfs never updates access times either way."""
    nonempty: bool = False
    """Allow mounting over a non-empty directory (its files are hidden while mounted)."""

    @property
    def revalidate_bound(self) -> float:
        """Seconds fetched metadata answers opens and lookups: ``revalidate``, at most ``attr_timeout``."""
        return min(self.revalidate, self.attr_timeout)

    @property
    def negative_ttl(self) -> float:
        """Seconds the kernel caches a failed lookup: ``negative_timeout``, or ``dir_timeout`` at -1."""
        return self.dir_timeout if self.negative_timeout < 0 else self.negative_timeout

    def validate(self) -> None:
        _check(
            bool(FSNAME_RE.fullmatch(self.fsname)) or not self.fsname,
            "fuse.fsname",
            "must be printable, without spaces or commas",
        )
        _check(
            bool(SUBTYPE_RE.fullmatch(self.subtype)),
            "fuse.subtype",
            "must be letters, digits, '.', '_' or '-' (the mount's type is fuse.SUBTYPE)",
        )
        for name in ("uid", "gid"):
            _check(-1 <= getattr(self, name) <= MAX_ID, f"fuse.{name}", f"must be -1 (as the source) or 0..{MAX_ID}")
        for name in ("file_mode", "dir_mode"):
            _check(-1 <= getattr(self, name) <= 0o777, f"fuse.{name}", "must be -1 (as the source) or 0000..0777")
        _check(0 <= self.umask <= 0o777, "fuse.umask", "must be between 0000 and 0777")
        for name in ("entry_timeout", "attr_timeout", "revalidate"):
            _check(0 <= getattr(self, name) <= 86400, f"fuse.{name}", "must be between 0 and 86400 seconds")
        _check(
            self.negative_timeout == -1 or 0 <= self.negative_timeout <= 86400,
            "fuse.negative_timeout",
            "must be -1 (as dir_timeout) or between 0 and 86400 seconds",
        )
        _check(
            MIN_DIR_TIMEOUT <= self.dir_timeout <= 86400,
            "fuse.dir_timeout",
            f"must be between {MIN_DIR_TIMEOUT:g} and 86400 seconds",
        )
        _check(0 <= self.read_ahead_kb <= 65536, "fuse.read_ahead_kb", "must be between 0 and 65536")
        _check(1 <= self.threads <= 256, "fuse.threads", "must be between 1 and 256")
        _check(
            self.passthrough in PASSTHROUGH_MODES, "fuse.passthrough", f"must be one of {', '.join(PASSTHROUGH_MODES)}"
        )
        _check(0 <= self.request_timeout <= 86400, "fuse.request_timeout", "must be between 0 and 86400 seconds")
        _check(0 <= self.spin_us <= 1000, "fuse.spin_us", "must be between 0 and 1000 microseconds")
        _check(1 <= self.max_pages <= 65535, "fuse.max_pages", "must be between 1 and 65535")


@dataclass(frozen=True)
class CacheConfig:
    """The RAM block cache."""

    budget: int = 0
    """Hard byte budget of cached and in-flight blocks; 0 picks min(25% of available memory, 4 GiB)."""
    block_size: int = 4 * MIB
    """Unit of caching and of source preads; a power of two between 64 KiB and 64 MiB."""
    workers: int = 16
    """Threads issuing parallel preads to the source (16 overlaps 1.5 ms requests at ~400 MB/s each)."""
    disk_dir: str = ""
    """Local directory (e.g. NVMe scratch) of the disk cache tier, an absolute path; empty: no disk tier."""
    disk_budget: str = "50%"
    """Most disk the tier uses: a size (100G) or a share of the space it may use (its filesystem's free space
    plus what it holds)."""
    disk_free_floor: str = "10%"
    """Free space on the disk tier's filesystem never used, held even while others fill it: a size or a share
    of the filesystem's size."""
    file_workers: int = 12
    """Source reads of one file that may run at once on each kind of pool worker (demand, prefetch):
    a file whose source hangs holds at most this many, the rest stay for the other files."""
    check_invariants: bool = False
    """Debug: check the consistency of the block cache (budget, indexes, pins), the engine's handle table,
    format range plans and the kernel's node table after every change and fail the request loudly when
    it breaks; walks the whole structure each time, so only for tests and bug hunts
    (``FASTFS_CHECK_INVARIANTS=1`` in the environment does the same)."""

    def validate(self) -> None:
        _check(
            self.budget == 0 or self.budget >= MIN_BUDGET,
            "cache.budget",
            f"must be 0 (auto) or >= {human_size(MIN_BUDGET)} (got {human_size(self.budget)})",
        )
        _check(
            not self.disk_dir or (self.disk_dir.startswith("/") and "\0" not in self.disk_dir),
            "cache.disk_dir",
            "must be an absolute path (or empty: off)",
        )
        budget = parse_amount(self.disk_budget, "cache.disk_budget")
        _check(
            budget.bytes >= MIN_DISK_BUDGET if not budget.share else budget.share > 0,
            "cache.disk_budget",
            f"must be a size >= {human_size(MIN_DISK_BUDGET)} or a share above 0%",
        )
        floor = parse_amount(self.disk_free_floor, "cache.disk_free_floor")
        _check(
            floor.share <= MAX_DISK_FLOOR_SHARE,
            "cache.disk_free_floor",
            f"must be a size or a share of at most {MAX_DISK_FLOOR_SHARE:.0%}",
        )
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
    """Files up to this size (and at most one cache block) are fetched whole by a small-file scan."""
    scan_trigger: int = 3
    """Distinct files opened in one directory, in a short span, that start a small-file scan."""
    scan_max_files: int = 100_000
    """Most files one scan plans (bounds the plan's memory on huge directories)."""
    local_scans: bool = False
    """Small-file scans on a local source whose small reads are fast too (off: each open there reads
    its small file itself and hands it to the kernel, cheaper than a scan's fetch on another thread;
    a local source found slow, such as a cold disk, is scanned either way)."""
    scan_window: int = 0
    """Fetches a scan of a reader out of name order (shuffled, several workers) keeps in flight. 0
    measures it per scan from its fetch times: as many as the source overlaps and about one more,
    and none on a source that answers one fetch at a time, where such a scan only delays the
    reader's own opens (``fastfs stats`` counts the scans stopped so; the debug log shows each
    window). 1-32 fixes it (a scan in name order, ahead of a walk or of a learned set keeps 32)."""
    walk_ahead: int = 1
    """Sibling directories a walk is scanned ahead by: when the reader goes from one directory into
    the next of the same parent (os.walk, rsync, a backup or indexing pass), the small files of the
    one after are fetched before it gets there (0: off). Lookups of different directories overlap on
    storage that answers those of one directory one at a time; a walk that stops wastes at most this
    many directories' small files, within the scan's budget share."""
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
    source_shape: str = "auto"
    """How large files are read from the source: ``parallel`` (each block as pieces over
    source_streams handles: NFS, Lustre, local disks, sshfs), ``sequential`` (one handle per file, whole
    blocks strictly in order: clients that serve a handle as one ranged download, such as rclone
    without its VFS cache, s3fs, gcsfuse without its file cache), or ``auto``: chosen from the source's
    mount type, and for an unknown FUSE client from a probe of one handle (a jump against a continuing
    read; a stream verdict is probed again at the next two other large files opened). ``fastfs stats``
    shows the choice and why. Needs a remount to change."""

    def validate(self) -> None:
        _check(
            self.source_shape in SOURCE_SHAPES,
            "readahead.source_shape",
            f"must be one of {', '.join(SOURCE_SHAPES)}",
        )
        _check(
            64 * 1024 <= self.initial_window <= self.max_window,
            "readahead.initial_window",
            "must be >= 64K and <= readahead.max_window",
        )
        _check(self.max_window <= 1 * GIB, "readahead.max_window", "must be <= 1G")
        _check(0 <= self.small_file_max <= 64 * MIB, "readahead.small_file_max", "must be between 0 and 64M")
        _check(2 <= self.scan_trigger <= 1000, "readahead.scan_trigger", "must be between 2 and 1000")
        _check(1 <= self.scan_max_files <= 10_000_000, "readahead.scan_max_files", "must be between 1 and 10000000")
        _check(
            0 <= self.scan_window <= MAX_SCAN_WINDOW,
            "readahead.scan_window",
            f"must be between 0 and {MAX_SCAN_WINDOW}",
        )
        _check(
            0 <= self.walk_ahead <= MAX_WALK_AHEAD, "readahead.walk_ahead", f"must be between 0 and {MAX_WALK_AHEAD}"
        )
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


class _Validated(Protocol):
    def validate(self) -> None: ...


@dataclass(frozen=True)
class Config:
    """Whole configuration of one mount."""

    source: str = ""
    """Directory to mirror (a config used by the systemd unit names it; the CLI argument overrides)."""
    mountpoint: str = ""
    """Where to mount (as for source)."""
    profile: str = ""
    """Preset of settings for a workload: training, checkpoint or serving (config/profiles.py lists each
    setting and why); it sits under this file's own settings and the command line's. Empty: none."""
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
                cast(_Validated, value).validate()  # (every section dataclass validates itself)
        if self.profile:
            _check(self.profile in PROFILES, "profile", f"must be one of {', '.join(PROFILES)}")
        _check(self.readahead.max_window <= 1 * GIB, "readahead.max_window", "must be <= 1G")
