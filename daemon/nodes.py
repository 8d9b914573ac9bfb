"""The node table: one kernel inode per source *version*, not per path.

Node ids, lookup counts and passthrough backing ids are kernel concepts, so this table lives on the
daemon side (only :mod:`fastfs.daemon` imports it); the engine knows paths and file keys.

A FUSE server names every inode the kernel knows by a 64-bit node id. fastfs gives each version of
a source object its own id: a lookup of a name whose source file was replaced or rewritten returns
a new id, while the kernel's older inode (held by open files and mappings) keeps its old id, its
own page cache, size and bytes, exactly as a local filesystem keeps an unlinked file alive for its
open descriptors. This is what lets the kernel keep its page cache across opens (``keep_cache``)
without ever showing one version's pages to a reader of another.

Versions: a regular file or symlink is identified by :func:`version_of` = (device, inode, size,
mtime, ctime), the engine's file key; a directory by (device, inode) only, so adding a file to a
directory does not give the directory (and every cached name below it) a new inode.

Lookup counts follow the protocol: every reply that hands the kernel a node id (LOOKUP, each
READDIRPLUS entry) adds one to that node's ``nlookup``; FORGET subtracts. A node whose count drops
to zero is dropped from the table; ids are never reused (a counter, so a late request naming a
forgotten id finds nothing instead of another file). A FORGET that leaves a count is the kernel's
eviction of one inode of the node while a lookup had already made the next one for the same id
(the kernel queues the FORGET at the eviction, after that lookup's reply): the pages went with the
evicted inode, so the node's ``paged`` goes too (``evicted`` counts such FORGETs, and the release
of an open made before one, run late, does not mark the newer inode's pages).

``current`` maps each path to the node of the newest version looked up there; older nodes of the
same path stay reachable by id until the kernel forgets them. The names the kernel holds in each
directory (:meth:`NodeTable.names_in`: the names of its live child nodes) are indexed, so a
directory that changed at the source can have the vanished ones dropped from the kernel's cache.

Growth. A file that was only appended to stays the same version for the handles open on it (see
:mod:`fastfs.fsio.refresh`): :meth:`NodeTable.grew` moves the node's attributes and version to the
grown file, so an ``fstat`` shows the new size and a later open of the node expects the grown file.

Kept backing ids. A passthrough backing id registered for the node's source file (not the disk tier's
copy, whose file the tier may replace) is kept registered after the node's last release
(``kept``, at most :data:`MAX_KEPT_BACKING` nodes): the next passthrough open of the node passes it
again (the node stands for one version, and the backing file is that version's file, also once it
grew), so a hot open + close costs no BACKING_OPEN and no BACKING_CLOSE. A kept id is closed when its
node is forgotten (:meth:`NodeTable.forget_many` returns it) or when a full table makes room
(:meth:`NodeTable.released` returns it). A full table does not simply drop its least recently
released id for the new one: epochs over more files than it holds release them in the same order
every time, so each id would be dropped just before its next open and none would ever be used again
(a second pass over 20,000 files: 151 us per open + close against 93 us with every id kept). The
least recently released id goes only when it is stale (not released again for
:data:`KEPT_STALE_RELEASES` times the bound's worth of keeping releases); otherwise the new id is
the one closed, so a cyclic epoch keeps the bound's worth of its files, and a data set no longer read
gives its ids up to a new one after a while.

Routes. The kernel requires every open handle of one inode to use the same route (served or
passthrough) and, passing through, the same backing file: the first open of a node sets its route
(:meth:`NodeTable.acquire`), later ones join it while any is open (``join``: the engine then decides
that open again for the held route), and the backing id registered first is the node's
(:meth:`NodeTable.attach_backing`). A passthrough node whose backing file the kernel refused and
that has no backing id falls back to served (:meth:`NodeTable.fall_back`): none of its handles was
answered yet, as a passthrough reply carries the id.

Concurrency: ``_lock`` guards ``_by_id``, ``_current``, ``_names``, ``_kept`` and ``_next_id`` (all
writes) and every node's mutable fields: ``nlookup``, ``opens``, ``route``, ``backing``, ``seen``,
``paged``, ``evicted``, ``listers``, ``keepable``, ``kept`` (read and written under it, see
:meth:`NodeTable.acquire`; ``listers`` also read without it by GETATTR, a hint of one int),
``version`` and ``st`` (written under it, and compared with a stat's version under it before a
refresh: an open may rebind the node meanwhile). ``evicted`` is also read without the lock by the
adapter as it answers an open (one int read: a FORGET racing it makes that open's release not
count, a page guess lost). ``kernel_size`` is a hint written without the lock by the adapter as it
answers (one int store; set to -1 under the lock by :meth:`NodeTable.rebind` and
:meth:`NodeTable.grew`): a race costs at most one handover skipped, or a store that sets the
kernel's size to the version's own (its bytes are that version's), never a wrong byte. A node's
``nodeid``, ``parent``, ``name`` and ``path`` never change. Read without the lock, on purpose:
``_by_id`` in :meth:`NodeTable.get` and ``_current`` in :meth:`NodeTable.current` (one dict lookup,
atomic in CPython; a node found may be forgotten right after, which a later request naming it
would see anyway), and a node's ``st``/``version`` by the operations (one reference read: the
attributes as of a moment ago, a whole ``stat_result``, never a torn one).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterable

from fastfs.fsio.cache import invariant_checks_requested
from fastfs.fsio.source import FileKey, stat_key

# A node's version: the file key of a file (fsio's FileKey), (device, inode) of anything else.
Version = FileKey | tuple[int, int]

ROOT_ID = 1
# Ids below this are reserved for the daemon's virtual nodes (its control directory).
FIRST_ID = 16
# Passthrough backing ids kept registered after their node's last release, at most (least recently
# released closed first): a re-open of a kept node passes its id again without a BACKING_OPEN and the
# last release without a BACKING_CLOSE (two ioctls per open + close); each holds one source file open
# in the kernel until its node is forgotten (a struct file there, no descriptor of the daemon's).
# Enough for a data set's second epoch of 10,000 small files: at 1,024 a second pass over 2,000 files
# evicted one kept id per open, and every open + close paid both ioctls again.
MAX_KEPT_BACKING = 16384
# A kept id not released again for this many times MAX_KEPT_BACKING keeping releases (its node's last
# release with an id to keep) is stale: a full table drops it for a new id. Younger ones stay and the new
# id is closed, so an epoch over up to this many times the bound's files keeps using the bound's worth.
KEPT_STALE_RELEASES = 4


def version_of(st: os.stat_result) -> Version:
    """Identity of one version of a source object (directories: device and inode only)."""
    if stat.S_ISDIR(st.st_mode):
        return (st.st_dev, st.st_ino)
    return stat_key(st)


def join(parent_path: str, name: str) -> str:
    return ("" if parent_path == "/" else parent_path) + "/" + name


class Node:
    """One version of one source object as the kernel knows it."""

    __slots__ = (
        "nodeid",
        "parent",
        "name",
        "path",
        "version",
        "st",
        "nlookup",
        "opens",
        "route",
        "backing",
        "seen",
        "paged",
        "evicted",
        "listers",
        "kernel_size",
        "keepable",
        "kept",
    )
    # ``version`` and ``st`` change only through NodeTable.rebind, before the node's first open, and
    # NodeTable.grew, when the file only grew.

    def __init__(self, nodeid: int, parent: int, name: str, path: str, st: os.stat_result) -> None:
        self.nodeid = nodeid
        self.parent = parent  # node id of the directory it was first looked up in
        self.name = name
        self.path = path
        self.version = version_of(st)
        self.st = st  # attributes of this version (what an open file of it reports)
        self.nlookup = 0
        self.opens = 0  # open handles (the kernel forbids mixing routes while any is open)
        self.route = ""  # route of the open handles ("served" or "passthrough"), "" when none
        self.backing = 0  # passthrough backing id shared by the open handles (0: none)
        self.seen = False  # opened before: the kernel may hold pages of this version
        self.paged = False  # an open of it was released: the kernel may hold pages read through it (not
        # set by an open still under way: a second reader opening the node meanwhile finds none there,
        # nor by the release of an open made before the kernel's last eviction of the node's inode)
        # FORGETs of the node so far: each is the kernel's eviction of an inode of this node id, its
        # pages gone with it (the node's count left is of a newer inode, made by a lookup meanwhile)
        self.evicted = 0
        self.listers = 0  # open directory handles (OPENDIR not yet released)
        # The size in the kernel's cached attributes of this node: what the last reply carrying them said
        # (the entry reply that made the node, then LOOKUP/READDIRPLUS/GETATTR replies, which the adapter
        # records); -1 after the kernel was told to drop them (rebind, grew) until a reply gives them again.
        self.kernel_size = st.st_size
        self.keepable = False  # the open handles' backing id may be kept after their last release
        self.kept = 0  # a backing id kept registered while no handle is open (0: none)

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)

    def matches(self, st: os.stat_result) -> bool:
        return version_of(st) == self.version


class NodeTable:
    """Node ids of the versions the kernel currently knows (see the module docstring)."""

    def __init__(
        self, root_st: os.stat_result, check_invariants: bool = False, max_kept: int = MAX_KEPT_BACKING
    ) -> None:
        self._lock = threading.Lock()
        self.max_kept = max_kept  # immutable
        # node ids holding a kept backing id -> the keeping release that kept it, least recent first
        self._kept: dict[int, int] = {}
        self._keeps = 0  # keeping releases so far (the clock of _kept)
        # Run check_invariants under the lock after every change (debug: config cache.check_invariants
        # or FASTFS_CHECK_INVARIANTS=1, as for the block cache); immutable.
        self.checking = check_invariants or invariant_checks_requested()
        root = Node(ROOT_ID, ROOT_ID, "", "/", root_st)
        root.nlookup = 1  # the kernel never forgets the root
        self.root = root
        self._by_id: dict[int, Node] = {ROOT_ID: root}
        self._current: dict[str, Node] = {"/": root}
        self._names: dict[int, dict[str, int]] = {}  # directory node id -> child name -> its live nodes
        self._next_id = FIRST_ID
        self.forgets = 0  # FORGET and BATCH_FORGET requests handled (written under _lock; read as a hint)

    def get(self, nodeid: int) -> Node | None:
        return self._by_id.get(nodeid)

    def __len__(self) -> int:
        return len(self._by_id)

    def lookup(self, parent: Node, name: str, st: os.stat_result) -> Node:
        """The node for *name* in *parent* at the version *st* describes, its count raised by one.

        Same path and version as the current node: that node; otherwise a new node becomes the
        path's current one (the previous stays until forgotten)."""
        path = join(parent.path, name)
        version = version_of(st)
        with self._lock:
            node = self._current.get(path)
            if node is None or node.version != version or node.nodeid not in self._by_id:
                node = Node(self._next_id, parent.nodeid, name, path, st)
                self._next_id += 1
                self._by_id[node.nodeid] = node
                self._current[path] = node
                names = self._names.setdefault(parent.nodeid, {})
                names[name] = names.get(name, 0) + 1
            elif node.is_dir:
                node.st = st  # a directory's node outlives changes of its listing: keep its attributes fresh
            node.nlookup += 1
            if self.checking:
                self._check_locked()
            return node

    def forget(self, nodeid: int, count: int) -> list[int]:
        """The kernel dropped *count* references to *nodeid*; returns backing ids to close."""
        return self.forget_many(((nodeid, count),))

    def forget_many(self, items: Iterable[tuple[int, int]]) -> list[int]:
        """The kernel dropped references: (node id, count) pairs (a BATCH_FORGET), under one lock.
        Returns the kept backing ids of the nodes dropped, for the caller to close."""
        close: list[int] = []
        with self._lock:
            self.forgets += 1
            by_id = self._by_id
            for nodeid, count in items:
                node = by_id.get(nodeid)
                if node is None or nodeid == ROOT_ID:
                    continue
                node.nlookup -= count
                # the kernel evicted an inode of this node id, and the pages it held went with it; counts
                # left are of a newer inode a lookup made meanwhile (the FORGET queued at the eviction,
                # read after that lookup's reply), which holds no page read before; the releases of
                # opens made before this FORGET, run late, do not count (:meth:`released`)
                node.paged = False
                node.evicted += 1
                if node.nlookup <= 0:
                    self._drop_locked(node)
                    if node.kept:
                        close.append(node.kept)
                        node.kept = 0
                        self._kept.pop(nodeid, None)
            if self.checking:
                self._check_locked()
        return close

    def _drop_locked(self, node: Node) -> None:
        del self._by_id[node.nodeid]
        if self._current.get(node.path) is node:
            del self._current[node.path]
        names = self._names.get(node.parent)
        if names is not None:
            left = names.get(node.name, 0) - 1
            if left > 0:
                names[node.name] = left
            else:
                names.pop(node.name, None)
                if not names:
                    del self._names[node.parent]

    def current(self, path: str) -> Node | None:
        """The node of the newest version looked up at *path* (None if the kernel holds none)."""
        return self._current.get(path)

    def refresh(self, node: Node, st: os.stat_result) -> bool:
        """Newer attributes of the same version (a directory's times, a file's atime); False, nothing
        changed, when *st* is of another version (checked under the lock: an open may
        :meth:`rebind` the node between the caller's stat and this call)."""
        with self._lock:
            if version_of(st) != node.version:
                return False
            node.st = st
            if self.checking:
                self._check_locked()
            return True

    def rebind(self, node: Node, st: os.stat_result) -> bool:
        """Make a node that was never opened stand for the version *st* describes (the source
        changed between the kernel's lookup and its open: the open resolves to the version current
        now, as a path walk a moment later would). False when the node was ever opened: the kernel
        may hold pages or mappings of its version, so it must stay that version."""
        with self._lock:
            if node.seen or node.opens or node.nodeid == ROOT_ID or not stat.S_ISREG(st.st_mode):
                return False
            node.version, node.st = version_of(st), st
            node.kernel_size = -1  # the kernel holds the old version's attributes until it asks again
            if self._by_id.get(node.nodeid) is node:
                self._current[node.path] = node
            if self.checking:
                self._check_locked()
            return True

    def grew(self, node: Node, st: os.stat_result) -> bool:
        """Move *node* to the attributes *st* of its file grown at the source (same device and inode,
        a regular file, not smaller): its open handles read the longer file, its ``fstat`` shows it,
        later opens of it expect it. False (nothing changed) for another file or a forgotten node."""
        with self._lock:
            old = node.st
            if (
                not stat.S_ISREG(st.st_mode)
                or (st.st_dev, st.st_ino) != (old.st_dev, old.st_ino)
                or st.st_size < old.st_size
                or self._by_id.get(node.nodeid) is not node
            ):
                return False
            node.version, node.st = version_of(st), st
            node.kernel_size = -1  # the kernel holds the old size until it asks again
            if self.checking:
                self._check_locked()
            return True

    def names_in(self, parent_id: int) -> list[str]:
        """The names the kernel holds nodes of in directory *parent_id* (each once)."""
        with self._lock:
            return list(self._names.get(parent_id, ()))

    def acquire(
        self, node: Node, route: str, join: bool = False, version: Version | tuple[()] | None = None
    ) -> tuple[str, int]:
        """Count an open of *node* on *route*; returns (route, backing id) its open handles share.

        The first open of a node picks the route; while handles are open, an open on the other
        route gets the held route back and is not counted, or, with *join*, is counted on the held
        route (the caller then has the open decided again for it). *version*: the version the open
        found at the source; ESTALE, nothing counted, when the node stands for another one now (a
        concurrent open of the node, never opened, rebound it to a newer version meanwhile: this
        open's handle would read the old version through the inode of the new one, a short read
        there setting the inode's size to the old version's)."""
        with self._lock:
            if version is not None and version != node.version:
                raise OSError(errno.ESTALE, "source file changed since it was looked up", node.path)
            if node.opens and node.route != route and not join:
                return node.route, node.backing
            if node.opens == 0:
                node.route, node.backing = route, 0
                if route == "passthrough" and node.kept:  # registered still: shared again
                    node.backing, node.kept, node.keepable = node.kept, 0, True
                    self._kept.pop(node.nodeid, None)
            node.opens += 1
            node.seen = True
            if self.checking:
                self._check_locked()
            return node.route, node.backing

    def dir_opened(self, node: Node) -> None:
        """Count an open handle of directory *node* (an OPENDIR)."""
        with self._lock:
            node.listers += 1
            if self.checking:
                self._check_locked()

    def dir_released(self, node: Node) -> None:
        """Count the release of an open handle of directory *node* (a RELEASEDIR)."""
        with self._lock:
            node.listers -= 1
            if self.checking:
                self._check_locked()

    def attach_backing(self, node: Node, backing: int, keep: bool = False) -> int:
        """Record the passthrough backing id of *node*'s open handles; returns the one to use (an
        id attached meanwhile by a concurrent open wins: the caller closes its own), or 0 when the
        node fell back to served meanwhile (:meth:`fall_back`; the caller closes its id and serves).
        *keep*: the id may stay registered after the last release (the node's source file)."""
        with self._lock:
            if not node.backing and node.route == "passthrough":
                node.backing, node.keepable = backing, keep
            if self.checking:
                self._check_locked()
            return node.backing

    def fall_back(self, node: Node) -> tuple[str, int]:
        """A passthrough open of *node* could not register a backing file: the node's handles turn
        served unless one attached a backing id meanwhile; returns the (route, backing id) to use."""
        with self._lock:
            if node.route == "passthrough" and not node.backing:
                node.route = "served"
            if self.checking:
                self._check_locked()
            return node.route, node.backing

    def released(self, node: Node, evicted: int = -1) -> int:
        """Count a release of *node*, whose open was answered when the node's ``evicted`` was *evicted*
        (-1: an open never answered); returns a backing id to close (else 0): the node's when it was
        the last handle and its id is not kept (also when the table is full of ids still in use), or
        the least recently released kept one when it is stale and keeping this one made too many."""
        with self._lock:
            node.opens -= 1
            if evicted == node.evicted:  # (its pages are in the inode the kernel holds now, if any)
                node.paged = True
            if node.opens > 0:
                if self.checking:
                    self._check_locked()
                return 0
            backing, node.backing, node.route = node.backing, 0, ""
            if backing and node.keepable and self.max_kept > 0 and self._by_id.get(node.nodeid) is node:
                self._keeps += 1
                full = len(self._kept) >= self.max_kept
                oldest_id = next(iter(self._kept), 0)
                # (full of ids still in use: this one is closed, returned as it is)
                if not full or self._keeps - self._kept[oldest_id] > KEPT_STALE_RELEASES * self.max_kept:
                    node.kept, backing = backing, 0
                    self._kept[node.nodeid] = self._keeps
                    if full:  # the stale oldest one makes room
                        oldest = self._by_id[oldest_id]
                        del self._kept[oldest_id]
                        backing, oldest.kept = oldest.kept, 0
            node.keepable = False
            if self.checking:
                self._check_locked()
            return backing

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant (tests and debug mounts): every node
        filed under its own id, ids below the counter, counts positive (the root's too) and opens >= 0,
        a route exactly while handles are open, a backing id only on the passthrough route and only
        while open, an open node marked seen, a file's version the one its attributes name,
        ``_current`` naming live nodes of their own path, and the names indexed per directory those
        of the live nodes."""
        with self._lock:
            self._check_locked()

    def _check_locked(self) -> None:
        """:meth:`check_invariants` with the lock held."""
        assert self._by_id.get(ROOT_ID) is self.root, "nodes: the root is not filed under its id"
        for nodeid, node in self._by_id.items():
            assert node.nodeid == nodeid, f"nodes: node {node.nodeid} filed under id {nodeid}"
            assert nodeid == ROOT_ID or FIRST_ID <= nodeid < self._next_id, (
                f"nodes: id {nodeid} outside [{FIRST_ID}, {self._next_id})"
            )
            assert node.nlookup > 0, f"nodes: node {nodeid} kept without references"
            assert node.opens >= 0, f"nodes: node {nodeid} has {node.opens} opens"
            assert node.listers >= 0, f"nodes: node {nodeid} has {node.listers} open directory handles"
            assert (node.opens == 0) == (node.route == ""), (
                f"nodes: node {nodeid} has {node.opens} opens on route {node.route!r}"
            )
            assert node.backing == 0 or (node.route == "passthrough" and node.opens > 0), (
                f"nodes: node {nodeid} holds backing id {node.backing} on route {node.route!r}"
            )
            assert node.opens == 0 or node.seen, f"nodes: open node {nodeid} not marked seen"
            assert not (node.kept and node.backing), f"nodes: node {nodeid} keeps an id while its handles hold one"
            assert bool(node.kept) == (nodeid in self._kept), f"nodes: node {nodeid}'s kept id is not indexed"
            assert nodeid == ROOT_ID or node.version == version_of(node.st), (
                f"nodes: node {nodeid}'s attributes name another version than {node.version!r}"
            )
        for path, node in self._current.items():
            assert node.path == path, f"nodes: {path!r} names node {node.nodeid} of {node.path!r}"
            assert self._by_id.get(node.nodeid) is node, f"nodes: {path!r} names forgotten node {node.nodeid}"
        names: dict[int, dict[str, int]] = {}
        for nodeid, node in self._by_id.items():
            if nodeid != ROOT_ID:
                names.setdefault(node.parent, {})
                names[node.parent][node.name] = names[node.parent].get(node.name, 0) + 1
        assert names == self._names, "nodes: the index of names per directory is not that of the live nodes"
        assert len(self._kept) <= self.max_kept and all(i in self._by_id for i in self._kept), (
            "nodes: kept backing ids beyond the bound or of forgotten nodes"
        )
