"""Planner for NumPy ``.npy`` files.

A ``.npy`` file is the magic ``\\x93NUMPY``, a version, a header length (u16 for 1.0, u32 for 2.0/3.0), a
Python-literal header dict (``descr``, ``fortran_order``, ``shape``) and then the raw array bytes.
``np.load`` (plain or memory-mapped) reads exactly ``prod(shape) * itemsize`` bytes from the data offset,
so that is the plan.

The header is parsed here with the same rules as ``numpy.lib.format`` (``ast.literal_eval``, the same keys
and types, Python 2 ``L`` integer suffixes accepted; the element size of a plain dtype string such as
``<f4`` or ``|S10`` read from the string itself, any other ``descr`` given to numpy's own
``descr_to_dtype``, so a daemon imports numpy, 12 MiB and 40-100 ms, only for structured dtypes) but
without numpy's tokenizer-based repair pass, which costs a hostile header tens of milliseconds; deeply
nested headers are refused before evaluation for the same reason. The header-size limit is ``np.load``'s
default, so a header always lies within the head and no extra read is needed. Object arrays are pickles
inside the file, not raw data: no plan.
"""

from __future__ import annotations

import ast
import math
import re
import struct

from fastfs.fsio.formats import Plan, ReadAt

MAGIC = b"\x93NUMPY"
MAX_HEADER = 10_000  # np.load's default max_header_size: a header it refuses by default is not worth planning
MAX_NESTING = 32  # bracket depth of a header: real ones (nested structured dtypes) stay far below, and deep
# nesting is what makes evaluating a hostile header slow
PREFIX_V1 = 10  # magic, version, u16 header length
PREFIX_V2 = 12  # magic, version, u32 header length
HEADER_KEYS = {"descr", "fortran_order", "shape"}
PY2_LONG = re.compile(r"\b(\d+)L\b")  # Python 2 wrote shapes like (10L, 3L)
OPENERS = b"([{"
CLOSERS = b")]}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in OPENERS + CLOSERS)
# A plain dtype string (numpy's array-protocol typestr): byte order, kind and size (bytes; characters of 4
# bytes for U). Object ("|O"), datetime, structured and sub-array dtypes are not plain: numpy parses them.
_PLAIN_DESCR = re.compile(r"[<>|=]?([biufcSaVU])([1-9][0-9]{0,8})")
# The sizes numpy gives each numeric kind on the platforms fastfs runs on (any other: numpy decides).
_NUMERIC_SIZES = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8, 16), "c": (8, 16, 32)}


def _too_deep(header: bytes) -> bool:
    depth = 0
    for byte in header.translate(None, _NOT_BRACKETS):
        depth += 1 if byte in OPENERS else -1
        if depth > MAX_NESTING:
            return True
    return False


# The loader does not map the file: np.load reads the header, then the array in one read()
# (see fastfs.fsio.formats.loader_maps).
MAPPED = False
# File names that hint at this format (np.save's name): see fastfs.fsio.formats.maps_by_name.
SUFFIXES = (".npy",)


def detect(head: bytes) -> bool:
    """True when the head starts with the npy magic."""
    return head[: len(MAGIC)] == MAGIC


def itemsize(descr: object) -> int | None:
    """Bytes per element of a plain dtype string (see :data:`_PLAIN_DESCR`), else None (numpy decides)."""
    if not isinstance(descr, str):
        return None
    match = _PLAIN_DESCR.fullmatch(descr)
    if match is None:
        return None
    kind, size = match.group(1), int(match.group(2))
    sizes = _NUMERIC_SIZES.get(kind)
    if sizes is not None and size not in sizes:
        return None
    return size * 4 if kind == "U" else size


def parse(head: bytes) -> tuple[int, int] | None:
    """``(data_offset, data_bytes)`` of an npy head, or ``None`` when the header is invalid or holds objects."""
    if len(head) < PREFIX_V2 or not detect(head):
        return None
    version = (head[6], head[7])
    if version == (1, 0):
        (length,), start = struct.unpack_from("<H", head, 8), PREFIX_V1
    elif version in ((2, 0), (3, 0)):
        (length,), start = struct.unpack_from("<I", head, 8), PREFIX_V2
    else:
        return None
    raw = head[start : start + length]
    if length > MAX_HEADER or len(raw) < length or _too_deep(raw):
        return None
    try:
        text = PY2_LONG.sub(r"\1", raw.decode("utf-8" if version == (3, 0) else "latin-1"))
        header = ast.literal_eval(text)
    except Exception:  # any malformed literal (SyntaxError, ValueError, MemoryError, RecursionError, ...)
        return None
    if not isinstance(header, dict) or set(header) != HEADER_KEYS:
        return None
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        return None
    if not isinstance(fortran, bool):
        return None
    size = itemsize(header["descr"])
    if size is None:
        from numpy.lib import format as npformat

        try:
            dtype = npformat.descr_to_dtype(header["descr"])
        except Exception:  # numpy refuses the descr (TypeError, ValueError, ...)
            return None
        if dtype.hasobject:
            return None
        size = dtype.itemsize
    return start + length, math.prod(shape) * size


def plan(head: bytes, size: int, read_at: ReadAt) -> Plan | None:
    """Plan of the array data, or ``None`` when the header is invalid or the file is shorter than its data."""
    parsed = parse(head)
    if parsed is None:
        return None
    offset, nbytes = parsed
    if offset + nbytes > size:
        return None
    return Plan("npy", ((offset, nbytes),) if nbytes else ())
