"""The disk store's RAM index: entries in LRU order, the bytes they charge, the counters, the lock.

One :class:`Catalog` per :class:`~fastfs.fsio.disk.store.DiskStore`, shared by all of its parts
(:mod:`.writer`, :mod:`.reads`, :mod:`.space`, :mod:`.journal`, :mod:`.files`). Its ``lock`` is
the store's one RAM lock: it guards the catalog's own fields, every :class:`~.index.Entry` field,
and the fields the other parts document as "under the catalog lock". It is never held across I/O.

LRU order is the order of ``entries`` (oldest first): reads and writes move an entry to the end
(:meth:`Catalog.touch_locked`); eviction takes from the front (:meth:`Catalog.victim_locked`).
``changed`` says the index or its order moved since the last journal compaction, so a clean close
rewrites the journal only when there is something to keep.

Metadata is bounded: at most ``max_entries`` entries (:data:`MAX_ENTRIES`, about 0.7 KiB of RAM
each) and 5 bytes of RAM per held 64 KiB chunk (:class:`~.index.Entry`).
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable

from fastfs.fsio.disk.index import Entry, Key

# Entries (cached file versions) kept at most: ~0.7 KiB of RAM each (measured), so 1 M is ~0.7 GiB at worst.
MAX_ENTRIES = 1_000_000

# Counters (monotonic) and gauges of :meth:`DiskStore.stats`.
HITS = "disk_hits"  # read_into calls served from disk
HIT_BYTES = "disk_hit_bytes"  # bytes served by them
MISSES = "disk_misses"  # read_into calls for ranges not held
WRITES = "disk_writes"  # puts written and recorded
BYTES_WRITTEN = "disk_bytes_written"
COMPLETED = "disk_files_completed"  # entries a write made complete (every chunk written and journalled)
WRITES_DROPPED = "disk_writes_dropped"  # puts declined: write queue full (backpressure)
WRITES_NO_ROOM = "disk_writes_no_room"  # puts not written: budget or free-space floor, nothing left to evict
WRITES_SKIPPED = "disk_writes_skipped"  # puts not taken: already held, unaligned, or closing
WRITE_ERRORS = "disk_write_errors"  # puts that failed with an OS error (ENOSPC, EIO...)
EVICTIONS = "disk_evictions"  # entries evicted (LRU, budget, floor, entry cap)
EVICTED_BYTES = "disk_evicted_bytes"
CORRUPT = "disk_corrupt_dropped"  # entries dropped because a check failed (CRC, size, missing, altered)
VERIFIED = "disk_verified_files"  # complete entries read back and verified for complete_fd
COMPLETE_FDS = "disk_complete_fds"  # descriptors handed out by complete_fd
CLEARED = "disk_cleared"  # 1 when the directory was ours but unusable and was cleared at open
COUNTERS = (
    HITS,
    HIT_BYTES,
    MISSES,
    WRITES,
    BYTES_WRITTEN,
    COMPLETED,
    WRITES_DROPPED,
    WRITES_NO_ROOM,
    WRITES_SKIPPED,
    WRITE_ERRORS,
    EVICTIONS,
    EVICTED_BYTES,
    CORRUPT,
    VERIFIED,
    COMPLETE_FDS,
    CLEARED,
)
USE = "disk_cache_bytes"  # data files + journal + directories, as charged
BUDGET = "disk_cache_budget"  # effective budget now
FREE = "disk_free_bytes"  # the filesystem's available bytes at the last check
FLOOR = "disk_free_floor"  # free bytes never used
FILES = "disk_cache_files"  # entries
QUEUED = "disk_queue_bytes"  # bytes waiting in the write queue
GAUGES = (USE, BUDGET, FREE, FLOOR, FILES, QUEUED)


class Catalog:
    """The index of one store (see the module docstring). Every field is guarded by ``lock``; the
    methods named ``*_locked`` expect it held, :meth:`load` runs before any other thread exists."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.lock = threading.Lock()
        self.max_entries = max(1, max_entries)
        self.entries: OrderedDict[Key, Entry] = OrderedDict()  # key -> entry, LRU order (oldest first)
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.used = 0  # data bytes charged: held chunks + reservations of writes in flight
        self.inflight = 0  # of which reservations of writes in flight
        self.changed = False  # LRU order or index changed since the last compaction

    def load(self, entries: Iterable[Entry]) -> None:
        """Install the entries a journal replay found (in their LRU order)."""
        for entry in entries:
            self.entries[entry.key] = entry
            self.used += entry.used

    def created_locked(self, key: Key) -> Entry | None:
        """The entry of ``key`` when it has a data file (no I/O)."""
        entry = self.entries.get(key)
        return entry if entry is not None and entry.created else None

    def touch_locked(self, key: Key) -> None:
        """Mark ``key`` most recently used."""
        self.entries.move_to_end(key)
        self.changed = True

    def add_locked(self, entry: Entry) -> None:
        self.entries[entry.key] = entry

    def remove_locked(self, entry: Entry) -> None:
        """Take ``entry`` out of the index (its bytes are no longer charged); no-op when already out."""
        if entry.live:
            entry.live = False
            self.used -= entry.used
            if self.entries.get(entry.key) is entry:
                del self.entries[entry.key]
            self.changed = True

    def victim_locked(self, keep: Entry | None) -> Entry | None:
        """The least recently used entry other than ``keep``, or None."""
        for entry in self.entries.values():
            if entry is not keep:
                return entry
        return None

    def reserve_locked(self, nbytes: int) -> None:
        """Charge a write in flight (before it is written)."""
        self.used += nbytes
        self.inflight += nbytes

    def unreserve_locked(self, nbytes: int) -> None:
        self.used -= nbytes
        self.inflight -= nbytes

    def mark_locked(self, entry: Entry, first: int, crcs: array[int]) -> None:
        """Record chunks ``first..`` of ``entry`` as held (written) with these CRCs."""
        self.used += entry.mark(first, crcs)
        self.changed = True

    def on_disk_locked(self) -> int:
        """Data bytes charged for what is on disk now (not counting writes in flight)."""
        return self.used - self.inflight

    def snapshot_locked(self) -> list[tuple[int, Key, int, bytes, bytes]]:
        """``(id, key, size, held, crcs)`` of every entry with a data file, in LRU order, for a journal
        compaction (which then holds all there is to keep: ``changed`` is cleared)."""
        self.changed = False
        return [(e.id, e.key, e.size, bytes(e.held), e.crcs.tobytes()) for e in self.entries.values() if e.created]
