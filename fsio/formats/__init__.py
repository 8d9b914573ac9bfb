"""Format-aware prefetch planners: which byte ranges a loader will read, found from the file's own header.

On open, the engine reads the first :data:`HEAD_BYTES` of a file and calls :func:`plan_for`. Each format
module (``npy``, ``safetensors``, ``torchzip``, ``pickle_payloads``) recognises its file by magic bytes in the
head (never by file name) and, when the header parses, returns a :class:`Plan`: the ranges the loader
(``np.load``, ``safetensors.load_file``, ``torch.load``, ``pickle.load`` / ``paddle.load``) will read, in the
order it reads them. The engine prefetches those ranges right away instead of waiting for a read pattern.

Design:

- Pure and defensive: no I/O of its own beyond the ``read_at`` callback, no threads, no clock. Input is
  untrusted: every length and offset is bounds-checked against the file size, a file that does not parse
  gives ``None`` and :func:`plan_for` never raises (a planner must never break an open).
- Few round trips: all extra reads go through :class:`Reader`, which serves from the head and from earlier
  reads and allows at most :data:`MAX_READS` calls of ``read_at`` per file; a parser that would need more
  falls back to a coarser (still sound) plan.
- Whether a format's loader maps the file (each module's ``MAPPED``: ``safe_open`` does, ``np.load``,
  ``torch.load`` and ``pickle.load`` read it in order) is told from the first bytes alone
  (:func:`loader_maps`, :data:`DETECT_BYTES`): on a source that serves a handle as one stream, the
  route of a large file's open depends on it (:func:`fastfs.fsio.policy.stream_file_route`). There
  alone a file's name is a hint (:func:`maps_by_name`, each module's ``SUFFIXES`` and archives read
  in order, :data:`IN_ORDER_SUFFIXES`), which spares the
  first-page read, one more download on such a client: a wrong hint costs nothing against direct
  reads (a misnamed file passes through, read as a direct reader would, or is served).
- Programs and shared libraries (ELF, :func:`is_program`) get no plan: what the dynamic loader touches
  depends on the symbols and code used. They are told apart so that the stream policy keeps its windows
  short there (:data:`fastfs.fsio.policy.CODE_WINDOW`); they stay out of :func:`loader_maps`, which
  decides routes on stream sources.
- Plans are normalised by :func:`normalize`: clipped to the file, empty ranges dropped, consecutive
  ranges merged where they overlap (order kept, since order is the loader's order; adjacent records stay apart).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

HEAD_BYTES = 64 * 1024  # holds every npy header np.load accepts by default, most safetensors headers and
# a torch.save data.pkl of a few hundred tensors, yet costs one modest read on every open
# Bytes that tell every format here by its magic (safetensors: an 8-byte length and "{"): what
# loader_maps needs; one page.
DETECT_BYTES = 4096
MAX_READS = 2  # read_at calls allowed per file: each is a source round trip made while open() waits
# The first bytes of every ELF object (executables, shared libraries): the dynamic loader maps these.
ELF_MAGIC = b"\x7fELF"

# Names of formats no parser here reads whose loaders read the file from its start to its end in order
# (WebDataset's tar shards, TFRecord files): the name tells a stream source's route (not mapped, see
# maps_by_name) without the first page's read, one more download on such a client (8 tar shards over
# rclone, 2 ms: 16 GETs, the server reading 1.35x the data, against 8 and 1.00x directly).
IN_ORDER_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tfrecord", ".tfrecords")

ReadAt = Callable[[int, int], bytes]


@dataclass(frozen=True)
class Plan:
    """What a loader will read from one file."""

    format: str
    """Short format name: ``npy``, ``safetensors``, ``torchzip`` or ``pickle``."""
    ranges: tuple[tuple[int, int], ...]
    """``(offset, length)`` pairs in the order the loader reads them; overlaps merged, clipped, may be empty."""
    heads: tuple[tuple[int, int], ...] = ()
    """``(offset, length)`` of small regions the loader reads first, one by one, before it reads the ranges
    they head (zip local headers: ``torch.load`` reads every record's header as it meets the record,
    with ``mmap=True`` all of them before any payload). The engine fetches them at once, in parallel."""

    @property
    def total(self) -> int:
        """Bytes planned."""
        return sum(length for _, length in self.ranges)


def _joins(earlier: tuple[int, int], later: tuple[int, int]) -> bool:
    """True when ``later`` overlaps ``earlier``. Adjacent ranges stay apart: each is one record or
    tensor, and the plan uses their boundaries (a reader touching one tensor wants that tensor)."""
    e_start, e_len = earlier
    l_start, l_len = later
    return l_start < e_start + e_len and l_start + l_len > e_start


def normalize(ranges: Iterable[tuple[int, int]], size: int) -> tuple[tuple[int, int], ...]:
    """Clip ranges to ``[0, size)``, drop empty ones, merge each into the previous when :func:`_joins` says so.

    Order is kept (it is the loader's order); adjacent ranges are not merged. Idempotent.
    """
    out: list[tuple[int, int]] = []
    for offset, length in ranges:
        start = max(0, offset)
        end = min(size, offset + length)
        if end <= start:
            continue
        out.append((start, end - start))
        while len(out) >= 2 and _joins(out[-2], out[-1]):
            (a_start, a_len), (b_start, b_len) = out[-2], out.pop()
            new_start = min(a_start, b_start)
            out[-1] = (new_start, max(a_start + a_len, b_start + b_len) - new_start)
    return tuple(out)


class Reader:
    """Bytes of one file from the head and a bounded number of ``read_at`` calls.

    ``get`` serves a range from what is already held; otherwise, while the budget lasts, it makes one
    ``read_at`` call (of ``want`` bytes when a caller knows it will need more than it asks for now).
    Answers ``None`` when the range is outside the file, the budget is spent or the source read short.
    """

    def __init__(self, head: bytes, size: int, read_at: ReadAt, budget: int = MAX_READS) -> None:
        self.size = size
        self.calls = 0
        self._budget = budget
        self._read_at = read_at
        self._chunks: list[tuple[int, bytes]] = [(0, bytes(head[:size]))]

    @property
    def spent(self) -> bool:
        """True when no ``read_at`` call is left."""
        return self.calls >= self._budget

    def held(self, offset: int, length: int) -> bytes | None:
        """The range if already held, without reading."""
        if offset < 0 or length < 0 or offset + length > self.size:
            return None
        for start, data in self._chunks:
            if start <= offset and offset + length <= start + len(data):
                return data[offset - start : offset - start + length]
        return None

    def get(self, offset: int, length: int, want: int = 0) -> bytes | None:
        """The range ``[offset, offset + length)``, read from the source (``max(length, want)`` bytes) if needed."""
        data = self.held(offset, length)
        if data is not None or offset < 0 or length < 0 or offset + length > self.size:
            return data
        if self.spent:
            return None
        count = min(max(length, want), self.size - offset)
        self.calls += 1
        got = self._read_at(offset, count)
        got = bytes(got) if got is not None else b""
        if len(got) < length:
            return None
        self._chunks.append((offset, got[:count]))
        return got[:length]


def preload() -> None:
    """Import every parser, so the first format probe of a daemon does not (a first load through a
    fresh mount waits for its plan). numpy is not imported: the ``.npy`` planner reads plain dtypes
    itself and imports numpy only for the others (see :mod:`.npy`); before it did, the first plan of
    a ``.npy`` took 43-96 ms, numpy's import, against 0.2 ms for the next one, on this project's 2-core
    VM. Called once per engine, on a thread of its own (:meth:`fastfs.fsio.engine.Engine.preload`)."""
    _parsers()


def _parsers() -> tuple[Any, ...]:
    """The format modules, in the order their ``detect`` is tried (imported on first use: the parsers
    import this module)."""
    from fastfs.fsio.formats import npy, pickle_payloads, safetensors, torchzip

    return (npy, torchzip, pickle_payloads, safetensors)


def loader_maps(head: bytes) -> bool:
    """True when the first bytes of a file (:data:`DETECT_BYTES` are enough) are those of a format whose
    loader maps the file instead of reading it (safetensors): its page faults then reach the file out
    of order. By content only; never raises (unknown content: False)."""
    try:
        for module in _parsers():
            if module.detect(head):
                return bool(module.MAPPED)
    except Exception:  # untrusted input: an unknown format, never a failed open
        return False
    return False


def maps_by_name(path: str) -> bool | None:
    """Whether a file's name says its loader maps it (``.safetensors``: True; ``.npy``, ``.pt``,
    ``.pdparams``, ``.pkl`` and the archives of :data:`IN_ORDER_SUFFIXES` ...: False), None for a name
    no format here claims (then :func:`loader_maps` of its first bytes tells). A hint, for the route on
    a stream source only (see the module docstring); plans are never made from names."""
    name = path.rpartition("/")[2].lower()
    for module in _parsers():
        if name.endswith(module.SUFFIXES):
            return bool(module.MAPPED)
    if name.endswith(IN_ORDER_SUFFIXES):
        return False
    return None


def is_program(head: bytes) -> bool:
    """True when the first bytes of a file are those of an ELF object (a program or shared library,
    which the dynamic loader maps and touches sparsely). By content only."""
    return bytes(head[: len(ELF_MAGIC)]) == ELF_MAGIC


def plan_for(head: bytes, size: int, read_at: ReadAt) -> Plan | None:
    """Plan of a file from its first bytes (``head``), its size and a reader of further bytes.

    Detection is by content only. Returns ``None`` for an unknown format or a file that does not parse;
    never raises. Calls ``read_at`` at most :data:`MAX_READS` times.
    """
    try:
        if not isinstance(size, int) or size <= 0:
            return None
        head = bytes(head[:size])
        for module in _parsers():
            if module.detect(head):
                plan = module.plan(head, size, read_at)
                if plan is None:
                    return None
                ranges = normalize(plan.ranges, size)
                heads = tuple((o, n) for o, n in plan.heads if o >= 0 and n > 0 and o + n <= size)
                return Plan(plan.format, ranges, heads)
        return None
    except Exception:  # untrusted input or a failing source read: no plan, never a failed open
        return None
