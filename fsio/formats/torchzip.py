"""Planner for ``torch.save`` files (the zip serialization format, PyTorch >= 1.6).

The file is an uncompressed zip: records ``<archive>/data.pkl`` (the pickled object graph),
``<archive>/data/<key>`` (raw storage bytes, one record per storage), small metadata records
(``byteorder``, ``version``, ``.format_version``, ...), then the central directory, a zip64 end record with
its locator (torch always writes them) and the end-of-central-directory record (EOCD).

``torch.load`` opens the zip (reads EOCD and central directory from the tail), reads the metadata records
and ``data.pkl``, then unpickles it: every storage the unpickler meets is fetched at once by its key
(``persistent_load``), so ``data/<key>`` records are read in the order their keys appear in ``data.pkl``.

Plan, in that order: the central-directory-to-end region, ``data.pkl``, the other non-storage records in
file order, then the storage records in the order of their keys in ``data.pkl`` (the keys are found by
scanning data.pkl's bytes for pickle string opcodes that spell a record key; records not found follow in
file order). A record's range is its local header plus data: from its local header offset to the next
record's (or the central directory's), capped by the largest local header + data + descriptor it can have,
so no local header has to be read. The storage records' local headers are also returned as the plan's
``heads``: ``torch.load`` reads each one (a small read, one source round trip) when it meets the record,
with ``mmap=True`` all of them before it touches any payload.

Reads: one of the tail (:data:`TAIL_BYTES`, holds the directory of files with up to about two thousand
records), one more for a larger directory or for a ``data.pkl`` longer than the head.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from fastfs.fsio.formats import Plan, ReadAt, Reader, normalize

LOCAL_SIG = b"PK\x03\x04"
CENTRAL_SIG = b"PK\x01\x02"
EOCD_SIG = b"PK\x05\x06"
EOCD64_LOCATOR_SIG = b"PK\x06\x07"
EOCD64_SIG = b"PK\x06\x06"

EOCD_FMT = "<4sHHHHIIH"  # signature, disk, cd disk, entries on disk, entries, cd size, cd offset, comment length
EOCD_SIZE = struct.calcsize(EOCD_FMT)
LOCATOR_FMT = "<4sIQI"  # signature, disk of zip64 EOCD, its offset, disk count
LOCATOR_SIZE = struct.calcsize(LOCATOR_FMT)
EOCD64_FMT = "<4sQHHIIQQQQ"  # signature, record size, versions, disks, entries on disk, entries, cd size, cd offset
EOCD64_SIZE = struct.calcsize(EOCD64_FMT)
CENTRAL_FMT = "<4sHHHHHHIIIHHHHHII"  # ..., csize, usize, name/extra/comment lengths, ..., local header offset
CENTRAL_SIZE = struct.calcsize(CENTRAL_FMT)
LOCAL_SIZE = 30  # fixed part of a local file header
MAX_COMMENT = 0xFFFF  # a zip comment's length field is 16 bits: bounds the EOCD search
MAX_EXTRA = 0xFFFF  # a local extra field's length is 16 bits: bounds a record's header when it is not read
MAX_DESCRIPTOR = 24  # zip64 data descriptor with signature, which torch's streaming writer appends to records
ZIP64_MARK = 0xFFFFFFFF  # a 32-bit field with this value is in the zip64 extra field instead
ZIP64_EXTRA_ID = 0x0001

TAIL_BYTES = 256 * 1024  # EOCD records plus the central directory of ~2000 records (about 120 bytes each)
MAX_DIRECTORY = 64 * 1024 * 1024  # central directory size beyond which a file is not planned (~500k records)
MAX_PICKLE_SCAN = 8 * 1024 * 1024  # data.pkl bytes read to find key order (a model of ~50k tensors)
MAX_KEY_LEN = 64  # storage keys are short decimal strings; longer strings are never keys

STRING_OPS = ((b"X", 4), (b"\x8c", 1))  # BINUNICODE (u32 length, protocol 2 default), SHORT_BINUNICODE (u8)


@dataclass(frozen=True)
class Entry:
    """One central directory record."""

    name: str
    offset: int
    """Offset of the local header."""
    csize: int
    """Stored (compressed) data size."""
    name_len: int


# The loader does not map the file: torch.load (mmap=False, its default) reads the directory, then the
# records with read() (see fastfs.fsio.formats.loader_maps).
MAPPED = False
# File names that hint at this format (torch.save's usual names): see fastfs.fsio.formats.maps_by_name.
SUFFIXES = (".pt", ".pth")


def detect(head: bytes) -> bool:
    """True when the head starts with a zip local file header."""
    return head[:4] == LOCAL_SIG


def _find_eocd(reader: Reader, size: int) -> tuple[int, int, int, int] | None:
    """``(cd_offset, cd_size, entries, directory_end)`` from the end records, or ``None``."""
    tail_len = min(size, TAIL_BYTES)
    tail_start = size - tail_len
    tail = reader.get(tail_start, tail_len)
    if tail is None:
        return None
    lowest = max(0, len(tail) - EOCD_SIZE - MAX_COMMENT)
    pos = tail.rfind(EOCD_SIG, lowest)
    while pos >= 0:
        if pos + EOCD_SIZE <= len(tail):
            fields = struct.unpack_from(EOCD_FMT, tail, pos)
            if pos + EOCD_SIZE + fields[7] <= len(tail):
                break
        pos = tail.rfind(EOCD_SIG, lowest, pos)
    if pos < 0:
        return None
    _sig, _disk, _cd_disk, _n_disk, entries, cd_size, cd_offset, _comment = fields
    eocd = tail_start + pos
    directory_end = eocd
    locator = reader.get(eocd - LOCATOR_SIZE, LOCATOR_SIZE) if eocd >= LOCATOR_SIZE else None
    if locator is not None and locator[:4] == EOCD64_LOCATOR_SIG:
        _sig, _disk, eocd64, _disks = struct.unpack(LOCATOR_FMT, locator)
        if eocd64 + EOCD64_SIZE > eocd - LOCATOR_SIZE:
            return None
        record = reader.get(eocd64, EOCD64_SIZE)
        if record is None or record[:4] != EOCD64_SIG:
            return None
        fields64 = struct.unpack(EOCD64_FMT, record)
        entries, cd_size, cd_offset = fields64[7], fields64[8], fields64[9]
        directory_end = eocd64
    if cd_offset + cd_size > directory_end or cd_size > MAX_DIRECTORY or entries > cd_size // CENTRAL_SIZE:
        return None
    return cd_offset, cd_size, entries, directory_end


def _zip64_values(extra: bytes, wanted: int) -> list[int] | None:
    """The first ``wanted`` u64 values of the zip64 extra field."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == ZIP64_EXTRA_ID:
            if length < 8 * wanted or pos + 4 + length > len(extra):
                return None
            return list(struct.unpack_from(f"<{wanted}Q", extra, pos + 4))
        pos += 4 + length
    return None


def parse_directory(cd: bytes, entries: int) -> list[Entry] | None:
    """Records of a central directory, or ``None`` if it is malformed."""
    out: list[Entry] = []
    pos = 0
    for _ in range(entries):
        if pos + CENTRAL_SIZE > len(cd):
            return None
        fields = struct.unpack_from(CENTRAL_FMT, cd, pos)
        if fields[0] != CENTRAL_SIG:
            return None
        csize, usize, name_len, extra_len, comment_len, offset = (
            fields[8], fields[9], fields[10], fields[11], fields[12], fields[16],
        )  # fmt: skip
        end = pos + CENTRAL_SIZE + name_len + extra_len + comment_len
        if end > len(cd):
            return None
        name = cd[pos + CENTRAL_SIZE : pos + CENTRAL_SIZE + name_len].decode("utf-8", "replace")
        marked = [v == ZIP64_MARK for v in (usize, csize, offset)]
        if any(marked):
            extra = cd[pos + CENTRAL_SIZE + name_len : pos + CENTRAL_SIZE + name_len + extra_len]
            values = _zip64_values(extra, sum(marked))
            if values is None:
                return None
            it = iter(values)
            usize = next(it) if marked[0] else usize
            csize = next(it) if marked[1] else csize
            offset = next(it) if marked[2] else offset
        out.append(Entry(name, offset, csize, name_len))
        pos = end
    return out


def key_order(pickle_bytes: bytes, keys: set[str]) -> list[str]:
    """Keys in the order a pickle's string opcodes first spell them."""
    wanted = {k.encode("utf-8"): k for k in keys}
    first: dict[str, int] = {}
    for opcode, width in STRING_OPS:
        pos = pickle_bytes.find(opcode)
        while pos >= 0:
            start = pos + 1 + width
            length = int.from_bytes(pickle_bytes[pos + 1 : start], "little")
            if 0 < length <= MAX_KEY_LEN:
                key = wanted.get(pickle_bytes[start : start + length])
                if key is not None and (key not in first or pos < first[key]):
                    first[key] = pos
            pos = pickle_bytes.find(opcode, pos + 1)
    return sorted(first, key=first.__getitem__)


def _pickle_bytes(reader: Reader, entry: Entry, span: int) -> bytes | None:
    """Stored bytes of the data.pkl record if cheap to get (held, or one read while the budget lasts)."""
    if entry.csize > MAX_PICKLE_SCAN:
        return None
    local = reader.get(entry.offset, LOCAL_SIZE, want=span)
    if local is None or local[:4] != LOCAL_SIG:
        return None
    name_len, extra_len = struct.unpack_from("<HH", local, 26)
    return reader.get(entry.offset + LOCAL_SIZE + name_len + extra_len, entry.csize)


def plan(head: bytes, size: int, read_at: ReadAt) -> Plan | None:
    """Plan of a torch zip checkpoint, or ``None`` when the zip is malformed or is no torch checkpoint."""
    reader = Reader(head, size, read_at)
    found = _find_eocd(reader, size)
    if found is None:
        return None
    cd_offset, cd_size, count, _end = found
    cd = reader.get(cd_offset, cd_size)
    if cd is None:
        return None
    entries = parse_directory(cd, count)
    if not entries:
        return None
    pkl = next((e for e in entries if e.name.count("/") == 1 and e.name.endswith("/data.pkl")), None)
    if pkl is None:
        return None
    prefix = pkl.name[: -len("data.pkl")]
    by_offset = sorted(entries, key=lambda e: e.offset)
    spans: dict[Entry, tuple[int, int]] = {}
    for i, e in enumerate(by_offset):
        if e.offset + LOCAL_SIZE + e.name_len + e.csize > cd_offset:
            return None
        boundary = by_offset[i + 1].offset if i + 1 < len(by_offset) else cd_offset
        limit = e.offset + LOCAL_SIZE + e.name_len + MAX_EXTRA + e.csize + MAX_DESCRIPTOR
        spans[e] = (e.offset, max(0, min(boundary, limit) - e.offset))

    data_prefix = prefix + "data/"
    storages = {e.name[len(data_prefix) :]: e for e in by_offset if e.name.startswith(data_prefix)}
    storage_set = set(storages.values())
    others = [e for e in by_offset if e != pkl and e not in storage_set]
    pickle_bytes = _pickle_bytes(reader, pkl, spans[pkl][1])
    order = key_order(pickle_bytes, set(storages)) if pickle_bytes is not None else []
    listed = set(order)
    ordered = [storages[k] for k in order] + [e for k, e in storages.items() if k not in listed]

    ranges = [(cd_offset, size - cd_offset), spans[pkl]]
    ranges += [spans[e] for e in others]
    ranges += [spans[e] for e in ordered]
    # the local header of each storage record, in the order torch.load looks them up
    heads = tuple((e.offset, LOCAL_SIZE + e.name_len) for e in ordered)
    return Plan("torchzip", normalize(ranges, size), heads)
