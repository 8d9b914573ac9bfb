"""Warm jobs: fetch files or trees into the cache on a caller's behalf, in the background.

A warm is asked for through the mount (``fastfs warm``), so it must not do more than the caller
could: it runs with the caller's identity (:class:`~fastfs.fsio.access.Caller`) and touches only
files that caller could open through the mount — every directory on the way searchable, every
directory walked listable, every file readable (:mod:`fastfs.fsio.access`, the source's ACLs included
where they can matter). Files and directories
the walk sees but the caller may not read are skipped (counted in ``skipped``; their sizes are not
counted anywhere), and directories the caller cannot list are not looked into at all. Symlinks are
never followed; the names given in ``hidden`` (the mount's control directory) are left out.

Jobs. :meth:`WarmJobs.start` checks the target, queues a :class:`WarmJob` and returns at once, so a
warm never holds the kernel request (nor a FUSE worker) that asked for it; the caller then polls
:meth:`WarmJobs.progress`. Jobs run on :data:`WARM_THREADS` threads of their own, taken from the
callers' queues in turn (one caller's many jobs do not starve another's). Each caller (uid) may
have :data:`MAX_JOBS_PER_CALLER` jobs queued or running, the mount :data:`MAX_JOBS`; beyond that
:meth:`~WarmJobs.start` fails with EAGAIN. Finished jobs are kept :data:`JOB_KEEP_SECONDS` for their
final report; only the caller that started a job (and root) can see it.

A job walks the tree a little ahead of its fetching (:data:`WALK_AHEAD` entries), so its totals
grow while it lists (``listed`` turns true when the walk is complete: ``fastfs warm`` shows no total
before that). :meth:`WarmJobs.cancel` stops a job (``fastfs warm`` interrupted by Ctrl-C): a queued
one never starts, a running one lets go of its files in flight without waiting for them.

Blocks a warm fetches are counted apart from read-ahead's own guesses (``bytes_fetched_warm``; not
``prefetched``, so neither their use nor their eviction counts in prefetch accuracy or waste), and
bytes dropped by :meth:`WarmJobs.evict` count as ``bytes_evicted_on_request``. For each file it queues the
fills of all its blocks at prefetch priority through the engine, and waits for them together, with
one deadline of ``readahead.read_timeout`` for the whole file: once one of its reads timed out the
file is given up (``failed``; the read counts as a stuck read of the file, as for a reader). Up to
:data:`FILES_AHEAD` files (and :data:`BYTES_AHEAD` bytes, at most a quarter of the budget) are in
flight at once, so small files overlap their round trips. A block the budget has no room for makes
the file ``declined`` (only partly cached); bytes of this warm that the cache evicted again before
the job ended (a tree larger than the budget) are counted in ``evicted``.

On a mount whose opens go to the kernel by passthrough (local sources), reads never come to the RAM
cache, so a warm asks each file into the source's page cache instead (``POSIX_FADV_WILLNEED``: the
device reads it in parallel, the job does not wait), and ``cached``/``evict`` report and drop the
source's page cache (cachestat, ``POSIX_FADV_DONTNEED``, after an ``fdatasync`` of the source file:
pages a writer has not written back cannot be dropped, so a file written shortly before kept them).

Disk warms (``fastfs warm --disk``, a job started with ``disk=True``) fill the disk cache tier
(``cache.disk_dir``) instead: blocks the tier already holds are not fetched at all, the others are
fetched through the RAM cache as usual and each one is then seen to be on disk or in its write
queue (waiting for room in the queue: a warm may wait for the disk, a reader never does). Its blocks
are marked ``disk_warm``, so the write a completed fill would queue (and drop when the queue is
full, counted as ``disk_writes_dropped``) is left to the job, which waits for room instead. Every
:data:`DISK_CONFIRM_FILES` files (or :data:`DISK_CONFIRM_BYTES`) and at the end, the job waits for
the tier's writes and counts a file done in bytes only for what the tier then holds. A file only
partly cached is ``declined``, and ``declined_reasons`` says why: ``ram`` (the RAM cache or its
prefetch queue had no room for its blocks), ``write_queue`` (the tier's write queue had no room
within ``readahead.read_timeout``), ``disk_room`` (written, but the disk budget or free-space floor
left no room for all of it). RAM evictions do
not count against a disk warm. Such a warm runs the same way on a passthrough mount.

Also here: :meth:`WarmJobs.cached` (how much of a file is in the cache, fetching nothing) and
:meth:`WarmJobs.evict` (drop a file's cached blocks), with the same permission checks, and their
disk-tier forms :meth:`WarmJobs.disk_cached` and :meth:`WarmJobs.disk_evict`.

Concurrency: ``WarmJobs._cond`` (a condition on its lock) guards the job table, the callers' queues
and ``_closed``; each job's counters are guarded by the job's own lock. No lock is held across I/O
or while waiting for a block.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastfs.fsio.access import (
    ACL_ACCESS,
    NO_ACL_ERRNOS,
    ROOT,
    Attrs,
    Caller,
    StatLike,
    may_list,
    may_read,
    may_search,
    needs_acl,
    read_acl,
)
from fastfs.fsio.cache import FAILED, READY, Block
from fastfs.fsio.source import HeadKey, split, stat_key

if TYPE_CHECKING:
    from fastfs.fsio.disk.index import Key as DiskKey
    from fastfs.fsio.disk.tier import DiskTier
    from fastfs.fsio.engine import Engine
    from fastfs.fsio.entry import FileEntry

# Threads running warm jobs (their own, so a warm never holds a FUSE worker or a pread worker).
WARM_THREADS = 2
# Warm jobs one caller (uid) may have queued or running at once.
MAX_JOBS_PER_CALLER = 8
# Warm jobs queued or running at once on one mount.
MAX_JOBS = 32
# Seconds a finished job's report is kept, and how many finished jobs are kept at most.
JOB_KEEP_SECONDS = 600.0
MAX_FINISHED = 256
# Files of one job whose block fills are in flight together (small files overlap their round trips).
FILES_AHEAD = 64
# Bytes of one job in flight at once (at most a quarter of the cache budget).
BYTES_AHEAD = 256 * 1024 * 1024
# Entries a job's walk lists ahead of its fetching, and lists per file fetched.
WALK_AHEAD = 10_000
WALK_STEP = 256
# Seconds to wait, and how many times, for room in the prefetch queue before a file counts as declined.
QUEUE_RETRY_SECONDS = 0.05
QUEUE_RETRIES = 100
# A disk warm waits for the tier's writes and counts what it holds after this many files or bytes.
DISK_CONFIRM_FILES = 256
DISK_CONFIRM_BYTES = 32 * 1024 * 1024
# Seconds a disk warm waits for the tier's writes at each confirmation at most, and polls them.
DISK_FLUSH_SECONDS = 120.0
DISK_POLL_SECONDS = 0.002
# Why a file may be declined (only partly cached); see WarmJob.reasons.
DECLINE_RAM, DECLINE_WRITE_QUEUE, DECLINE_DISK_ROOM = "ram", "write_queue", "disk_room"
DECLINE_REASONS = (DECLINE_RAM, DECLINE_WRITE_QUEUE, DECLINE_DISK_ROOM)
# Errors a job keeps for its report, and the length each is cut to (the report fits one xattr).
MAX_ERRORS = 10
MAX_ERROR_CHARS = 300


class WarmJob:
    """One warm of one path for one caller; its counters are guarded by ``lock``."""

    def __init__(self, job_id: int, path: str, caller: Caller, st: os.stat_result, disk: bool = False) -> None:
        self.id = job_id
        self.path = path
        self.caller = caller
        self.st = st
        self.disk = disk  # fill the disk tier (fastfs warm --disk)
        self.unconfirmed: list[
            tuple[DiskKey, int]
        ] = []  # disk warm: (disk key, size) of files written, not yet counted
        self.lock = threading.Lock()
        self.state = "queued"
        self.listed = False
        self.files_total = self.bytes_total = 0
        self.files_done = self.bytes_done = 0
        self.declined = self.failed = self.skipped = 0
        # why files were declined: the RAM cache had no room (budget or prefetch queue), the disk tier's
        # write queue had no room in time, or the disk tier holds less after its writes (budget/floor)
        self.reasons = dict.fromkeys(DECLINE_REASONS, 0)
        self.cancelled = False  # asked to stop (fastfs warm interrupted): set once, read by the job's thread
        self.evicted_bytes = 0
        self.errors: list[str] = []
        self.created = time.monotonic()
        self.started: float | None = None
        self.finished: float | None = None

    @property
    def done(self) -> bool:
        return self.state == "done"

    def evicted(self, nbytes: int) -> None:
        """The cache evicted a block this job fetched (called by the cache)."""
        with self.lock:
            if self.state != "done":
                self.evicted_bytes += nbytes

    def decline(self, reason: str) -> None:
        """A file of this job is only partly cached, for *reason* (lock held by the caller)."""
        self.declined += 1
        self.reasons[reason] += 1

    def error(self, path: str, why: str) -> None:
        with self.lock:
            self.failed += 1
            if len(self.errors) < MAX_ERRORS:
                self.errors.append(f"{path}: {why}"[:MAX_ERROR_CHARS])

    def progress(self) -> dict[str, Any]:
        """The job's report (JSON-ready)."""
        with self.lock:
            end = self.finished if self.finished is not None else time.monotonic()
            return {
                "job": self.id,
                "path": self.path,
                "state": self.state,
                "done": self.state == "done",
                "listed": self.listed,
                "files_total": self.files_total,
                "bytes_total": self.bytes_total,
                "files_done": self.files_done,
                "bytes_done": self.bytes_done,
                "declined": self.declined,
                "declined_reasons": dict(self.reasons),
                "cancelled": self.cancelled,
                "failed": self.failed,
                "skipped": self.skipped,
                "evicted": self.evicted_bytes,
                "disk": self.disk,
                "errors": list(self.errors),
                "seconds": round(end - (self.started or end), 3),
            }


@dataclass
class _FileWarm:
    """A file of a job whose blocks are in flight."""

    path: str
    fh: int
    entry: FileEntry
    blocks: list[Block]
    deadline: float | None
    declined: bool


class WarmJobs:
    """The warm jobs of one engine (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        hidden: Iterable[str] = (),
        threads: int = WARM_THREADS,
        per_caller: int = MAX_JOBS_PER_CALLER,
        total: int = MAX_JOBS,
    ) -> None:
        self.engine = engine
        self.hidden = frozenset(hidden)
        self.threads = threads
        self.per_caller = per_caller
        self.total = total
        self._cond = threading.Condition()
        self._jobs: OrderedDict[int, WarmJob] = OrderedDict()
        self._queues: OrderedDict[int, deque[WarmJob]] = OrderedDict()  # uid -> its queued jobs
        self._runners: list[threading.Thread] = []
        self._next_id = 1
        self._closed = False

    # -- requests ---------------------------------------------------------------------------------
    def start(self, path: str, caller: Caller, disk: bool = False) -> WarmJob:
        """Queue a warm of *path* as *caller* (*disk*: into the disk tier); returns the job at once.
        OSError: ENOENT, EACCES (the caller could not open or list it), ENOTSUP (neither file nor
        directory, or *disk* on a mount without a disk tier), EAGAIN (too many jobs)."""
        if disk:
            self._tier(path)
        st = self._target(path, caller)
        with self._cond:
            if self._closed:
                raise OSError(errno.ESHUTDOWN, "the mount is shutting down", path)
            self._prune()
            active = [j for j in self._jobs.values() if not j.done]
            mine = sum(1 for j in active if j.caller.uid == caller.uid)
            if mine >= self.per_caller or len(active) >= self.total:
                limit = f"{self.per_caller} per user" if mine >= self.per_caller else f"{self.total} in all"
                raise OSError(errno.EAGAIN, f"too many warm jobs ({limit}); try again later", path)
            job = WarmJob(self._next_id, path, caller, st, disk)
            self._next_id += 1
            self._jobs[job.id] = job
            self._queues.setdefault(caller.uid, deque()).append(job)
            if len(self._runners) < self.threads:
                runner = threading.Thread(target=self._run_jobs, name=f"fastfs-warm-{len(self._runners)}", daemon=True)
                self._runners.append(runner)
                runner.start()
            self._cond.notify()
        return job

    def progress(self, job_id: int, caller: Caller) -> dict[str, Any]:
        """The report of job *job_id*; ENODATA when there is none the caller may see."""
        with self._cond:
            self._prune()
            job = self._jobs.get(job_id)
        if job is None or not (caller.is_root or caller.uid == job.caller.uid):
            raise OSError(errno.ENODATA, "no such warm job")
        return job.progress()

    def cancel(self, job_id: int, caller: Caller) -> dict[str, Any]:
        """Stop job *job_id* (``fastfs warm`` was interrupted): a queued job never starts, a running one
        ends after the files it is reading, without waiting for the rest; its report (``cancelled``
        true). ENODATA when there is no such job the caller may see."""
        with self._cond:
            self._prune()
            job = self._jobs.get(job_id)
            if job is None or not (caller.is_root or caller.uid == job.caller.uid):
                raise OSError(errno.ENODATA, "no such warm job")
            queue = self._queues.get(job.caller.uid)
            queued = queue is not None and job in queue
            if queue is not None and queued:
                queue.remove(job)
                if not queue:
                    del self._queues[job.caller.uid]
        with job.lock:
            if not job.done:
                job.cancelled = True
                if queued:
                    job.state, job.finished = "done", time.monotonic()
        return job.progress()

    def cached(self, path: str, caller: Caller) -> dict[str, int]:
        """``{"size", "cached"}``: bytes of the current version of file *path* in the cache now."""
        st = self._file(path, caller)
        if self.engine.passes_through():  # the reads of it will come from the source's page cache
            return {"size": st.st_size, "cached": min(st.st_size, self.engine.page_cache_bytes(path))}
        return {"size": st.st_size, "cached": self.engine.cache.cached_bytes(stat_key(st))}

    def evict(self, path: str, caller: Caller) -> dict[str, int]:
        """Drop the cached blocks of file *path* (those not in use right now); ``{"size", "evicted"}``."""
        st = self._file(path, caller)
        if self.engine.passes_through():
            self._write_back(path)
            return {"size": st.st_size, "evicted": self.engine.page_cache_evict(path)}
        key = stat_key(st)
        cache = self.engine.cache
        before = cache.cached_bytes(key)
        cache.invalidate_file(key, on_request=True)
        cache.invalidate_file(HeadKey(key), on_request=True)  # its head windows too (a key kind of their own)
        return {"size": st.st_size, "evicted": max(0, before - cache.cached_bytes(key))}

    def _write_back(self, path: str) -> None:
        """Have the dirty pages of source file *path* written (fdatasync): the page cache cannot drop
        pages a writer has not written back yet, so a file written shortly before kept nearly all of
        them. It only persists what the writer wrote; the file's bytes are never changed."""
        try:
            src = self.engine.source.open_file(path)
        except OSError:
            return
        try:
            os.fdatasync(src.fd)
        except OSError:
            pass  # a source that cannot sync keeps its dirty pages; evict reports what it dropped
        finally:
            src.close()

    def disk_cached(self, path: str, caller: Caller) -> dict[str, int]:
        """``{"size", "cached"}``: bytes of the current version of file *path* the disk tier holds."""
        tier = self._tier(path)
        st = self._file(path, caller)
        return {"size": st.st_size, "cached": tier.store.held_bytes(tier.key(path, stat_key(st)))}

    def disk_evict(self, path: str, caller: Caller) -> dict[str, int]:
        """Drop file *path*'s entry from the disk tier; ``{"size", "evicted"}`` (bytes it held)."""
        tier = self._tier(path)
        st = self._file(path, caller)
        key = tier.key(path, stat_key(st))
        held = tier.store.held_bytes(key)
        tier.store.discard(key)
        return {"size": st.st_size, "evicted": held}

    def _tier(self, path: str) -> DiskTier:
        tier: DiskTier | None = getattr(self.engine, "disk", None)
        if tier is None:
            raise OSError(errno.ENOTSUP, "this mount has no disk tier (cache.disk_dir)", path)
        return tier

    def close(self) -> None:
        """Stop: queued jobs are dropped, running ones end after their current files."""
        with self._cond:
            self._closed = True
            self._queues.clear()
            self._cond.notify_all()
            runners = list(self._runners)
        for runner in runners:
            runner.join(timeout=1.0)

    # -- permission checks ------------------------------------------------------------------------
    def _attrs(self, path: str, st: os.stat_result, caller: Caller) -> StatLike:
        """*st* with the source's access ACL when it can matter (as the kernel checks on an allow_other
        mount); a failure to read it other than "none" denies like an ACL the kernel cannot read."""
        if not needs_acl(st, caller):
            return st
        try:
            raw: bytes | None = self.engine.source.getxattr(path, ACL_ACCESS)
        except OSError as e:
            raw = None if e.errno in NO_ACL_ERRNOS else b""
        return Attrs.of(st, read_acl(raw))

    def _hidden(self, path: str) -> bool:
        return any(path == h or path.startswith(h + "/") for h in self.hidden)

    def _reach(self, path: str, caller: Caller) -> os.stat_result:
        """lstat of *path* after checking every directory on its way is searchable by *caller*."""
        if self._hidden(path):
            raise OSError(errno.ENOTSUP, "not a file of the source", path)
        parts = split(path)
        source = self.engine.source
        for i in range(len(parts)):
            st = source.lstat("/" + "/".join(parts[:i]))
            if not stat.S_ISDIR(st.st_mode):
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            if not may_search(self._attrs("/" + "/".join(parts[:i]), st, caller), caller):
                raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return source.lstat("/" + "/".join(parts))

    def _target(self, path: str, caller: Caller) -> os.stat_result:
        st = self._reach(path, caller)
        if stat.S_ISREG(st.st_mode):
            ok = may_read(self._attrs(path, st, caller), caller)
        elif stat.S_ISDIR(st.st_mode):
            ok = may_list(self._attrs(path, st, caller), caller)
        else:
            raise OSError(errno.ENOTSUP, "neither a regular file nor a directory", path)
        if not ok:
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return st

    def _file(self, path: str, caller: Caller) -> os.stat_result:
        st = self._reach(path, caller)
        if stat.S_ISDIR(st.st_mode):
            raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.ENOTSUP, "not a regular file", path)
        if not may_read(self._attrs(path, st, caller), caller):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return st

    # -- running ----------------------------------------------------------------------------------
    def _prune(self) -> None:
        """Forget finished jobs past their keep time or beyond MAX_FINISHED (lock held)."""
        now = time.monotonic()
        finished = [j for j in self._jobs.values() if j.done]
        excess = len(finished) - MAX_FINISHED
        for job in finished:
            if excess > 0 or now - (job.finished or now) > JOB_KEEP_SECONDS:
                del self._jobs[job.id]
                excess -= 1

    def _next_job(self) -> WarmJob | None:
        """The next queued job, callers taken in turn; None when closing (lock held by the caller)."""
        while not self._queues and not self._closed:
            self._cond.wait()
        if self._closed:
            return None
        uid, queue = next(iter(self._queues.items()))
        job = queue.popleft()
        if queue:
            self._queues.move_to_end(uid)
        else:
            del self._queues[uid]
        return job

    def _run_jobs(self) -> None:
        while True:
            with self._cond:
                job = self._next_job()
            if job is None:
                return
            try:
                self.run(job)
            except Exception as e:  # noqa: BLE001 - a failed job reports it, the runner carries on
                job.error(job.path, f"{type(e).__name__}: {e}")
                with job.lock:
                    job.state, job.finished = "done", time.monotonic()

    def run(self, job: WarmJob) -> None:
        """Carry out *job* in this thread (see the module docstring)."""
        engine = self.engine
        with job.lock:
            job.state, job.started = "warming", time.monotonic()
        bytes_ahead = min(BYTES_AHEAD, max(engine.block_size, engine.cache.budget // 4))
        walker = self._walk(job)
        pending: deque[tuple[str, int]] = deque()
        inflight: deque[_FileWarm] = deque()
        inflight_bytes = 0
        listed = False

        def drain() -> bool:
            """Finish the oldest file in flight; False when there is none."""
            nonlocal inflight_bytes
            if not inflight:
                return False
            done = inflight.popleft()
            inflight_bytes -= done.entry.size
            self._finish(job, done)
            return True

        try:
            while not self._stopping() and not job.cancelled:
                step = 0
                while not listed and len(pending) < WALK_AHEAD and step < WALK_STEP:
                    step += 1
                    try:
                        path, size = next(walker)
                    except StopIteration:
                        listed = True
                        with job.lock:
                            job.listed = True
                        break
                    pending.append((path, size))
                    with job.lock:
                        job.files_total += 1
                        job.bytes_total += size
                if not pending:
                    if listed:
                        break
                    continue
                path, size = pending.popleft()
                while inflight and (len(inflight) >= FILES_AHEAD or inflight_bytes + size > bytes_ahead):
                    drain()
                fw = self._start_file(job, path, drain)
                if fw is not None:
                    inflight.append(fw)
                    inflight_bytes += fw.entry.size
        finally:
            while inflight:
                fw = inflight.popleft()
                if job.cancelled:
                    self._abandon(fw)
                else:
                    self._finish(job, fw)
            if job.disk and not job.cancelled:
                self._confirm_disk(job)
            with job.lock:
                job.state, job.finished = "done", time.monotonic()

    def _stopping(self) -> bool:
        return self._closed or getattr(self.engine, "_closed", False)

    def _walk(self, job: WarmJob) -> Iterator[tuple[str, int]]:
        """(path, size) of the files of the job the caller may read; counts the others as skipped."""
        caller, source = job.caller, self.engine.source
        if stat.S_ISREG(job.st.st_mode):
            yield job.path, job.st.st_size
            return
        stack = [job.path]
        while stack:
            current = stack.pop()
            prefix = current.rstrip("/") + "/"
            try:
                names = sorted(source.listdir(current))
            except OSError as e:
                job.error(current, e.strerror or str(e))
                continue
            subdirs = []
            for name in names:
                child = prefix + name
                if self._hidden(child):
                    continue
                try:
                    st = source.lstat(child)
                except OSError:
                    continue  # vanished since the listing
                if stat.S_ISDIR(st.st_mode):
                    if may_list(self._attrs(child, st, caller), caller):
                        subdirs.append(child)
                    else:
                        with job.lock:
                            job.skipped += 1
                elif stat.S_ISREG(st.st_mode):
                    if may_read(self._attrs(child, st, caller), caller):
                        yield child, st.st_size
                    else:
                        with job.lock:
                            job.skipped += 1
            stack.extend(reversed(subdirs))

    def _start_file(self, job: WarmJob, path: str, drain: Any) -> _FileWarm | None:
        """Hold the file and queue the fills of its blocks; None when it failed at once (or when the
        mount passes files through: then the source's page cache is asked for the file instead)."""
        engine = self.engine
        if engine.passes_through() and not job.disk:
            try:
                asked = engine.page_cache_warm(path)
            except OSError as e:
                job.error(path, e.strerror or str(e))
                asked = 0
            with job.lock:
                job.files_done += 1
                job.bytes_done += asked
            return None
        try:
            fh, entry = engine.hold(path)
        except OSError as e:
            job.error(path, e.strerror or str(e))
            with job.lock:
                job.files_done += 1
            return None
        if entry.stuck:
            engine.release(fh)
            job.error(path, "source reads of this file are stuck")
            with job.lock:
                job.files_done += 1
            return None
        timeout = engine.config.readahead.read_timeout
        blocks: list[Block] = []
        declined = False
        nblocks = -(-entry.size // engine.block_size)
        index = retries = 0
        bs = engine.block_size
        disk = self._tier(path) if job.disk else None
        while index < nblocks:
            if disk is not None and disk.holds(entry.dkey, index * bs, min(bs, entry.size - index * bs)):
                index += 1  # on disk already: nothing to fetch (counted when the job confirms the file)
                continue
            block = engine.warm_block(entry, index)
            if block is not None and (block.state != FAILED or block.errno):
                if job.disk:
                    block.disk_warm = True  # written by this job (waiting for room), not dropped at fill time
                blocks.append(block)
                index += 1
                continue
            if block is not None:  # not queued (the prefetch queue is full): let some fills finish
                engine.cache.unpin(block)
            if retries >= QUEUE_RETRIES:
                declined = True
                break
            retries += 1
            # the disk tier's queued writes pin blocks until written: a disk warm waits for them
            waits = disk is not None and disk.writing()
            if not drain() and block is None and not waits:  # nothing of ours holds the budget: it is full
                declined = True
                break
            if block is not None or waits:
                time.sleep(QUEUE_RETRY_SECONDS)
        deadline = time.monotonic() + timeout if timeout else None
        return _FileWarm(path, fh, entry, blocks, deadline, declined)

    def _abandon(self, fw: _FileWarm) -> None:
        """A cancelled job lets go of a file in flight without waiting for its blocks (their fills end
        on their own and stay cached)."""
        for block in fw.blocks:
            self.engine.cache.unpin(block)
        self.engine.release(fw.fh)

    def _finish(self, job: WarmJob, fw: _FileWarm) -> None:
        """Wait for the file's blocks together (one deadline); count what it got; release it."""
        engine = self.engine
        got = 0
        why = ""
        queued = True
        try:
            for block in fw.blocks:
                if why:
                    continue
                remaining = None if fw.deadline is None else max(0.0, fw.deadline - time.monotonic())
                if not block.done.wait(remaining):
                    engine.abandon_block(fw.entry, block)
                    why = "source read timed out"
                elif block.state == READY and job.disk:
                    cache, entry = engine.cache, fw.entry
                    on_disk = self._tier(fw.path).ensure(
                        entry.dkey, entry.size, block, cache.pin, cache.unpin, fw.deadline
                    )
                    queued = queued and on_disk
                elif block.state == READY:
                    got += block.length
                    block.owner = job
                else:
                    why = os.strerror(block.errno) if block.errno else "read failed"
        finally:
            for block in fw.blocks:
                engine.cache.unpin(block)
            engine.release(fw.fh)
        if why:
            job.error(fw.path, why)
        if job.disk:
            with job.lock:
                job.files_done += 1
                if why:
                    return
                if fw.declined or not queued:
                    job.decline(DECLINE_RAM if fw.declined else DECLINE_WRITE_QUEUE)
                    return
                job.unconfirmed.append((fw.entry.dkey, fw.entry.size))
                due = len(job.unconfirmed) >= DISK_CONFIRM_FILES or (
                    sum(size for _, size in job.unconfirmed) >= DISK_CONFIRM_BYTES
                )
            if due:
                self._confirm_disk(job)
            return
        with job.lock:
            job.files_done += 1
            job.bytes_done += got
            if fw.declined and not why:
                job.decline(DECLINE_RAM)

    def _confirm_disk(self, job: WarmJob) -> None:
        """Disk warm: wait for the tier's writes of the files written, then count them as done in what
        the tier holds."""
        with job.lock:
            files, job.unconfirmed = job.unconfirmed, []
        if not files:
            return
        store = self._tier(job.path).store
        deadline = time.monotonic() + DISK_FLUSH_SECONDS
        for dkey, size in files:
            while store.pending(dkey) and time.monotonic() < deadline and not self._stopping() and not job.cancelled:
                time.sleep(DISK_POLL_SECONDS)
            held = store.held_bytes(dkey)
            with job.lock:
                job.bytes_done += held
                if held < size:
                    job.decline(DECLINE_DISK_ROOM)


def warm_now(
    engine: Engine, path: str, caller: Caller = ROOT, hidden: Iterable[str] = (), disk: bool = False
) -> dict[str, Any]:
    """Warm *path* as *caller* in this thread (*disk*: into the disk tier) and return the final report
    (tools and tests)."""
    jobs = WarmJobs(engine, hidden)
    if disk:
        jobs._tier(path)
    job = WarmJob(0, path, caller, jobs._target(path, caller), disk)
    jobs.run(job)
    return job.progress()
