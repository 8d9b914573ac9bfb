"""The disk store's index format: one :class:`Entry` per cached source-file version, and the journal's records.

An entry is one version of one source file (its key: the identity ``stat_key`` gives, any tuple of
ints) and one sparse data file holding the cached bytes *at their source offsets*, so a complete
data file is byte for byte the source file. The file is divided into chunks of :data:`CHUNK` bytes
(the last one shorter); the entry records which chunks are held and the CRC-32 of each held chunk,
computed from the bytes the engine read from the source.

The journal (``journal`` in the cache directory) is an append-only log of records, each framed as
``<payload length u32> <crc32 of type+payload u32> <type u8> <payload>`` after a header naming the
format and the chunk size:

* ``NEXT id``: ids below this were handed out (ids are never reused, so a data file name always
  means one entry).
* ``ENTRY id size key``: a data file ``id`` exists for this key (appended after the file was made).
* ``CHUNKS id first crc...``: chunks ``first..`` of entry ``id`` were written with these CRCs
  (appended only after the write returned).
* ``DROP id``: the entry was evicted or found corrupt (appended when its data file was unlinked).

:func:`replay` reads records up to the first one that is short or fails its CRC (a torn tail after
a crash, or damage): everything after it is ignored and the file is truncated there. Losing records
is always safe: the journal only ever *under*-states what the data files hold, and every byte is
checked against its recorded CRC before it is served. The journal is rewritten as a snapshot of the
live index (in LRU order, so LRU survives a clean restart) when it grows past
:data:`COMPACT_FACTOR` times the snapshot's size: written to ``journal.new``, fsynced, renamed over
``journal``, directory fsynced.

This module does no I/O: it encodes and decodes bytes (the file itself: :mod:`fastfs.fsio.disk.journal`).
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from fastfs.fsio.disk.directory import FORMAT

# A store key: the identity of one source-file version, a short tuple of ints (see :func:`valid_key`).
Key = tuple[int, ...]
# A data file's identity (inode, size, mtime_ns, ctime_ns): any write, truncate or replacement changes it.
Ident = tuple[int, int, int, int]
KIB = 1024
# Unit of checksum and of read verification: the smallest cache.block_size, so every engine block
# (and a whole small file) is a run of whole chunks, and an unaligned read verifies at most 64 KiB extra.
CHUNK = 64 * KIB
# Disk space is charged per chunk rounded up to a filesystem block (4 KiB on ext4/xfs).
PAGE = 4096
MAGIC = b"FFSDJRNL"
HEADER = struct.Struct("<8sII")  # magic, format version, chunk size
RECORD = struct.Struct("<IIB")  # payload length, crc32(type byte + payload), type
NEXT, ENTRY, CHUNKS, DROP = 1, 2, 3, 4
_Q = struct.Struct("<Q")
_ENTRY = struct.Struct("<QQB")  # id, size, number of key ints
_CHUNKS = struct.Struct("<QII")  # id, first chunk, count
# Bytes per key int (signed): wide enough for any dev/ino/size/ns timestamp.
KEY_INT_BYTES = 16
MAX_KEY_INTS = 16
# Longest payload replay accepts (a CHUNKS record of 4 Mi chunks = 256 GiB in one put); longer = damage.
MAX_PAYLOAD = 16 * 1024 * 1024 + _CHUNKS.size
# Rewrite the journal when it is this many times larger than a snapshot of the live index ...
COMPACT_FACTOR = 2
# ... and at least this large (small journals are cheap to replay).
COMPACT_MIN = 4 * 1024 * 1024


def nchunks(size: int) -> int:
    return (size + CHUNK - 1) // CHUNK


def chunk_len(size: int, index: int) -> int:
    return min(CHUNK, size - index * CHUNK)


def charge(length: int) -> int:
    """Disk bytes charged for ``length`` bytes of one chunk."""
    return (length + PAGE - 1) // PAGE * PAGE


def crcs_of(view: memoryview) -> array[int]:
    """CRC-32 of each CHUNK-sized piece of ``view`` (zlib releases the GIL on large buffers)."""
    out = array("I", bytes(4 * nchunks(len(view))))
    for i in range(len(out)):
        out[i] = zlib.crc32(view[i * CHUNK : (i + 1) * CHUNK])
    return out


class Entry:
    """One cached source-file version.

    ``held[i]`` is 1 once chunk ``i`` was written and ``crcs[i]`` recorded; ``used`` is the disk space
    charged for the held chunks. ``live`` turns False when the entry leaves the index (evicted or
    found corrupt); ``created`` is True once its data file exists; ``verified`` is the identity
    (ino, size, mtime_ns, ctime_ns) of the data file when all of it was read back and matched its
    CRCs in this process, ``verifying`` while that check is queued. All fields are guarded by the
    store's catalog lock; the data file's bytes are written only by the entry's writer thread.
    """

    __slots__ = ("id", "key", "size", "held", "crcs", "nheld", "used", "live", "created", "verified", "verifying")

    def __init__(self, entry_id: int, key: Key, size: int) -> None:
        n = nchunks(size)
        self.id = entry_id
        self.key = key
        self.size = size
        self.held = bytearray(n)
        self.crcs = array("I", bytes(4 * n))
        self.nheld = 0
        self.used = 0
        self.live = True
        self.created = False
        self.verified: Ident | None = None
        self.verifying = False

    @property
    def complete(self) -> bool:
        return self.nheld == len(self.held)

    def holds(self, first: int, last: int) -> bool:
        """Whether chunks ``first..last`` (inclusive) are all held."""
        if self.nheld == len(self.held):
            return True
        return self.held.find(0, first, last + 1) < 0

    def mark(self, first: int, crcs: array[int]) -> int:
        """Record chunks ``first..`` as held with these CRCs; returns the bytes newly charged."""
        added = 0
        for i, crc in enumerate(crcs, first):
            self.crcs[i] = crc
            if not self.held[i]:
                self.held[i] = 1
                self.nheld += 1
                added += charge(chunk_len(self.size, i))
        self.used += added
        return added

    def runs(self) -> Iterator[tuple[int, int]]:
        """Maximal runs ``(first, end)`` of held chunks."""
        held = self.held
        pos = 0
        while True:
            first = held.find(1, pos)
            if first < 0:
                return
            end = held.find(0, first)
            if end < 0:
                end = len(held)
            yield first, end
            pos = end


# == encoding ===========================================================================================
def header() -> bytes:
    return HEADER.pack(MAGIC, FORMAT, CHUNK)


def record(rtype: int, payload: bytes) -> bytes:
    body = bytes([rtype]) + payload
    return RECORD.pack(len(payload), zlib.crc32(body), rtype) + payload


def rec_next(next_id: int) -> bytes:
    return record(NEXT, _Q.pack(next_id))


def rec_entry(entry_id: int, size: int, key: Key) -> bytes:
    ints = b"".join(int(k).to_bytes(KEY_INT_BYTES, "little", signed=True) for k in key)
    return record(ENTRY, _ENTRY.pack(entry_id, size, len(key)) + ints)


def rec_chunks(entry_id: int, first: int, crcs: array[int]) -> bytes:
    data = crcs
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
        data = array("I", crcs)
        data.byteswap()
    return record(CHUNKS, _CHUNKS.pack(entry_id, first, len(crcs)) + data.tobytes())


def rec_drop(entry_id: int) -> bytes:
    return record(DROP, _Q.pack(entry_id))


def valid_key(key: object) -> bool:
    """Keys are short tuples of ints that fit KEY_INT_BYTES signed bytes."""
    if not isinstance(key, tuple) or not 0 < len(key) <= MAX_KEY_INTS:
        return False
    limit = 1 << (8 * KEY_INT_BYTES - 1)
    return all(isinstance(k, int) and not isinstance(k, bool) and -limit <= k < limit for k in key)


def snapshot(entries: Iterable[tuple[int, Key, int, bytes, bytes]], next_id: int) -> bytes:
    """A whole journal (header, NEXT, then ENTRY + CHUNKS runs per entry in the given order) from
    ``(id, key, size, held bytes, crcs bytes)`` tuples."""
    parts = [header(), rec_next(next_id)]
    for entry_id, key, size, held, crc_bytes in entries:
        parts.append(rec_entry(entry_id, size, key))
        crcs = array("I")
        crcs.frombytes(crc_bytes)
        pos = 0
        while True:
            first = held.find(1, pos)
            if first < 0:
                break
            end = held.find(0, first)
            if end < 0:
                end = len(held)
            parts.append(rec_chunks(entry_id, first, crcs[first:end]))
            pos = end
    return b"".join(parts)


# == decoding ===========================================================================================
def check_header(data: bytes | memoryview) -> bool:
    if len(data) < HEADER.size:
        return False
    magic, version, chunk = HEADER.unpack_from(data)
    return bool(magic == MAGIC and version == FORMAT and chunk == CHUNK)


def records(data: bytes | memoryview, pos: int = HEADER.size) -> Iterator[tuple[int, memoryview, int]]:
    """``(type, payload, end offset)`` of each intact record from ``pos``; stops at the first bad one."""
    view = memoryview(data)
    size = len(view)
    while pos + RECORD.size <= size:
        length, crc, rtype = RECORD.unpack_from(view, pos)
        start = pos + RECORD.size
        end = start + length
        if length > MAX_PAYLOAD or end > size:
            return
        payload = view[start:end]
        if zlib.crc32(payload, zlib.crc32(bytes([rtype]))) != crc:
            return
        yield rtype, payload, end
        pos = end


@dataclass
class Replay:
    """The index a journal describes: live entries in LRU order (oldest first), the next free id,
    where the intact records end, and ids whose data files are stale (superseded, dropped)."""

    entries: OrderedDict[int, Entry] = field(default_factory=OrderedDict)
    next_id: int = 1
    good_end: int = HEADER.size
    stale: list[int] = field(default_factory=list)


def replay(data: bytes | memoryview) -> Replay:
    """Rebuild the index from a journal's bytes (the header must have been checked)."""
    out = Replay()
    entries = out.entries
    by_key: dict[Key, int] = {}
    for rtype, payload, end in records(data):
        out.good_end = end
        try:
            if rtype == NEXT:
                out.next_id = max(out.next_id, _Q.unpack(payload)[0])
            elif rtype == ENTRY:
                entry_id, size, nkey = _ENTRY.unpack_from(payload)
                ints = payload[_ENTRY.size :]
                if len(ints) != nkey * KEY_INT_BYTES or entry_id in entries or size <= 0:
                    continue
                key = tuple(
                    int.from_bytes(ints[i : i + KEY_INT_BYTES], "little", signed=True)
                    for i in range(0, len(ints), KEY_INT_BYTES)
                )
                old = by_key.pop(key, None)
                if old is not None:  # a newer entry of the same key: the old one's DROP was lost
                    del entries[old]
                    out.stale.append(old)
                entry = Entry(entry_id, key, size)
                entry.created = True
                entries[entry_id] = entry
                by_key[key] = entry_id
                out.next_id = max(out.next_id, entry_id + 1)
            elif rtype == CHUNKS:
                entry_id, first, count = _CHUNKS.unpack_from(payload)
                held = entries.get(entry_id)
                if held is None or len(payload) != _CHUNKS.size + 4 * count or first + count > len(held.held):
                    continue
                crcs = array("I")
                crcs.frombytes(payload[_CHUNKS.size :])
                if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
                    crcs.byteswap()
                held.mark(first, crcs)
                entries.move_to_end(entry_id)
            elif rtype == DROP:
                entry_id = _Q.unpack(payload)[0]
                dropped = entries.pop(entry_id, None)
                if dropped is not None:
                    by_key.pop(dropped.key, None)
                    out.stale.append(entry_id)
        except struct.error:
            continue  # a record of the right type but wrong length: skip it (its CRC matched: our bug)
    return out
