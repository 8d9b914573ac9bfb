"""Handing small files to the kernel's page cache at open: whether, and what (pure policy).

A served open of a small file whose version fastfs holds whole in RAM (a small-file scan fetched it,
or earlier reads did) can put the file's bytes into the kernel's page cache before the OPEN is
answered (``FUSE_NOTIFY_STORE``), and the reply keeps the cache (``FOPEN_KEEP_CACHE``): the reader's
READs are then answered by the kernel and never reach the daemon (one round trip less per small
file, the bulk of a pass over scanned files). :func:`decide` is the decision; the daemon
(:mod:`fastfs.daemon.ops`) gathers its facts, gets the bytes from the engine
(:meth:`fastfs.fsio.engine.Engine.handover_parts`), writes the notification and counts it
(:meth:`fastfs.fsio.engine.Engine.handed_over`: ``opens_handed``, ``bytes_handed``, and the bytes as
delivered to the application and served from the cache).

The rules (each a fact of :class:`OpenFacts`):

* served route only: a passthrough open's reads go to the backing file, never through the daemon;
* a non-empty file of at most the limit (:data:`HANDOVER_MAX`): beyond that the open's reply would
  wait on copying bytes a reader may not want;
* the whole version in RAM now (``in_ram`` covers ``size``): nothing is fetched for it (or read at
  the open from a fast local source, below);
* the kernel's cached attributes of the node are those of the version opened (``kernel_size`` equals
  ``size``): a store beyond the kernel's size extends it, and a page stored short of the kernel's
  size is not marked up to date; a node the kernel was told to drop attributes of (rebound to
  another version, or grown) has ``kernel_size`` -1 until a reply gives them again;
* the node was not rebound by this open (the kernel held the old version's attributes a moment ago);
* the kernel holds no pages of the node yet (never opened): its later opens find them in the page
  cache already (pages the kernel dropped since come by READ, from RAM, which is only slower).

Inline handover from a fast local source. An open of a small file that RAM does not hold, on a
source local to this machine whose small reads take page-cache time (:class:`ReadSpeed`), reads the
file from the version's source file itself, at the open, and hands it over the same way (at most
:data:`INLINE_MAX` bytes): the pread costs microseconds there, the READ round trip it saves tens of
them. Such a source gets no small-file scans either (:func:`scans_wanted`): a scan's fetch of a file
on another thread (queue, wake-up, open, pread, metadata, budget) cost the daemon more than the
reader's own open and READ (a first pass over 10,000 files of 3 KiB on tmpfs, served route: 268 us a
file with scans and handover from RAM, 168 us with reads at the open). A local source found slow (a
cold disk: its small reads above :data:`LOCAL_SLOW_READ`) is scanned again, fetches in parallel
being what hides a disk's latency, and its opens no longer read inline.

RAM budget. The kernel's page cache holds its own copy of what was handed over (the kernel's memory,
reclaimed by the kernel under pressure like any page cache); fastfs's RAM copy stays in the block
cache, under its own budget, and is evicted by it as any block (a handed-over block counts as read,
so it is a drop-behind candidate). Nothing is charged twice to fastfs's budget and nothing the
kernel holds is charged to it.
"""

from __future__ import annotations

from typing import NamedTuple

from fastfs.fsio.policy import ROUTE_SERVED

__all__ = [
    "HANDOVER_MAX",
    "INLINE_MAX",
    "LOCAL_SLOW_READ",
    "Handover",
    "OpenFacts",
    "SLOW_SHARE",
    "ReadSpeed",
    "decide",
    "scans_wanted",
]

# Largest file handed to the kernel at open: one READ request at most (the kernel's default 1 MiB
# max_read); the scans fetch files up to readahead.small_file_max, larger ones are read as they come.
HANDOVER_MAX = 1024 * 1024
# Largest file read from a fast local source at its open and handed over (class-folder images of
# 100-200 KiB fit): a pread of that from a page cache costs tens of microseconds, a READ's own.
INLINE_MAX = 256 * 1024
# Seconds above which a small source read counts as slow (a cold disk's, not its page cache's, which
# answers in a few microseconds; a cold NVMe read takes about 80 us).
LOCAL_SLOW_READ = 50e-6
# Share of slow small reads above which a source is slow (most of them: a cold disk, not a few
# reads timed across a wait for the interpreter lock).
SLOW_SHARE = 0.5
# Weight of one sample in the moving share of :class:`ReadSpeed` (about the last 16 reads count).
SPEED_WEIGHT = 1 / 16
# Largest read :class:`ReadSpeed` samples: larger ones measure bandwidth, not the latency asked about.
SPEED_SAMPLE_MAX = INLINE_MAX


class OpenFacts(NamedTuple):
    """What the handover decision depends on, for one open (see the module docstring)."""

    route: str  # the open's route (``served`` or ``passthrough``)
    size: int  # size of the version opened
    in_ram: int  # bytes of that version RAM holds from offset 0 on, ready now
    kernel_size: int  # size in the kernel's cached attributes of the node (-1: dropped, unknown)
    kernel_pages: bool  # the kernel may hold pages of the node (it was opened before)
    rebound: bool  # this open rebound the node to another version
    limit: int = HANDOVER_MAX
    fast_local: bool = False  # the source is local and its small reads fast: the open may read the file itself


class Handover(NamedTuple):
    """Bytes to put into the kernel's page cache of the node: [offset, offset + length)."""

    offset: int
    length: int
    from_source: bool = False  # read from the version's source file at the open (RAM does not hold it)


def decide(f: OpenFacts) -> Handover | None:
    """The bytes to hand over at this open, or None (see the module docstring)."""
    if f.route != ROUTE_SERVED or f.rebound or f.kernel_pages:
        return None
    if f.size <= 0 or f.kernel_size != f.size:
        return None
    if f.in_ram >= f.size:
        return Handover(0, f.size) if f.size <= f.limit else None
    if f.fast_local and f.size <= min(f.limit, INLINE_MAX):
        return Handover(0, f.size, from_source=True)
    return None


def scans_wanted(local: bool, slow: bool, local_scans: bool) -> bool:
    """Whether opens on this source may start or feed small-file scans: not on a *local* source whose
    small reads are fast (not *slow*), where each open reads its file itself (see the module
    docstring), unless the ``readahead.local_scans`` setting (*local_scans*) asks for them."""
    return local_scans or not local or slow


class ReadSpeed:
    """Is the source slow? The share of its last about 16 small reads that took longer than
    :data:`LOCAL_SLOW_READ` (a moving mean of 0s and 1s, fed by the caller's timings), above
    :data:`SLOW_SHARE`. A share, not a mean of the times: a read timed on a busy daemon includes its
    wait for the interpreter lock (up to milliseconds), which one sample in a mean would turn into a
    slow source; a cold disk makes most reads slow.

    Concurrency: fed from request and pool threads without a lock; two samples at once may lose one
    (a float store is atomic under the GIL): the share is a hint, and the next samples correct it."""

    __slots__ = ("share",)

    def __init__(self) -> None:
        self.share = 0.0  # (from no sample: 11 slow reads in a row make a source slow)

    def note(self, seconds: float, size: int) -> None:
        """One source read of *size* bytes took *seconds* (reads above SPEED_SAMPLE_MAX are not sampled)."""
        if size > SPEED_SAMPLE_MAX:
            return
        late = 1.0 if seconds > LOCAL_SLOW_READ else 0.0
        self.share += (late - self.share) * SPEED_WEIGHT

    @property
    def slow(self) -> bool:
        return self.share > SLOW_SHARE
