"""The operations adapter: kernel requests (node ids, handles, offsets) to engine calls (paths).

Design: every decision about caching, prefetch and the route of an open lives in the engine; this
module translates. It keeps the node table (:mod:`fastfs.fsio.nodes`: one node id per source
version), parses request bodies with the structs of :mod:`fastfs.daemon.kernel.abi`, and builds
reply payloads. Errors: an ``OSError`` from the engine becomes the errno of the reply (the session
turns other exceptions into EIO with a rate-limited log line; there is no per-request logging).

Consistency (one inode per version, close-to-open):

* LOOKUP stats the source; a name whose source changed gets a new node id, so the kernel keeps the
  old version's inode (page cache, size, mappings) for those who still hold it.
* OPEN revalidates: the engine opens the source and, when it is no longer the node's version,
  answers ESTALE; the kernel then looks the name up again (``LOOKUP_REVAL``) and opens the new
  node. Every open of a node may keep the kernel's page cache (``FOPEN_KEEP_CACHE``): its pages are
  that version's.
* GETATTR of an open file (``fstat``) answers the node's own version. A path ``stat`` of a node whose
  source changed or vanished answers ESTALE, which makes the kernel revalidate the name the same way.

Route of an open (``fuse.passthrough``): *served* opens are read through the engine; *passthrough*
opens hand the source descriptor to the kernel (``FUSE_DEV_IOC_BACKING_OPEN``) so reads and mmap go
straight to the source file and never reach the daemon. The kernel requires every open handle of
one inode to use the same route and backing file: the node table keeps the route and backing id
while a node has open handles; the id is closed after its last release.

Control channel: a hidden directory ``/.fastfs`` (reserved node ids, not listed in the root; a
source entry of that name is hidden) holds ``stats``, a JSON snapshot served with direct I/O, one
snapshot per open; the ``user.fastfs.*`` extended attributes (stats, warm jobs, cache reports,
evictions). Both are answered by a :class:`~fastfs.daemon.controller.Controller` with the request's
caller (uid, gid, pid from the request header, supplementary groups from ``/proc``), which decides
what the answer may contain. The mount is read-only: every write-type request answers EROFS.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import threading
import time
from collections import OrderedDict
from typing import Any

from fastfs.daemon import ownership
from fastfs.daemon.caller import caller_of
from fastfs.daemon.control import CONTROL_NAME, STATS_DIR, STATS_FILE, STATS_NAME
from fastfs.daemon.controller import Controller, is_control_xattr
from fastfs.daemon.kernel import abi
from fastfs.daemon.kernel.abi import Op
from fastfs.daemon.kernel.session import NO_REPLY, Request
from fastfs.fsio.api import EngineAPI
from fastfs.fsio.engine import OpenResult, ReplyParts
from fastfs.fsio.nodes import ROOT_ID, Node, NodeTable, join
from fastfs.fsio.policy import ROUTE_PASSTHROUGH

log = logging.getLogger("fastfs.ops")

ENOATTR = getattr(errno, "ENOATTR", errno.ENODATA)
# Reserved node ids of the control directory and its stats file (the node table starts at 16).
CONTROL_ID = 2
STATS_ID = 3
# Handles of open stats snapshots start here, far above any handle the engine hands out.
VIRTUAL_FH_BASE = 1 << 62
# Directory listings kept between the READDIR requests of one pass (offsets index into them).
MAX_LISTINGS = 256
# Size reported for the stats file before it is opened (reads use direct I/O: the real length wins).
STATS_SIZE_ESTIMATE = 64 * 1024
# no_open: the fixed size of the stats file, each snapshot padded with spaces to it (JSON allows
# trailing whitespace) or, when larger, cut down by dropping top files as the stats xattr is;
# 4x the xattr's 64 KiB, so the full table of top files fits with long paths.
NOFH_STATS_SIZE = 256 * 1024
# Attributes the kernel reports for the virtual nodes' block size.
VIRTUAL_BLKSIZE = 4096
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT

_NUL = b"\0"


def _split_seconds(seconds: float) -> tuple[int, int]:
    whole = int(seconds)
    return whole, int((seconds - whole) * 1e9)


def _encode_dev(rdev: int) -> int:
    """st_rdev -> the kernel's 32-bit ``new_encode_dev`` form that fuse_attr.rdev carries."""
    major, minor = os.major(rdev), os.minor(rdev)
    return ((minor & 0xFF) | (major << 8) | ((minor & ~0xFF) << 12)) & 0xFFFFFFFF


def attr_fields(st: os.stat_result, own: ownership.Ownership | None = None) -> tuple[int, ...]:
    """``os.stat_result`` -> the fields of ``struct fuse_attr``, in order (ownership options applied)."""
    a_s, a_ns = divmod(st.st_atime_ns, 1_000_000_000)
    m_s, m_ns = divmod(st.st_mtime_ns, 1_000_000_000)
    c_s, c_ns = divmod(st.st_ctime_ns, 1_000_000_000)
    rdev = _encode_dev(st.st_rdev) if st.st_rdev else 0
    mode, uid, gid = ownership.translate(st.st_mode, st.st_uid, st.st_gid, own)
    return (
        st.st_ino,
        st.st_size,
        st.st_blocks,
        a_s & 0xFFFFFFFFFFFFFFFF,
        m_s & 0xFFFFFFFFFFFFFFFF,
        c_s & 0xFFFFFFFFFFFFFFFF,
        a_ns,
        m_ns,
        c_ns,
        mode,
        st.st_nlink & 0xFFFFFFFF,
        uid,
        gid,
        rdev,
        st.st_blksize & 0xFFFFFFFF,
        0,
    )


def _name(body: memoryview) -> str:
    """The NUL-terminated name of a request body."""
    raw = bytes(body)
    end = raw.find(_NUL)
    return os.fsdecode(raw if end < 0 else raw[:end])


def _erofs(request: Request, body: memoryview) -> Any:
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))


class _VirtualStat:
    """Attributes of the control directory and stats file (``os.stat_result``-shaped)."""

    def __init__(self, mode: int, size: int, nlink: int, ino: int, when_ns: int) -> None:
        self.st_mode, self.st_size, self.st_nlink, self.st_ino = mode, size, nlink, ino
        self.st_uid, self.st_gid = os.getuid(), os.getgid()
        self.st_atime_ns = self.st_mtime_ns = self.st_ctime_ns = when_ns
        self.st_blocks = (size + 511) // 512
        self.st_rdev = 0
        self.st_blksize = VIRTUAL_BLKSIZE


class KernelOps:
    """Handlers of one mount's kernel requests over one engine (see the module docstring).

    ``session`` (set by the daemon before the first request) gives access to backing files and
    notifications; ``mount_info`` (source, mountpoint) is added to stats snapshots.

    Concurrency: ``_lock`` guards ``_handles``, ``_virtual``, ``_listings``,
    ``_next_vfh``, ``_lookups`` and ``lookups_max``; the node table has its own lock; the engine documents its own.
    """

    def __init__(
        self, engine: EngineAPI, mount_info: dict[str, Any] | None = None, no_open: bool | None = None
    ) -> None:
        self.engine = engine
        fc = engine.config.fuse
        self.mount_info = dict(mount_info or {})
        self.no_open = bool(fc.no_open if no_open is None else no_open)
        self.session: Any = None
        self.nodes = NodeTable(engine.lstat("/"), check_invariants=engine.config.cache.check_invariants)
        self._entry_valid = _split_seconds(fc.entry_timeout)
        self._attr_valid = _split_seconds(fc.attr_timeout)
        self._negative_valid = _split_seconds(fc.negative_timeout)
        self._lock = threading.Lock()
        self._handles: dict[int, Node] = {}
        self._virtual: dict[int, bytes] = {}
        self._next_vfh = VIRTUAL_FH_BASE
        self._nofh_stats: dict[bool, bytes] = {}  # no_open: the stats file per view (complete or redacted)
        self._listings: OrderedDict[int, list[tuple[str, int, int]]] = OrderedDict()
        self._started_ns = time.time_ns()
        self._passthrough_failed = False
        self._ownership = ownership.Ownership.from_config(fc)
        self.control = Controller(engine, self.mount_info, extra=self._kernel_section)
        self._lookups = 0  # lookups being answered now
        self.lookups_max = 0  # most lookups answered at once (the kernel sends them in parallel)

    def handlers(self) -> dict[int, Any]:
        """Opcode -> handler, for :class:`~fastfs.daemon.kernel.session.Session`."""
        table: dict[int, Any] = {
            Op.LOOKUP: self.lookup,
            Op.FORGET: self.forget,
            Op.BATCH_FORGET: self.batch_forget,
            Op.GETATTR: self.getattr,
            Op.READLINK: self.readlink,
            Op.OPEN: self.open,
            Op.READ: self.read,
            Op.RELEASE: self.release,
            Op.FLUSH: self.flush,
            Op.OPENDIR: self.opendir,
            Op.READDIR: self.readdir,
            Op.READDIRPLUS: self.readdirplus,
            Op.RELEASEDIR: self.releasedir,
            Op.STATFS: self.statfs,
            Op.GETXATTR: self.getxattr,
            Op.LISTXATTR: self.listxattr,
            Op.ACCESS: self.access,
            Op.INTERRUPT: self.interrupt,
            Op.DESTROY: self.destroy,
        }
        for opcode in abi.WRITE_OPS:
            table[opcode] = _erofs
        return table

    # -- nodes ----------------------------------------------------------------------------------
    def _node(self, nodeid: int) -> Node:
        node = self.nodes.get(nodeid)
        if node is None:
            raise OSError(errno.ESTALE, "unknown node id")
        return node

    def _entry(self, nodeid: int, st: Any, entry_valid: tuple[int, int] | None = None) -> bytes:
        ev = entry_valid or self._entry_valid
        av = self._attr_valid
        return abi.ENTRY_OUT.pack(nodeid, 0, ev[0], av[0], ev[1], av[1], *attr_fields(st, self._ownership))

    def _attr(self, st: Any) -> bytes:
        av = self._attr_valid
        return abi.ATTR_OUT.pack(av[0], av[1], 0, *attr_fields(st, self._ownership))

    def lookup(self, request: Request, body: memoryview) -> bytes:
        name = _name(body)
        parent_id = request.nodeid
        if parent_id == CONTROL_ID:
            if name != STATS_NAME:
                raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
            return self._entry(STATS_ID, self._virtual_stat(STATS_ID))
        if parent_id == STATS_ID:
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        if parent_id == ROOT_ID and name == CONTROL_NAME:
            return self._entry(CONTROL_ID, self._virtual_stat(CONTROL_ID))
        parent = self._node(parent_id)
        with self._lock:
            self._lookups += 1
            self.lookups_max = max(self.lookups_max, self._lookups)
        try:
            st = self.engine.lstat(join(parent.path, name))
        except FileNotFoundError:
            if self._negative_valid != (0, 0):
                # node id 0 with a timeout: the kernel caches the name as absent
                return abi.ENTRY_OUT.pack(0, 0, *self._negative_valid[:1], 0, self._negative_valid[1], 0, *([0] * 16))
            raise
        finally:
            with self._lock:
                self._lookups -= 1
        node = self.nodes.lookup(parent, name, st)
        return self._entry(node.nodeid, st)

    def forget(self, request: Request, body: memoryview) -> Any:
        (count,) = abi.FORGET_IN.unpack_from(body)
        self.nodes.forget(request.nodeid, count)
        return NO_REPLY

    def batch_forget(self, request: Request, body: memoryview) -> Any:
        count, _ = abi.BATCH_FORGET_IN.unpack_from(body)
        base = abi.BATCH_FORGET_IN.size
        step = abi.FORGET_ONE.size
        for i in range(min(count, (len(body) - base) // step)):
            nodeid, nlookup = abi.FORGET_ONE.unpack_from(body, base + i * step)
            self.nodes.forget(nodeid, nlookup)
        return NO_REPLY

    def getattr(self, request: Request, body: memoryview) -> bytes:
        nodeid = request.nodeid
        if nodeid in (CONTROL_ID, STATS_ID):
            return self._attr(self._virtual_stat(nodeid))
        node = self._node(nodeid)
        flags, _, fh = abi.GETATTR_IN.unpack_from(body) if len(body) >= abi.GETATTR_IN.size else (0, 0, 0)
        if flags & abi.GETATTR_FH and not node.is_dir:
            return self._attr(node.st)  # fstat of an open file: the version it opened
        try:
            st = self.engine.lstat(node.path)
        except FileNotFoundError:
            if nodeid == ROOT_ID:
                raise
            raise OSError(errno.ESTALE, "source entry is gone") from None
        if not node.matches(st) and nodeid != ROOT_ID:
            raise OSError(errno.ESTALE, "source entry changed")
        self.nodes.refresh(node, st)
        return self._attr(st)

    def readlink(self, request: Request, body: memoryview) -> bytes:
        if request.nodeid in (CONTROL_ID, STATS_ID):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return os.fsencode(self.engine.readlink(self._node(request.nodeid).path))

    # -- files ----------------------------------------------------------------------------------
    def open(self, request: Request, body: memoryview) -> bytes:
        flags, _ = abi.OPEN_IN.unpack_from(body)
        if flags & WRITE_FLAGS:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        nodeid = request.nodeid
        if nodeid == STATS_ID:
            fh = self._open_virtual(self._stats_bytes(request))
            return abi.OPEN_OUT.pack(fh, abi.FOPEN_DIRECT_IO, 0)
        if nodeid == CONTROL_ID:
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
        if self.no_open:
            raise OSError(errno.ENOSYS, "open-less mode")  # the kernel stops sending OPEN/RELEASE
        node = self._node(nodeid)
        for _attempt in range(3):
            held = node.route if node.opens else ""
            result = self._open_version(node, flags, held)
            route, backing = self.nodes.acquire(node, result.route)
            if route != result.route:  # another open of this node picked the other route meanwhile
                self.engine.release(result.fh)
                continue
            if route == ROUTE_PASSTHROUGH and not backing:
                backing = self._attach_backing(node, result.backing_fd)
                if not backing:  # the kernel refused: serve this open instead
                    self.nodes.released(node)
                    self.engine.release(result.fh)
                    continue
            with self._lock:
                self._handles[result.fh] = node
            if route == ROUTE_PASSTHROUGH:
                return abi.OPEN_OUT.pack(result.fh, abi.FOPEN_PASSTHROUGH | abi.FOPEN_NOFLUSH, backing)
            return abi.OPEN_OUT.pack(result.fh, abi.FOPEN_KEEP_CACHE | abi.FOPEN_NOFLUSH, 0)
        raise OSError(errno.EIO, "could not settle the route of an open")

    def _open_version(self, node: Node, flags: int, held: str) -> OpenResult:
        """The engine's open of the node's version; a node never opened whose source changed since
        the lookup is rebound to the version there now (its attributes dropped from the kernel's
        cache first), so an open racing a writer's rename still succeeds; any other mismatch is
        ESTALE (the kernel looks the name up again and opens the new node)."""
        try:
            return self.engine.open(node.path, flags, expect=node.version, cached=node.seen, held_route=held)
        except OSError as e:
            if e.errno != errno.ESTALE or node.seen:
                raise
        result = self.engine.open(node.path, flags, held_route=held)
        if result.st is None or not self.nodes.rebind(node, result.st):
            self.engine.release(result.fh)
            raise OSError(errno.ESTALE, "source file changed since it was looked up")
        if self.session is not None:
            self.session.inval_inode(node.nodeid, -1, 0)  # attributes only: the node has no pages
        return result

    def _attach_backing(self, node: Node, fd: int) -> int:
        """Register *fd* as the node's backing file; 0 when the kernel refuses (then never again)."""
        try:
            backing = self.session.backing_open(fd)
        except (OSError, AttributeError) as e:
            if not self._passthrough_failed:
                self._passthrough_failed = True
                log.warning("passthrough unavailable (%s); serving every file", getattr(e, "strerror", e))
            self.engine.passthrough_available = False
            return 0
        used = self.nodes.attach_backing(node, backing)
        if used != backing:
            self.session.backing_close(backing)
        return used

    def read(self, request: Request, body: memoryview) -> Any:
        fh, offset, size, _rflags, _owner, _flags, _pad = abi.READ_IN.unpack_from(body)
        dest = request.buffer[: min(size, len(request.buffer))]
        if fh >= VIRTUAL_FH_BASE:
            with self._lock:
                data = self._virtual.get(fh)
            if data is None:
                raise OSError(errno.EBADF, os.strerror(errno.EBADF))
            return data[offset : offset + size]
        if fh == 0 and request.nodeid == STATS_ID:
            return self._read_nofh_stats(request, offset, size)
        parts = ReplyParts()
        request.after = functools.partial(self.engine.release_parts, parts)
        if fh == 0:
            node = self._node(request.nodeid)
            self.engine.read_into(0, offset, dest, node.path, node.version, parts)
        else:
            self.engine.read_into(fh, offset, dest, parts=parts)
        return parts.views  # RAM blocks and source bytes in file order, sent by one writev

    def abandoned(self, opcode: int, body: memoryview) -> None:
        """The session's watchdog answered a request its handler is still serving (a hung source)."""
        if opcode == Op.READ and len(body) >= abi.READ_IN.size:
            fh = abi.READ_IN.unpack_from(body)[0]
            if 0 < fh < VIRTUAL_FH_BASE:
                self.engine.abandoned_read(fh)

    def release(self, request: Request, body: memoryview) -> None:
        fh = abi.RELEASE_IN.unpack_from(body)[0]
        if fh >= VIRTUAL_FH_BASE:
            with self._lock:
                self._virtual.pop(fh, None)
            return None
        with self._lock:
            node = self._handles.pop(fh, None)
        if fh:
            self.engine.release(fh)
        if node is not None:
            backing = self.nodes.released(node)
            if backing and self.session is not None:
                self.session.backing_close(backing)
        return None

    def flush(self, request: Request, body: memoryview) -> None:
        """Nothing to flush on a read-only mirror: ENOSYS makes the kernel stop sending FLUSH on
        close for good (opens also say FOPEN_NOFLUSH, but open-less files have no open to say it)."""
        raise OSError(errno.ENOSYS, "no flush")

    # -- directories ----------------------------------------------------------------------------
    def opendir(self, request: Request, body: memoryview) -> bytes:
        negotiated = getattr(self.session, "negotiated", None)
        if negotiated is not None and negotiated.offers(abi.Init.NO_OPENDIR_SUPPORT):
            raise OSError(errno.ENOSYS, "open-less directories")  # no OPENDIR/RELEASEDIR from now on
        if request.nodeid not in (CONTROL_ID,):
            self._node(request.nodeid)
        return abi.OPEN_OUT.pack(0, abi.FOPEN_KEEP_CACHE | abi.FOPEN_CACHE_DIR, 0)

    def releasedir(self, request: Request, body: memoryview) -> None:
        return None

    def _listing(self, nodeid: int, offset: int) -> list[tuple[str, int, int]]:
        """(name, type bits, inode) of the directory's entries, '.' and '..' first; fetched anew at
        offset 0 and kept for the requests that continue the same pass."""
        if offset:
            with self._lock:
                kept = self._listings.get(nodeid)
                if kept is not None:
                    self._listings.move_to_end(nodeid)
                    return kept
        if nodeid == CONTROL_ID:
            entries = [(STATS_NAME, stat.S_IFREG, STATS_ID)]
            ino = CONTROL_ID
        else:
            node = self._node(nodeid)
            entries = self.engine.scandir(node.path)
            if nodeid == ROOT_ID:
                entries = [e for e in entries if e[0] != CONTROL_NAME]
            ino = node.st.st_ino
        listing = [(".", stat.S_IFDIR, ino), ("..", stat.S_IFDIR, 1), *entries]
        with self._lock:
            self._listings[nodeid] = listing
            self._listings.move_to_end(nodeid)
            while len(self._listings) > MAX_LISTINGS:
                self._listings.popitem(last=False)
        return listing

    def readdir(self, request: Request, body: memoryview) -> bytes:
        _fh, offset, size, *_ = abi.READ_IN.unpack_from(body)
        listing = self._listing(request.nodeid, offset)
        out = bytearray()
        for index in range(offset, len(listing)):
            name, kind, ino = listing[index]
            raw = os.fsencode(name)
            rec = abi.rec_align(abi.DIRENT.size + len(raw))
            if len(out) + rec > size:
                break
            out += abi.DIRENT.pack(ino, index + 1, len(raw), kind >> 12)
            out += raw
            out += bytes(rec - abi.DIRENT.size - len(raw))
        return bytes(out)

    def readdirplus(self, request: Request, body: memoryview) -> bytes:
        _fh, offset, size, *_ = abi.READ_IN.unpack_from(body)
        nodeid = request.nodeid
        listing = self._listing(nodeid, offset)
        parent = None if nodeid == CONTROL_ID else self._node(nodeid)
        base = abi.ENTRY_OUT.size + abi.DIRENT.size
        # the entries that fit, then their attributes in one go (in parallel on remote sources)
        end, used = offset, 0
        while end < len(listing):
            rec = abi.rec_align(base + len(os.fsencode(listing[end][0])))
            if used + rec > size:
                break
            used += rec
            end += 1
        stats: list[Any] = [None] * (end - offset)
        if parent is not None:
            wanted = [i for i in range(offset, end) if listing[i][0] not in (".", "..")]
            found = self.engine.lstat_many([join(parent.path, listing[i][0]) for i in wanted])
            for i, st in zip(wanted, found, strict=True):
                stats[i - offset] = st
        out = bytearray()
        for index in range(offset, end):
            name, kind, ino = listing[index]
            raw = os.fsencode(name)
            rec = abi.rec_align(base + len(raw))
            entry = None
            if name not in (".", ".."):
                if parent is None:
                    entry = self._entry(STATS_ID, self._virtual_stat(STATS_ID))
                else:
                    st = stats[index - offset]
                    if st is not None:
                        node = self.nodes.lookup(parent, name, st)  # counted: the kernel links it
                        entry = self._entry(node.nodeid, st)
                        ino, kind = st.st_ino, stat.S_IFMT(st.st_mode)
            out += entry if entry is not None else bytes(abi.ENTRY_OUT.size)  # node id 0: no entry
            out += abi.DIRENT.pack(ino, index + 1, len(raw), kind >> 12)
            out += raw
            out += bytes(rec - base - len(raw))
        return bytes(out)

    # -- other metadata -------------------------------------------------------------------------
    def statfs(self, request: Request, body: memoryview) -> bytes:
        sv = self.engine.statvfs()
        return abi.STATFS_OUT.pack(
            sv.f_blocks, sv.f_bfree, sv.f_bavail, sv.f_files, sv.f_ffree, sv.f_bsize, sv.f_namemax, sv.f_frsize, 0
        )

    def access(self, request: Request, body: memoryview) -> None:
        mask, _ = abi.ACCESS_IN.unpack_from(body)
        if mask & os.W_OK:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        nodeid = request.nodeid
        if nodeid in (CONTROL_ID, STATS_ID):
            if nodeid == STATS_ID and mask & os.X_OK:
                raise OSError(errno.EACCES, os.strerror(errno.EACCES))
            return None
        self.engine.access(self._node(nodeid).path, mask)
        return None

    def getxattr(self, request: Request, body: memoryview) -> bytes:
        size, _ = abi.GETXATTR_IN.unpack_from(body)
        name = _name(body[abi.GETXATTR_IN.size :])
        value = self._xattr_value(request, name, size)
        return self._sized(value, size)

    @staticmethod
    def _sized(value: bytes, size: int) -> bytes:
        """The xattr protocol: size 0 asks for the length; a too small buffer is ERANGE."""
        if size == 0:
            return abi.GETXATTR_OUT.pack(len(value), 0)
        if len(value) > size:
            raise OSError(errno.ERANGE, os.strerror(errno.ERANGE))
        return value

    def _xattr_value(self, request: Request, name: str, size: int) -> bytes:
        nodeid = request.nodeid
        if is_control_xattr(name):
            if nodeid == CONTROL_ID:
                path = STATS_DIR
            elif nodeid == STATS_ID:
                path = STATS_FILE
            else:
                path = self._node(nodeid).path
            forget = functools.partial(self._forget_pages, nodeid)  # fastfs warm --evict: the kernel's copy too
            return self.control.getxattr(path, name, size, self._caller(request), request.pid, forget)
        if nodeid in (CONTROL_ID, STATS_ID):
            raise OSError(ENOATTR, os.strerror(ENOATTR))
        try:
            return self.engine.getxattr(self._node(nodeid).path, name)
        except OSError as e:
            if e.errno in (errno.ENODATA, ENOATTR):
                raise OSError(ENOATTR, os.strerror(ENOATTR)) from None
            raise

    def _forget_pages(self, nodeid: int) -> None:
        if self.session is not None and self.session.notifier is not None:
            self.session.notifier.submit(("inode", nodeid, 0, -1))

    @staticmethod
    def _caller(request: Request) -> Any:
        return caller_of(request.uid, request.gid, request.pid)

    def listxattr(self, request: Request, body: memoryview) -> bytes:
        size, _ = abi.GETXATTR_IN.unpack_from(body)
        nodeid = request.nodeid
        names: list[str] = [] if nodeid in (CONTROL_ID, STATS_ID) else self.engine.listxattr(self._node(nodeid).path)
        value = b"".join(os.fsencode(n) + _NUL for n in names)
        return self._sized(value, size)

    def interrupt(self, request: Request, body: memoryview) -> Any:
        (unique,) = abi.INTERRUPT_IN.unpack_from(body)
        if self.session is not None and not self.session.interrupt(unique):
            raise OSError(errno.EAGAIN, "not being served yet")  # the kernel sends it again
        return NO_REPLY

    def destroy(self, request: Request, body: memoryview) -> None:
        return None

    # -- the control directory ------------------------------------------------------------------
    def _virtual_stat(self, nodeid: int) -> _VirtualStat:
        if nodeid == CONTROL_ID:
            return _VirtualStat(stat.S_IFDIR | 0o555, 0, 2, CONTROL_ID, self._started_ns)
        # no_open: no direct I/O, so the kernel reads exactly this size (a short read does not shrink it:
        # the rest would read as zeros); every snapshot is padded to it (see _read_nofh_stats)
        size = NOFH_STATS_SIZE if self.no_open else STATS_SIZE_ESTIMATE
        return _VirtualStat(stat.S_IFREG | 0o444, size, 1, STATS_ID, time.time_ns())

    def snapshot(self) -> dict[str, Any]:
        """The complete snapshot (metrics, status lines): engine, mount identity, kernel connection."""
        return self.control.snapshot()

    def _kernel_section(self) -> dict[str, Any]:
        if self.session is None:
            return {}
        kernel = self.session.counters()
        negotiated = self.session.negotiated
        if negotiated is not None:
            kernel["protocol"] = f"{negotiated.major}.{negotiated.minor}"
            kernel["flags"] = abi.flag_names(negotiated.flags)
            kernel["max_read"] = negotiated.max_read
        kernel["nodes"] = len(self.nodes)
        kernel["lookups_in_flight_max"] = self.lookups_max
        return {"kernel": kernel}

    def _stats_bytes(self, request: Request) -> bytes:
        return self.control.stats_file(self._caller(request))

    def _open_virtual(self, data: bytes) -> int:
        with self._lock:
            fh = self._next_vfh
            self._next_vfh += 1
            self._virtual[fh] = data
        return fh

    def _read_nofh_stats(self, request: Request, offset: int, size: int) -> bytes:
        """Stats file read without open (``fuse.no_open``): one snapshot per pass from offset 0, padded
        with spaces to the file's fixed size (:data:`NOFH_STATS_SIZE`: the kernel reads up to the size
        it was told, whatever a read returns). Without
        an open there is no direct I/O, so the kernel keeps the file's pages for whoever reads next: on
        an ``allow_other`` mount everyone gets the redacted view here (the full one stays available to
        the owner and root through the root's stats xattr)."""
        caller = self._caller(request)
        full = self.control.sees_all(caller) and not self.engine.config.fuse.allow_other
        data = self._nofh_stats.get(full)
        if data is None or offset == 0:
            data = self.control.stats_file(caller if full else None, redacted=not full, limit=NOFH_STATS_SIZE)
            data = self._nofh_stats[full] = data.ljust(NOFH_STATS_SIZE, b" ")
        chunk = data[offset : offset + size]
        if offset + len(chunk) >= len(data):
            self._nofh_stats.pop(full, None)
            if self.session is not None and self.session.notifier is not None:
                self.session.notifier.submit(("inode", STATS_ID, 0, -1))  # the next pass reads anew
        return chunk
