"""Learned access sets: which files of a directory a job reads, remembered across epochs and restarts.

A training job reads the same files every epoch, often in a new shuffled order each time, and the
next run of the job reads them again. The first epoch teaches fastfs the set; from then on the
engine can prefetch the whole set as soon as the directory is touched again, instead of waiting
for a small-file scan to be detected.

Model. Per directory (its FUSE path) :class:`AccessLog` keeps two ordered maps ``name -> size``:
``current``, the files opened so far in this epoch in order of first open, and ``learned``, the
previous complete epoch (or what was loaded from disk). When :data:`EPOCH_REPEATS` files already in
``current`` are opened in a row with no new file between, the pass is over: ``current`` becomes
``learned`` and the new epoch starts with those files (a single shared file, such as a label list
reopened for every sample, therefore never ends an epoch). :meth:`AccessLog.record_open` says when a
replay is due (first open of a directory with a learned set, or a new epoch) and
:meth:`AccessLog.plan` returns ``learned`` followed by the files only seen in ``current``, once at
least :data:`MIN_FILES` are known. The order of an epoch tells how the job walks the directory:
mostly ascending names means sorted access (the plan keeps the recorded order), anything else is a
shuffle (the plan is the set in sorted order; the fetch order no longer matters, only the set).

Whole-file loads. Per large file with a format plan (its FUSE path, size and mtime), the share of the
plan its last load read (:meth:`~AccessLog.record_file`, when the file's last handle closes); the next
load of the same version, after a remount too, finds it with :meth:`~AccessLog.file_share`, and the
engine then releases the whole plan at open instead of waiting for the reader to prove a dense run.
At most :data:`MAX_FILES` files are remembered (least recently used forgotten first).

Accuracy. The first :meth:`~AccessLog.plan` of a directory in an epoch counts as a replay: its
names become "outstanding"; :meth:`~AccessLog.note_plan_used` turns an outstanding name into a hit.
:meth:`~AccessLog.accuracy` reports planned files vs hits (also counted into the engine's
:class:`~fastfs.fsio.stats.Stats` as ``learned_plans`` / ``learned_files_used`` when one is given).

Persistence. :meth:`~AccessLog.save` writes one JSON file per mount, named by a hash of the source
path, under ``state.dir`` (empty: ``$STATE_DIRECTORY``, else ``/var/lib/fastfs``), atomically
(temporary file in the same directory, fsync, ``os.replace``). The file is bounded to
``state.max_bytes``: directories are kept most recently used first until the next one would not
fit. Directories with fewer than :data:`MIN_FILES` files are not written. :meth:`~AccessLog.load`
never raises: a missing file is a fresh start, an unreadable or corrupt one is logged once and
ignored. Neither method raises on I/O errors. When to save is the engine's decision alone: its save
thread calls :meth:`~AccessLog.save` every ``LEARN_SAVE_SECONDS`` while :attr:`~AccessLog.dirty`, and
once more at close.

Concurrency. ``_lock`` guards every in-memory structure (``_dirs`` and each :class:`_Dir` in it,
``_files``, the accuracy counters ``_planned``/``_hits``, and the ``_dirty`` flag); it
is held only for dictionary work, never across file I/O: :meth:`save` copies what it needs under the
lock and serializes and writes outside it. A ``_Dir``'s ``learned`` map is never changed in place
(only replaced), so a reference taken under the lock can be read after it. :attr:`dirty` reads the
flag without the lock (a bool; a stale answer only moves a save to the next tick). ``_save_lock`` only orders concurrent
saves (so an older snapshot never replaces a newer one) and is never taken on the read path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastfs.config.schema import Config
from fastfs.fsio.stats import LEARNED_FILES_USED, LEARNED_PLANS, Stats

log = logging.getLogger(__name__)

# Fewest files a directory needs before its set is worth replaying (fewer: the scan detector copes).
MIN_FILES = 8
# Most names remembered per directory per epoch (matches the default readahead.scan_max_files).
MAX_NAMES_PER_DIR = 100_000
# Most directories tracked in memory; the least recently used one is forgotten beyond this.
MAX_DIRS = 50_000
# Known files opened in a row, with no new file between, that end an epoch (a few shared files such as
# a labels list reopened for every sample must not end it).
EPOCH_REPEATS = 4
# Share of ascending consecutive pairs from which an epoch counts as sorted: a shuffle gives ~0.5, natural
# numbering (img9, img10, ...) read in order still gives > 0.85 as string comparisons.
SORTED_PAIR_FRACTION = 0.75
# Large files whose last load is remembered (a few hundred bytes each in memory, ~100 in the file).
MAX_FILES = 4096
# Version of the state file layout; a file with another version is ignored.
STATE_VERSION = 1
# Default state directory when neither state.dir nor $STATE_DIRECTORY is set.
DEFAULT_STATE_DIR = "/var/lib/fastfs"
# Hex digits of the source-path hash in the state file name (64 bits: no collisions in practice).
STATE_HASH_CHARS = 16


@dataclass(frozen=True)
class LearnedPlan:
    """The files of one directory a job is expected to read, in the order worth fetching them."""

    dir_path: str
    names: tuple[str, ...]
    sizes: tuple[int, ...]
    shuffled: bool
    """True when the recorded order looked shuffled (names are then sorted); False: recorded order."""

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def __len__(self) -> int:
        return len(self.names)


@dataclass
class _Dir:
    """Bookkeeping of one directory (all fields guarded by AccessLog._lock)."""

    current: dict[str, int] = field(default_factory=dict)  # this epoch: name -> size, first-open order
    learned: dict[str, int] = field(default_factory=dict)  # previous epoch (or loaded): name -> size
    repeats: dict[str, int] = field(default_factory=dict)  # known files reopened since the last new one
    learned_shuffled: bool = False
    last_used: float = 0.0  # wall-clock seconds of the last open (LRU order of the state file)
    outstanding: set[str] | None = None  # names of the plan replayed this epoch not yet read


def looks_shuffled(names: list[str]) -> bool:
    """True unless at least :data:`SORTED_PAIR_FRACTION` of consecutive pairs are ascending."""
    if len(names) < 2:
        return False
    ascending = sum(1 for a, b in zip(names, names[1:], strict=False) if a < b)
    return ascending < SORTED_PAIR_FRACTION * (len(names) - 1)


def _merge_passes(
    learned: dict[str, int], learned_shuffled: bool, current: dict[str, int]
) -> tuple[list[tuple[str, int]], bool]:
    """The learned pass merged with the current one: plan items (learned, then files new in *current*;
    sorted when shuffled) and the shuffled flag."""
    merged = dict(learned)
    for name, size in current.items():
        merged.setdefault(name, size)
    items = list(merged.items())[:MAX_NAMES_PER_DIR]
    shuffled = looks_shuffled(list(current)) if len(current) >= MIN_FILES else learned_shuffled
    if shuffled:
        items.sort()
    return items, shuffled


def state_dir(config: Config | None = None) -> str:
    """Directory holding the state files: state.dir, else $STATE_DIRECTORY, else /var/lib/fastfs."""
    configured = config.state.dir if config is not None else ""
    if configured:
        return configured
    # systemd may pass several colon-separated directories; the first is ours.
    env = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return env or DEFAULT_STATE_DIR


def state_file(source: str, config: Config | None = None) -> str:
    """Path of the state file of the mount of *source* (keyed by a hash of its real path)."""
    key = hashlib.sha256(os.fsencode(os.path.realpath(source))).hexdigest()[:STATE_HASH_CHARS]
    return os.path.join(state_dir(config), f"learned-{key}.json")


class AccessLog:
    """Per-directory access sets of one mount; thread-safe (see the module docstring)."""

    def __init__(
        self,
        source: str,
        config: Config | None = None,
        stats: Stats | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        config = config or Config()
        self.source = os.path.realpath(source)
        self.path = state_file(source, config)
        self.max_bytes = config.state.max_bytes
        self.stats = stats
        self._clock = clock
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._dirs: OrderedDict[str, _Dir] = OrderedDict()  # least recently used first
        self._files: OrderedDict[str, tuple[int, int, float, float]] = OrderedDict()  # path -> (size,
        # mtime_ns, share of its plan read, last used), least recently used first
        self._dirty = False
        self._planned = 0
        self._hits = 0

    # -- recording --------------------------------------------------------------------------------
    def record_open(self, dir_path: str, name: str, size: int) -> bool:
        """A file *name* of directory *dir_path* (FUSE path) of *size* bytes was opened.

        Returns True when a replay of the directory's learned set is due (the first open of it in
        this process or the start of a new epoch): the caller then asks :meth:`plan`.
        """
        now = self._clock()
        with self._lock:
            entry = self._dirs.get(dir_path)
            if entry is None:
                entry = self._dirs[dir_path] = _Dir()
                if len(self._dirs) > MAX_DIRS:
                    self._dirs.popitem(last=False)
            else:
                self._dirs.move_to_end(dir_path)
            entry.last_used = now
            if name in entry.current:
                entry.current[name] = size
                entry.repeats[name] = size
                if len(entry.repeats) >= EPOCH_REPEATS:
                    # Several known files in a row and nothing new: the previous pass is complete.
                    entry.learned_shuffled = looks_shuffled(list(entry.current))
                    entry.learned = entry.current
                    entry.current = entry.repeats
                    entry.repeats = {}
                    entry.outstanding = None
            else:
                entry.repeats.clear()
                if len(entry.current) < MAX_NAMES_PER_DIR:
                    entry.current[name] = size
                    self._dirty = True
            return entry.outstanding is None and len(entry.learned) >= MIN_FILES

    def plan(self, dir_path: str) -> LearnedPlan | None:
        """The learned set of *dir_path* (previous pass plus files new in this one), or None below
        :data:`MIN_FILES` files.

        The first call in an epoch counts as a replay for :meth:`accuracy`; later calls in the same
        epoch return the same plan without counting again.
        """
        with self._lock:
            entry = self._dirs.get(dir_path)
            if entry is None:
                return None
            # learned is never mutated in place (only replaced), so a reference is a stable copy.
            learned, learned_shuffled, current = entry.learned, entry.learned_shuffled, dict(entry.current)
        items, shuffled = _merge_passes(learned, learned_shuffled, current)
        if len(items) < MIN_FILES:
            return None
        with self._lock:
            if entry.outstanding is None and self._dirs.get(dir_path) is entry:
                entry.outstanding = {n for n, _ in items}
                self._planned += len(items)
                counted = True
            else:
                counted = False
        if counted and self.stats is not None:
            self.stats.add(LEARNED_PLANS)
        return LearnedPlan(dir_path, tuple(n for n, _ in items), tuple(s for _, s in items), shuffled)

    def note_plan_used(self, dir_path: str, name: str) -> bool:
        """A file was read; True (counted as a hit) when it belongs to a replayed plan not yet used."""
        with self._lock:
            entry = self._dirs.get(dir_path)
            if entry is None or not entry.outstanding or name not in entry.outstanding:
                return False
            entry.outstanding.discard(name)
            self._hits += 1
        if self.stats is not None:
            self.stats.add(LEARNED_FILES_USED)
        return True

    def record_file(self, path: str, size: int, mtime_ns: int, share: float) -> None:
        """The load of file *path* (this size and mtime) that just ended read *share* of its format plan."""
        with self._lock:
            self._files.pop(path, None)
            self._files[path] = (size, mtime_ns, min(1.0, max(0.0, share)), self._clock())
            if len(self._files) > MAX_FILES:
                self._files.popitem(last=False)
            self._dirty = True

    def file_share(self, path: str, size: int, mtime_ns: int) -> float | None:
        """Share of its plan the last load of this version of *path* read, or None if unknown."""
        with self._lock:
            known = self._files.get(path)
            if known is None or known[0] != size or known[1] != mtime_ns:
                return None
            self._files.move_to_end(path)
            return known[2]

    def accuracy(self) -> dict[str, float]:
        """Files planned by replays, how many of them were then read, and the ratio."""
        with self._lock:
            planned, hits = self._planned, self._hits
        return {"planned": planned, "hits": hits, "ratio": hits / planned if planned else 0.0}

    @property
    def dirty(self) -> bool:
        """True when something was recorded since the last successful save or load."""
        return self._dirty

    def __len__(self) -> int:
        with self._lock:
            return len(self._dirs)

    # -- persistence ------------------------------------------------------------------------------
    def save(self) -> bool:
        """Write the state file atomically, bounded to ``state.max_bytes``; False (logged) on error."""
        with self._save_lock:
            with self._lock:
                # Cheap copies under the lock (learned is only ever replaced); merging happens outside.
                raw = [(d, e.last_used, e.learned, e.learned_shuffled, dict(e.current)) for d, e in self._dirs.items()]
                files = list(self._files.items())
                self._dirty = False
            snapshot = []
            for dir_path, last_used, learned, learned_shuffled, current in raw:
                items, shuffled = _merge_passes(learned, learned_shuffled, current)
                if len(items) >= MIN_FILES:
                    snapshot.append((dir_path, last_used, shuffled, items))
            text = self._encode(snapshot, files)
            try:
                self._write(text)
            except OSError as e:
                with self._lock:
                    self._dirty = True
                log.warning("cannot save learned access sets to %s: %s", self.path, e)
                return False
            return True

    def _encode(
        self,
        snapshot: list[tuple[str, float, bool, list[tuple[str, int]]]],
        files: list[tuple[str, tuple[int, int, float, float]]] | None = None,
    ) -> str:
        """JSON text of the most recently used files, then directories, that fit in ``max_bytes``."""
        # ensure_ascii (the default) keeps the text ASCII, so characters equal bytes, and escapes
        # the lone surrogates that stand for undecodable bytes in file names.
        head = f'{{"version":{STATE_VERSION},"source":{json.dumps(self.source)},"files":{{'
        middle, tail = '},"dirs":{', "}}"
        file_parts = (
            json.dumps(path) + ":" + json.dumps([size, mtime_ns, round(share, 4), last_used])
            for path, (size, mtime_ns, share, last_used) in reversed(files or [])
        )
        kept_files, used = _fitting(file_parts, len(head) + len(middle) + len(tail), self.max_bytes)
        dir_parts = (
            json.dumps(dir_path) + ":" + json.dumps({"t": last_used, "s": shuffled, "f": names}, separators=(",", ":"))
            for dir_path, last_used, shuffled, names in sorted(snapshot, key=lambda e: e[1], reverse=True)
        )
        kept_dirs, _ = _fitting(dir_parts, used, self.max_bytes)
        return head + ",".join(kept_files) + middle + ",".join(kept_dirs) + tail

    def _write(self, text: str) -> None:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".learned-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def load(self) -> int:
        """Replace the in-memory sets with the state file; returns the directories loaded (0 if none)."""
        try:
            with open(self.path, encoding="ascii") as f:
                text = f.read(self.max_bytes + 1)
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as e:
            log.warning("cannot read learned access sets %s (starting empty): %s", self.path, e)
            return 0
        try:
            if len(text) > self.max_bytes:
                raise ValueError(f"larger than state.max_bytes ({self.max_bytes})")
            dirs = _decode(text)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
            log.warning("ignoring corrupt learned access sets %s (starting empty): %s", self.path, e)
            return 0
        with self._lock:
            self._dirs, self._files = dirs
            self._dirty = False
        return len(dirs[0])


def _fitting(parts: Iterable[str], used: int, limit: int) -> tuple[list[str], int]:
    """The leading ``parts`` that fit in ``limit`` characters after ``used`` (joined by commas), and
    the characters used then; stops at the first part that does not fit."""
    kept: list[str] = []
    for part in parts:
        cost = len(part) + (1 if kept else 0)
        if used + cost > limit:
            break
        kept.append(part)
        used += cost
    return kept, used


def _decode(text: str) -> tuple[OrderedDict[str, _Dir], OrderedDict[str, tuple[int, int, float, float]]]:
    """Parse and validate a state file; raises ValueError/TypeError on anything malformed."""
    doc: Any = json.loads(text)
    if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
        raise ValueError("unknown state file version")
    known = doc.get("files", {})
    if not isinstance(known, dict):
        raise TypeError("files is not an object")
    files: list[tuple[str, tuple[int, int, float, float]]] = []
    for path, item in known.items():
        size, mtime_ns, share, last_used = item
        if (
            type(size) is not int
            or type(mtime_ns) is not int
            or not isinstance(share, (int, float))
            or not isinstance(last_used, (int, float))
            or size < 0
            or not 0 <= share <= 1
        ):
            raise TypeError(f"bad file entry {path!r}")
        files.append((path, (size, mtime_ns, float(share), float(last_used))))
    files.sort(key=lambda e: e[1][3])  # least recently used first, as in memory
    raw = doc["dirs"]
    if not isinstance(raw, dict):
        raise TypeError("dirs is not an object")
    entries: list[tuple[str, _Dir]] = []
    for dir_path, item in raw.items():
        last_used = item["t"]
        shuffled = item["s"]
        dir_names = item["f"]
        if not isinstance(last_used, (int, float)) or not isinstance(shuffled, bool) or not isinstance(dir_names, list):
            raise TypeError(f"bad entry for {dir_path!r}")
        learned: dict[str, int] = {}
        for pair in dir_names[:MAX_NAMES_PER_DIR]:
            name, size = pair
            if not isinstance(name, str) or type(size) is not int or size < 0:
                raise TypeError(f"bad file entry in {dir_path!r}")
            learned[name] = size
        entries.append((dir_path, _Dir(learned=learned, learned_shuffled=shuffled, last_used=float(last_used))))
    entries.sort(key=lambda e: e[1].last_used)  # least recently used first, as in memory
    return OrderedDict(entries[-MAX_DIRS:]), OrderedDict(files[-MAX_FILES:])
