"""Type stub of the native request loop (``_loop.c``), built when a C compiler is at hand."""

from collections.abc import Callable, Collection, Sequence
from typing import Any

class Readers:
    """The reader places of one session's workers (at most *spare* read the device at once)."""

    def __init__(self, spare: int) -> None: ...
    def end(self) -> None: ...
    def counts(self) -> tuple[int, int, int]: ...

DIRECT_RING: int
LATER_RECORD: int
DIRECT_WINDOWS: int
SIZE_BITS: int

Tally = tuple[int, int, float, tuple[int, ...], dict[int, int], tuple[tuple[int, int], ...]]

class Direct:
    """Handles whose READs the loop answers by pread itself (see the C file)."""

    def __init__(
        self,
        max_read: int,
        reorder: int,
        page: int,
        max_slack: int,
        latency_bounds: Sequence[float],
        on_unstuck: Callable[[int], None] | None = None,
    ) -> None: ...
    def add(self, fh: int, fd: int, size: int, windows: Sequence[tuple[int, int]], /) -> None: ...
    def take(self, fh: int, /) -> Tally | None: ...
    def remove(self, fh: int, /) -> Tally | None: ...
    def abandon(self, fh: int, /) -> tuple[int, Tally | None]: ...
    def drain(self) -> list[tuple[int, Tally]]: ...
    def state(self, fh: int, /) -> tuple[bool, tuple[tuple[int, int], ...]] | None: ...
    def read(self, fh: int, offset: int, size: int, /) -> bytes | None: ...
    def __len__(self) -> int: ...

class Later:
    """RELEASE requests the loop answered at once, for their handler to run later (see the C file)."""

    def __init__(self, cap: int) -> None: ...
    def wait(self, timeout: float | None, /) -> bool: ...
    def take(self) -> list[bytes]: ...
    def close(self) -> None: ...
    def keep(self, request: bytes, /) -> bool: ...
    def __len__(self) -> int: ...

def serve(
    fd: int,
    buffer: bytearray,
    handlers: dict[int, Callable[[Any, memoryview], Any]],
    request: Any,
    worker: Any,
    no_reply: object,
    no_reply_ops: Collection[int],
    on_exception: Callable[[int, BaseException], None],
    on_reply_error: Callable[[int], None],
    readers: Readers,
    direct: Direct | None,
    later: Later | None,
    /,
) -> int: ...
