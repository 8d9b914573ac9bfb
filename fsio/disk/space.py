"""The disk store's space: the budget, the free-space floor and LRU eviction.

Two limits hold at all times (checked before every write, and periodically):

* **Budget** (``cache.disk_budget``): bytes, or a share of the space available to the tier (its
  filesystem's free space plus what the tier holds); it bounds data files + journal + fan-out
  directories, as charged (each chunk rounded up to a filesystem block, :data:`DIR_CHARGE` per
  directory of ours and for the marker).
* **Free-space floor** (``cache.disk_free_floor``): bytes, or a share of the filesystem's size, of
  free space that is never used, also when another program fills the disk.

Free space comes from ``statvfs`` (injectable), re-read (:meth:`Space.refresh`) at least every
:data:`SPACE_CHECK_INTERVAL` seconds, after every :data:`SPACE_CHECK_BYTES` written, and whenever
the estimate says a write would go below the floor; between checks the estimate subtracts what was
written (``written_since``) and what is in flight (``pending``). When a write would break the budget
(:meth:`Space.make_room_locked`) or the floor (:meth:`Space.reserve`), least recently used entries
are evicted (whole entries); when even evicting all others cannot make room, nothing is evicted and
the write is declined. Writer thread 0 calls the store's ``maintain`` every
:data:`SPACE_CHECK_INTERVAL` even when idle (:meth:`Space.to_limits_locked`), so the floor is held
while another program fills the disk (the tier shrinks, down to nothing).

Eviction only takes entries out of the index (RAM) and hands them back in ``victims``; the caller
unlinks their data files and journals the drops outside the lock (the store's ``_drop_files``).

Locks: every field is guarded by the catalog lock; :meth:`refresh` calls ``statvfs`` without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastfs.fsio.disk import index
from fastfs.fsio.disk.catalog import EVICTED_BYTES, EVICTIONS, Catalog
from fastfs.fsio.disk.index import Entry
from fastfs.fsio.disk.journal import Journal

MIB = 1024 * 1024
# Seconds between statvfs checks (also while idle: another program may be filling the disk).
SPACE_CHECK_INTERVAL = 1.0
# Bytes written between statvfs checks under load (the estimate between checks subtracts them).
SPACE_CHECK_BYTES = 64 * MIB
# Disk space charged per directory of ours and for the marker (one filesystem block each).
DIR_CHARGE = 4096


def check_limits(budget_bytes: int, budget_share: float, floor_bytes: int, floor_share: float) -> None:
    """Raise ValueError unless exactly one budget (bytes or share) and at most one floor are given."""
    if (budget_bytes > 0) == (0 < budget_share <= 1):
        raise ValueError("give exactly one of budget_bytes > 0 or 0 < budget_share <= 1")
    if floor_bytes < 0 or not 0 <= floor_share < 1 or (floor_bytes and floor_share):
        raise ValueError("floor: bytes >= 0 or a share in [0, 1), not both")


class Space:
    """Budget, floor and eviction of one store (see the module docstring)."""

    def __init__(
        self,
        catalog: Catalog,
        journal: Journal,
        root_fd: int,
        *,
        budget_bytes: int,
        budget_share: float,
        floor_bytes: int,
        floor_share: float,
        statvfs: Callable[[int], Any],
        clock: Callable[[], float],
    ) -> None:
        check_limits(budget_bytes, budget_share, floor_bytes, floor_share)
        self._catalog = catalog
        self._journal = journal
        self._root = root_fd
        self._budget_bytes = budget_bytes
        self._budget_share = budget_share
        self._floor_bytes = floor_bytes
        self._floor_share = floor_share
        self._statvfs = statvfs
        self._clock = clock
        # All below: catalog lock.
        self.budget = budget_bytes  # effective budget (a share is re-computed at every refresh)
        self.floor = floor_bytes  # free bytes never used (a share is re-computed at every refresh)
        self.avail = 0  # the filesystem's available bytes at the last refresh
        self.written_since = 0  # bytes written since the last refresh
        self.pending = 0  # bytes of writes that passed the floor check and are not yet written
        self.due = 0.0  # clock time of the next refresh
        self.dir_bytes = 0  # charge of the root, the marker, data/ and its fan-out directories

    def count_dirs(self, fanout: int) -> None:
        """At open: charge the root, the marker, ``data/`` and its ``fanout`` directories."""
        self.dir_bytes = DIR_CHARGE * (3 + fanout)

    def charge_dir(self) -> None:
        """A fan-out directory was created."""
        with self._catalog.lock:
            self.dir_bytes += DIR_CHARGE

    def charged_locked(self) -> int:
        """What the tier uses now, as charged: data (with writes in flight), journal, directories."""
        return self._catalog.used + self._journal.nbytes + self.dir_bytes

    def seconds_to_check_locked(self) -> float:
        """Seconds until the next periodic refresh is due (0: now)."""
        return max(0.0, self.due - self._clock())

    def check_now_locked(self) -> None:
        """Re-read free space at the next chance (a write failed with ENOSPC)."""
        self.due = 0.0

    def refresh(self) -> None:
        """Re-read free space (``statvfs``) and re-compute a budget or floor given as a share."""
        st = self._statvfs(self._root)
        avail = st.f_bavail * st.f_frsize
        total = st.f_blocks * st.f_frsize
        catalog = self._catalog
        with catalog.lock:
            self.avail = avail
            self.written_since = 0
            self.due = self._clock() + SPACE_CHECK_INTERVAL
            self.floor = self._floor_bytes if self._floor_bytes else int(self._floor_share * total)
            if self._budget_share:
                mine = catalog.on_disk_locked() + self._journal.nbytes + self.dir_bytes  # on disk now
                self.budget = int(self._budget_share * (avail + mine))

    # -- the floor --------------------------------------------------------------------------------
    def reserve(self, need: int, entry: Entry, drop_files: Callable[[list[Entry]], None]) -> int:
        """Reserve ``need`` bytes against the free-space floor (evicting LRU entries other than
        ``entry`` if that helps: ``drop_files`` removes their files); returns the bytes reserved (0: no
        room). The caller gives them back with :meth:`written_locked` or :meth:`unreserve_locked`."""
        need += index.PAGE  # inode and extent blocks the write may add
        catalog = self._catalog
        with catalog.lock:
            due = self._clock() >= self.due or self.written_since >= SPACE_CHECK_BYTES
            short = self.avail - self.written_since - self.pending - need < self.floor
        if due or short:
            self.refresh()
        for attempt in range(2):
            victims: list[Entry] = []
            with catalog.lock:
                deficit = self.floor - (self.avail - self.written_since - self.pending - need)
                if deficit <= 0:
                    self.pending += need
                    return need
                if attempt == 1 or catalog.on_disk_locked() - entry.used < deficit:
                    return 0  # evicting every other entry would not be enough: evict nothing
                while deficit > 0:
                    victim = catalog.victim_locked(entry)
                    if victim is None:
                        break
                    deficit -= victim.used
                    self._evict_one_locked(victim, victims)
            if not victims:
                return 0
            drop_files(victims)
            self.refresh()
        return 0

    def written_locked(self, reserved: int) -> None:
        """A write reserved with :meth:`reserve` is on disk."""
        self.pending -= reserved
        self.written_since += reserved

    def unreserve_locked(self, reserved: int) -> None:
        """A write reserved with :meth:`reserve` did not happen."""
        self.pending -= reserved

    # -- the budget and the entry cap ---------------------------------------------------------------
    def make_room_locked(self, victims: list[Entry], need: int, keep: Entry | None, new: bool = False) -> bool:
        """Evict LRU entries other than ``keep`` (into ``victims``) until ``need`` more bytes fit the
        budget and, with ``new``, one more entry fits the cap; False (nothing evicted for the budget)
        when that is impossible."""
        catalog = self._catalog
        while len(catalog.entries) + (1 if new else 0) > catalog.max_entries:
            victim = catalog.victim_locked(keep)
            if victim is None:
                return False
            self._evict_one_locked(victim, victims)
        fixed = self._journal.nbytes + self.dir_bytes + catalog.inflight + (keep.used if keep is not None else 0)
        if fixed + need > self.budget:
            return False  # even evicting every other entry would not make room: evict nothing
        while self.charged_locked() + need > self.budget:
            victim = catalog.victim_locked(keep)
            if victim is None:
                return False
            self._evict_one_locked(victim, victims)
        return True

    def to_limits_locked(self, victims: list[Entry]) -> None:
        """Evict LRU entries (into ``victims``) until the index fits the entry cap, the budget and the
        floor (at open: a journal may describe more than fits now; periodically: the disk filled)."""
        self.make_room_locked(victims, need=0, keep=None)
        deficit = self.floor - (self.avail - self.written_since - self.pending)
        while deficit > 0:
            victim = self._catalog.victim_locked(None)
            if victim is None:
                break
            deficit -= victim.used
            self._evict_one_locked(victim, victims)

    def _evict_one_locked(self, victim: Entry, victims: list[Entry]) -> None:
        counters = self._catalog.counters
        counters[EVICTIONS] += 1
        counters[EVICTED_BYTES] += victim.used
        self._catalog.remove_locked(victim)
        if victim.created:
            victims.append(victim)
