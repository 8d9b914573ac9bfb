"""The access shape a source is read with, chosen from what is known and measured of it.

Sources differ in what they do with concurrency and order, and reading one the wrong way costs
more than not reading ahead at all:

* a local disk, NFS, Lustre, CephFS, sshfs: any handle reads any offset; several handles read one
  file in parallel, each stream adding bandwidth on a latency-bound link. fastfs reads a block as
  pieces spread over several source handles (:data:`PARALLEL`);
* stream-oriented clients (rclone without its VFS cache, s3fs, goofys, gcsfuse without its file
  cache, blobfuse2, mountpoint-s3) serve a handle as one ranged download: a read that does not
  continue where the handle's last one ended restarts the download, and the server reads ahead for
  the old one in vain. Measured here over a loopback rclone mount (256 MiB, page cache dropped,
  the server's own read counter): one handle read in order, 4 MiB requests, 0.73 s and 1.06x the
  file at the server; 4 handles over contiguous quarters 0.64 s but 1.69x; 4 handles interleaving
  1 MiB pieces (the parallel shape) 1.19 s and 5.24x. So such a source is read with one handle per
  file, strictly in order, in whole blocks (:data:`SEQUENTIAL`).

What is known (:class:`SourceFacts`): the type of the source's mount (its FUSE subtype names the
client: ``fuse.rclone``); whether the source is local; optionally a measured probe of one handle
(the cost of a read that continues the last one against one that jumps). :func:`choose` is pure:
the override (``readahead.source_shape``) wins, then a known client, then the probe; everything
else keeps the parallel shape. The reason is kept for ``fastfs stats`` and the debug log.
"""

from __future__ import annotations

from dataclasses import dataclass

PARALLEL = "parallel"
SEQUENTIAL = "sequential"
AUTO = "auto"
SHAPES = (AUTO, PARALLEL, SEQUENTIAL)

# FUSE subtypes of clients that serve a handle as one ranged download (a jump restarts it).
STREAM_CLIENTS = frozenset(
    {"rclone", "s3fs", "goofys", "gcsfuse", "blobfuse", "blobfuse2", "mountpoint-s3", "mount-s3", "s3backer"}
)
# A jump costs at least this many times a continuing read on the probed handle: the handle is a stream.
JUMP_RATIO = 4.0
# ... and at least this much more in absolute terms (seconds): below it the difference is noise on
# a fast source, whatever the ratio.
JUMP_EXTRA = 0.002


@dataclass(frozen=True)
class SourceFacts:
    """What is known of a source when its shape is chosen."""

    mount_type: str = ""  # the source mount's type as the mount table gives it: "ext4", "nfs4", "fuse.rclone"
    local: bool = False  # a local filesystem (statfs type), read by passthrough where it can be
    continue_seconds: float | None = None  # probe: a read continuing the handle's last one
    jump_seconds: float | None = None  # probe: a read of the same size at a distant offset on that handle


@dataclass(frozen=True)
class Shape:
    """How a source's files are read."""

    kind: str  # PARALLEL or SEQUENTIAL
    reason: str  # why, in a few words (stats, debug log)

    @property
    def sequential(self) -> bool:
        return self.kind == SEQUENTIAL


def client_of(mount_type: str) -> str:
    """The FUSE client a mount type names ("fuse.rclone" -> "rclone"; "" for kernel filesystems)."""
    kind, _, sub = mount_type.partition(".")
    return sub if kind in ("fuse", "fuseblk") and sub else ""


def choose(facts: SourceFacts, override: str = AUTO) -> Shape:
    """The shape to read the source with (see the module docstring)."""
    if override == PARALLEL:
        return Shape(PARALLEL, "readahead.source_shape=parallel")
    if override == SEQUENTIAL:
        return Shape(SEQUENTIAL, "readahead.source_shape=sequential")
    if facts.local:
        return Shape(PARALLEL, "local filesystem")
    client = client_of(facts.mount_type)
    if client in STREAM_CLIENTS:
        return Shape(SEQUENTIAL, f"{client} serves a handle as one ranged download")
    if facts.continue_seconds is not None and facts.jump_seconds is not None:
        extra = facts.jump_seconds - facts.continue_seconds
        if facts.jump_seconds >= JUMP_RATIO * facts.continue_seconds and extra >= JUMP_EXTRA:
            return Shape(
                SEQUENTIAL,
                f"a jump on one handle cost {facts.jump_seconds * 1e3:.1f} ms, a continuing read "
                f"{facts.continue_seconds * 1e3:.1f} ms",
            )
        return Shape(PARALLEL, "a jump on one handle costs about what a continuing read does")
    return Shape(PARALLEL, f"{facts.mount_type or 'unknown'} reads any offset on any handle")
