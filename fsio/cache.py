"""RAM block cache with a hard byte budget.

Blocks are keyed by ``(file key, block index)``; the file key (device, inode, size, mtime, ctime)
changes whenever the source file changes, so a changed source can never be served from cache.

Budget: a block's capacity is charged when it is *reserved*, before any I/O, so cached plus
in-flight bytes never exceed the budget; a small block is charged its Python objects too
(:data:`SMALL_BLOCK_OVERHEAD`: next to a 4 KiB page they are not negligible). When a reservation
does not fit, ready blocks are evicted: first those a sequential reader already consumed
(drop-behind: the kernel's page cache holds them now), then the least recently used. Blocks being
filled, and blocks pinned by a reader copying out of them, are never evicted. When nothing can be
evicted the reservation fails: prefetch is declined (backpressure) and demand reads go straight to
the source without caching.

Buffers are page-aligned anonymous memory (so ``O_DIRECT`` preads can fill them): a block-size
buffer is an ``mmap`` of its own; evicted ones are kept on a free list, still charged to the budget,
and reused (on this class of VM faulting in fresh anonymous memory costs more than the pread that
fills it). A small block (a small file, a file's short last block, a head window: up to 512 KiB) is
a run of pages in a shared slab (:mod:`fastfs.fsio.slabs`): one mapping per block ran into the
kernel's limit on mappings with 100,000 small files held, where freeing a block failed unseen and its
memory stayed while the budget counted it free.

Concurrency (what guards what; the fields say it again):

* ``_lock`` guards every table and counter of the cache (``_blocks``, ``_consumed``, ``_by_file``,
  ``_free``, ``_slabs``, ``reserved``, ``budget``, and the gauges ``_pending`` and ``_ready_bytes``,
  kept as blocks change so a snapshot never walks the table) and a block's ``pins``, ``state``,
  ``length``, ``errno`` and ``used``:
  :meth:`complete` and :meth:`fail` write the outcome under it, then set ``done`` outside it. A
  reader that waited for ``done`` reads the outcome without the lock (``Latch.set``/``wait``
  order the writes before the reads) and so may the filler that wrote it.
* A block's ``key``, ``start``, ``buf``, ``view``, ``capacity`` and ``prefetched`` never change after
  :meth:`reserve` made it. ``used`` only goes from False to True, by :meth:`use` (a reader copying
  out of the block, pinned); readers test it without the lock first (a stale False costs one take of
  the lock).
  ``job`` is written by the block's filler, read without the lock by a reader deciding whether to
  promote it (a stale value promotes a job that already runs: :meth:`PreadPool.promote` says no).
  ``owner`` is set once by a warm before the block can be evicted; ``disk_warm`` once by a disk
  warm right after it got the block (a plain flag, read when the fill completes).
* :meth:`peek` reads ``_blocks`` without the lock: one dict lookup (atomic under the GIL), an
  advisory answer (the block may go right after) that the caller never dereferences without a pin.

The lock is never held across I/O or while waiting (the one syscall made under it is the
``MADV_DONTNEED`` that gives a dropped small block's pages back, :meth:`SlabAllocator.give`).

Invariants (:meth:`BlockCache.check_invariants`): ``reserved`` equals the capacities of the blocks
(a small one's with its overhead) plus the free buffers and stays within the budget (after a budget
cut that pinned and in-flight blocks keep from being met at once: within what was charged then, and
never growing past the budget again); ``_by_file`` and ``_consumed`` index exactly blocks of
``_blocks``; the gauges agree with the table (pending blocks, bytes of ready ones), and the slabs'
page maps with the small blocks' runs; no block is FAILED (failed blocks leave the table), pins are
>= 0, a ready block's length fits its capacity. With ``check_invariants`` (config
``cache.check_invariants`` or ``FASTFS_CHECK_INVARIANTS=1`` in the environment) every mutating
method runs the check under the lock before releasing it (tests and debug mounts; it walks the whole
cache, so it is off by default).
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from fastfs.fsio import stats as m
from fastfs.fsio.latch import Latch
from fastfs.fsio.slabs import Run, SlabAllocator

PENDING, READY, FAILED = 0, 1, 2
# Smallest buffer granule: page size, also the O_DIRECT alignment.
PAGE = 4096
# Bytes a small block (a run of slab pages) is charged beside its pages: its Python objects (the Block,
# its Latch, Run and view, its entries in the tables) took 1.17 KiB a block, measured with 100,000
# blocks of 3 KiB files; uncharged, 100,000 scanned small files held 112 MiB more than the budget said.
SMALL_BLOCK_OVERHEAD = 1200
# Environment variable that turns on the invariant check of every cache (debug mounts, test runs).
CHECK_ENV = "FASTFS_CHECK_INVARIANTS"


def invariant_checks_requested() -> bool:
    """True when the environment asks for invariant checks (``FASTFS_CHECK_INVARIANTS=1``)."""
    return os.environ.get(CHECK_ENV, "") not in ("", "0")


def round_up(n: int, granule: int = PAGE) -> int:
    return (n + granule - 1) // granule * granule


def charge_of(capacity: int, small: bool) -> int:
    """Budget bytes a block of *capacity* is charged: a small one (a run of slab pages) its objects too."""
    return capacity + SMALL_BLOCK_OVERHEAD if small else capacity


# A block's key: (file key, block index); a file key is any hashable (the engine's FileKey).
BlockKey = tuple[Hashable, int]


class EvictionListener(Protocol):
    """A block's owner (``Block.owner``): a warm that hears of its block's eviction."""

    def evicted(self, nbytes: int) -> None: ...


class BlockFill(Protocol):
    """The fill of one block while it is queued or running (``Block.job``): a
    :class:`~fastfs.fsio.fills.Preads` or a :class:`~fastfs.fsio.fills.DiskFill`."""

    @property
    def demand(self) -> bool:  # the priority its jobs were queued with
        ...

    @property
    def jobs(self) -> Sequence[Callable[[], None]]:  # its pool jobs (promoted when a reader waits for a prefetch)
        ...


class Block:
    """One cached range of a file version, from file offset ``start``; ``length`` valid bytes live at
    the start of ``buf``. A block keyed by a file key holds block ``index`` of that file; one keyed by
    a :class:`~fastfs.fsio.source.HeadKey` holds a small extra range (a format plan's head window
    number ``index``) at any page-aligned ``start``.

    What guards each field is listed in the module docstring (Concurrency)."""

    __slots__ = (
        "key",
        "start",
        "buf",
        "view",
        "capacity",
        "length",
        "state",
        "errno",
        "done",
        "prefetched",
        "used",
        "pins",
        "job",
        "owner",
        "disk_warm",
    )

    def __init__(self, key: BlockKey, start: int, buf: mmap.mmap | Run, capacity: int, prefetched: bool) -> None:
        self.key = key
        self.start = start
        self.buf = buf  # a mapping of its own (block-size buffers, large runs) or a run of a slab's pages
        self.view = buf.view if isinstance(buf, Run) else memoryview(buf)
        self.capacity = capacity
        self.length = 0
        self.state = PENDING
        self.errno = 0
        self.done = Latch()  # set when the fill ends (READY or FAILED)
        self.prefetched = prefetched
        self.used = False
        self.pins = 0
        self.job: BlockFill | None = None  # the queued fill, so a waiting reader can promote it
        self.owner: EvictionListener | None = None  # a warm that wants to hear of its eviction (``owner.evicted(n)``)
        self.disk_warm = False  # a disk warm writes it to the disk tier itself, waiting for queue room


class BlockCache:
    """Budgeted block store shared by every file of a mount."""

    def __init__(self, budget: int, block_size: int, stats: m.Stats, check_invariants: bool = False) -> None:
        self.budget = budget  # guarded by _lock (set_budget); read unlocked only as an advisory bound
        # Run check_invariants after every mutating operation (debug); immutable.
        self.checking = check_invariants or invariant_checks_requested()
        # Bytes charged when a budget cut could not be met at once (0: none); guarded by _lock.
        self._over_budget = 0
        self.block_size = block_size  # immutable
        self.stats = stats  # internally synchronised
        self._lock = threading.Lock()
        # All guarded by _lock (peek reads _blocks without it, see the module docstring):
        self._blocks: OrderedDict[BlockKey, Block] = OrderedDict()  # LRU order, oldest first
        self._consumed: OrderedDict[BlockKey, None] = OrderedDict()  # drop-behind candidates
        self._by_file: dict[Hashable, set[int]] = {}  # file key -> indexes of its blocks in _blocks
        self._free: list[mmap.mmap] = []  # block_size buffers kept for reuse (charged)
        self._slabs = SlabAllocator()  # the buffers of small blocks (fastfs.fsio.slabs)
        self.reserved = 0  # bytes charged: blocks (any state) + free buffers; read unlocked only as a gauge
        # The gauges, kept as blocks change state in or leave _blocks (a snapshot reads them without
        # walking the table under the lock: a mount holding 100,000 scanned small files would stall
        # every read and fetch for each scrape); both guarded by _lock.
        self._pending = 0  # blocks of _blocks in state PENDING
        self._ready_bytes = 0  # the lengths of the blocks of _blocks in state READY
        # the capacities of the prefetched blocks of _blocks not used yet (pending ones too): what the
        # scans bound themselves by mount-wide (fastfs.fsio.scanner); read unlocked as a hint
        self.unused_prefetch = 0

    # -- lookup -----------------------------------------------------------------------------
    def get(self, file_key: Hashable, index: int) -> Block | None:
        """The block if present (any state), refreshed in LRU order and pinned; call :meth:`unpin`."""
        key = (file_key, index)
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
                block.pins += 1
                if self.checking:
                    self._check_locked()
            return block

    def peek(self, file_key: Hashable, index: int) -> Block | None:
        """The block if present, without pinning or touching LRU order."""
        return self._blocks.get((file_key, index))

    def unpin(self, block: Block) -> None:
        with self._lock:
            block.pins -= 1
            if self.checking:
                self._check_locked()

    def pin(self, block: Block) -> None:
        """One more pin of a block the caller already holds pinned (it stays until :meth:`unpin`)."""
        with self._lock:
            block.pins += 1
            if self.checking:
                self._check_locked()

    # -- reservation --------------------------------------------------------------------------
    def reserve(
        self, file_key: Hashable, index: int, size: int, prefetched: bool, start: int | None = None
    ) -> tuple[Block | None, bool]:
        """Reserve a pending block of ``size`` bytes capacity, holding the file from ``start`` (default:
        ``index`` x block size).

        Returns ``(block, created)``: an existing block (pinned, created False), a new pending
        block (pinned, created True: the caller must fill it and call :meth:`complete`), or
        ``(None, False)`` when the budget has no room even after eviction.
        """
        key = (file_key, index)
        capacity = self.block_size if size > self.block_size // 2 else round_up(max(size, 1))
        evicted: list[Block] = []
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
                block.pins += 1
                if self.checking:
                    self._check_locked()
                return block, False
            buf = None
            in_slab = capacity < self.block_size and self._slabs.fits(capacity)
            charge = charge_of(capacity, in_slab)
            if capacity == self.block_size and self._free:
                buf = self._free.pop()  # already charged
            else:
                buf = self._make_room(charge, evicted, reuse=capacity == self.block_size)
                if buf is None:
                    if self.reserved + charge > self.budget:
                        if self.checking:
                            self._check_locked()
                        self._account_evictions(evicted)
                        return None, False
                    self.reserved += charge
            first = index * self.block_size if start is None else start
            memory: mmap.mmap | Run
            if buf is not None:
                memory = buf
            elif in_slab:
                memory = self._slabs.take(capacity)
            else:
                memory = _allocate(capacity)
            block = Block(key, first, memory, capacity, prefetched)
            block.pins = 1
            if prefetched:
                self.unused_prefetch += capacity
            self._blocks[key] = block
            self._pending += 1
            self._by_file.setdefault(file_key, set()).add(index)
            if self.checking:
                self._check_locked()
        self._account_evictions(evicted)
        return block, True

    def _account_evictions(self, evicted: list[Block]) -> None:
        for victim in evicted:
            self.stats.add(m.EVICTIONS)
            owner = victim.owner
            if owner is not None:
                owner.evicted(victim.length)
            if victim.prefetched and not victim.used and victim.state == READY:
                self.stats.add(m.BYTES_PREFETCH_WASTED, victim.length)

    def _make_room(self, capacity: int, evicted: list[Block], reuse: bool) -> mmap.mmap | None:
        """Release free buffers, then evict (lock held), until ``capacity`` more bytes fit the budget.

        With ``reuse`` the first evicted block-size buffer is handed back instead of being released
        (still charged); evicted blocks are appended to ``evicted`` for accounting outside the lock.
        """
        while self.reserved + capacity > self.budget:
            if self._free:
                self.reserved -= self.block_size
                self._free.pop().close()
                continue
            victim = self._victim()
            if victim is None:
                return None
            evicted.append(victim)
            buf = self._drop(victim, keep_buffer=reuse)
            if buf is not None:
                return buf
        return None

    def _victim(self) -> Block | None:
        for key in self._consumed:
            block = self._blocks.get(key)
            if block is not None and block.pins == 0 and block.state != PENDING:
                return block
        for block in self._blocks.values():
            if block.pins == 0 and block.state != PENDING:
                return block
        return None

    def _drop(self, block: Block, keep_buffer: bool) -> mmap.mmap | None:
        """Remove a block (lock held). Returns its buffer when it can be reused by the caller."""
        del self._blocks[block.key]
        self._uncount(block)
        if block.prefetched and not block.used:
            self.unused_prefetch -= block.capacity
        self._consumed.pop(block.key, None)
        indexes = self._by_file.get(block.key[0])
        if indexes is not None:
            indexes.discard(block.key[1])
            if not indexes:
                del self._by_file[block.key[0]]
        buf = block.buf
        block.view.release()
        if isinstance(buf, Run):
            self._slabs.give(buf)
            self.reserved -= charge_of(block.capacity, True)
            return None
        if keep_buffer and block.capacity == self.block_size and isinstance(buf, mmap.mmap):
            return buf
        self.reserved -= block.capacity
        if (
            block.capacity == self.block_size
            and isinstance(buf, mmap.mmap)
            and self.reserved + self.block_size <= self.budget
        ):
            self._free.append(buf)
            self.reserved += self.block_size
        return None

    def _uncount(self, block: Block) -> None:
        """Take *block*, leaving ``_blocks`` or its state, out of the gauges (lock held)."""
        if block.state == PENDING:
            self._pending -= 1
        elif block.state == READY:
            self._ready_bytes -= block.length

    # -- completion ---------------------------------------------------------------------------
    def complete(self, block: Block, length: int) -> None:
        """The block's fill finished with ``length`` valid bytes; wake waiters."""
        with self._lock:
            held = self._blocks.get(block.key) is block  # (a closed cache holds none)
            if held:
                self._uncount(block)
            block.length = length
            block.errno = 0
            block.state = READY
            if held:
                self._ready_bytes += length
            if self.checking:
                self._check_locked()
        block.done.set()

    def fail(self, block: Block, errno_value: int) -> None:
        """The fill failed: the block leaves the cache (errors are never cached as data); waiters wake."""
        with self._lock:
            if self._blocks.get(block.key) is block:
                self._drop(block, keep_buffer=False)
            block.state = FAILED
            block.errno = errno_value
            if self.checking:
                self._check_locked()
        block.done.set()

    def use(self, block: Block) -> bool:
        """A reader copied out of *block* (pinned): marks it used; True the first time, when a
        prefetched block's bytes count as prefetch used (called only while ``used`` reads False, so
        the lock is taken once per block)."""
        with self._lock:
            if block.used:
                return False
            block.used = True
            if block.prefetched and self._blocks.get(block.key) is block:
                self.unused_prefetch -= block.capacity
            if self.checking:
                self._check_locked()
        return True

    def consumed(self, block: Block) -> None:
        """A sequential reader passed the end of this block: prefer it for eviction."""
        with self._lock:
            if block.key in self._blocks:
                self._consumed[block.key] = None
            if self.checking:
                self._check_locked()

    # -- maintenance --------------------------------------------------------------------------
    def invalidate_file(self, file_key: Hashable, on_request: bool = False) -> int:
        """Drop every unpinned, settled block of a file version; returns blocks dropped. *on_request*:
        a user asked for it (``fastfs warm --evict``): the bytes count as evicted on request, not as
        prefetch wasted by a wrong guess."""
        dropped = 0
        with self._lock:
            for index in list(self._by_file.get(file_key, ())):
                block = self._blocks.get((file_key, index))
                if block is not None and block.pins == 0 and block.state != PENDING:
                    if on_request and block.state == READY:
                        self.stats.add(m.BYTES_EVICTED_ON_REQUEST, block.length)
                    elif block.prefetched and not block.used and block.state == READY:
                        self.stats.add(m.BYTES_PREFETCH_WASTED, block.length)
                    self._drop(block, keep_buffer=False)
                    dropped += 1
            if self.checking:
                self._check_locked()
        return dropped

    def discard(self, file_key: Hashable, index: int) -> bool:
        """Drop block *index* of a file version if it is settled and unpinned (a grown file's block that
        ends at its old end); True when no such block is left, False when it is pinned or being filled."""
        with self._lock:
            block = self._blocks.get((file_key, index))
            if block is None:
                return True
            if block.pins or block.state == PENDING:
                return False
            self._drop(block, keep_buffer=False)
            if self.checking:
                self._check_locked()
        return True

    def cached_bytes(self, file_key: Hashable) -> int:
        """Bytes of the file version held in ready blocks (its head windows aside)."""
        with self._lock:
            total = 0
            for index in self._by_file.get(file_key, ()):
                block = self._blocks.get((file_key, index))
                if block is not None and block.state == READY:
                    total += block.length
            return total

    def set_budget(self, budget: int) -> None:
        """Change the budget (reload); evicts down to it where possible."""
        evicted: list[Block] = []
        with self._lock:
            self.budget = budget
            self._make_room(0, evicted, reuse=False)
            # pinned and in-flight blocks may keep the cut from being met now; the excess only shrinks
            self._over_budget = self.reserved if self.reserved > budget else 0
            if self.checking:
                self._check_locked()
        self._account_evictions(evicted)

    def gauges(self) -> dict[str, int]:
        """The cache's gauges for a stats snapshot: O(1), from the counts kept as blocks change."""
        with self._lock:
            return {
                "cache_bytes": self.reserved,
                "cache_data_bytes": self._ready_bytes,
                "cache_budget": self.budget,
                "cache_blocks": len(self._blocks),
                "inflight_blocks": self._pending,
                "free_buffers": len(self._free),
                "cache_unused_prefetch_bytes": self.unused_prefetch,
            }

    def close(self) -> None:
        with self._lock:
            for buf in self._free:
                buf.close()
            self._free.clear()
            self._slabs.close()
            self._blocks.clear()
            self._consumed.clear()
            self._by_file.clear()
            self.reserved = 0
            self._pending = self._ready_bytes = 0
            self.unused_prefetch = 0
            self._over_budget = 0
            if self.checking:
                self._check_locked()

    # -- invariants ---------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (see the module docstring)."""
        with self._lock:
            self._check_locked()

    def _check_locked(self) -> None:
        """:meth:`check_invariants` with the lock held."""
        bs = self.block_size
        charged = sum(charge_of(b.capacity, isinstance(b.buf, Run)) for b in self._blocks.values())
        charged += len(self._free) * bs
        assert self.reserved == charged, (
            f"cache: reserved {self.reserved} != {charged} (the charges of {len(self._blocks)} blocks"
            f" + {len(self._free)} free buffers)"
        )
        limit = max(self.budget, self._over_budget)
        assert self.reserved <= limit, f"cache: reserved {self.reserved} over the budget {self.budget}"
        buffers = {id(buf) for buf in self._free}
        assert len(buffers) == len(self._free), "cache: a buffer is twice on the free list"
        for buf in self._free:
            assert len(buf) == bs, f"cache: free buffer of {len(buf)} bytes, not the block size {bs}"
        indexed = 0
        for key, block in self._blocks.items():
            assert block.key == key, f"cache: block {block.key!r} filed under {key!r}"
            file_key, index = key
            assert index in self._by_file.get(file_key, ()), f"cache: block {key!r} missing from _by_file"
            assert block.pins >= 0, f"cache: block {key!r} has {block.pins} pins"
            assert block.state in (PENDING, READY), f"cache: block {key!r} in the table in state {block.state}"
            assert block.state != PENDING or not block.done.is_set(), f"cache: pending block {key!r} marked done"
            assert 0 < block.capacity <= bs and block.capacity % PAGE == 0, (
                f"cache: block {key!r} has capacity {block.capacity}"
            )
            assert 0 <= block.length <= block.capacity, (
                f"cache: block {key!r} holds {block.length} bytes in {block.capacity}"
            )
            assert id(block.buf) not in buffers, f"cache: block {key!r} uses a buffer on the free list"
        for file_key, indexes in self._by_file.items():
            assert indexes, f"cache: empty index set kept for {file_key!r}"
            for index in indexes:
                assert (file_key, index) in self._blocks, f"cache: _by_file names missing block {(file_key, index)!r}"
            indexed += len(indexes)
        assert indexed == len(self._blocks), f"cache: _by_file indexes {indexed} of {len(self._blocks)} blocks"
        for key in self._consumed:
            assert key in self._blocks, f"cache: consumed mark of missing block {key!r}"
        unused = sum(b.capacity for b in self._blocks.values() if b.prefetched and not b.used)
        assert self.unused_prefetch == unused, f"cache: {self.unused_prefetch} unused prefetch bytes counted, {unused}"
        self._slabs.check()
        in_runs = sum(b.capacity for b in self._blocks.values() if isinstance(b.buf, Run))
        assert in_runs == self._slabs.pages_used * PAGE, (
            f"cache: blocks hold {in_runs} bytes of slab runs, the slabs {self._slabs.pages_used} pages"
        )
        pending = sum(1 for b in self._blocks.values() if b.state == PENDING)
        assert self._pending == pending, f"cache: {self._pending} pending blocks counted, {pending} in the table"
        ready = sum(b.length for b in self._blocks.values() if b.state == READY)
        assert self._ready_bytes == ready, f"cache: {self._ready_bytes} ready bytes counted, {ready} in the table"


def _allocate(capacity: int) -> mmap.mmap:
    """A page-aligned anonymous buffer (O_DIRECT-capable)."""
    return mmap.mmap(-1, capacity, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
