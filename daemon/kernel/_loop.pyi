"""Type stub of the native request loop (``_loop.c``), built when a C compiler is at hand."""

from collections.abc import Callable, Collection
from typing import Any

class Readers:
    """The reader places of one session's workers (at most *spare* read the device at once)."""

    def __init__(self, spare: int) -> None: ...
    def end(self) -> None: ...
    def counts(self) -> tuple[int, int, int]: ...

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
    /,
) -> int: ...
