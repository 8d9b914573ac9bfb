"""The typed engine interface: exactly what the daemon (``fastfs.daemon``) calls on the engine.

The daemon is a thin adapter (kernel requests in, engine calls out); it codes against
:class:`EngineAPI`, not against :class:`~fastfs.fsio.engine.Engine` and not against ``Any``, so the
engine's parts can move behind the facade without the adapter noticing, and a test
(tests/unit/test_api.py) holds the real engine to this protocol: every member exists on ``Engine``, with
the same parameters. A member belongs here when, and only when, something under ``daemon/`` uses it
(warm jobs, which run inside the engine's package, use the engine itself).

Paths are the mount's paths (``/`` is the source root). Errors are ``OSError`` with the errno the
caller should answer.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Callable

    from fastfs.config.schema import Config
    from fastfs.fsio.changes import ChangeListener
    from fastfs.fsio.opening import OpenResult
    from fastfs.fsio.readpath import DirectOffer, DirectTally, ReplyParts
    from fastfs.fsio.source import FileKey


@runtime_checkable
class EngineAPI(Protocol):
    """The operations and the few attributes the daemon uses (see the module docstring)."""

    config: Config
    """The running configuration (what a reload applied live included)."""
    passthrough_available: bool
    """Set by the daemon once the connection is negotiated: the kernel can hand opens to the kernel
    (passthrough). The daemon never clears it: a refused backing file is reported with :meth:`refused`."""
    inline_reads: bool
    """Set by the daemon: a watchdog bounds every request, so small exact reads may run on the caller's thread."""
    opens_hand_over: bool
    """Set by the daemon: its served opens hand small files to the kernel, reading those of a fast local
    source themselves (fastfs.fsio.handover), so no scans are wanted there."""
    direct_tallies: Callable[[], list[tuple[int, DirectTally]]] | None
    """Set by the daemon when its request loop answers reads itself: what it served, taken before a snapshot."""

    # -- metadata ---------------------------------------------------------------------------------
    def lstat(self, path: str) -> os.stat_result: ...

    def lstat_many(self, paths: list[str]) -> list[os.stat_result | None]: ...

    def scandir(self, path: str) -> list[tuple[str, int, int]]: ...

    def listing(self, path: str) -> list[tuple[str, int, int]]: ...

    def listen(self, listener: ChangeListener) -> None: ...

    def listing_attributes(self) -> bool: ...

    def readlink(self, path: str) -> str: ...

    def statvfs(self) -> os.statvfs_result: ...

    def access(self, path: str, mode: int) -> None: ...

    def getxattr(self, path: str, name: str) -> bytes: ...

    def listxattr(self, path: str) -> list[str]: ...

    # -- files ------------------------------------------------------------------------------------
    def open(
        self,
        path: str,
        flags: int = os.O_RDONLY,
        expect: FileKey | None = None,
        cached: bool = False,
        held_route: str = "",
        backed: bool = False,
    ) -> OpenResult: ...

    def backing(self, fh: int) -> OpenResult: ...

    def preload(self) -> threading.Thread | None: ...

    def reroute(self, fh: int, held_route: str) -> OpenResult: ...

    def refused(self, fh: int, reason: str) -> OpenResult: ...

    def read_into(
        self,
        fh: int,
        offset: int,
        dest: memoryview,
        path: str | None = None,
        expect: FileKey | None = None,
        parts: ReplyParts | None = None,
    ) -> int: ...

    def release_parts(self, parts: ReplyParts) -> None: ...

    def direct_offer(self, fh: int) -> DirectOffer | None: ...

    def direct_served(self, fh: int, tally: DirectTally) -> None: ...

    def direct_stuck(self, fh: int, count: int) -> None: ...

    def direct_unstuck(self, fh: int) -> None: ...

    def defer_close(self, call: Callable[[], object]) -> None:
        """Run *call*, which closes a source descriptor, off the caller's thread (fsio/closer.py)."""
        ...

    def ram_head(self, fh: int) -> int: ...

    def handover_parts(self, fh: int, length: int) -> ReplyParts | None: ...

    def handed_over(self, fh: int, parts: ReplyParts) -> None: ...

    def fast_local(self) -> bool: ...

    def read_at_open(self, fh: int, length: int) -> memoryview | None: ...

    def handed_from_source(self, fh: int, n: int) -> None: ...

    def abandoned_read(self, fh: int) -> None: ...

    def release(self, fh: int) -> None: ...

    # -- control ----------------------------------------------------------------------------------
    def snapshot(self, top: int = 10) -> dict[str, Any]: ...

    def reconfigure(self, config: Config) -> list[str]: ...

    def close(self) -> None: ...
