"""The access shape a source is read with, chosen from what is known and measured of it.

Sources differ in what they do with concurrency and order, and reading one the wrong way costs
more than not reading ahead at all:

* a local disk, NFS, Lustre, CephFS, sshfs: any handle reads any offset; several handles read one
  file in parallel, each stream adding bandwidth on a latency-bound link. fastfs reads a block as
  pieces spread over several source handles (:data:`PARALLEL`);
* stream-oriented clients (rclone without its VFS cache, s3fs, goofys, gcsfuse without its file
  cache, blobfuse2, mountpoint-s3) serve a handle as one ranged download: a read that does not
  continue where the handle's last one ended restarts the download, and the server reads ahead for
  the old one in vain. Measured here over a loopback rclone mount (256 MiB, page cache dropped,
  the server's own read counter): one handle read in order, 4 MiB requests, 0.73 s and 1.06x the
  file at the server; 4 handles over contiguous quarters 0.64 s but 1.69x; 4 handles interleaving
  1 MiB pieces (the parallel shape) 1.19 s and 5.24x. So such a source is read with one handle per
  file, strictly in order, in whole blocks (:data:`SEQUENTIAL`). There, the first open of a large
  file whose loader reads it in order passes through instead: the client already streams it ahead
  of the loader (:func:`fastfs.fsio.policy.stream_file_route`, which also says what stays served).

What is known (:class:`SourceFacts`): the type of the source's mount (its FUSE subtype names the
client: ``fuse.rclone``); whether the source is local; optionally a measured probe of one handle
(the cost of a read that continues the last one against one that jumps). :func:`choose` is pure:
the override (``readahead.source_shape``) wins, then a known client (a stream client, or one whose
protocol reads by offset: :data:`POSITIONAL_CLIENTS`), then the probe; everything else keeps the
parallel shape. The reason is kept for ``fastfs stats`` and the debug log.

The jump probe (:func:`needs_probe`, :func:`probe_reads`) is for FUSE sources whose client the
table does not know: on one fresh handle of the first large file opened (:data:`PROBE_MIN_SIZE`),
a read at the start, one continuing it, a jump far ahead and one continuing that, each
:data:`PROBE_READ` bytes; when that jump looked like a restart (:func:`jumps_restart`), a second
jump (back to the middle) and its continuation confirm it. The cheapest continuing read and the
cheapest jump are the facts (the least noisy of each: a busy machine only makes reads slower, and a
real restart is never cheap). The I/O is :func:`fastfs.fsio.source.jump_probe`'s, run off the
reader's path. A probe runs next to the loader whose open started it, and a busy link can make a
jump look like a restart, never a restart look cheap: so a stream verdict is probed again at the
opens of the next :data:`PROBE_CONFIRMS` other large files (state :data:`PROBE_RECHECK`, the verdict
in force meanwhile), and the cheapest continuing read and jump of all probes decide. On a
stream-oriented client a jump costs a restarted download (the emulator of the benchmarks charges
8 MiB for it), so the probes cost one or two of them each, a few per mount.

:class:`Shaper` holds a mount's choice at run time: the facts, the override, the shape in force
and the probe's state, for the stats snapshot. While a probe is due or running the shape is
:data:`SEQUENTIAL`: it never makes the source move more than the reader asks for, where the parallel
shape would multiply it on a stream-oriented client; on a source the probe then finds parallel, the
files read meanwhile only had one handle instead of several. A format plan decided in that window
would read its whole file that way, so the format probe waits for a running jump probe first
(:meth:`Shaper.wait_settled`, bounded by :data:`SETTLE_WAIT`), and so does the route of the large
file's open that starts the probe on its file, and of other files of a probe's size opened while it
runs (served in that window, a stream client's in-order loader would be read on one stream at half
the client's own speed), until :data:`SETTLE_WAIT` after the probe started at most
(:meth:`Shaper.wait_probe`: a probe hung on its file holds up opens only in that span, and smaller
files never). Concurrency: ``shape`` is replaced
whole (one attribute store) and read without a lock on the fill path; the rest is written under
``_lock``, whose condition ``_settled`` wakes the waiters when a running probe ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

PARALLEL = "parallel"
SEQUENTIAL = "sequential"
AUTO = "auto"
SHAPES = (AUTO, PARALLEL, SEQUENTIAL)

# FUSE subtypes of clients that serve a handle as one ranged download (a jump restarts it).
STREAM_CLIENTS = frozenset(
    {"rclone", "s3fs", "goofys", "gcsfuse", "blobfuse", "blobfuse2", "mountpoint-s3", "mount-s3", "s3backer"}
)
# FUSE subtypes of object-store clients, whose directories are made up from the store's key prefixes:
# their times do not move when entries are made, removed or replaced (measured: over rclone mount of
# rclone serve webdav, a file made on the server showed in the mount's listing, the directory's mtime
# and ctime unchanged; over s3fs on a moto server, an object put under a prefix showed in the
# listing while the directory's times stayed at the epoch). Listings and verified directories cannot
# rest on them (dir_times_kept); the other clients are named for their design (directories made up).
SYNTHETIC_DIR_CLIENTS = frozenset(
    {"rclone", "s3fs", "goofys", "gcsfuse", "blobfuse", "blobfuse2", "mountpoint-s3", "mount-s3"}
)
# FUSE subtypes of clients whose protocol reads by offset (SFTP, Ceph, Gluster, JuiceFS's chunks): any
# handle reads any offset, so they are read in parallel without a probe. A probe runs next to the
# loader whose open started it, and on a busy link it can take the loader's queue for a restart:
# in one of nine fresh mounts over loopback sshfs it found a "stream" (jump 3.6 ms, continuing read
# 0.8 ms; alone it measures the two within 0.3 ms at 0, 2 and 10 ms of delay), and over sshfs at
# 10 ms one-way delay np.load of 256 MiB ran at 0.98x direct read as one stream against 7.7x in
# parallel. (Measured over sshfs; the others are named for their protocol.)
POSITIONAL_CLIENTS = frozenset({"sshfs", "ceph-fuse", "glusterfs", "juicefs"})
# FUSE subtypes of clients whose listing asks the store about every entry: s3fs answers a directory
# listing with a HEAD of each object its stat cache lacks (measured over moto, 2 ms delay: a scan's
# listing of 10,000 objects for a reader of 1,000 made 11,079 HEADs against the reader's own 2,003).
# A replay of a learned set, whose names are known, does not list such a directory
# (:func:`replay_lists`): each fetch's open asks for its own object's metadata, only for the set.
PER_ENTRY_LISTING_CLIENTS = frozenset({"s3fs"})
# Stream clients where a jump costs one ranged request and wastes nothing: s3fs fetches the ranges a
# reader asks for (parts of its multipart_size) and drops no download, so a loader that maps a file
# loses nothing reading it directly (measured over loopback, 256 MiB safetensors: load_file moved 1.00x
# the file at the server, direct or through fastfs, and ran at 0.88x served against 1.09x passed
# through). On the others a jump restarts a download the server reads ahead for (rclone: 90-219x).
CHEAP_JUMP_CLIENTS = frozenset({"s3fs"})
# A jump costs at least this many times a continuing read on the probed handle: the handle is a stream.
JUMP_RATIO = 4.0
# ... and at least this much more in absolute terms (seconds): below it the difference is noise on
# a fast source, whatever the ratio.
JUMP_EXTRA = 0.002
# Files at least this large are probed: the jumps land tens of MiB away from the stream, beyond what
# any client reads ahead or skips forward through (rclone's buffer is 16 MiB).
PROBE_MIN_SIZE = 32 * 1024 * 1024
# Bytes of each probe read: small, so a continuing read costs little next to a restart's round trip,
# and page-aligned for O_DIRECT.
PROBE_READ = 128 * 1024
# Probes of a mount that may fail (a file that vanished, an I/O error) before the shape is settled
# without one.
PROBE_ATTEMPTS = 3
# Probes after a first stream verdict before it is final, each at the open of another large file: a
# probe runs next to the loader whose open started it, and a busy link can make a jump look like a
# restart (over loopback sshfs, in one of nine fresh mounts: jump 3.6 ms, continuing read 0.8 ms)
# while noise never makes a jump cheap, so the cheapest of each over all probes decides. On a real
# stream client each costs one or two restarted downloads, once per mount.
PROBE_CONFIRMS = 2
# Seconds a format probe waits for a running jump probe before it plans in the provisional shape: the
# probe is an open and four reads of 128 KiB, milliseconds on any source worth reading in parallel.
SETTLE_WAIT = 2.0
# Probe read kinds (see probe_reads).
START, CONTINUE, JUMP = "start", "continue", "jump"
# Probe states (Shaper.probe_state).
PROBE_NONE, PROBE_DUE, PROBE_RUNNING, PROBE_DONE, PROBE_FAILED = "none", "due", "running", "done", "failed"
# A stream verdict in force, to be probed again at the next large file's open (PROBE_CONFIRMS).
PROBE_RECHECK = "recheck"


@dataclass(frozen=True)
class SourceFacts:
    """What is known of a source when its shape is chosen."""

    mount_type: str = ""  # the source mount's type as the mount table gives it: "ext4", "nfs4", "fuse.rclone"
    local: bool = False  # a local filesystem (statfs type), read by passthrough where it can be
    continue_seconds: float | None = None  # probe: a read continuing the handle's last one
    jump_seconds: float | None = None  # probe: a read of the same size at a distant offset on that handle


@dataclass(frozen=True)
class Shape:
    """How a source's files are read."""

    kind: str  # PARALLEL or SEQUENTIAL
    reason: str  # why, in a few words (stats, debug log)

    @property
    def sequential(self) -> bool:
        return self.kind == SEQUENTIAL


def client_of(mount_type: str) -> str:
    """The FUSE client a mount type names ("fuse.rclone" -> "rclone"; "" for kernel filesystems)."""
    kind, _, sub = mount_type.partition(".")
    return sub if kind in ("fuse", "fuseblk") and sub else ""


def dir_times_kept(mount_type: str) -> bool:
    """Whether the source's directory times move when the directory's entries change, so that a stat
    of a directory tells whether its listing still holds (:mod:`fastfs.fsio.dirs`): every filesystem
    but the object-store clients (:data:`SYNTHETIC_DIR_CLIENTS`)."""
    return client_of(mount_type) not in SYNTHETIC_DIR_CLIENTS


def replay_lists(mount_type: str) -> bool:
    """Whether a replay of a learned set lists its directory before fetching the set: everywhere but
    over clients whose listing costs a request per entry (:data:`PER_ENTRY_LISTING_CLIENTS`). The
    listing is one request per buffer of entries, and it tells the source's client every name at once:
    a client whose listing brings attributes (GlusterFS's READDIRPLUS, sshfs's attribute cache; NFS's
    READDIRPLUS by design) then opens each file without a lookup of its own, which many clients answer
    one at a time per directory. Measured with 2 ms one-way delay, 10,000 files of 3 KiB, one reader in
    name order on a rerun of the job: over GlusterFS a replay without the listing took 47.5 s (direct:
    51.4 s, 10,000 serial lookups), with it 5.7 s; over sshfs 53.6 s against 11.7 s (direct 140.7 s)."""
    return client_of(mount_type) not in PER_ENTRY_LISTING_CLIENTS


def scan_lists_first(mount_type: str) -> bool:
    """Whether a scan may list its directory before the reader (or the kernel) listed it on this mount:
    where a listing is cheap, as for :func:`replay_lists`. Over a client whose listing costs a request
    per entry (:data:`PER_ENTRY_LISTING_CLIENTS`) a directory listed by the reader first costs the scan
    no more than the reader's own listing (the client's stat cache holds its entries), and one it never
    lists is scanned by no one: the listing would ask about every entry for a reader of a few. Measured
    over s3fs on moto (2 ms one-way delay, 10,000 files of 3 KiB, names known to the reader without a
    listing): the first tenth in name order took 41.96 s against 23.77 s directly (0.57x), a shuffled
    tenth 0.44x; whole passes gained 1.13-1.23x on their first run (their next runs replay what they
    read, without a listing)."""
    return replay_lists(mount_type)


def is_fuse(mount_type: str) -> bool:
    """True for a FUSE mount type (``fuse``, ``fuse.rclone``, ``fuseblk.ntfs``)."""
    return mount_type.partition(".")[0] in ("fuse", "fuseblk")


def needs_probe(facts: SourceFacts, override: str = AUTO) -> bool:
    """True when only the jump probe can tell the shape: a FUSE source whose client the table does not
    know, not probed yet, no override."""
    return (
        override == AUTO
        and not facts.local
        and is_fuse(facts.mount_type)
        and client_of(facts.mount_type) not in STREAM_CLIENTS | POSITIONAL_CLIENTS
        and (facts.continue_seconds is None or facts.jump_seconds is None)
    )


def probe_reads(size: int, read: int = PROBE_READ) -> list[tuple[str, int]]:
    """The probe's reads of a file of *size* bytes, in order: (kind, offset), offsets multiples of
    *read* (see the module docstring; the last two only confirm a first jump that looked like a
    restart); empty when the file is too small to jump far enough."""
    if size < max(PROBE_MIN_SIZE, 8 * read):
        return []
    far = (size - 3 * read) // read * read  # near the end, a whole read and its continuation inside
    middle = size // 2 // read * read
    return [
        (START, 0),
        (CONTINUE, read),
        (JUMP, far),
        (CONTINUE, far + read),
        (JUMP, middle),
        (CONTINUE, middle + read),
    ]


def jumps_restart(continue_seconds: float, jump_seconds: float) -> bool:
    """True when a jump costs what a restarted download does: :data:`JUMP_RATIO` times a continuing
    read and :data:`JUMP_EXTRA` more."""
    return jump_seconds >= JUMP_RATIO * continue_seconds and jump_seconds - continue_seconds >= JUMP_EXTRA


def choose(facts: SourceFacts, override: str = AUTO) -> Shape:
    """The shape to read the source with (see the module docstring)."""
    if override == PARALLEL:
        return Shape(PARALLEL, "readahead.source_shape=parallel")
    if override == SEQUENTIAL:
        return Shape(SEQUENTIAL, "readahead.source_shape=sequential")
    if facts.local:
        return Shape(PARALLEL, "local filesystem")
    client = client_of(facts.mount_type)
    if client in STREAM_CLIENTS:
        return Shape(SEQUENTIAL, f"{client} serves a handle as one ranged download")
    if client in POSITIONAL_CLIENTS:
        return Shape(PARALLEL, f"{client} reads any offset on any handle")
    if facts.continue_seconds is not None and facts.jump_seconds is not None:
        if jumps_restart(facts.continue_seconds, facts.jump_seconds):
            return Shape(
                SEQUENTIAL,
                f"a jump on one handle cost {facts.jump_seconds * 1e3:.1f} ms, a continuing read "
                f"{facts.continue_seconds * 1e3:.1f} ms",
            )
        return Shape(PARALLEL, "a jump on one handle costs about what a continuing read does")
    return Shape(PARALLEL, f"{facts.mount_type or 'unknown'} reads any offset on any handle")


class Shaper:
    """A mount's shape at run time: the facts, the override, the shape in force and the probe's state
    (see the module docstring)."""

    def __init__(self, facts: SourceFacts, override: str = AUTO, clock: Callable[[], float] = time.monotonic) -> None:
        self.facts = facts
        self.override = override
        self.clock = clock
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # notified when a running probe ends
        self.attempts = 0  # probes that failed (guarded by _lock)
        self.probes = 0  # probes that measured (guarded by _lock)
        self.error = ""  # the last probe failure, for the report (guarded by _lock)
        self._resume = (PROBE_DUE, "")  # the state and last probed file a claim came from (guarded by _lock)
        self._probed_path = ""  # the file the last claimed probe reads (guarded by _lock)
        self._claimed_at = 0.0  # clock() when the last probe was claimed (guarded by _lock)
        if needs_probe(facts, override):
            self.probe_state = PROBE_DUE  # guarded by _lock
            pending = f"{facts.mount_type or 'unknown'}: one handle in order until the jump probe of a large file tells"
            self.shape = Shape(SEQUENTIAL, pending)
        else:
            self.probe_state = PROBE_NONE
            self.shape = choose(facts, override)

    @property
    def sequential(self) -> bool:
        """The shape in force is SEQUENTIAL (one attribute load; read on every block fill)."""
        return self.shape.kind == SEQUENTIAL

    @property
    def provisional(self) -> bool:
        """The shape in force only waits for the jump probe (due or running): SEQUENTIAL so the source
        moves no more than the reader asks, not yet known to be a stream (one attribute load)."""
        return self.probe_state in (PROBE_DUE, PROBE_RUNNING)

    @property
    def stream(self) -> bool:
        """The source is known to be read as one stream per file: :data:`SEQUENTIAL` by a known client, a
        setting or the jump probe's answer, not only while the probe is due or running."""
        return self.shape.kind == SEQUENTIAL and not self.provisional

    @property
    def jumps_waste(self) -> bool:
        """A jump on one handle of the source wastes a download (every stream source but the
        :data:`CHEAP_JUMP_CLIENTS`; an unknown one found a stream by the jump probe counts as wasting)."""
        return client_of(self.facts.mount_type) not in CHEAP_JUMP_CLIENTS

    def claim_probe(self, size: int, at_open: bool = False, path: str = "") -> bool:
        """True once, for the caller that is to probe *path*, a file of *size* bytes (then
        :meth:`probed` or :meth:`probe_failed`); False when no probe is due or the file is too small.
        A stream verdict's recheck is claimed only *at_open*, of another file than the last probed:
        not by the fills or the next open of the file whose loader ran next to the last probe (a
        loader opens a file twice: to parse its header, then to map it)."""
        state = self.probe_state  # racy first test: no lock per fill
        if not (state == PROBE_DUE or (at_open and state == PROBE_RECHECK)) or not probe_reads(size):
            return False
        with self._lock:
            if self.probe_state != state or (state == PROBE_RECHECK and path == self._probed_path):
                return False
            self._resume = (state, self._probed_path)
            self._probed_path = path
            self._claimed_at = self.clock()
            self.probe_state = PROBE_RUNNING
        return True

    def unclaim_probe(self) -> None:
        """The claimed probe could not be started (the pool's queue was full): it is due again."""
        with self._lock:
            if self.probe_state == PROBE_RUNNING:
                self.probe_state, self._probed_path = self._resume
            self._settled.notify_all()

    def wait_settled(self, timeout: float) -> bool:
        """Wait up to *timeout* seconds while the jump probe runs; True when none is running then
        (the shape in force is the probe's, or it is still only due)."""
        with self._lock:
            return self._settled.wait_for(lambda: self.probe_state != PROBE_RUNNING, timeout)

    def wait_probe(self, limit: float) -> None:
        """Wait while the jump probe runs, until at most *limit* seconds after it was claimed: the
        open that started it waits that long at most, and opens after them none (a probe hung on its
        file holds up opens only in that span)."""
        with self._lock:
            if self.probe_state != PROBE_RUNNING:
                return
            left = self._claimed_at + limit - self.clock()
            if left > 0:
                self._settled.wait_for(lambda: self.probe_state != PROBE_RUNNING, left)

    def probed(self, continue_seconds: float, jump_seconds: float) -> Shape:
        """The probe measured: the shape is chosen from the facts with the cheapest continuing read and
        the cheapest jump of all probes so far; a stream verdict is probed again at the next
        :data:`PROBE_CONFIRMS` large files' opens before it is final. Returns the shape."""
        with self._lock:
            facts = self.facts
            if facts.continue_seconds is not None and facts.jump_seconds is not None:
                continue_seconds = min(continue_seconds, facts.continue_seconds)
                jump_seconds = min(jump_seconds, facts.jump_seconds)
            self.facts = replace(facts, continue_seconds=continue_seconds, jump_seconds=jump_seconds)
            self.probes += 1
            self.shape = choose(self.facts, self.override)
            recheck = self.shape.kind == SEQUENTIAL and self.probes <= PROBE_CONFIRMS
            self.probe_state = PROBE_RECHECK if recheck else PROBE_DONE
            self._settled.notify_all()
            return self.shape

    def probe_failed(self, error: str) -> Shape:
        """A probe could not measure (*error*, one line): the next large file tries again, up to
        :data:`PROBE_ATTEMPTS` in all; then the shape is chosen without a probe. Returns the shape."""
        with self._lock:
            self.attempts += 1
            self.error = error
            if self._resume[0] == PROBE_RECHECK:  # a recheck that could not measure: the verdict stays
                self.probe_state = PROBE_DONE
            elif self.attempts < PROBE_ATTEMPTS:
                self.probe_state = PROBE_DUE
            else:
                self.probe_state = PROBE_FAILED
                chosen = choose(self.facts, self.override)
                self.shape = Shape(chosen.kind, f"{chosen.reason} (the jump probe failed: {error})")
            self._settled.notify_all()
            return self.shape

    def report(self) -> dict[str, Any]:
        """The ``source`` section of the stats snapshot: mount type, shape, reason, probe state and timings."""
        with self._lock:
            facts, shape, state, error, probes = self.facts, self.shape, self.probe_state, self.error, self.probes
        out: dict[str, Any] = {
            "mount_type": facts.mount_type,
            "local": facts.local,
            "shape": shape.kind,
            "reason": shape.reason,
            "setting": self.override,
            "probe": state,
            "probes": probes,
        }
        if facts.continue_seconds is not None and facts.jump_seconds is not None:
            out["probe_continue_ms"] = round(facts.continue_seconds * 1e3, 3)
            out["probe_jump_ms"] = round(facts.jump_seconds * 1e3, 3)
        if error:
            out["probe_error"] = error
        return out
