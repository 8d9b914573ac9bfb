"""Page runs carved out of shared anonymous mappings: the buffers of small cache blocks.

A cache block of a small file (or the short last block of a larger one) used to be an ``mmap`` of
its own. The kernel allows a process 65,530 mappings (``vm.max_map_count``), and a mount whose scans
hold 100,000 small files churns through them: mappings of neighbouring blocks merge while they are
made, and dropping one block then splits the merged mapping in two. At the limit that split fails,
``munmap`` returns ENOMEM, and Python's ``mmap.close`` ignores it: the block's memory stayed mapped
and resident while the budget counted it free (measured: 140,000 blocks of 3 KiB, every other one
dropped: 65,531 mappings; then every block dropped: 4,896 mappings stayed, 219 before the blocks,
about 18 MiB that no block owned).

Here small buffers are runs of pages in slabs of :data:`SLAB_PAGES` pages, each slab one mapping
made once: a run is found first-fit in a slab with room (its page map searched by ``bytes.find``, in
C), and given back with ``MADV_DONTNEED`` so its memory leaves the process at once (the budget counts
what is resident) without touching the mapping. A slab whose pages are all free is let go (unmapped
whole when the last view of it goes: no split). Runs are page aligned, so ``O_DIRECT`` reads can
fill them as they fill a mapping of their own.

Bounds: a run is at most :data:`RUN_MAX_PAGES` (an eighth of a slab: larger buffers keep their own
mapping, few enough under any budget); slabs in use are at most the pages in use over a slab's worth
plus one per slab too fragmented for a request, so mappings stay far below the kernel's limit.

Not thread-safe: the cache calls it under its own lock. No I/O but ``madvise`` and ``mmap``.
"""

from __future__ import annotations

import mmap

PAGE = 4096
# Pages of one slab (4 MiB): a thousand one-page files share one mapping; 100,000 small files held
# need about a hundred mappings instead of 100,000.
SLAB_PAGES = 1024
# Largest run carved from a slab, as a share of it (an eighth: 512 KiB of the default slab): a larger
# request would leave slabs hard to fill; buffers above it keep a mapping of their own (at most
# budget / 512 KiB of them).
RUN_SHARE = 8
RUN_MAX_PAGES = SLAB_PAGES // RUN_SHARE


class Slab:
    """One anonymous mapping of ``pages`` pages and its page map (1: in a run, 0: free)."""

    __slots__ = ("mem", "view", "used", "free", "pages")

    def __init__(self, pages: int) -> None:
        self.mem = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.view = memoryview(self.mem)
        self.used = bytearray(pages)
        self.free = pages
        self.pages = pages


class Run:
    """A run of pages of one slab: the buffer of one small block (``view`` its bytes)."""

    __slots__ = ("slab", "first", "count", "view")

    def __init__(self, slab: Slab, first: int, count: int) -> None:
        self.slab = slab
        self.first = first  # index of its first page in the slab
        self.count = count  # pages
        self.view = slab.view[first * PAGE : (first + count) * PAGE]


class SlabAllocator:
    """Runs of pages from slabs (see the module docstring); the caller serialises every call."""

    def __init__(self, slab_pages: int = SLAB_PAGES) -> None:
        self.slab_pages = slab_pages
        self.run_max = max(1, slab_pages // RUN_SHARE)  # pages (RUN_MAX_PAGES for the default slab)
        self._room: dict[Slab, None] = {}  # slabs with a free page, oldest first (searched newest first)
        self._slabs: set[Slab] = set()  # every slab with a run in use
        self.pages_used = 0

    def fits(self, capacity: int) -> bool:
        """Whether a buffer of *capacity* bytes (a multiple of the page) comes from a slab."""
        return capacity // PAGE <= self.run_max

    def take(self, capacity: int) -> Run:
        """A run of ``capacity // PAGE`` pages (``capacity`` a multiple of the page, :meth:`fits`)."""
        count = capacity // PAGE
        want = bytes(count)
        for slab in reversed(self._room):
            if slab.free >= count:
                first = slab.used.find(want)
                if first >= 0:
                    return self._mark(slab, first, count)
        slab = Slab(self.slab_pages)
        self._slabs.add(slab)
        self._room[slab] = None
        return self._mark(slab, 0, count)

    def _mark(self, slab: Slab, first: int, count: int) -> Run:
        slab.used[first : first + count] = b"\1" * count
        slab.free -= count
        self.pages_used += count
        if slab.free == 0:
            del self._room[slab]
        return Run(slab, first, count)

    def give(self, run: Run) -> None:
        """Give *run* back (its views released by the caller): its memory goes back to the system."""
        slab = run.slab
        run.view.release()
        slab.used[run.first : run.first + run.count] = bytes(run.count)
        slab.free += run.count
        self.pages_used -= run.count
        if slab.free == slab.pages:
            self._room.pop(slab, None)
            self._slabs.discard(slab)
            slab.view.release()  # (the mapping goes whole when the last view of it does)
            return
        slab.mem.madvise(mmap.MADV_DONTNEED, run.first * PAGE, run.count * PAGE)
        if slab not in self._room:
            self._room[slab] = None

    def slabs(self) -> int:
        return len(self._slabs)

    def close(self) -> None:
        """Forget every slab (the cache is closing; each mapping goes with its last view)."""
        for slab in self._slabs:
            slab.view.release()
        self._slabs.clear()
        self._room.clear()
        self.pages_used = 0

    def check(self) -> None:
        """Raise AssertionError when the page maps disagree with the counts."""
        used = 0
        for slab in self._slabs:
            free = slab.used.count(0)
            assert free == slab.free, f"slabs: {slab.free} free pages counted, {free} in the map"
            assert (slab in self._room) == (free > 0), "slabs: a slab with room is not searched, or a full one is"
            assert free < slab.pages, "slabs: an empty slab is kept"
            used += slab.pages - free
        assert set(self._room) <= self._slabs, "slabs: a slab searched for room is not in use"
        assert used == self.pages_used, f"slabs: {self.pages_used} pages counted in use, {used} in the maps"
