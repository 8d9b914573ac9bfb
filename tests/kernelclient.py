"""A fake kernel for protocol tests without a mount: speaks FUSE over a SOCK_SEQPACKET socket pair.

A :class:`~fastfs.daemon.kernel.session.Session` reads one request per ``readv`` and writes one
reply per ``writev``, which is exactly what a sequenced-packet socket preserves, so the session
and the operations adapter run unchanged against :class:`FakeKernel` (the descriptor clone ioctl
fails on a socket and the session falls back to sharing the one descriptor, as on old kernels).
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import struct
import threading
import time

from fastfs.daemon.kernel import abi
from fastfs.daemon.kernel.abi import Init, Op

# Everything a 6.18 kernel offers in INIT (flags and flags2).
KERNEL_FLAGS = int(
    Init.ASYNC_READ
    | Init.POSIX_LOCKS
    | Init.ATOMIC_O_TRUNC
    | Init.EXPORT_SUPPORT
    | Init.BIG_WRITES
    | Init.DONT_MASK
    | Init.SPLICE_WRITE
    | Init.SPLICE_MOVE
    | Init.SPLICE_READ
    | Init.FLOCK_LOCKS
    | Init.HAS_IOCTL_DIR
    | Init.AUTO_INVAL_DATA
    | Init.DO_READDIRPLUS
    | Init.READDIRPLUS_AUTO
    | Init.ASYNC_DIO
    | Init.WRITEBACK_CACHE
    | Init.NO_OPEN_SUPPORT
    | Init.PARALLEL_DIROPS
    | Init.HANDLE_KILLPRIV
    | Init.POSIX_ACL
    | Init.ABORT_ERROR
    | Init.MAX_PAGES
    | Init.CACHE_SYMLINKS
    | Init.NO_OPENDIR_SUPPORT
    | Init.EXPLICIT_INVAL_DATA
    | Init.MAP_ALIGNMENT
    | Init.SUBMOUNTS
    | Init.HANDLE_KILLPRIV_V2
    | Init.SETXATTR_EXT
    | Init.INIT_EXT
    | Init.SECURITY_CTX
    | Init.HAS_INODE_DAX
    | Init.CREATE_SUPP_GROUP
    | Init.HAS_EXPIRE_ONLY
    | Init.DIRECT_IO_ALLOW_MMAP
    | Init.PASSTHROUGH
    | Init.NO_EXPORT_SUPPORT
    | Init.HAS_RESEND
    | Init.ALLOW_IDMAP
    | Init.OVER_IO_URING
    | Init.REQUEST_TIMEOUT
)
INIT_REPLY = struct.Struct("<IIIIHHIIHHIIH")
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)  # root may exceed net.core.wmem_max
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)


def init_body(major: int = 7, minor: int = 45, flags: int = KERNEL_FLAGS, max_readahead: int = 131072) -> bytes:
    low, high = abi.split_flags(flags)
    return abi.INIT_IN.pack(major, minor, max_readahead, low, high)


class FakeKernel:
    """The kernel side of a connection: sends requests, collects replies by unique id."""

    def __init__(self) -> None:
        self.kernel, self.daemon = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for sock in (self.kernel, self.daemon):  # one packet must hold a 1 MiB READ reply
            for opt in (SO_SNDBUFFORCE, SO_RCVBUFFORCE):
                sock.setsockopt(socket.SOL_SOCKET, opt, 8 << 20)
        self.fd = self.daemon.detach()  # the session owns and closes it
        self._unique = itertools.count(2, 2)
        self._lock = threading.Lock()
        self._replies: dict[int, tuple[int, bytes]] = {}
        self.notifications: list[tuple[int, bytes]] = []

    def send(self, opcode: int, body: bytes = b"", nodeid: int = 1, uid: int = 0, gid: int = 0, pid: int = 1) -> int:
        unique = next(self._unique)
        header = abi.IN_HEADER.pack(abi.IN_HEADER.size + len(body), opcode, unique, nodeid, uid, gid, pid, 0, 0)
        self.kernel.send(header + body)
        return unique

    def reply(self, unique: int, timeout: float = 10.0) -> tuple[int, bytes]:
        """(errno or 0, payload) of the reply to *unique* (safe to call from several threads)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if unique in self._replies:
                    return self._replies.pop(unique)
                ready, _, _ = select.select([self.kernel], [], [], 0.02)
                if ready:
                    data = self.kernel.recv(1 << 22)
                    length, error, got = abi.OUT_HEADER.unpack_from(data)
                    assert length == len(data), (length, len(data))
                    payload = data[abi.OUT_HEADER.size :]
                    if got == 0:
                        self.notifications.append((error, payload))
                    else:
                        self._replies[got] = (-error, payload)
                    continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"no reply to request {unique}")

    def call(self, opcode: int, body: bytes = b"", nodeid: int = 1, **kw: int) -> tuple[int, bytes]:
        return self.reply(self.send(opcode, body, nodeid, **kw))

    def silent(self, timeout: float = 0.3) -> bool:
        """True when nothing arrives within *timeout* (a request that takes no reply)."""
        ready, _, _ = select.select([self.kernel], [], [], timeout)
        return not ready

    def close(self) -> None:
        self.kernel.close()


def lookup(fk: FakeKernel, parent: int, name: str) -> tuple[int, bytes]:
    return fk.call(Op.LOOKUP, os.fsencode(name) + b"\0", parent)


def entry_nodeid(payload: bytes) -> int:
    return abi.ENTRY_OUT.unpack_from(payload)[0]


def entry_attr(payload: bytes) -> tuple:
    return abi.ENTRY_OUT.unpack_from(payload)[6:]


def read_body(fh: int, offset: int, size: int) -> bytes:
    return abi.READ_IN.pack(fh, offset, size, 0, 0, 0, 0)


def parse_dirents(payload: bytes, plus: bool = False) -> list[tuple[str, int, int]]:
    """(name, offset of the next entry, node id (plus) or inode) of a READDIR(PLUS) reply."""
    out = []
    pos = 0
    while pos < len(payload):
        nodeid = abi.ENTRY_OUT.unpack_from(payload, pos)[0] if plus else None
        base = pos + (abi.ENTRY_OUT.size if plus else 0)
        ino, off, namelen, _kind = abi.DIRENT.unpack_from(payload, base)
        name = payload[base + abi.DIRENT.size : base + abi.DIRENT.size + namelen].decode()
        out.append((name, off, nodeid if plus else ino))
        pos = base + abi.rec_align(abi.DIRENT.size + namelen)
    return out
