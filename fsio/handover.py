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
* the whole version in RAM now (``in_ram`` covers ``size``): nothing is fetched for it;
* the kernel's cached attributes of the node are those of the version opened (``kernel_size`` equals
  ``size``): a store beyond the kernel's size extends it, and a page stored short of the kernel's
  size is not marked up to date; a node the kernel was told to drop attributes of (rebound to
  another version, or grown) has ``kernel_size`` -1 until a reply gives them again;
* the node was not rebound by this open (the kernel held the old version's attributes a moment ago);
* the kernel holds no pages of the node yet (never opened): its later opens find them in the page
  cache already (pages the kernel dropped since come by READ, from RAM, which is only slower).

RAM budget. The kernel's page cache holds its own copy of what was handed over (the kernel's memory,
reclaimed by the kernel under pressure like any page cache); fastfs's RAM copy stays in the block
cache, under its own budget, and is evicted by it as any block (a handed-over block counts as read,
so it is a drop-behind candidate). Nothing is charged twice to fastfs's budget and nothing the
kernel holds is charged to it.
"""

from __future__ import annotations

from typing import NamedTuple

from fastfs.fsio.policy import ROUTE_SERVED

__all__ = ["HANDOVER_MAX", "Handover", "OpenFacts", "decide"]

# Largest file handed to the kernel at open: one READ request at most (the kernel's default 1 MiB
# max_read); the scans fetch files up to readahead.small_file_max, larger ones are read as they come.
HANDOVER_MAX = 1024 * 1024


class OpenFacts(NamedTuple):
    """What the handover decision depends on, for one open (see the module docstring)."""

    route: str  # the open's route (``served`` or ``passthrough``)
    size: int  # size of the version opened
    in_ram: int  # bytes of that version RAM holds from offset 0 on, ready now
    kernel_size: int  # size in the kernel's cached attributes of the node (-1: dropped, unknown)
    kernel_pages: bool  # the kernel may hold pages of the node (it was opened before)
    rebound: bool  # this open rebound the node to another version
    limit: int = HANDOVER_MAX


class Handover(NamedTuple):
    """Bytes to put into the kernel's page cache of the node: [offset, offset + length)."""

    offset: int
    length: int


def decide(f: OpenFacts) -> Handover | None:
    """The bytes to hand over at this open, or None (see the module docstring)."""
    if f.route != ROUTE_SERVED or f.rebound or f.kernel_pages:
        return None
    if not 0 < f.size <= f.limit or f.in_ram < f.size or f.kernel_size != f.size:
        return None
    return Handover(0, f.size)
