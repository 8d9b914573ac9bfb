"""The I/O engine: pattern detection, read-ahead policy, parallel pread pool, RAM block cache, stats.

Nothing here imports the FUSE binding; :class:`fastfs.fsio.engine.Engine` is driven by the
daemon's operations adapter and, in tests, directly.
"""

from fastfs.fsio.engine import Engine, OpenResult

__all__ = ["Engine", "OpenResult"]
