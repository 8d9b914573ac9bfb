"""Planner for pickle protocol 4/5 files: ``paddle.save`` checkpoints, ``pickle.dump`` of NumPy arrays.

A protocol >= 4 pickler writes ``PROTO`` and then a chain of ``FRAME`` opcodes (an 8-byte length and about
64 KiB of small opcodes each) with every large ``bytes``/``str``/``bytearray`` payload written *between*
frames, as one opcode whose header carries the payload length (``BINBYTES``, ``BINBYTES8``, ``BYTEARRAY8``,
``BINUNICODE``, ``BINUNICODE8``); array data (a NumPy array's ``tobytes()``, a paddle tensor's data) are those
payloads. ``STOP`` ends the stream inside the last frame.

The unpickler reads the stream sequentially from offset 0 to ``STOP``: the frames and the payloads between
them, every byte. The walker follows that chain from the start without parsing frame contents: a frame is
skipped by its length, an out-of-frame opcode is decoded with a length table built from ``pickletools``
(payloads are skipped by their length, never read). It checks every length against the file size, so a
truncated or corrupt chain gives ``None``. A frame that ends with ``STOP`` and is followed by anything but
a frame or a payload ends the stream: bytes after it (another pickle, trailing data) are not read by
``pickle.load``. The plan is the stream, ``[(0, end)]``: the payloads, located precisely, plus the small
frames between them, which the loader reads too (leaving them out would only turn each into a synchronous
miss between two prefetched payloads).

Each hop past a payload lands on the next frame header, which lies beyond the head for large payloads. The
walker reads a :data:`WINDOW` there (one read covers the frame and the next payload's header); when the
read budget runs out before the end of the chain, the plan is the whole file, which is what a valid chain
would give anyway.
"""

from __future__ import annotations

import pickle
import pickletools

from fastfs.fsio.formats import Plan, ReadAt, Reader

PROTO = 0x80
FRAME = 0x95
STOP = ord(".")
PROTOCOLS = (4, 5)  # protocols that frame their stream and write large payloads outside frames
HEADS = tuple(bytes((PROTO, p)) for p in PROTOCOLS)
WINDOW = 256 * 1024  # one read at a frame header holds the frame (cut near 64 KiB, < 128 KiB) and the next header
# what a pickler writes after a frame other than the final one: FRAME, or a large payload opcode
# (BINBYTES, BINBYTES8, BYTEARRAY8, BINUNICODE, BINUNICODE8)
CHAIN_OPS = frozenset(b"\x95B\x8e\x96X\x8d")
MAX_LINE = 4096  # text-argument opcodes (GLOBAL module and name) are short; a longer line is not planned

MAX_STEPS = 256  # frames and opcodes outside frames walked: a stdlib pickler's chain, whose payloads are
# >= 64 KiB each, reaches the read budget within a dozen steps; more steps mean no stdlib pickle

PAIR = -100  # argument kind: two newline-terminated lines (GLOBAL, INST)
_LENGTH_WIDTH = {
    pickletools.TAKEN_FROM_ARGUMENT1: (1, False),
    pickletools.TAKEN_FROM_ARGUMENT4: (4, True),
    pickletools.TAKEN_FROM_ARGUMENT4U: (4, False),
    pickletools.TAKEN_FROM_ARGUMENT8U: (8, False),
}


def _arg_kinds() -> dict[int, int]:
    kinds: dict[int, int] = {}
    for op in pickletools.opcodes:
        arg = op.arg
        if arg is None:
            kind = 0
        elif arg.name == "stringnl_noescape_pair":
            kind = PAIR
        else:
            kind = arg.n
        kinds[op.code.encode("latin-1")[0]] = kind
    return kinds


ARG_KINDS = _arg_kinds()  # opcode byte -> fixed argument length, or a pickletools length kind


class _CorruptError(Exception):
    """The stream cannot be a valid pickle."""


class _OutOfReadsError(Exception):
    """The walk needs bytes beyond the read budget."""


# The loader does not map the file: pickle.load / paddle.load read the stream front to back with read()
# (see fastfs.fsio.formats.loader_maps).
MAPPED = False
# File names that hint at this format (paddle.save's and pickle's usual names): see fastfs.fsio.formats.maps_by_name.
SUFFIXES = (".pdparams", ".pdopt", ".pkl", ".pickle")


def detect(head: bytes) -> bool:
    """True when the head starts with ``PROTO 4`` or ``PROTO 5``."""
    return head[:2] in HEADS


class _Walker:
    def __init__(self, reader: Reader, size: int) -> None:
        self.reader = reader
        self.size = size

    def bytes_at(self, offset: int, length: int) -> bytes:
        if offset + length > self.size:
            raise _CorruptError
        data = self.reader.get(offset, length, want=WINDOW)
        if data is None:
            raise _OutOfReadsError
        return data

    def line_end(self, offset: int) -> int:
        """Offset just past the newline that ends a text argument starting at ``offset``."""
        chunk = self.bytes_at(offset, min(MAX_LINE, self.size - offset))
        newline = chunk.find(b"\n")
        if newline < 0:
            raise _CorruptError
        return offset + newline + 1

    def op_end(self, pos: int) -> int:
        """Offset just past the opcode at ``pos`` (payloads are skipped, not read)."""
        code = self.bytes_at(pos, 1)[0]
        kind = ARG_KINDS.get(code)
        if kind is None:
            raise _CorruptError
        if kind >= 0:
            end = pos + 1 + kind
        elif kind == pickletools.UP_TO_NEWLINE:
            end = self.line_end(pos + 1)
        elif kind == PAIR:
            end = self.line_end(self.line_end(pos + 1))
        else:
            width, signed = _LENGTH_WIDTH[kind]
            length = int.from_bytes(self.bytes_at(pos + 1, width), "little", signed=signed)
            if length < 0:
                raise _CorruptError
            end = pos + 1 + width + length
        if end > self.size:
            raise _CorruptError
        if code == PROTO and self.bytes_at(pos + 1, 1)[0] > pickle.HIGHEST_PROTOCOL:
            raise _CorruptError
        return end

    def stream_end(self) -> int:
        """Offset just past the stream: after ``STOP``, or the file end when the frame chain reaches it."""
        pos = self.op_end(0)  # PROTO
        for _ in range(MAX_STEPS):
            if pos >= self.size:
                return pos
            code = self.bytes_at(pos, 1)[0]
            if code == STOP:
                return pos + 1
            if code != FRAME:
                pos = self.op_end(pos)
                continue
            pos += 9 + int.from_bytes(self.bytes_at(pos + 1, 8), "little")
            if pos > self.size:
                raise _CorruptError
            # a frame ending in STOP and followed by neither a frame nor a payload ended the stream: what
            # follows is not read by pickle.load (after a non-final frame a pickler writes only those)
            if pos < self.size and self.bytes_at(pos - 1, 1)[0] == STOP and self.bytes_at(pos, 1)[0] not in CHAIN_OPS:
                return pos
        raise _CorruptError


def walk(reader: Reader, size: int) -> int | None:
    """End offset of the pickle stream, ``size`` when it cannot be found within the read budget, ``None`` if corrupt."""
    walker = _Walker(reader, size)
    try:
        return walker.stream_end()
    except _OutOfReadsError:
        return size
    except _CorruptError:
        return None


def plan(head: bytes, size: int, read_at: ReadAt) -> Plan | None:
    """Plan of the pickle stream, or ``None`` when it is truncated or corrupt."""
    if not detect(head):
        return None
    end = walk(Reader(head, size, read_at), size)
    if end is None:
        return None
    return Plan("pickle", ((0, end),))
