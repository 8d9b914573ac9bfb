"""``fastfs warm``: load files of a fastfs mount into its RAM cache ahead of a job, report what is
cached, or drop it again.

    fastfs warm PATH... [--from-file LIST] [-j N]     # fetch into the cache now
    fastfs warm --check PATH...                        # how much of each PATH is cached (fetches nothing)
    fastfs warm --evict PATH...                        # drop the cached blocks of the files under PATH
    fastfs warm --disk [--check | --evict] PATH...     # the same for the disk cache tier (cache.disk_dir)

PATHs are files or directories inside fastfs mounts; ``--from-file LIST`` adds one path per line of
LIST (``-`` reads standard input; empty lines are ignored), so a pipeline can hand over its file
list. Every path is checked before anything starts: a missing path or one outside a fastfs mount is
one line on stderr and exit 1.

Warming. The command never reads file data itself. For each PATH it asks the daemon, through the
mount's control channel (:mod:`fastfs.daemon.control`), to start a background warm job
(``getxattr(PATH, "user.fastfs.warm")`` answers ``{"job": ID}`` at once) and polls the job's
progress (``user.fastfs.warm.ID`` of the mount root) until it is done. Up to ``-j`` jobs run at once
(the daemon also bounds the jobs of one user; when it answers EAGAIN the command waits for one of
its own to finish). The daemon warms only what the calling user could read through the mount, and
walks directories itself. Progress on a terminal: a bar in files with bytes beside it, without a
total (nor an ETA) until the daemon has listed every tree. Ctrl-C asks the daemon to cancel the
running jobs (``user.fastfs.warm.cancel.ID``), says how far they got, and exits 130.

Exit status: 0 when everything asked for is now in the cache; 1 otherwise — a file failed (an
error, or a source read that timed out), was only partly cached (each reason said: the cache budget
was full; for ``--disk`` also the write queue or the disk's room),
was evicted again before the warm ended (more data than the budget), or was skipped because the
user may not read it; also when the daemon cannot warm at all. Each reason is one line on stderr
(at most :data:`MAX_ERRORS_SHOWN` file errors are listed), then one summary line on stdout.

``--check`` walks the paths (as the user, through the mount) and asks, per file, how many of its
bytes the cache holds (``user.fastfs.cached``): one line per PATH, exit 0 only when every file is
entirely cached. ``--evict`` asks the daemon to drop each file's cached blocks
(``user.fastfs.evict``). All sizes are in binary units (KiB, MiB, GiB) and rates in MiB/s.

``--disk`` does each of these for the mount's disk cache tier instead of its RAM cache
(``user.fastfs.disk.warm`` / ``.cached`` / ``.evict``): a warm fetches what the tier does not hold yet
and waits until the tier has written it, so a later epoch or a remount finds it on local disk;
exit 0 when every file is then entirely on disk. A mount without a disk tier says so (exit 1).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import errno
import json
import os
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

from fastfs.daemon.control import (
    CONTROL_NAME,
    XATTR_CACHED,
    XATTR_DISK_CACHED,
    XATTR_DISK_EVICT,
    XATTR_DISK_WARM,
    XATTR_EVICT,
    XATTR_WARM,
    warm_cancel_xattr,
    warm_job_xattr,
)
from fastfs.daemon.mounttable import containing_mount, is_fastfs
from fastfs.daemon.summary import human_bytes as human  # one unit system: MiB/GiB, as fastfs stats

# Warm jobs run at once by default (the daemon allows 8 per user).
DEFAULT_JOBS = 4
# Most parallel requests accepted.
MAX_JOBS = 256
# Seconds between progress polls: from the first, doubling while nothing changes, up to the last.
POLL_FIRST = 0.005
POLL_MAX = 0.25
# Per-file failures printed; the rest are only counted.
MAX_ERRORS_SHOWN = 10
# errno values meaning the daemon has no such control (an older daemon, or not a fastfs file).
UNSUPPORTED = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA}
# Exit status after Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130
# errno values of a daemon that has no room for another job right now.
BUSY = {errno.EAGAIN, errno.EBUSY}
PROG = "fastfs warm"


class WarmError(Exception):
    """A problem with the command line (bad path, not a fastfs mount); one-line message."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fastfs warm`` (for the CLI's subcommand parser)."""
    parser.add_argument("paths", nargs="*", metavar="PATH", help="file or directory inside a fastfs mount")
    parser.add_argument(
        "--from-file",
        metavar="LIST",
        action="append",
        default=[],
        help="also the paths in LIST, one a line (- : stdin)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="report how much of each path is cached; fetch nothing")
    mode.add_argument("--evict", action="store_true", help="drop the cached blocks of the files under each path")
    parser.add_argument(
        "--disk", action="store_true", help="the disk cache tier (cache.disk_dir) instead of the RAM cache"
    )
    parser.add_argument(
        "-j", "--jobs", type=int, default=DEFAULT_JOBS, metavar="N", help=f"requests at once (default {DEFAULT_JOBS})"
    )


# -- paths ------------------------------------------------------------------------------------------
def read_list(name: str, stdin: TextIO | None = None) -> list[str]:
    """The paths in list file *name* (``-``: standard input), one a line, empty lines skipped."""
    try:
        if name == "-":
            stream = stdin or sys.stdin
            data = stream.buffer.read() if hasattr(stream, "buffer") else os.fsencode(stream.read())
        else:
            with open(name, "rb") as f:
                data = f.read()
    except OSError as e:
        raise WarmError(f"{name}: {e.strerror}") from None
    return [os.fsdecode(line.rstrip(b"\r")) for line in data.split(b"\n") if line.strip()]


def find_mount_root(path: str) -> str | None:
    """The mount point of the fastfs mount holding *path*, or None when it lies on anything else."""
    entry = containing_mount(path)
    return entry.mountpoint if is_fastfs(entry) else None


def _resolve(path: str) -> str:
    """Absolute *path* with its parent directories resolved but its last component not followed."""
    absolute = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))


def validate(paths: Iterable[str], covered_too: bool = True) -> list[tuple[str, str]]:
    """(absolute path, its mount root) of every path, each checked; raises WarmError for the first bad one.

    A path named twice is kept once; with *covered_too* so is one inside a directory also named (the
    directory's warm covers it).
    """
    checked: list[tuple[str, str, bool]] = []
    seen: set[str] = set()
    for arg in paths:
        path = _resolve(arg)
        root = find_mount_root(path)
        try:
            st = os.lstat(path)
        except OSError as e:
            if e.errno == errno.ENOTCONN and root is not None:
                raise WarmError(f"{arg}: the fastfs daemon is not running (run: fastfs umount {root})") from None
            raise WarmError(f"{arg}: {e.strerror}") from None
        if root is None:
            raise WarmError(f"{arg}: not inside a fastfs mount")
        if path not in seen:
            seen.add(path)
            checked.append((path, root, stat.S_ISDIR(st.st_mode)))
    dirs = {path for path, _, is_dir in checked if is_dir} if covered_too else set()

    def covered(path: str) -> bool:
        parent = os.path.dirname(path)
        while parent != path:
            if parent in dirs:
                return True
            path, parent = parent, os.path.dirname(parent)
        return False

    return [(path, root) for path, root, _ in checked if not covered(path)]


def walk_files(path: str, root: str, skipped: list[str]) -> Iterator[tuple[str, int]]:
    """Regular files (path, size) under *path* as this user sees them through the mount (symlinks not
    followed, the control directory left out); directories it cannot list are added to *skipped*."""
    try:
        st = os.lstat(path)
    except OSError as e:
        skipped.append(f"{path}: {e.strerror}")
        return
    if stat.S_ISREG(st.st_mode):
        yield path, st.st_size
        return
    if not stat.S_ISDIR(st.st_mode):
        return

    def onerror(e: OSError) -> None:
        skipped.append(f"{e.filename}: {e.strerror}")

    for dirpath, dirnames, filenames in os.walk(path, onerror=onerror, followlinks=False):
        if dirpath == root and CONTROL_NAME in dirnames:
            dirnames.remove(CONTROL_NAME)
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            try:
                fst = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(fst.st_mode):
                yield full, fst.st_size


def _ask(path: str, name: str) -> dict[str, Any]:
    answer = json.loads(os.getxattr(path, name, follow_symlinks=False))
    if not isinstance(answer, dict):
        raise ValueError("unexpected answer from the daemon")
    return answer


# -- warming ----------------------------------------------------------------------------------------
@dataclass
class Result:
    """What a run did (warm: job totals; check and evict: per-file sums)."""

    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0
    cached_files: int = 0  # warm: files now entirely in the cache
    failed: int = 0
    declined: int = 0
    skipped: int = 0
    evicted: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # why files were declined (see fsio.warm)
    errors: list[str] = field(default_factory=list)
    unsupported: str = ""
    cancelled: int = 0  # jobs the daemon stopped because the command was interrupted
    interrupted: bool = False

    @property
    def complete(self) -> bool:
        """Everything asked for is cached."""
        return not (self.failed or self.declined or self.skipped or self.evicted or self.unsupported or self.errors)


@dataclass
class _Job:
    path: str
    root: str
    id: int
    report: dict[str, Any] = field(default_factory=dict)


class _Progress:
    """A files bar with bytes beside it, on stderr when it is a terminal. While the daemon still lists
    the trees the bar has no total (a total that grows with the walk made a bar and an ETA that lied:
    0/5 ... 0/1273, ETA 54:47); it gets one once every tree is listed."""

    def __init__(self, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=None, unit="file", desc="warm", file=sys.stderr, leave=False)

    def show(self, files_done: int, files_total: int, bytes_done: int, bytes_total: int, listed: bool) -> None:
        if self.bar is None:
            return
        self.bar.total = max(files_total, files_done) if listed else None
        self.bar.n = files_done
        text = f"{human(bytes_done)} of {human(bytes_total)}" if listed else f"{human(bytes_done)}, listing"
        self.bar.set_postfix_str(text, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_warm(items: list[tuple[str, str]], jobs: int, progress: _Progress | None = None, disk: bool = False) -> Result:
    """Warm every (path, root) with up to *jobs* daemon jobs at once (*disk*: into the disk tier);
    returns the summed reports. Interrupted (Ctrl-C), it asks the daemon to cancel the running jobs,
    starts no more, and returns what was done (``interrupted``, ``cancelled``)."""
    result = Result()
    running: list[_Job] = []
    finished: list[dict[str, Any]] = []
    try:
        _warm_loop(items, jobs, progress, disk, result, running, finished)
    except KeyboardInterrupt:
        result.interrupted = True
        for job in running:
            try:
                report = _ask(job.root, warm_cancel_xattr(job.id))
            except (OSError, ValueError):
                continue  # gone already, or a daemon without cancel: nothing more to do
            result.cancelled += 1
            finished.append(report)
    _sum(result, finished)
    return result


def _sum(result: Result, finished: list[dict[str, Any]]) -> None:
    for report in finished:
        for key in ("files_total", "bytes_total", "files_done", "bytes_done", "failed", "declined", "skipped"):
            setattr(result, key, getattr(result, key) + int(report.get(key, 0)))
        result.evicted += int(report.get("evicted", 0))
        for reason, n in (report.get("declined_reasons") or {}).items():
            result.reasons[reason] = result.reasons.get(reason, 0) + int(n)
        result.cached_files += max(
            0, int(report.get("files_done", 0)) - int(report.get("failed", 0)) - int(report.get("declined", 0))
        )
        result.errors.extend(str(e) for e in report.get("errors", []))


def _warm_loop(
    items: list[tuple[str, str]],
    jobs: int,
    progress: _Progress | None,
    disk: bool,
    result: Result,
    running: list[_Job],
    finished: list[dict[str, Any]],
) -> None:
    """Start and poll the jobs; *running* and *finished* are kept up to date for the caller."""
    start_name = XATTR_DISK_WARM if disk else XATTR_WARM
    queue = list(reversed(items))
    poll = POLL_FIRST
    while queue or running:
        started = False
        while queue and len(running) < jobs:
            path, root = queue[-1]
            try:
                answer = _ask(path, start_name)
            except OSError as e:
                if e.errno in BUSY and running:
                    break  # the daemon's bound: wait for one of ours
                if e.errno in BUSY:
                    time.sleep(POLL_MAX)  # someone else's jobs: wait for the daemon to make room
                    break
                queue.pop()
                if e.errno in UNSUPPORTED:
                    result.unsupported = (
                        f"{path}: this mount has no disk tier (mount it with -o disk_dir=DIR)"
                        if disk
                        else f"{path}: the fastfs daemon cannot warm files ({e.strerror})"
                    )
                    queue.clear()
                    break
                result.failed += 1
                result.errors.append(f"{path}: {e.strerror or e}")
                continue
            except ValueError as e:
                queue.pop()
                result.failed += 1
                result.errors.append(f"{path}: bad answer from the daemon: {e}")
                continue
            queue.pop()
            if not isinstance(answer.get("job"), int):
                result.unsupported = f"{path}: the fastfs daemon predates warm jobs (remount to update it)"
                queue.clear()
                break
            running.append(_Job(path, root, answer["job"]))
            started = True
        changed = started
        for job in list(running):
            try:
                report = _ask(job.root, warm_job_xattr(job.id))
            except (OSError, ValueError) as e:
                running.remove(job)
                result.failed += 1
                result.errors.append(f"{job.path}: lost track of the warm job: {getattr(e, 'strerror', None) or e}")
                changed = True
                continue
            if report != job.report:
                changed = True
            job.report = report
            if report.get("done"):
                running.remove(job)
                finished.append(report)
        reports = finished + [j.report for j in running]
        if progress is not None:
            listed = not queue and all(r.get("listed", True) for r in reports)
            files_done, files_total, bytes_done, bytes_total = (
                sum(int(r.get(k, 0)) for r in reports) for k in _BAR_KEYS
            )
            progress.show(files_done, files_total, bytes_done, bytes_total, listed=listed)
        if running:
            poll = POLL_FIRST if changed else min(POLL_MAX, poll * 2)
            time.sleep(poll)


_BAR_KEYS = ("files_done", "files_total", "bytes_done", "bytes_total")


# -- check and evict ----------------------------------------------------------------------------------
def run_per_file(items: list[tuple[str, str]], name: str, jobs: int, out: TextIO) -> Result:
    """``--check`` (name: cached) or ``--evict``: one request per file under each path, *jobs* at once;
    for --check one line per path on *out*."""
    result = Result()
    check = name in (XATTR_CACHED, XATTR_DISK_CACHED)
    where = "on disk" if name in (XATTR_DISK_CACHED, XATTR_DISK_EVICT) else "cached"
    with cf.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="warm") as pool:
        for path, root in items:
            skipped: list[str] = []
            files = list(walk_files(path, root, skipped))
            result.skipped += len(skipped)
            result.errors.extend(f"{s} (skipped)" for s in skipped)
            sums = {"files": 0, "cached_files": 0, "size": 0, "cached": 0, "evicted": 0}
            for (file_path, size), outcome in zip(
                files, pool.map(_ask_or_error(name), [f for f, _ in files]), strict=True
            ):
                if isinstance(outcome, str):
                    result.failed += 1
                    result.errors.append(f"{file_path}: {outcome}")
                    if outcome == os.strerror(errno.ENOTSUP) and where == "on disk":
                        result.unsupported = f"{file_path}: this mount has no disk tier (mount it with -o disk_dir=DIR)"
                    continue
                sums["files"] += 1
                sums["size"] += int(outcome.get("size", size))
                sums["cached"] += int(outcome.get("cached", 0))
                sums["evicted"] += int(outcome.get("evicted", 0))
                if check and int(outcome.get("cached", 0)) >= int(outcome.get("size", size)):
                    sums["cached_files"] += 1
            result.files_total += len(files)
            result.files_done += sums["cached_files"] if check else sums["files"]
            result.bytes_total += sums["size"]
            result.bytes_done += sums["cached"] if check else sums["evicted"]
            if check:
                share = sums["cached"] / sums["size"] if sums["size"] else 1.0
                print(
                    f"{path}: {sums['cached_files']} of {len(files)} files {where}, {human(sums['cached'])} of"
                    f" {human(sums['size'])} ({100 * share:.1f}%)",
                    file=out,
                )
                if sums["cached_files"] < len(files):
                    result.declined += len(files) - sums["cached_files"]
    return result


def _ask_or_error(name: str):
    def ask(path: str) -> dict[str, Any] | str:
        try:
            return _ask(path, name)
        except OSError as e:
            return e.strerror or str(e)
        except ValueError as e:
            return f"bad answer from the daemon: {e}"

    return ask


# -- main -------------------------------------------------------------------------------------------
def _report_errors(result: Result) -> None:
    for line in result.errors[:MAX_ERRORS_SHOWN]:
        print(f"{PROG}: {line}", file=sys.stderr)
    if len(result.errors) > MAX_ERRORS_SHOWN:
        print(f"{PROG}: ... and {len(result.errors) - MAX_ERRORS_SHOWN} more", file=sys.stderr)


def _declined_lines(result: Result, disk: bool) -> list[str]:
    """One line per reason files were only partly cached, saying what happened (the daemon's reasons;
    an older daemon without them gets the general line)."""
    where = "on disk" if disk else "cached"
    reasons = result.reasons
    if result.declined and not any(reasons.values()):
        why = "the disk tier had no room for them" if disk else "the cache budget is full"
        return [f"{result.declined} files only partly {where}: {why}"]
    texts = {
        "ram": (
            "the RAM cache had no room for their blocks on the way to the disk (raise cache.budget)"
            if disk
            else "the cache budget is full"
        ),
        "write_queue": "the disk tier's write queue had no room for them within readahead.read_timeout"
        " (the disk writes more slowly than the source reads)",
        "disk_room": "the disk budget or free-space floor left no room for all of them",
    }
    return [f"{n} files only partly {where}: {texts.get(reason, reason)}" for reason, n in reasons.items() if n]


def main(args: argparse.Namespace) -> int:
    """Entry point of ``fastfs warm`` (*args*: paths, from_file, check, evict, jobs); the exit status."""
    jobs = getattr(args, "jobs", None) or DEFAULT_JOBS
    if not 1 <= jobs <= MAX_JOBS:
        print(f"{PROG}: -j must be between 1 and {MAX_JOBS}", file=sys.stderr)
        return 1
    try:
        paths = list(args.paths)
        for name in getattr(args, "from_file", None) or []:
            paths += read_list(name)
        if not paths:
            raise WarmError("no paths given (PATH arguments or --from-file LIST)")
        per_file = bool(getattr(args, "check", False) or getattr(args, "evict", False))
        items = validate(paths, covered_too=not per_file)
    except WarmError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    start = time.monotonic()
    disk = bool(getattr(args, "disk", False))
    if per_file:
        check = bool(getattr(args, "check", False))
        names = (XATTR_DISK_CACHED, XATTR_DISK_EVICT) if disk else (XATTR_CACHED, XATTR_EVICT)
        name = names[0] if check else names[1]
        result = run_per_file(items, name, jobs, sys.stdout)
        if result.unsupported:
            print(f"{PROG}: {result.unsupported}", file=sys.stderr)
            return 1
        _report_errors(result)
        if check:
            cached_share = result.bytes_done / result.bytes_total if result.bytes_total else 1.0
            print(
                f"{'on disk' if disk else 'cached'}: {result.files_done} of {result.files_total} files,"
                f" {human(result.bytes_done)} of {human(result.bytes_total)} ({100 * cached_share:.1f}%)"
            )
            return 0 if result.complete else 1
        print(f"evicted {human(result.bytes_done)} from {result.files_done} files{' from disk' if disk else ''}")
        return 0 if not (result.failed or result.errors) else 1
    progress = _Progress(sys.stderr.isatty())
    try:
        result = run_warm(items, jobs, progress, disk=disk)
    finally:
        progress.close()
    seconds = time.monotonic() - start
    if result.interrupted:
        print(
            f"{PROG}: interrupted: cancelled {result.cancelled} warm job{'s' if result.cancelled != 1 else ''} in the"
            f" daemon; {result.files_done} of {result.files_total} files listed so far were warmed"
            f" ({human(result.bytes_done)})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    _report_errors(result)
    if result.unsupported:
        print(f"{PROG}: {result.unsupported}", file=sys.stderr)
    for line in _declined_lines(result, disk):
        print(f"{PROG}: {line}", file=sys.stderr)
    if result.evicted and not disk:
        print(
            f"{PROG}: {human(result.evicted)} of this warm was evicted again to make room: the data is larger"
            " than the cache budget",
            file=sys.stderr,
        )
    if result.skipped:
        print(f"{PROG}: {result.skipped} files or directories skipped: no permission to read them", file=sys.stderr)
    cached = result.cached_files
    rate = result.bytes_done / seconds / (1 << 20) if seconds > 0 else 0.0
    extra = "".join(
        f", {n} {what}"
        for n, what in (
            (result.failed, "failed"),
            (result.declined, "partly cached"),
            (result.skipped, "skipped"),
        )
        if n
    )
    into = " onto the disk tier" if disk else ""
    print(f"warmed {cached} files{into}, {human(result.bytes_done)} in {seconds:.2f} s ({rate:.1f} MiB/s){extra}")
    return 0 if result.complete else 1


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog=PROG, description="load files of a fastfs mount into its RAM cache")
    add_arguments(_parser)
    raise SystemExit(main(_parser.parse_args()))
