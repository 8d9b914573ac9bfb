"""One FUSE connection: the request loop, replies, notifications, backing files, the watchdog.

Threads. After the mount, :meth:`Session.start` reads the kernel's INIT on the connection's device
descriptor, answers it (:mod:`.negotiate`), then starts ``threads`` workers. Each worker owns a
clone of the descriptor (``FUSE_DEV_IOC_CLONE``: the kernel hands requests to any idle reader and
expects each reply on the descriptor its request was read from) and loops: read one request into
its own buffer, parse the header, call the handler for the opcode, write the reply with one
``os.writev`` of a header and the handler's buffers (payload bytes are never joined or copied
here). Per request the loop allocates nothing but the header's fields and the body's view: the
worker's one :class:`Request` is refilled, and a single-bytes reply is written inline. A read of
``ENODEV`` means the connection is gone (unmounted or aborted): the worker ends.

Two implementations of that loop, the same steps in the same order: the native one (``_loop.c``,
built by pip where a C compiler was at hand; :attr:`Session.native`), which holds the GIL only
while a handler runs, and the Python one (:meth:`Session._serve_python`), which holds it from the
device read's return to the next read, so a second worker woken for the next request (an OPEN right
after the RELEASE of the close before it) waits for it. ``$FASTFS_LOOP`` (:data:`LOOP_ENV`) picks
one; the stats show which runs (``kernel.loop``). The native loop alone also answers the READs of
handles the engine handed over to it (:attr:`Session.direct`, ``_loop.Direct``: random reads, one
pread each, no handler; the C file says how and when a handle goes back to its handler).

Late releases. The kernel sends RELEASE after close() has returned and never waits for its answer,
but the worker serving it held the GIL while the reader's next OPEN arrived, and that OPEN's worker
waited for it. With ``late_release`` the native loop answers a RELEASE at once and keeps the request
(``_loop.Later``); the session's late thread runs the RELEASE handler on what was kept every
:data:`LATER_BATCH` seconds, a batch at a time (:meth:`Session.run_late`), and so does anyone who
needs the handles' counts exact first (the stats: :meth:`Session.run_late` waits for a batch being
run). A full queue (:data:`LATER_CAP`) or the Python loop serves RELEASE at once, as before. The
handler waits on no source: the closes a release makes run on the engine's closer
(:mod:`fastfs.fsio.closer`), so the late thread is never stuck behind a hung source's close.

Readers. At most :data:`SPARE_READERS` workers wait in the device read at once; the others park,
each on a lock of its own (the native loop keeps these places in C: ``_loop.Readers``). A worker
that takes the last reader's place (every reader now busy serving) wakes one parked worker first
(counted as a reader by the waker, so it never parks again on the way), so a request that blocks on
a slow or hung source never keeps the next one waiting; a worker done with its request parks if
enough others are reading. The worker woken is the one parked last (the warmest). A serial stream
of requests is so served by the same two warm threads (what libfuse's multithreaded loop does by
starting threads only when all are busy), and parallel requests by as many workers as arrive at
once, up to ``threads``.

Handlers are plain callables ``handler(request, body) -> reply`` from the operations adapter, where
``body`` is a view of the request after its header, valid only during the call. A reply is a
bytes-like payload, a list of them (sent in order by one writev), None (success without payload)
or :data:`NO_REPLY` for requests that take none (FORGET, INTERRUPT). An ``OSError`` becomes an
error reply with its errno; any other exception EIO.

Watchdog. A source that stops answering must not take the daemon with it: one thread looks at every
worker's current request every :data:`WATCHDOG_TICK` seconds. A request older than its timeout
(``request_timeout`` for metadata requests; reads have their own, shorter deadline in the engine and
get ``read_timeout`` plus a margin here) is answered EIO from the watchdog, on the worker's
descriptor; the worker is abandoned (its late reply is dropped, it exits once its handler returns),
the adapter is told before the answer is written (``on_abandon``: the engine counts the read as
stuck, so the kernel's retry of the page fails at once) and a new worker takes its place, up to
:data:`MAX_ABANDONED` abandoned at once. A request the kernel interrupted (the caller got a signal,
``FUSE_INTERRUPT``) is answered EINTR that way after :data:`INTERRUPT_GRACE` seconds if the handler
has not finished by then. Reads the kernel sends as asynchronous read-ahead are never interrupted by
the kernel (their reader sleeps on a page lock that only a fatal signal wakes), so a READ older than
:data:`SIGNAL_POLL_AGE` whose reader (the header's pid) has a signal pending
(:func:`signal_pending`) is answered EINTR the same way: the kernel then reads the page
synchronously, and that request the signal interrupts.

Shutdown: the connection is gone once every worker still serving has read its end (``ENODEV``);
:meth:`Session.wait` returns then. Abandoned workers are not waited for: one may stay stuck in a
source call for as long as the source does not answer.

Notifications (invalidations) may block in the kernel on locks a request in flight holds, so they
are written by their own thread from a deduplicated queue (:class:`Notifier`).

Concurrency: ``Worker.current`` is written only by its worker (and by :meth:`Session.interrupt`,
which replaces the tuple whole) and read (one tuple, atomically) by the watchdog; ``_readers``,
``_parked`` and ``_ending`` are guarded by ``_park`` (a lock of its own: never held across the
device read, a handler or a wait), the native loop's places (``_places``) by a C mutex of their own,
under which no Python object is touched; ``Worker.abandoned`` is set once by the watchdog under ``_lock``,
which also guards ``_workers``, the counts of abandoned workers and of interrupts (``_interrupts``;
``_timeouts`` is written by the watchdog alone). Request counters are per worker (no lock on the
request path) and summed when read.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import signal
import struct
import threading
import time
import types
from collections.abc import Callable
from typing import Any, Literal

from fastfs.daemon.kernel import abi
from fastfs.daemon.kernel.abi import Op
from fastfs.daemon.kernel.negotiate import Negotiated, NegotiationError, Offer, Wishes, negotiate

native_loop: types.ModuleType | None
try:  # the native request loop, built from _loop.c at install when a C compiler was at hand
    from fastfs.daemon.kernel import _loop as native_loop
except ImportError:  # pragma: no cover - depends on the install
    native_loop = None

log = logging.getLogger("fastfs.kernel")

# Environment variable that picks the request loop: "python" (the loop below); unset or anything else:
# the native one (_loop.c) when it was built.
LOOP_ENV = "FASTFS_LOOP"

# Seconds between watchdog passes over the workers' current requests.
WATCHDOG_TICK = 0.25
# Seconds an interrupted request may still take before the watchdog answers it EINTR.
INTERRUPT_GRACE = 1.0
# Seconds a READ may wait before the watchdog looks whether its reader has a signal pending: the
# kernel sends no FUSE_INTERRUPT for asynchronous read-ahead, whose reader sleeps on a page lock that
# only a fatal signal wakes (dd catches SIGINT to print its statistics), so the daemon looks itself.
SIGNAL_POLL_AGE = 0.5
# Signals that do not ask a reader to stop: often caught (a DataLoader's SIGCHLD handler), and a read
# cut short by one of them would only surprise a program that expects regular-file reads to finish.
BENIGN_SIGNALS = frozenset({signal.SIGCHLD, signal.SIGWINCH, signal.SIGURG, signal.SIGCONT})
_BENIGN_MASK = sum(1 << (int(s) - 1) for s in BENIGN_SIGNALS)
# Seconds beyond read_timeout a READ may take before the watchdog answers it: reads waiting on the
# pool time out in the engine first; reads the engine runs on the request's own thread (small exact
# reads) are bounded by this.
READ_MARGIN = 2.0
# Workers waiting in the device read at once; the others park until every reader is busy. The kernel
# hands a request to the reader that has waited longest, so with all 16 reading a serial stream of
# requests went each to the coldest thread: open + close of one file took 135 us against 100-113 us
# with 2 workers (tmpfs source, this 2-core VM). Two keep the hot pair alternating, and a request
# that arrives while one is being served still finds a reader without a wake-up.
SPARE_READERS = 2
# Workers abandoned to hung requests at once before no more are replaced.
MAX_ABANDONED = 64
# Buffers of one reply written as they are, at most (as MAX_PARTS in _loop.c): a reply of more, which
# only a read of many small blocks makes, is joined into one first (a writev takes at most IOV_MAX).
MAX_REPLY_PARTS = 64
# Request buffer beyond the largest write payload: headers and the longest names.
REQUEST_SLACK = 64 * 1024
# Errors of unexpected exceptions logged per opcode at most once in this many seconds.
ERROR_LOG_INTERVAL = 10.0
# Invalidations queued beyond which new ones are dropped (a mass change is rare).
MAX_PENDING_NOTIFICATIONS = 65536
# Seconds the late thread lets answered RELEASEs gather before it runs their handler: one batch (one
# hand-over of the GIL) per wake-up instead of one per close, and a handle given back this late at most.
LATER_BATCH = 0.005
# RELEASEs kept for their handler at most (64 bytes each); past it a RELEASE is served at once.
LATER_CAP = 4096

Handler = Callable[["Request", memoryview], Any]
# An invalidation for the notifier: ("entry", parent node id, name) or ("inode", node id, offset, length).
Notification = tuple[Literal["entry"], int, bytes] | tuple[Literal["inode"], int, int, int]
# A worker's current request: (unique, opcode, started, interrupted, pid of the caller).
Current = tuple[int, int, float, bool, int]
# A handler's answer for requests the kernel expects no reply to.
NO_REPLY = object()
_HEADER = abi.IN_HEADER
_OUT = abi.OUT_HEADER
_HEADER_SIZE = _HEADER.size
# The requests that drop the kernel's references to nodes (counted as read: Session.forgets_read).
_FORGET_OPS = frozenset({abi.Op.FORGET, abi.Op.BATCH_FORGET})
_OUT_SIZE = _OUT.size


class Request:
    """One request being served: its header fields and the worker serving it. Each worker has one,
    refilled for every request it reads (a handler must not keep it past its return)."""

    __slots__ = ("unique", "opcode", "nodeid", "uid", "gid", "pid", "worker", "after")

    def __init__(self, unique: int, opcode: int, nodeid: int, uid: int, gid: int, pid: int, worker: Worker) -> None:
        self.unique, self.opcode, self.nodeid = unique, opcode, nodeid
        self.uid, self.gid, self.pid = uid, gid, pid
        self.worker = worker
        self.after: Callable[[], None] | None = None
        """Set by a handler whose reply refers to memory it must give back once the reply is written."""

    @property
    def buffer(self) -> memoryview:
        """The worker's reply buffer (``max_read`` bytes, page-aligned) for READ payloads."""
        return self.worker.out


class Worker:
    """A thread serving requests from its own clone of the connection's descriptor."""

    __slots__ = ("fd", "buf", "view", "out", "current", "abandoned", "counts", "thread", "owns_fd", "wake")

    def __init__(self, fd: int, owns_fd: bool, request_size: int, reply_size: int) -> None:
        self.fd = fd
        self.owns_fd = owns_fd
        self.buf = bytearray(request_size)
        self.view = memoryview(self.buf)
        self.out = memoryview(mmap.mmap(-1, reply_size))
        self.current: Current | None = None
        self.abandoned = False
        self.counts: dict[int, int] = {}
        self.thread: threading.Thread | None = None
        self.wake = threading.Lock()
        """Held while the worker is not parked; a parked worker waits to acquire it (see Readers)."""
        self.wake.acquire()


class _RateLimitedLog:
    """One log line per key per interval."""

    def __init__(self) -> None:
        self._last: dict[Any, float] = {}
        self._lock = threading.Lock()

    def error(self, key: Any, message: str, *args: Any) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(key, -ERROR_LOG_INTERVAL) < ERROR_LOG_INTERVAL:
                return
            self._last[key] = now
        log.error(message, *args)


class Notifier:
    """Writes invalidation notifications from its own thread (deduplicated, bounded)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._cond = threading.Condition()
        self._pending: dict[Notification, None] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="fastfs-notify", daemon=True)
        self._thread.start()

    def submit(self, item: Notification) -> None:
        with self._cond:
            if not self._stopped and len(self._pending) < MAX_PENDING_NOTIFICATIONS:
                self._pending[item] = None
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                items = list(self._pending)
                self._pending.clear()
            for item in items:
                if item[0] == "entry":
                    self._session.inval_entry(item[1], item[2])
                elif item[0] == "inode":
                    self._session.inval_inode(item[1], item[2], item[3])

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)


class Session:
    """A mounted FUSE connection and the threads serving it."""

    def __init__(
        self,
        fd: int,
        handlers: dict[int, Handler],
        wishes: Wishes,
        threads: int = 16,
        request_timeout: float = 0.0,
        read_timeout: float = 0.0,
        name: str = "fastfs",
        on_abandon: Callable[[int, memoryview], None] | None = None,
        native: bool | None = None,
        direct: Any = None,
        late_release: bool = False,
        spin_us: int = 0,
    ) -> None:
        self.fd = fd
        self.native = (use_native_loop() if native is None else native) and native_loop is not None
        """Workers run the native request loop (``_loop.c``, when it was built); else the Python one."""
        self.direct = direct if self.native else None
        """The handles whose reads the native loop answers itself (a ``_loop.Direct``, see the C file),
        or None (the Python loop, or none given): every READ goes to its handler."""
        self.later = native_loop.Later(LATER_CAP) if self.native and late_release and native_loop else None
        """RELEASEs the native loop answered and kept for their handler (a ``_loop.Later``), or None:
        each RELEASE is served at once."""
        self._late_lock = threading.Lock()  # held by whoever runs a batch of kept RELEASEs (never by a worker)
        self._late_thread: threading.Thread | None = None
        self._late_ending = threading.Event()  # the session is closing: the late thread runs the rest and ends
        self._late_released = 0  # RELEASEs served late; guarded by _late_lock
        # the worker named by the requests run late (a handler may look at it; nothing replies on it)
        self._late_worker = Worker(fd, False, _HEADER_SIZE, mmap.PAGESIZE)
        # the native loop's reader places (its twin of _readers, _parked and _ending; with spin_us, the
        # reading worker that keeps reading for the next request a while: see read_request in _loop.c),
        # or None
        self._places = native_loop.Readers(SPARE_READERS, spin_us) if self.native and native_loop is not None else None
        # FORGET and BATCH_FORGET requests the Python loop read (the native loop counts in _places)
        self._forgets_lock = threading.Lock()
        self._forgets_read = 0  # guarded by _forgets_lock
        self.handlers = handlers
        self.wishes = wishes
        self.threads = threads
        self.request_timeout = request_timeout
        self.read_deadline = 0.0  # read by the watchdog without a lock (one float); see set_read_timeout
        self.set_read_timeout(read_timeout)
        self.name = name
        self.on_abandon = on_abandon  # (opcode, request body) of a request the watchdog answered
        self.negotiated: Negotiated | None = None
        self.notifier: Notifier | None = None
        self._lock = threading.Lock()
        self._workers: list[Worker] = []
        self._abandoned = 0
        self._timeouts = 0
        self._interrupts = 0
        self._stopped = threading.Event()
        self._errors = _RateLimitedLog()
        self._watchdog: threading.Thread | None = None
        self._closed = False
        self._park = threading.Lock()
        self._readers = 0  # workers in (or entering) the device read; guarded by _park
        self._parked: list[Worker] = []  # waiting on their wake lock, the latest last; guarded by _park
        self._ending = False  # the connection is gone: parked workers leave; guarded by _park

    # -- startup --------------------------------------------------------------------------------

    def set_read_timeout(self, read_timeout: float) -> None:
        """The engine's read_timeout (0: none) changed: READs are answered by the watchdog past it plus
        :data:`READ_MARGIN` (a reload applies it live)."""
        self.read_deadline = read_timeout + READ_MARGIN if read_timeout else 0.0

    def start(self, on_init: Callable[[Negotiated], None] | None = None) -> Negotiated:
        """Answer INIT on the connection, then start the workers and the watchdog.

        *on_init* sees the negotiated connection before any other request is served."""
        buf = bytearray(abi.MIN_READ_BUFFER * 2)
        while True:
            try:
                n = os.readv(self.fd, [buf])
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.ENOENT:
                    continue
                raise NegotiationError(f"reading INIT failed: {e.strerror}") from None
            break
        length, opcode, unique, _nodeid, _uid, _gid, _pid, _ext, _pad = _HEADER.unpack_from(buf)
        if opcode != Op.INIT or n < length:
            raise NegotiationError(f"expected INIT, got opcode {opcode}")
        body = memoryview(buf)[_HEADER_SIZE:length]
        try:
            negotiated = negotiate(Offer.parse(body), self.wishes)
        except NegotiationError:
            self._send(self.fd, unique, -errno.EPROTO, ())
            raise
        self.negotiated = negotiated
        if on_init is not None:
            on_init(negotiated)
        # every worker (and its clone of the descriptor) exists before INIT is answered: the kernel
        # sends no other request before that reply, and a mount that answers has all it will hold
        self.notifier = Notifier(self)
        for _ in range(self.threads):
            self._spawn()
        self._send(self.fd, unique, 0, (negotiated.reply(),))
        self._watchdog = threading.Thread(target=self._watch, name=f"{self.name}-watchdog", daemon=True)
        self._watchdog.start()
        if self.later is not None:
            self._late_thread = threading.Thread(target=self._run_late_forever, name=f"{self.name}-late", daemon=True)
            self._late_thread.start()
        return negotiated

    def _spawn(self) -> Worker | None:
        assert self.negotiated is not None
        fd, owns = self._clone()
        request_size = self.negotiated.max_write + REQUEST_SLACK
        worker = Worker(fd, owns, request_size, self.negotiated.max_read)
        thread = threading.Thread(target=self._serve, args=(worker,), name=f"{self.name}-fuse", daemon=True)
        worker.thread = thread
        with self._lock:
            if self._closed:
                if owns:
                    os.close(fd)
                return None
            self._workers.append(worker)
        thread.start()
        return worker

    def _clone(self) -> tuple[int, bool]:
        """A clone of the session descriptor (replies go back on it), or the descriptor itself."""
        try:
            fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return self.fd, False
        try:
            fcntl.ioctl(fd, abi.DEV_IOC_CLONE, struct.pack("I", self.fd))
        except OSError:
            os.close(fd)
            return self.fd, False
        return fd, True

    # -- the request loop -----------------------------------------------------------------------
    def _serve(self, worker: Worker) -> None:
        try:
            if self.native:
                self._serve_native(worker)
            else:
                self._serve_python(worker)
        finally:
            with self._lock:
                if worker in self._workers:
                    self._workers.remove(worker)
                if worker.abandoned:
                    self._abandoned -= 1
                # the connection is gone when the last worker still serving it has seen its end;
                # abandoned workers (still stuck in a hung source, or leaving after their late
                # reply) never serve again, so they are not waited for
                last = not worker.abandoned and not any(not w.abandoned for w in self._workers)
            if worker.owns_fd:
                try:
                    os.close(worker.fd)
                except OSError:
                    pass
            if last:
                self._stopped.set()

    def _serve_native(self, worker: Worker) -> None:
        """The native loop (``_loop.c``): the same steps as :meth:`_serve_python` (reader places
        included, kept in C), the GIL held only while a handler runs."""
        assert native_loop is not None
        request = Request(0, 0, 0, 0, 0, 0, worker)
        code = native_loop.serve(
            worker.fd, worker.buf, self.handlers, request, worker, NO_REPLY, abi.NO_REPLY_OPS,
            self._handler_failed, self._reply_errno, self._places, self.direct, self.later,
        )  # fmt: skip
        if code:  # the device read ended the connection (ENODEV: unmounted or aborted; -1: end of file)
            self._end_readers()
            if code > 0 and code != errno.ENODEV:
                log.error("reading the FUSE device failed: %s", os.strerror(code))

    # -- late releases ---------------------------------------------------------------------------
    def _run_late_forever(self) -> None:
        later = self.later
        assert later is not None
        while later.wait(None):  # (False once closed and empty)
            self._late_ending.wait(LATER_BATCH)  # (let a batch gather)
            self.run_late()

    def forgets_read(self) -> int:
        """FORGET and BATCH_FORGET requests read so far, each counted by the worker that read it before
        its handler runs (the native loop: before it takes the GIL). The adapter compares it with the
        FORGETs it handled: one read and not yet handled may have been queued by the kernel's eviction
        of an inode a request being answered now was made for (a node whose pages went with it)."""
        if self._places is not None:
            return int(self._places.forgets())
        return self._forgets_read

    def run_late(self) -> int:
        """Run the RELEASE handler on every RELEASE the loop answered and kept, after any batch already
        being run (so a caller that needs the handles' counts exact sees them); returns how many ran."""
        later = self.later
        if later is None:
            return 0
        with self._late_lock:
            records = later.take()
            if not records:
                return 0
            handler = self.handlers[Op.RELEASE]  # (the loop keeps only RELEASEs it has a handler for)
            for record in records:
                _length, opcode, unique, nodeid, uid, gid, pid, _ext, _pad = _HEADER.unpack_from(record)
                request = Request(unique, opcode, nodeid, uid, gid, pid, self._late_worker)
                try:
                    handler(request, memoryview(record)[_HEADER_SIZE:])
                    if request.after is not None:
                        request.after()
                except Exception as e:  # noqa: BLE001 - one failed release must not keep the others
                    self._handler_failed(opcode, e)
            self._late_released += len(records)
            return len(records)

    def _end_late(self) -> None:
        """Keep no more RELEASEs, let the late thread run what was kept and end."""
        if self.later is None:
            return
        self._late_ending.set()
        self.later.close()
        thread = self._late_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self.run_late()

    def _handler_failed(self, opcode: int, e: BaseException) -> None:
        self._errors.error(opcode, "%s failed with %s: %s; answered EIO", _name(opcode), type(e).__name__, e)

    def _reply_errno(self, code: int) -> None:
        self._reply_failed(OSError(code, os.strerror(code)))

    def _serve_python(self, worker: Worker) -> None:
        handlers = self.handlers
        fd = worker.fd
        buf = worker.buf
        view = worker.view
        counts = worker.counts
        unpack = _HEADER.unpack_from
        pack = _OUT.pack
        writev = os.writev
        monotonic = time.monotonic
        request = Request(0, 0, 0, 0, 0, 0, worker)  # refilled per request (no object per request)
        while not worker.abandoned:
            if not self._take_reader_place(worker):
                break
            try:
                n = os.readv(fd, [buf])
            except OSError as e:
                code = e.errno
                if code in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    self._leave_reader_place()
                    continue
                self._end_readers()  # (ENODEV: the connection is gone; any other: unusable)
                if code != errno.ENODEV:
                    log.error("reading the FUSE device failed: %s", e.strerror)
                break
            self._leave_reader_place()
            if n < _HEADER_SIZE:
                if n == 0:  # end of the connection (only a socket peer says so this way)
                    self._end_readers()
                    break
                continue
            length, opcode, unique, nodeid, uid, gid, pid, _ext, _pad = unpack(buf)
            if opcode in _FORGET_OPS:  # (counted as soon as read: see forgets_read)
                with self._forgets_lock:
                    self._forgets_read += 1
            counts[opcode] = counts.get(opcode, 0) + 1
            handler = handlers.get(opcode)
            if handler is None:
                if opcode not in abi.NO_REPLY_OPS:
                    self._send(fd, unique, -errno.ENOSYS, ())
                continue
            request.unique, request.opcode, request.nodeid = unique, opcode, nodeid
            request.uid, request.gid, request.pid, request.after = uid, gid, pid, None
            worker.current = (unique, opcode, monotonic(), False, pid)
            try:
                reply = handler(request, view[_HEADER_SIZE:length])
                error = 0
            except OSError as e:
                reply = None
                error = e.errno if isinstance(e.errno, int) and e.errno > 0 else errno.EIO
            except Exception as e:  # noqa: BLE001 - a bug must cost one request, not the daemon
                reply = None
                error = errno.EIO
                self._handler_failed(opcode, e)
            worker.current = None
            try:
                if worker.abandoned:
                    break  # the watchdog answered this request already
                if type(reply) is bytes:  # the common answer, one payload: written here (no call of _send)
                    try:
                        writev(fd, (pack(_OUT_SIZE + len(reply), 0, unique), reply))
                    except OSError as e:
                        self._reply_failed(e)
                elif error:
                    self._send(fd, unique, -error, ())
                elif reply is None:
                    self._send(fd, unique, 0, ())
                elif reply is not NO_REPLY:
                    self._send(fd, unique, 0, reply if isinstance(reply, list) else (reply,))
            finally:
                if request.after is not None:
                    request.after()

    def _take_reader_place(self, worker: Worker) -> bool:
        """Wait until *worker* may read the device (parked while :data:`SPARE_READERS` others are);
        False when the connection is gone."""
        with self._park:
            if self._ending:
                return False
            if self._readers < SPARE_READERS:
                self._readers += 1
                return True
            self._parked.append(worker)
        worker.wake.acquire()  # released by the worker that hands it a reader's place, or at the end
        return not self._ending

    def _leave_reader_place(self) -> None:
        """The calling worker got a request: when it was the last reader, the most recently parked
        worker (the warmest) takes a reader's place, counted for it here."""
        with self._park:
            self._readers -= 1
            if self._readers or not self._parked:
                return
            woken = self._parked.pop()
            self._readers += 1
        woken.wake.release()

    def _end_readers(self) -> None:
        """The connection is gone: no worker reads again, the parked ones leave."""
        if self._places is not None:
            self._places.end()
        with self._park:
            self._ending = True
            parked, self._parked = self._parked, []
        for worker in parked:
            worker.wake.release()

    def _send(self, fd: int, unique: int, error: int, payload: Any) -> None:
        if len(payload) > MAX_REPLY_PARTS:
            payload = (b"".join(payload),)
        size = _OUT_SIZE
        for part in payload:
            size += len(part)
        try:
            os.writev(fd, [_OUT.pack(size, error, unique), *payload])
        except OSError as e:
            self._reply_failed(e)

    def _reply_failed(self, e: OSError) -> None:
        # ENOENT: the kernel no longer waits for this request (interrupted, or answered by the
        # watchdog); ENODEV: the connection is gone
        if e.errno not in (errno.ENOENT, errno.ENODEV):
            self._errors.error(("reply", e.errno), "FUSE reply failed: %s", e.strerror)

    # -- interrupts and the watchdog ------------------------------------------------------------
    def interrupt(self, unique: int) -> bool:
        """Mark the request *unique* interrupted; False when no worker is serving it (yet)."""
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            current = worker.current
            if current is not None and current[0] == unique:
                worker.current = (current[0], current[1], current[2], True, current[4])
                with self._lock:  # (_interrupts is counted by any worker: guarded by _lock)
                    self._interrupts += 1
                return True
        return False

    def _watch(self) -> None:
        while not self._stopped.wait(WATCHDOG_TICK):
            now = time.monotonic()
            with self._lock:
                workers = [w for w in self._workers if not w.abandoned]
            for worker in workers:
                current = worker.current
                if current is None:
                    continue
                unique, opcode, started, interrupted, pid = current
                age = now - started
                if interrupted and age > INTERRUPT_GRACE:
                    self._abandon(worker, current, errno.EINTR)
                    continue
                if opcode == Op.READ and age > SIGNAL_POLL_AGE and signal_pending(pid):
                    with self._lock:
                        self._interrupts += 1
                    self._abandon(worker, current, errno.EINTR)
                    continue
                limit = self.read_deadline if opcode == Op.READ else self.request_timeout
                if limit and age > limit:
                    self._timeouts += 1
                    self._errors.error(
                        ("timeout", opcode),
                        "%s request stuck for %.0f s (source not answering): answered EIO",
                        _name(opcode),
                        age,
                    )
                    self._abandon(worker, current, errno.EIO)

    def _abandon(self, worker: Worker, current: Current, error: int) -> None:
        with self._lock:
            if worker.current is not current or worker.abandoned:
                return  # it finished meanwhile
            worker.abandoned = True
            self._abandoned += 1
            replace = self._abandoned <= MAX_ABANDONED and not self._closed
        # the adapter first: the kernel may send the next request for the same page the moment it has
        # the answer (it reads a page again after its read-ahead failed), and that one must find the
        # handle taken back from the native loop's direct reads, the file counted stuck (it then fails
        # at once instead of waiting for a second deadline)
        if self.on_abandon is not None:
            try:
                self.on_abandon(current[1], worker.view[_HEADER_SIZE:])  # the request is still in the buffer
            except Exception:  # noqa: BLE001 - the watchdog must go on
                log.exception("abandon hook failed")
        self._send(worker.fd, current[0], -error, ())
        if replace:
            self._spawn()

    # -- notifications and backing files --------------------------------------------------------
    def _notify(self, code: int, parts: list[Any]) -> int:
        size = _OUT_SIZE + sum(len(p) for p in parts)
        try:
            os.writev(self.fd, [_OUT.pack(size, code, 0), *parts])
        except OSError as e:
            return -(e.errno or errno.EIO)
        return 0

    def inval_entry(self, parent: int, name: bytes) -> int:
        """Drop the kernel's cached name *name* in directory *parent* (0 or -errno; ENOENT: not cached)."""
        head = abi.NOTIFY_INVAL_ENTRY_OUT.pack(parent, len(name), 0)
        return self._notify(abi.Notify.INVAL_ENTRY, [head, name, b"\0"])

    def inval_inode(self, nodeid: int, offset: int = 0, length: int = -1) -> int:
        """Drop cached attributes (and pages in [offset, offset+length), -1: to the end) of *nodeid*.

        A negative *offset* drops the attributes only."""
        return self._notify(abi.Notify.INVAL_INODE, [abi.NOTIFY_INVAL_INODE_OUT.pack(nodeid, offset, length)])

    def store(self, nodeid: int, offset: int, data: Any) -> int:
        """Put *data* into the kernel's page cache of *nodeid* at *offset* (0 or -errno)."""
        head = abi.NOTIFY_STORE_OUT.pack(nodeid, offset, len(data), 0)
        return self._notify(abi.Notify.STORE, [head, data])

    def backing_open(self, fd: int) -> int:
        """Register *fd* as a passthrough backing file; returns its id (raises OSError)."""
        arg = bytearray(abi.BACKING_MAP.pack(fd, 0, 0))
        backing_id: int = fcntl.ioctl(self.fd, abi.DEV_IOC_BACKING_OPEN, arg, True)
        return backing_id

    def backing_close(self, backing_id: int) -> None:
        try:
            fcntl.ioctl(self.fd, abi.DEV_IOC_BACKING_CLOSE, struct.pack("I", backing_id))
        except OSError as e:
            if e.errno not in (errno.ENODEV, errno.ENOENT):
                self._errors.error("backing_close", "closing backing file %d failed: %s", backing_id, e.strerror)

    # -- state ----------------------------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        """Requests per opcode name, watchdog timeouts, interrupts, abandoned workers."""
        with self._lock:
            workers = list(self._workers)
            abandoned = self._abandoned
        requests: dict[str, int] = {}
        counts = [list(worker.counts.items()) for worker in workers]
        if self._places is not None:  # (requests of no handler the native loop answered without the GIL)
            counts.append(list(self._places.answered().items()))
        for items in counts:
            for opcode, n in items:
                key = _name(opcode).lower()
                requests[key] = requests.get(key, 0) + n
        return {
            "requests": requests,
            "timeouts": self._timeouts,
            "interrupts": self._interrupts,
            "abandoned_workers": abandoned,
            "workers": len(workers),
            "late_releases": None if self.later is None else self._late_released,
            "spun_reads": None if self._places is None else self._places.spun(),
        }

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every worker still serving has ended (the connection is gone); True if it has.
        Workers the watchdog abandoned are not waited for: one may stay stuck in a source call that
        never returns, and the daemon must exit anyway."""
        return self._stopped.wait(timeout)

    @property
    def running(self) -> bool:
        return not self._stopped.is_set()

    @staticmethod
    def abort(st_dev: int) -> bool:
        """Abort the connection of the mount whose device number is *st_dev* (its mount turns dead:
        every request fails with ENOTCONN until it is unmounted); True if the kernel took it."""
        name = os.minor(st_dev) if os.major(st_dev) == 0 else st_dev
        try:
            with open(f"/sys/fs/fuse/connections/{name}/abort", "w") as f:
                f.write("1")
        except OSError:
            return False
        return True

    def close(self) -> None:
        """Stop the notifier and close the session descriptor (after the workers ended)."""
        with self._lock:
            self._closed = True
        self._end_readers()
        self._end_late()
        if self.notifier is not None:
            self.notifier.stop()
        self._stopped.set()
        try:
            os.close(self.fd)
        except OSError:
            pass


def use_native_loop() -> bool:
    """Whether sessions run the native request loop: when it was built, unless ``$FASTFS_LOOP`` says
    ``python``."""
    return os.environ.get(LOOP_ENV, "") != "python" and native_loop is not None


def signal_pending(pid: int) -> bool:
    """Whether thread *pid* has a signal pending that it does not block and that asks it to stop (one
    of :data:`BENIGN_SIGNALS` does not): ``SigPnd``/``ShdPnd`` of ``/proc/PID/status``. False when the
    thread is gone or unknown (pid 0: a request of the kernel itself)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read()
    except OSError:
        return False
    masks: dict[bytes, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(b":")
        if key in (b"SigPnd", b"ShdPnd", b"SigBlk", b"SigIgn"):
            masks[key] = int(value.strip() or b"0", 16)
    pending = masks.get(b"SigPnd", 0) | masks.get(b"ShdPnd", 0)
    return bool(pending & ~masks.get(b"SigBlk", 0) & ~masks.get(b"SigIgn", 0) & ~_BENIGN_MASK)


def _name(opcode: int) -> str:
    try:
        return Op(opcode).name
    except ValueError:
        return f"OP{opcode}"
