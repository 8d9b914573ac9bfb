"""Directory listings kept between the READDIR(PLUS) requests of one pass over a directory.

A *pass* is what one reader sees from offset 0 to the end of a directory: one listing, fetched from
the source at the pass's first request (offset 0), then handed out in pieces as the kernel asks for
the offsets of the entries it was given. The offset of each entry (``fuse_dirent.off``, opaque to
the kernel, which hands back the last one it consumed) names its pass::

    offset = pass << PASS_SHIFT | (index + 1)

so a request at offset *o* continues pass ``o >> PASS_SHIFT`` at index ``o & INDEX_MASK``. Every
pass keeps its own listing, keyed by (directory node, pass): a reader starting at offset 0 never
replaces the list under another reader's pass (with one listing per directory, a concurrent pass
over a changing directory shifted the other's indexes: skipped or repeated entries). This needs no
directory handle: OPENDIR is answered with handle 0 (fastfs keeps no per-open directory state; it
answers OPENDIR only so the kernel does not cache listings, see ``KernelOps.opendir`` in :mod:`fastfs.daemon.ops`). The
listing of a pass's first request is the engine's, checked against the source at that moment
(:mod:`fastfs.fsio.dirs`).

Bounds. At most :data:`MAX_LISTINGS` passes are kept, least recently used dropped first; a pass is
dropped as soon as a request finds nothing left (the reader got its end of directory). A request of
a pass no longer kept (dropped for newer ones, or an offset fastfs never handed out: ``seekdir`` to
a made-up value) gets a fresh listing, kept under that pass, and continues at its index: the best
that can be done without the old listing, as before for a dropped one. Pass numbers run from 1 to
:data:`MAX_PASS` and then wrap, so offsets stay below 2**63 (the kernel's ``loff_t`` is signed) and
directories of up to 2**32 - 2 entries are served.

Concurrency: ``_lock`` guards ``_kept`` and ``_next``; the listing is fetched outside it (a source
round trip). A kept listing is never changed, only replaced or dropped, so a reader may use the one it
got while another pass starts.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from fastfs.daemon.kernel.replies import Dirent

# Bits of a directory offset that hold the entry index (+1); the pass number sits above them.
PASS_SHIFT = 32
INDEX_MASK = (1 << PASS_SHIFT) - 1
# Largest pass number: offsets stay below 2**63.
MAX_PASS = (1 << (63 - PASS_SHIFT)) - 1
# Passes whose listing is kept at once (readers paging through directories concurrently).
MAX_LISTINGS = 256


class Listings:
    """The listings of the directory passes in progress (see the module docstring)."""

    def __init__(self, fetch: Callable[[int], list[Dirent]], limit: int = MAX_LISTINGS) -> None:
        self._fetch = fetch  # node id -> its listing ('.' and '..' first), from the source
        self._limit = limit
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[int, int], list[Dirent]] = OrderedDict()  # (node id, pass) -> listing
        self._next = 1  # the next pass number

    def get(self, nodeid: int, offset: int) -> tuple[list[Dirent], int, int]:
        """(listing, index of the entry at *offset*, cookie of the pass) for a request of directory
        *nodeid* at *offset* (0 starts a new pass); an entry's offset is ``cookie + index + 1``."""
        if offset == 0:
            listing = self._fetch(nodeid)
            with self._lock:
                number = self._next
                self._next = number + 1 if number < MAX_PASS else 1
                self._keep_locked((nodeid, number), listing)
            return listing, 0, number << PASS_SHIFT
        number, index = offset >> PASS_SHIFT, offset & INDEX_MASK
        key = (nodeid, number)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                return kept, index, number << PASS_SHIFT
        listing = self._fetch(nodeid)  # a pass no longer kept: a fresh listing continues it by index
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                self._keep_locked(key, listing)
                kept = listing
        return kept, index, number << PASS_SHIFT

    def done(self, nodeid: int, cookie: int) -> None:
        """The pass of *cookie* reached its end (a request found nothing left): forget its listing."""
        with self._lock:
            self._kept.pop((nodeid, cookie >> PASS_SHIFT), None)

    def __len__(self) -> int:
        return len(self._kept)

    def _keep_locked(self, key: tuple[int, int], listing: list[Dirent]) -> None:
        self._kept[key] = listing
        self._kept.move_to_end(key)
        while len(self._kept) > self._limit:
            self._kept.popitem(last=False)
