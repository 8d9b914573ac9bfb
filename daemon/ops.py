"""The operations adapter: kernel requests (node ids, handles, offsets) to engine calls (paths).

A thin translation layer, as mountpoint-s3's ``fuse.rs`` is: each handler takes a typed request
(decoded by :mod:`fastfs.daemon.kernel.requests`), asks the engine (by path) or the node table
(:mod:`fastfs.daemon.nodes`: one node id per source version), and returns a reply built by
:mod:`fastfs.daemon.kernel.replies`. Every decision about caching, prefetch and the route of an open
lives in the engine; the hidden ``/.fastfs`` directory is :mod:`fastfs.daemon.controlfs`, directory
passes are :mod:`fastfs.daemon.listings`. Errors: an ``OSError`` becomes the errno of the reply (the
session turns other exceptions into EIO with a rate-limited log line; there is no per-request
logging).

Consistency (one inode per version, close-to-open):

* LOOKUP stats the source; a name whose source changed gets a new node id, so the kernel keeps the
  old version's inode (page cache, size, mappings) for those who still hold it.
* OPEN revalidates: the engine opens the source and, when it is no longer the node's version,
  answers ESTALE; the kernel then looks the name up again (``LOOKUP_REVAL``) and opens the new
  node. Every open of a node may keep the kernel's page cache (``FOPEN_KEEP_CACHE``): its pages are
  that version's.
* Handover (:mod:`fastfs.fsio.handover` decides): a served first open of a small file whose version
  is whole in RAM, and whose size the kernel's cached attributes of the node agree with
  (``Node.kernel_size``, recorded as replies carry attributes), puts the file's bytes into the
  kernel's page cache (``FUSE_NOTIFY_STORE``) before the reply; its reads never reach the daemon. A
  node rebound by the open (its old attributes dropped) is never handed over.
* GETATTR of an open file answers the node's own version: with a handle (``GETATTR_FH``), and
  without one (``fstat`` asks so too) while the node has open handles, when the kernel is also told
  to drop the name if the source changed or vanished (the next path walk finds the new version). A
  path ``stat`` of a node without open handles whose source changed or vanished answers ESTALE, which
  makes the kernel revalidate the name the same way.
* Directories: OPENDIR is answered without ``FOPEN_CACHE_DIR``, so every listing reaches the daemon,
  and the engine checks it against the source (one stat; a new listing only on change). A new
  listing (from READDIR or from the engine's refresher, :mod:`fastfs.fsio.refresh`) comes back as
  :meth:`KernelOps.dir_changed`: the kernel drops the names it holds there that vanished and the
  failed lookups there (:mod:`fastfs.daemon.negatives`) that now exist. Directories' attributes are
  cached for ``fuse.dir_timeout``.
* A file that only grew under open handles (:meth:`KernelOps.file_grew`) moves their node to the
  grown attributes (:meth:`~fastfs.daemon.nodes.NodeTable.grew`); the kernel drops its attributes
  and, served, its pages from the old end on.

The open walk (the engine's side is in :mod:`fastfs.fsio.opening`, which decides the route)::

    KernelOps.open(request, OpenIn)
      -> Engine.open(path, flags, expect=node.version, cached=node.seen, held_route=the node's route)
           -> Opener: revalidate, handle, Route(kind, backing_fd, on_disk)
      -> NodeTable.acquire(node, route, join=True): the node's open handles share one route
         [another open settled the other route meanwhile: Engine.reroute(fh, held)]
         [passthrough, no backing id yet: Session.backing_open(fd) -> NodeTable.attach_backing;
          the kernel refused: NodeTable.fall_back, Engine.refused(fh, why): served from now on]
      [served: handover.decide(OpenFacts) -> Engine.handover_parts -> Session.store -> Engine.handed_over]
      -> replies.open_reply(fh, flags, backing id)

*Served* opens are read through the engine; *passthrough* opens hand a descriptor to the kernel
(``FUSE_DEV_IOC_BACKING_OPEN``) so reads and mmap go straight to that file and never reach the
daemon. The node table keeps the route and backing id while a node has open handles; an id of the
source file stays registered after the last release, for the node's next open (bounded; closed when
the node is forgotten, see :mod:`fastfs.daemon.nodes`), a disk-tier copy's is closed then. With the
native request loop, the random reads of a served handle may be answered by the loop itself once the
engine offers the handle (``direct``: ``_loop.Direct``; the engine's rule, :mod:`fastfs.fsio.readpath`):
a read that reaches :meth:`KernelOps.read` first hands the engine what the loop served of its handle,
and after it the engine is asked again; a release or a watchdog answer takes the handle back.

Control channel: the ``/.fastfs`` directory (:mod:`fastfs.daemon.controlfs`) and the
``user.fastfs.*`` extended attributes (stats, warm jobs, cache reports, evictions), both answered by
a :class:`~fastfs.daemon.controller.Controller` with the request's caller (uid, gid, pid from the
request header, supplementary groups from ``/proc``), which decides what the answer may contain.
The mount is read-only: every write-type request answers EROFS.

Concurrency: ``_lock`` guards ``_lookups`` and ``lookups_max``; ``_handles`` is changed and read one
dict operation at a time (a store at open, a pop at release, a copy of its values: each atomic in
CPython), so no lock is taken for it on the hot open and release; the node table, the
listings and the control file system have their own locks; the engine documents its own.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import threading
from typing import Any, cast

from fastfs.daemon import ownership
from fastfs.daemon.caller import caller_of
from fastfs.daemon.control import CONTROL_NAME, STATS_DIR, STATS_FILE
from fastfs.daemon.controlfs import CONTROL_ID, CONTROL_IDS, NOFH_STATS_SIZE, STATS_ID, VIRTUAL_FH_BASE, ControlFS
from fastfs.daemon.controller import Controller, is_control_xattr
from fastfs.daemon.kernel import abi, replies
from fastfs.daemon.kernel import requests as rq
from fastfs.daemon.kernel.abi import Op
from fastfs.daemon.kernel.replies import Dirent, Replies
from fastfs.daemon.kernel.requests import (
    AccessIn,
    BatchForgetIn,
    ForgetIn,
    GetattrIn,
    GetxattrIn,
    InterruptIn,
    ListxattrIn,
    LookupIn,
    OpenIn,
    ReadIn,
    ReleaseIn,
)
from fastfs.daemon.kernel.session import NO_REPLY, Handler, Request, Session, native_loop
from fastfs.daemon.listings import Listings
from fastfs.daemon.negatives import Negatives
from fastfs.daemon.nodes import ROOT_ID, Node, NodeTable, join, version_of
from fastfs.fsio import handover
from fastfs.fsio.access import Caller
from fastfs.fsio.api import EngineAPI
from fastfs.fsio.changes import DirChange, Growth
from fastfs.fsio.opening import OpenResult
from fastfs.fsio.policy import ROUTE_PASSTHROUGH, ROUTE_SERVED
from fastfs.fsio.readpath import DirectTally, ReplyParts, direct_limits
from fastfs.fsio.source import FileKey

__all__ = ["CONTROL_ID", "NOFH_STATS_SIZE", "STATS_ID", "VIRTUAL_FH_BASE", "KernelOps"]

log = logging.getLogger("fastfs.ops")

ENOATTR = getattr(errno, "ENOATTR", errno.ENODATA)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT
_DOTS = (".", "..")
_NUL = b"\0"
# Reply flags of each route's opens.
SERVED_OPEN = abi.FOPEN_KEEP_CACHE | abi.FOPEN_NOFLUSH
PASSTHROUGH_OPEN = abi.FOPEN_PASSTHROUGH | abi.FOPEN_NOFLUSH
# The kernel's page size: a grown file's pages are dropped from the one holding its old end on.
PAGE = 4096
# What a handler of data may answer (see fastfs.daemon.kernel.session).
Reply = bytes | list[memoryview] | None


def _error(code: int, message: str | None = None) -> OSError:
    return OSError(code, message or os.strerror(code))


def _erofs(request: Request, body: memoryview) -> None:
    raise _error(errno.EROFS)


class KernelOps:
    """Handlers of one mount's kernel requests over one engine (see the module docstring).

    ``session`` (set by the daemon before the first request) gives access to backing files and
    notifications; ``mount_info`` (source, mountpoint) is added to stats snapshots.
    """

    def __init__(
        self, engine: EngineAPI, mount_info: dict[str, Any] | None = None, no_open: bool | None = None
    ) -> None:
        self.engine = engine
        fc = engine.config.fuse
        self.mount_info = dict(mount_info or {})
        self.no_open = bool(fc.no_open if no_open is None else no_open)
        self.session: Session | None = None
        # the native loop's table of handles whose reads it answers itself (set with the session by
        # attach_direct; None: every read comes here)
        self.direct: Any = None
        self.nodes = NodeTable(engine.lstat("/"), check_invariants=engine.config.cache.check_invariants)
        own = self._ownership = ownership.Ownership.from_config(fc)  # also how ACL xattrs are shown
        translate = None if own is None else functools.partial(ownership.translate, own=own)
        self.replies = Replies(fc.entry_timeout, fc.attr_timeout, fc.negative_ttl, translate, fc.dir_timeout)
        self.control = Controller(engine, self.mount_info, extra=self._kernel_section, settle=self._run_late)
        self.controlfs = ControlFS(self.control, self.no_open, fc.allow_other, self._invalidate_stats)
        self.listings = Listings(self._fetch_listing)
        self.negatives = Negatives()  # the names answered absent, per directory node
        self._lock = threading.Lock()
        # open handle -> its node and the node's ``evicted`` when it was answered (one atomic operation
        # at a time)
        self._handles: dict[int, tuple[Node, int]] = {}
        self._lookups = 0  # lookups being answered now
        self.lookups_max = 0  # most lookups answered at once (the kernel sends them in parallel)
        engine.listen(self)  # directory changes and file growths the engine finds: dir_changed, file_grew

    def handlers(self) -> dict[int, Handler]:
        """Opcode -> handler, for :class:`~fastfs.daemon.kernel.session.Session` (each typed handler
        bound to its request's decoder)."""
        t = rq.typed
        table: dict[int, Handler] = {
            Op.LOOKUP: t(rq.lookup_in, self.lookup),
            Op.FORGET: t(rq.forget_in, self.forget),
            Op.BATCH_FORGET: t(rq.batch_forget_in, self.batch_forget),
            Op.GETATTR: t(rq.getattr_in, self.getattr),
            Op.READLINK: self.readlink,
            Op.OPEN: t(rq.open_in, self.open),
            Op.READ: t(rq.read_in, self.read),
            Op.RELEASE: t(rq.release_in, self.release),
            Op.FLUSH: self.flush,
            Op.OPENDIR: t(rq.open_in, self.opendir),
            Op.READDIR: t(rq.read_in, self.readdir),
            Op.READDIRPLUS: t(rq.read_in, self.readdirplus),
            Op.RELEASEDIR: t(rq.release_in, self.releasedir),
            Op.STATFS: self.statfs,
            Op.GETXATTR: t(rq.getxattr_in, self.getxattr),
            Op.LISTXATTR: t(rq.listxattr_in, self.listxattr),
            Op.ACCESS: t(rq.access_in, self.access),
            Op.INTERRUPT: t(rq.interrupt_in, self.interrupt),
            Op.DESTROY: self.destroy,
        }
        for opcode in abi.WRITE_OPS:
            table[opcode] = _erofs
        return table

    # -- nodes ----------------------------------------------------------------------------------
    def _node(self, nodeid: int) -> Node:
        node = self.nodes.get(nodeid)
        if node is None:
            raise _error(errno.ESTALE, "unknown node id")
        return node

    def lookup(self, request: Request, r: LookupIn) -> bytes:
        name = r.name
        parent_id = request.nodeid
        if parent_id in CONTROL_IDS:
            nodeid = self.controlfs.lookup(parent_id, name)
            return self.replies.entry(nodeid, self.controlfs.stat(nodeid))
        if parent_id == ROOT_ID and name == CONTROL_NAME:
            return self.replies.entry(CONTROL_ID, self.controlfs.stat(CONTROL_ID))
        parent = self._node(parent_id)
        with self._lock:
            self._lookups += 1
            if self._lookups > self.lookups_max:
                self.lookups_max = self._lookups
        try:
            st = self.engine.lstat(join(parent.path, name))
        except FileNotFoundError:
            negative = self.replies.negative
            if negative is not None:  # node id 0 with a timeout: the kernel caches the name as absent
                self.negatives.add(parent_id, name)  # (dropped from the kernel when it appears)
                return negative
            raise
        finally:
            with self._lock:
                self._lookups -= 1
        node = self.nodes.lookup(parent, name, st)
        node.kernel_size = st.st_size  # what this reply tells the kernel (a handover fact)
        return self.replies.entry(node.nodeid, st)

    def forget(self, request: Request, r: ForgetIn) -> object:
        self._close_backing(self.nodes.forget(request.nodeid, r.nlookup))
        return NO_REPLY

    def batch_forget(self, request: Request, r: BatchForgetIn) -> object:
        self._close_backing(self.nodes.forget_many(r.items))  # one pass under the table's lock
        return NO_REPLY

    def _close_backing(self, ids: list[int]) -> None:
        """Close the kept backing ids of forgotten nodes (see the node table's kept backing ids)."""
        session = self.session
        if session is not None:
            for backing in ids:
                session.backing_close(backing)

    def getattr(self, request: Request, r: GetattrIn) -> bytes:
        nodeid = request.nodeid
        if nodeid in CONTROL_IDS:
            return self.replies.attr(self.controlfs.stat(nodeid))
        node = self._node(nodeid)
        if r.flags & abi.GETATTR_FH and not node.is_dir:
            return self._own_attr(node)  # fstat of an open file: the version it opened
        try:
            st = self.engine.lstat(node.path)
        except FileNotFoundError:
            if nodeid == ROOT_ID:
                raise
            if node.opens or node.listers:
                return self._moved_on(node)
            raise _error(errno.ESTALE, "source entry is gone") from None
        # (the version compared under the table's lock: an open may rebind the node meanwhile, and
        # the attributes of the version it left would then stand for the new one's, a size cutting
        # its bytes short)
        if not self.nodes.refresh(node, st) and nodeid != ROOT_ID:
            if node.opens or node.listers:
                return self._moved_on(node)
            raise _error(errno.ESTALE, "source entry changed")
        node.kernel_size = st.st_size
        return self.replies.attr(st)

    def _own_attr(self, node: Node) -> bytes:
        st = node.st
        node.kernel_size = st.st_size
        return self.replies.attr(st)

    def _moved_on(self, node: Node) -> bytes:
        """GETATTR (without a handle: the kernel sends fstat so too) of a node with open handles whose
        name now stands for another version, or none: the node's own version (its open files'
        ``fstat`` must show the size they read), and the kernel drops the name (queued), so the next
        path walk looks it up again and finds the new version's node. (ESTALE here failed ``fstat``:
        of a file, and of a directory removed and made again at the source between the open of its
        old node and the ``fstat`` that glibc's ``opendir`` makes, so ``os.listdir`` failed.)"""
        notifier = self.session.notifier if self.session is not None else None
        if notifier is not None:
            notifier.submit(("entry", node.parent, os.fsencode(node.name)))
        return self._own_attr(node)

    def readlink(self, request: Request, _body: memoryview) -> bytes:
        if request.nodeid in CONTROL_IDS:
            raise _error(errno.EINVAL)
        return os.fsencode(self.engine.readlink(self._node(request.nodeid).path))

    # -- files ----------------------------------------------------------------------------------
    def open(self, request: Request, r: OpenIn) -> bytes:
        """OPEN: the engine decides the route, the node table makes the node's handles share it (see
        the open walk in the module docstring)."""
        if r.flags & WRITE_FLAGS:
            raise _error(errno.EROFS)
        nodeid = request.nodeid
        if nodeid in CONTROL_IDS:
            return replies.open_reply(self.controlfs.open(nodeid, self._caller(request)), abi.FOPEN_DIRECT_IO)
        if self.no_open:
            raise _error(errno.ENOSYS, "open-less mode")  # the kernel stops sending OPEN/RELEASE
        node = self._node(nodeid)
        kernel_pages = node.seen  # (before this open marks it seen)
        opened, rebound = self._open_version(node, r.flags)
        try:
            route, backing = self.nodes.acquire(node, opened.route, True, opened.key)
        except BaseException:  # (ESTALE: the node was rebound meanwhile; or the debug invariant checks)
            self.engine.release(opened.fh)
            raise
        try:
            if route != opened.route:  # another open of this node settled the other route meanwhile
                opened = self.engine.reroute(opened.fh, route)
            if route == ROUTE_PASSTHROUGH and not backing:
                route, backing, opened = self._attach_backing(node, opened)
        except BaseException:
            self._drop(node, opened.fh)
            raise
        fh = opened.fh
        self._handles[fh] = (node, node.evicted)
        if route == ROUTE_PASSTHROUGH:
            return replies.open_reply(fh, PASSTHROUGH_OPEN, backing)
        if not kernel_pages and self.session is not None and opened.st is not None:  # (decide: never
            # for a node opened before; the hot re-open skips gathering the facts)
            facts = handover.OpenFacts(
                route,
                opened.st.st_size,
                self.engine.ram_head(fh),
                node.kernel_size,
                kernel_pages,
                rebound,
                fast_local=self.engine.fast_local(),
            )
            plan = handover.decide(facts)
            if plan is not None:
                self._hand_over(node, fh, plan)
        return replies.open_reply(fh, SERVED_OPEN)  # (keep_cache: the kernel keeps what it was handed)

    def _hand_over(self, node: Node, fh: int, plan: handover.Handover) -> None:
        """Put the version's bytes into the kernel's page cache of *node* before the OPEN reply (see
        :mod:`fastfs.fsio.handover`): its READs are then answered by the kernel. Written on the
        request's thread: the kernel must hold the pages before the reader's first read, and a node
        never opened has no page a reader could hold locked (two first opens at once may both
        store: the same bytes)."""
        assert self.session is not None
        if plan.from_source:
            data = self.engine.read_at_open(fh, plan.length)
            if data is not None and self.session.store(node.nodeid, plan.offset, data) == 0:
                self.engine.handed_from_source(fh, len(data))
            return
        parts = self.engine.handover_parts(fh, plan.length)
        if parts is None:
            return  # evicted since the decision: the reads come as READs
        try:
            if self.session.store(node.nodeid, plan.offset, parts.views[0]) == 0:
                self.engine.handed_over(fh, parts)
        finally:
            self.engine.release_parts(parts)

    def _open_version(self, node: Node, flags: int) -> tuple[OpenResult, bool]:
        """The engine's open of the node's version (its held route the hint); a node never opened
        whose source changed since the lookup is rebound to the version there now (its attributes
        dropped from the kernel's cache first), so an open racing a writer's rename still succeeds;
        any other mismatch is ESTALE (the kernel looks the name up again and opens the new node).
        Returns (the open, whether it rebound the node: no handover then)."""
        held = node.route if node.opens else ""  # (a hint: NodeTable.acquire settles it)
        backed = bool(node.backing if node.opens else node.kept)  # (a hint too: see _attach_backing)
        try:
            expect = cast(FileKey, node.version)  # (a node opened is a file: its version is its FileKey)
            # (the kernel may hold the version's pages once an open of the node was released, not while
            # its first is under way: a second reader opening it then, answered from metadata, read a
            # source the version had left: ESTALE; node.paged, a hint like the two above; and not while
            # a FORGET read is still being handled: the kernel's eviction that queued it may have taken
            # the inode this open was made for, its pages with it)
            paged = node.paged and not self._forget_pending()
            return self.engine.open(node.path, flags, expect, paged, held, backed), False
        except OSError as e:
            if e.errno != errno.ESTALE or node.seen:
                raise
        result = self.engine.open(node.path, flags, held_route=held)
        if result.st is None or not self.nodes.rebind(node, result.st):
            self.engine.release(result.fh)
            raise _error(errno.ESTALE, "source file changed since it was looked up")
        if self.session is not None:
            self.session.inval_inode(node.nodeid, -1, 0)  # attributes only: the node has no pages
        return result, True

    def _forget_pending(self) -> bool:
        """Whether a FORGET or BATCH_FORGET the session read is not handled yet (its handler may run
        on another worker after this request's, though the kernel queued it first)."""
        session = self.session
        return session is not None and session.forgets_read() > self.nodes.forgets

    def _attach_backing(self, node: Node, opened: OpenResult) -> tuple[str, int, OpenResult]:
        """The node's handles pass through and have no backing id yet: register this open's backing
        file. Returns (route, backing id, open) to answer: the id (ours, or one a concurrent open
        attached first), or, when the kernel refused ours and no other open attached one, served
        (the node falls back; a refusal is the engine's second decision)."""
        session = self.session
        refused = ""
        backing = 0
        if session is None:
            refused = "no kernel connection"
        else:
            if opened.backing_fd < 0:  # opened while the node's backing file was registered: it went meanwhile
                opened = self.engine.backing(opened.fh)  # (an error here fails this open, it is no refusal)
            try:
                backing = session.backing_open(opened.backing_fd)
            except OSError as e:
                refused = e.strerror or str(e)
            else:
                used = self.nodes.attach_backing(node, backing, keep=not opened.on_disk)
                if used != backing:
                    session.backing_close(backing)
                backing = used
        if backing:
            return ROUTE_PASSTHROUGH, backing, opened
        route, backing = self.nodes.fall_back(node)
        if route == ROUTE_PASSTHROUGH:  # another open of the node attached one meanwhile: shared
            return route, backing, opened
        if refused:
            return ROUTE_SERVED, 0, self.engine.refused(opened.fh, refused)
        return ROUTE_SERVED, 0, self.engine.reroute(opened.fh, ROUTE_SERVED)  # the node fell back meanwhile

    def _drop(self, node: Node, fh: int) -> None:
        """Undo an open counted on *node* whose reply failed."""
        backing = self.nodes.released(node)
        if backing and self.session is not None:
            self.session.backing_close(backing)
        self.engine.release(fh)

    def read(self, request: Request, r: ReadIn) -> Reply:
        fh, offset, size = r
        if fh >= VIRTUAL_FH_BASE:
            return self.controlfs.read(fh, offset, size)
        nodeid = request.nodeid
        if fh == 0 and nodeid == STATS_ID:
            return self.controlfs.read_open_less(self._caller(request), offset, size)
        out = request.worker.out  # the worker's reply buffer (max_read bytes)
        dest = out[: min(size, len(out))]
        parts = ReplyParts()
        request.after = functools.partial(self.engine.release_parts, parts)
        if fh == 0:
            node = self._node(nodeid)
            self.engine.read_into(0, offset, dest, node.path, cast(FileKey, node.version), parts)  # (a file)
            return parts.views
        direct = self.direct
        if direct is None:
            self.engine.read_into(fh, offset, dest, None, None, parts)  # (positional: no keyword parsing)
            return parts.views  # RAM blocks and source bytes in file order, sent by one writev
        # what the loop served of the handle is counted (and seen by the policy) first; then the
        # engine says whether the loop may answer the handle's next reads itself
        tally = direct.take(fh)
        if tally is not None:
            self.engine.direct_served(fh, DirectTally(*tally))
        self.engine.read_into(fh, offset, dest, None, None, parts)
        offer = self.engine.direct_offer(fh)
        if offer is not None:
            direct.add(fh, offer.fd, offer.size, offer.windows)
        return parts.views

    def abandoned(self, opcode: int, body: memoryview) -> None:
        """The session's watchdog answered a request its handler is still serving (a hung source)."""
        if opcode == Op.READ and len(body) >= abi.READ_IN.size:
            fh = rq.read_in(body).fh
            if 0 < fh < VIRTUAL_FH_BASE:
                self.engine.abandoned_read(fh)  # (a read of the engine's own)
                if self.direct is not None:  # the loop's reads of the handle: its next ones go to the engine
                    stuck, tally = self.direct.abandon(fh)
                    if tally is not None:
                        self.engine.direct_served(fh, DirectTally(*tally))
                    self.engine.direct_stuck(fh, stuck)

    def release(self, request: Request, r: ReleaseIn) -> None:
        fh = r.fh
        if fh >= VIRTUAL_FH_BASE:
            self.controlfs.release(fh)
            return None
        held = self._handles.pop(fh, None)
        if fh:
            self._direct_end(fh)
            self.engine.release(fh)
        if held is not None:
            backing = self.nodes.released(*held)
            if backing and self.session is not None:
                self.session.backing_close(backing)
        return None

    def direct_table(self) -> Any:
        """A new table of the native loop's direct reads (``_loop.Direct``), for the session; None when
        the loop was not built or ``fuse.direct_reads`` is off."""
        if native_loop is None or not self.engine.config.fuse.direct_reads:
            return None
        return native_loop.Direct(*direct_limits(), on_unstuck=self.engine.direct_unstuck)

    def attach_direct(self, direct: Any) -> None:
        """The session's loop answers reads of the handles put in *direct* (None: none)."""
        self.direct = direct
        if direct is not None:
            self.engine.direct_tallies = lambda: [(fh, DirectTally(*t)) for fh, t in direct.drain()]

    def _direct_end(self, fh: int) -> None:
        """The loop answers no read of *fh* any more; what it served is counted now, and the table
        forgets the handle on a closer thread (that closes its duplicate of the source descriptor: a
        round trip on a FUSE source, fsio/closer.py)."""
        direct = self.direct
        if direct is not None:
            tally = direct.take(fh)
            if tally is not None:
                self.engine.direct_served(fh, DirectTally(*tally))
            # (no read of a released handle comes: the tally remove returns is empty)
            self.engine.defer_close(functools.partial(direct.remove, fh))

    def flush(self, request: Request, _body: memoryview) -> None:
        """Nothing to flush on a read-only mirror: ENOSYS makes the kernel stop sending FLUSH on
        close for good (opens also say FOPEN_NOFLUSH, but open-less files have no open to say it)."""
        raise _error(errno.ENOSYS, "no flush")

    # -- directories ----------------------------------------------------------------------------
    def opendir(self, request: Request, r: OpenIn) -> bytes:
        """OPENDIR is answered (never ENOSYS, which would make the kernel cache every listing, with
        ``FOPEN_CACHE_DIR``, until it drops the directory): handle 0 (a pass needs none, see
        :mod:`fastfs.daemon.listings`) and no cache flags, so every listing reaches the daemon, which
        checks it against the source."""
        if request.nodeid != CONTROL_ID:
            self.nodes.dir_opened(self._node(request.nodeid))  # (its fstat: see _moved_on)
        return replies.open_reply(0, 0)

    def releasedir(self, request: Request, r: ReleaseIn) -> None:
        node = self.nodes.get(request.nodeid)  # (None for the control directory: not in the table)
        if node is not None:
            self.nodes.dir_released(node)
        return None

    def _fetch_listing(self, nodeid: int) -> list[Dirent]:
        """(name, type bits, inode) of the directory's entries, '.' and '..' first (a new pass): the
        engine's listing, checked against the source by one stat and listed again only when the
        directory changed (then :meth:`dir_changed` hears of it)."""
        if nodeid == CONTROL_ID:
            return self.controlfs.listing()
        node = self._node(nodeid)
        entries = self.engine.listing(node.path)
        if nodeid == ROOT_ID:
            entries = [e for e in entries if e[0] != CONTROL_NAME]
        return [(".", stat.S_IFDIR, node.st.st_ino), ("..", stat.S_IFDIR, 1), *entries]

    def readdir(self, request: Request, r: ReadIn) -> bytes:
        nodeid = request.nodeid
        listing, start, cookie = self.listings.get(nodeid, r.offset)
        if start >= len(listing):
            self.listings.done(nodeid, cookie)  # the reader has every entry of its pass
            return b""
        return replies.dirents(listing, start, r.size, cookie)[0]

    def readdirplus(self, request: Request, r: ReadIn) -> bytes:
        nodeid = request.nodeid
        listing, start, cookie = self.listings.get(nodeid, r.offset)
        parent = None if nodeid == CONTROL_ID else self._node(nodeid)
        if start >= len(listing):
            self.listings.done(nodeid, cookie)  # the reader has every entry of its pass
            return b""
        end = replies.fit_plus(listing, start, r.size)
        # the entries that fit, then their attributes in one go (in parallel on remote sources)
        stats: list[os.stat_result | None] = [None] * (end - start)
        if parent is not None:
            wanted = [i for i in range(start, end) if listing[i][0] not in _DOTS]
            found = self.engine.lstat_many([join(parent.path, listing[i][0]) for i in wanted])
            for i, st in zip(wanted, found, strict=True):
                stats[i - start] = st
        records: list[tuple[bytes | None, str, int, int]] = []
        for index in range(start, end):
            name, kind, ino = listing[index]
            entry = None
            if name not in _DOTS:
                if parent is None:
                    entry = self.replies.entry(STATS_ID, self.controlfs.stat(STATS_ID))
                else:
                    st = stats[index - start]
                    if st is not None:
                        node = self.nodes.lookup(parent, name, st)  # counted: the kernel links it
                        node.kernel_size = st.st_size
                        entry = self.replies.entry(node.nodeid, st)
                        ino, kind = st.st_ino, stat.S_IFMT(st.st_mode)
            records.append((entry, name, kind, ino))  # no entry: node id 0, the kernel links none
        return replies.direntplus(records, start, cookie)

    # -- changes at the source (the engine's listener) ------------------------------------------
    def dir_changed(self, change: DirChange) -> None:
        """The engine listed a directory anew (it changed, or was not listed before): the kernel drops
        the names it holds there that are gone and the failed lookups there that now exist (and with
        them the directory's attributes); queued: the notifier writes them, never a request's thread."""
        notifier = self.session.notifier if self.session is not None else None
        node = self.nodes.current(change.path)
        if notifier is None or node is None or not node.is_dir:
            return
        present = change.names
        stale = [name for name in self.nodes.names_in(node.nodeid) if name not in present]
        stale += self.negatives.existing(node.nodeid, present)
        for name in stale:
            notifier.submit(("entry", node.nodeid, os.fsencode(name)))

    def file_grew(self, growth: Growth) -> None:
        """An open file only grew (its handles read the longer file now): the inodes of those handles
        take its attributes and the kernel drops their cached attributes, and on the served route their
        pages from the old end's page on (that page held the old end); passthrough reads the file itself."""
        notifier = self.session.notifier if self.session is not None else None
        versions = (version_of(growth.old), version_of(growth.new))
        nodes = list(self._handles.values())  # (one atomic copy)
        held = {n.nodeid: n for n, _ in nodes if n.path == growth.path and n.version in versions}
        for node in held.values():
            if not self.nodes.grew(node, growth.new) or notifier is None:
                continue
            if node.route == ROUTE_PASSTHROUGH:
                notifier.submit(("inode", node.nodeid, -1, 0))
            else:
                notifier.submit(("inode", node.nodeid, growth.old.st_size & ~(PAGE - 1), -1))

    # -- other metadata -------------------------------------------------------------------------
    def statfs(self, request: Request, _body: memoryview) -> bytes:
        return replies.statfs(self.engine.statvfs())

    def access(self, request: Request, r: AccessIn) -> None:
        mask = r.mask
        if mask & os.W_OK:
            raise _error(errno.EROFS)
        nodeid = request.nodeid
        if nodeid in CONTROL_IDS:
            self.controlfs.access(nodeid, mask)
            return None
        self.engine.access(self._node(nodeid).path, mask)
        return None

    def getxattr(self, request: Request, r: GetxattrIn) -> bytes:
        return replies.xattr(self._xattr_value(request, r.name, r.size), r.size)

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
        if nodeid in CONTROL_IDS:
            raise _error(ENOATTR)
        node = self._node(nodeid)
        try:
            value = self.engine.getxattr(node.path, name)
        except OSError as e:
            if e.errno in (errno.ENODATA, ENOATTR) or ownership.no_acl(name, e.errno):
                raise _error(ENOATTR) from None
            raise
        shown = ownership.shown_xattr(name, value, node.st.st_mode, self._ownership)  # ACLs: as the mount shows them
        if shown is None:
            raise _error(ENOATTR)
        return shown

    def _forget_pages(self, nodeid: int) -> None:
        if self.session is not None and self.session.notifier is not None:
            self.session.notifier.submit(("inode", nodeid, 0, -1))

    @staticmethod
    def _caller(request: Request) -> Caller:
        return caller_of(request.uid, request.gid, request.pid)

    def listxattr(self, request: Request, r: ListxattrIn) -> bytes:
        nodeid = request.nodeid
        names: list[str] = []
        if nodeid not in CONTROL_IDS:
            node = self._node(nodeid)
            names = ownership.shown_xattr_names(self.engine.listxattr(node.path), node.st.st_mode, self._ownership)
        return replies.xattr(b"".join(os.fsencode(n) + _NUL for n in names), r.size)

    def interrupt(self, request: Request, r: InterruptIn) -> object:
        if self.session is not None and not self.session.interrupt(r.unique):
            raise _error(errno.EAGAIN, "not being served yet")  # the kernel sends it again
        return NO_REPLY

    def destroy(self, request: Request, _body: memoryview) -> None:
        return None

    # -- the control channel --------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The complete snapshot (metrics, status lines): engine, mount identity, kernel connection."""
        return self.control.snapshot()

    def _run_late(self) -> None:
        """The RELEASEs the loop answered and kept are served first: a snapshot counts no closed handle."""
        if self.session is not None:
            self.session.run_late()

    def _kernel_section(self) -> dict[str, Any]:
        if self.session is None:
            return {}
        kernel = self.session.counters()
        kernel["loop"] = "native" if self.session.native else "python"  # the workers' request loop
        negotiated = self.session.negotiated
        if negotiated is not None:
            kernel["protocol"] = f"{negotiated.major}.{negotiated.minor}"
            kernel["flags"] = abi.flag_names(negotiated.flags)
            kernel["max_read"] = negotiated.max_read
        kernel["nodes"] = len(self.nodes)
        kernel["lookups_in_flight_max"] = self.lookups_max
        # handles whose random reads the loop may answer itself (None: it answers none, fuse.direct_reads)
        kernel["direct_handles"] = None if self.direct is None else len(self.direct)
        return {"kernel": kernel}

    def _invalidate_stats(self) -> None:
        """Drop the kernel's pages of the stats file (a no_open pass ended: the next one reads anew)."""
        session = self.session
        if session is not None and session.notifier is not None:
            session.notifier.submit(("inode", STATS_ID, 0, -1))
