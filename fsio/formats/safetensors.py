"""Planner for safetensors files.

Layout: an 8-byte little-endian header length ``N``, a JSON header of ``N`` bytes (an object starting with
``{``: tensor name -> ``{"dtype", "shape", "data_offsets": [begin, end]}`` plus an optional
``__metadata__``), then the data buffer where each tensor occupies ``[8 + N + begin, 8 + N + end)``.
``safetensors.load_file`` / ``safe_open`` parse the header, then map the data buffer and touch each tensor.

Plan: the part of the header beyond the head (only for headers longer than the head; one extra read), then
the tensor ranges sorted by offset and merged. The header is validated as the library does (types, offset
order, bounds, byte count matching dtype and shape for known dtypes); anything off gives ``None``.
"""

from __future__ import annotations

import json
import math
import struct

from fastfs.fsio.formats import Plan, ReadAt, Reader, normalize

PREFIX = 8  # bytes of the little-endian u64 header length
MAX_HEADER = 100 * 1000 * 1000  # the safetensors library refuses larger headers (its MAX_HEADER_SIZE)
METADATA_KEY = "__metadata__"
# The loader maps the file (safe_open): its page faults read around each fault, out of order for a
# source that serves a handle as one stream (see fastfs.fsio.formats.loader_maps).
MAPPED = True
# File names that hint at this format (the library's name): see fastfs.fsio.formats.maps_by_name.
SUFFIXES = (".safetensors",)

# Bytes per element of the dtypes whose size is a whole number of bytes (sub-byte dtypes are not size-checked).
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}  # fmt: skip


def _header_length(head: bytes) -> int | None:
    if len(head) < PREFIX + 1:
        return None
    length: int = struct.unpack_from("<Q", head, 0)[0]
    if not 2 <= length <= MAX_HEADER or head[PREFIX : PREFIX + 1] != b"{":
        return None
    return length


def detect(head: bytes) -> bool:
    """True when the head starts with a sane header length followed by ``{``."""
    return _header_length(head) is not None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def tensor_spans(header: dict[str, object], data_size: int) -> list[tuple[int, int]] | None:
    """``(begin, end)`` of each tensor relative to the data buffer, or ``None`` if the header is invalid."""
    spans: list[tuple[int, int]] = []
    for name, info in header.items():
        if name == METADATA_KEY:
            if info is not None and not isinstance(info, dict):
                return None
            continue
        if not isinstance(info, dict):
            return None
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or not isinstance(shape, list) or not all(_is_int(n) for n in shape):
            return None
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(n) for n in offsets):
            return None
        begin, end = offsets
        if begin > end or end > data_size:
            return None
        itemsize = DTYPE_SIZES.get(dtype)
        if itemsize is not None and math.prod(shape) * itemsize != end - begin:
            return None
        spans.append((begin, end))
    return sorted(spans)


def plan(head: bytes, size: int, read_at: ReadAt) -> Plan | None:
    """Plan of the header remainder (if any) and the tensor data, or ``None`` for an invalid file."""
    length = _header_length(head)
    if length is None or PREFIX + length > size:
        return None
    reader = Reader(head, size, read_at)
    raw = reader.get(PREFIX, length)
    if raw is None:
        return None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    base = PREFIX + length
    spans = tensor_spans(header, size - base)
    if spans is None:
        return None
    ranges: list[tuple[int, int]] = []
    if base > len(head):
        ranges.append((len(head), base - len(head)))
    ranges.extend((base + begin, end - begin) for begin, end in spans)
    return Plan("safetensors", normalize(ranges, size))
