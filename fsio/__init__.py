"""The I/O engine: pattern detection, read-ahead policy, parallel pread pool, RAM block cache, stats.

Nothing here knows FUSE; :class:`fastfs.fsio.engine.Engine` is driven by the daemon's kernel adapter
(:mod:`fastfs.daemon.ops`) and, in tests, directly.
"""

from fastfs.fsio.engine import Engine, OpenResult

__all__ = ["Engine", "OpenResult"]
