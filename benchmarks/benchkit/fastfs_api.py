"""The only place the benchmarks import fastfs itself (module paths of the product may move).

Everything the harness needs from the product goes through these names: where a mount's stats
live (the stats file relative to the mount point, the stats xattr of the root) and the forced
unmount of any FUSE mount. The product is otherwise driven through its CLI (``python -m fastfs``),
so a refactor of ``daemon/`` or ``fsio/`` touches this file only.
"""

from __future__ import annotations

import os

from fastfs.daemon.control import STATS_RELPATH, XATTR_STATS

__all__ = ["STATS_RELPATH", "XATTR_STATS", "force_unmount_any"]


def force_unmount_any(path: str | os.PathLike[str]) -> None:
    """Unmount the FUSE mount at *path* while it is one (any FUSE file system, not only fastfs); never raises."""
    from fastfs.daemon import mounttable

    mounttable.force_unmount(path, any_fuse=True)
