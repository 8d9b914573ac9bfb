"""Sources that change while they are read: soaks that count wrong bytes and failed reads.

The promise under test: the bytes a reader gets are the bytes of the version it opened, whole,
whatever a writer does next to it (README, "Consistency"). Each scenario runs ``direct`` (the storage
itself), ``fastfs`` (defaults) and ``fastfs served`` (``-o fuse.passthrough=off``) one after the
other for ``--seconds`` each. The figures are counts, not times, so they are not interleaved.

* ``tree``: a writer, every 10 ms, fills one of 10 directories with 5-40 files of 100 B-400 KB
  (each written under a temporary name and renamed into place), removes a whole directory, or
  renames one away, fills it anew and removes the old one. ``--readers`` processes walk the tree
  through the reader's root and read about half the files they meet whole, a fraction (``--mmap``)
  by ``mmap``. Every 4 KiB page of a file starts with its name, version and size, so each read is
  checked on its own: right (one version, whole), wrong (a mix of versions, cut short, too long),
  or failed (by errno at open or read; ENOENT at open is expected, names vanish). A mapped read
  is made in a child process: one killed by SIGBUS (a page past the size the kernel holds) is a
  failed read (``mapped read SIGBUS``), and the reader goes on.
* ``files``: one process writes and reads: 400 names, at most 200 files of 1 KB-5 MB; each step
  writes a new version of a name (renamed over it, or rewritten in place for ``--inplace`` of the
  steps), deletes a file when there are more than 200, then reads three live files whole through the
  reader's root (a fraction by ``mmap``) and compares each with every version it wrote: the current
  one, an older one whole (replaced how long before: within fastfs's one-second bound or beyond it),
  a mix, or ENOENT.

Both run on ``--storage`` (default ``local``: the directory itself, tmpfs; ``emu:SPEC``, ``sshfs`` and
``rclone`` serve the directory the harness writes into, so their own caches are part of what
``direct`` sees).

Run: ``python benchmarks/bench_churn.py [--only tree,files] [--seconds 30] [--storage local]``;
smoke: ``--seconds 3``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_changing import Contender, make_contenders, parse_storage, route_note, storage_mnt, storage_over  # noqa: E402
from benchkit.cli import RAM_ROOT, add_fastfs_options, extra_options, selected  # noqa: E402
from benchkit.report import log, markdown_table  # noqa: E402
from benchkit.storages import StorageSpec  # noqa: E402
from benchkit.system import mountpoint, require_root  # noqa: E402

SCENARIOS = ("tree", "files")
# Seconds each reader runs per scenario: thousands of reads against hundreds of writer steps.
DEFAULT_SECONDS = 30.0
# Page size of the stamps: every page of a tree file starts with the file's stamp.
PAGE = 4096
# The tree: directories, files per fill, their sizes, and the writer's step (s).
TREE_DIRS = 10
TREE_FILES = (5, 40)
TREE_SIZES = (100, 3000, 50_000, 400_000)
TREE_STEP = 0.01
# Share of the tree writer's steps that remove a directory, and that rename one away and refill it.
TREE_REMOVE = 0.3
TREE_RENAME = 0.2
# The files scenario: names, most live files, sizes, reads per step, share of listings per step.
FILE_NAMES = 400
FILE_LIVE = 200
FILE_SIZES = (1000, 3000, 70_000, 300_000, 1_500_000, 5_000_000)
FILE_READS = 3
FILE_LISTING = 0.05
# fastfs's default bound on serving a replaced version (fuse.revalidate, s), plus scheduling slack.
BOUND = 1.1
# Exit code of a mapped read's child that failed otherwise than by an errno (errnos are below it).
CHILD_FAILED = 255
# Mount point of fastfs.
FASTFS_MOUNT = "churn-fastfs"


# -- stamps ---------------------------------------------------------------------------------------
def stamped(rel: str, version: int, size: int) -> bytes:
    """*size* bytes whose every page starts with ``rel|version|size|``."""
    head = f"{rel}|{version}|{size}|".encode()
    page = (head + b"." * PAGE)[:PAGE]
    return (page * (size // PAGE + 1))[:size]


def check_stamped(rel: str, data: bytes) -> str | None:
    """Why *data*, read from *rel*, is not one version of it whole (None: it is)."""
    if not data:
        return "empty"
    parts = data[:200].split(b"|")
    if len(parts) < 4:
        return "no stamp"
    try:
        name, size = parts[0].decode(), int(parts[2])
    except ValueError:
        return "no stamp"
    if name != rel:
        return f"the stamp of {name}"
    if len(data) != size:
        return f"{len(data)} bytes of a version of {size}"
    head = data[: len(parts[0]) + len(parts[1]) + len(parts[2]) + 3]
    for off in range(PAGE, len(data), PAGE):
        page = data[off : off + PAGE]
        if not (page.startswith(head) or head.startswith(page)):  # (a last page may be shorter than the stamp)
            return "a mix of versions"
    return None


def read_whole(path: str, by_mmap: bool) -> bytes:
    with open(path, "rb") as f:
        return read_open(f, by_mmap)


class KilledReadError(Exception):
    """A mapped read died of a signal (SIGBUS: a page past the end of the file the kernel holds)."""


def read_open(f: BinaryIO, by_mmap: bool) -> bytes:
    """The whole of open file *f*, by ``read`` or by ``mmap`` of the size ``fstat`` gives (in a child
    process, so a SIGBUS kills that read, not the reader: :class:`KilledReadError`)."""
    if not by_mmap:
        return f.read()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child: map, copy into the pipe, exit with 0 or the errno)
        code = 0
        try:
            os.close(r)
            size = os.fstat(f.fileno()).st_size
            data = b""
            if size:
                with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                    data = m[:]
            with open(w, "wb") as out:
                out.write(data)
        except OSError as e:
            code = e.errno or CHILD_FAILED
        except BaseException:
            code = CHILD_FAILED
        os._exit(code)
    os.close(w)
    with open(r, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise KilledReadError(signal.Signals(os.WTERMSIG(status)).name)
    code = os.WEXITSTATUS(status)
    if code:
        raise OSError(code, os.strerror(code) if code != CHILD_FAILED else "mapped read failed")
    return data


def _errname(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e.errno))


# -- tree -----------------------------------------------------------------------------------------
def tree_reader(root: str, seconds: float, seed: int, mmap_share: float) -> dict[str, object]:
    """One reader process's walk (see the module docstring): counts of reads right and wrong, and of
    failures by where and errno."""
    rng = random.Random(seed)
    out: dict[str, object] = {"reads": 0, "wrong": 0, "errors": {}, "examples": []}
    errors: dict[str, int] = out["errors"]  # type: ignore[assignment]
    examples: list[str] = out["examples"]  # type: ignore[assignment]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            for d, _dirs, files in os.walk(root):
                for f in files:
                    if f.startswith(".") or rng.random() < 0.5:
                        continue
                    path = os.path.join(d, f)
                    rel = os.path.relpath(path, root).replace(".old/", "/", 1)
                    try:
                        fh = open(path, "rb")  # noqa: SIM115 (an open failing is counted apart from a read)
                    except OSError as e:
                        key = f"open {_errname(e)}"
                        errors[key] = errors.get(key, 0) + 1
                        continue
                    try:
                        with fh:
                            data = read_open(fh, rng.random() < mmap_share)
                    except OSError as e:
                        key = f"read {_errname(e)}"
                        errors[key] = errors.get(key, 0) + 1
                        continue
                    except KilledReadError as e:
                        key = f"mapped read {e}"
                        errors[key] = errors.get(key, 0) + 1
                        continue
                    out["reads"] += 1  # type: ignore[operator]
                    why = check_stamped(rel, data)
                    if why:
                        out["wrong"] += 1  # type: ignore[operator]
                        if len(examples) < 3:
                            examples.append(f"{rel}: {why}")
        except OSError as e:
            key = f"walk {_errname(e)}"
            errors[key] = errors.get(key, 0) + 1
    return out


class TreeWriter:
    """The tree scenario's writer (see the module docstring), one step at a time."""

    def __init__(self, top: str, seed: int) -> None:
        self.top = top
        self.rng = random.Random(seed)
        self.version = 0
        self.steps = 0
        self.errors: list[str] = []

    def fill(self, d: str) -> None:
        os.makedirs(os.path.join(self.top, d), exist_ok=True)
        for i in range(self.rng.randrange(*TREE_FILES)):
            self.version += 1
            rel = f"{d}/f{i}.bin"
            tmp = os.path.join(self.top, d, f".t{i}")
            with open(tmp, "wb") as f:
                f.write(stamped(rel, self.version, self.rng.choice(TREE_SIZES)))
            os.rename(tmp, os.path.join(self.top, rel))

    def step(self) -> None:
        d = f"d{self.rng.randrange(TREE_DIRS)}"
        r = self.rng.random()
        path = os.path.join(self.top, d)
        self.steps += 1
        try:
            if r < TREE_REMOVE:
                shutil.rmtree(path, ignore_errors=True)
            elif r < TREE_REMOVE + TREE_RENAME and os.path.exists(path):
                os.rename(path, path + ".old")
                self.fill(d)
                shutil.rmtree(path + ".old")
            else:
                self.fill(d)
        except OSError as e:
            self.errors.append(str(e))


@dataclass
class Tally:
    """What the readers of one contender met."""

    reads: int = 0
    wrong: int = 0
    killed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    # files scenario only
    stale: int = 0  # an older version whole, replaced within the bound
    stale_beyond: int = 0  # ... replaced longer than the bound before
    oldest: float = 0.0  # the longest such age (s)

    def add(self, result: dict[str, object]) -> None:
        self.reads += int(result["reads"])  # type: ignore[call-overload]
        self.wrong += int(result["wrong"])  # type: ignore[call-overload]
        for k, v in dict(result["errors"]).items():  # type: ignore[call-overload]
            self.errors[k] = self.errors.get(k, 0) + int(v)
        self.examples += list(result["examples"])[: 3 - len(self.examples)]  # type: ignore[call-overload]

    def failed(self, expected: tuple[str, ...] = ()) -> str:
        shown = {k: v for k, v in self.errors.items() if k not in expected}
        return ", ".join(f"{v} {k}" for k, v in sorted(shown.items())) or "0"


def run_tree(root: str, top: str, args: argparse.Namespace) -> Tally:
    writer = TreeWriter(top, args.seed)
    readers = [
        subprocess.Popen(
            [sys.executable, __file__, "--tree-reader", root, str(args.seconds), str(args.seed + k), str(args.mmap)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in range(args.readers)
    ]
    tally = Tally()
    try:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            writer.step()
            time.sleep(TREE_STEP)
    finally:
        for p in readers:
            out, err = p.communicate()
            if p.returncode == 0:
                tally.add(json.loads(out))
            elif p.returncode < 0:
                tally.killed += 1
                tally.examples.append(f"reader killed by {signal.Signals(-p.returncode).name}")
            else:
                raise RuntimeError(f"tree reader failed: {err.strip()[-500:]}")
    log(f"tree: {writer.steps} writer steps, {len(writer.errors)} writer errors")
    return tally


def scenario_tree(args: argparse.Namespace, spec: StorageSpec | None, work: str, contenders: list[Contender]) -> None:
    rows = []
    for c in contenders:
        top = os.path.join(work, f"tree-{c.label.replace(' ', '-')}")
        writer = TreeWriter(top, args.seed)
        for k in range(TREE_DIRS):
            writer.fill(f"d{k}")
        with reader_root(c, spec, top) as root:
            tally = run_tree(root, top, args)
        rows.append(
            [
                c.label,
                tally.reads,
                tally.wrong,
                tally.failed(("open ENOENT",)),
                tally.killed,
                tally.errors.get("open ENOENT", 0),
                "; ".join(tally.examples) or "-",
                route_note(c),
            ]
        )
        log(f"tree, {c.label}: {tally.reads} reads, {tally.wrong} wrong, failed {tally.failed(('open ENOENT',))}")
    print(f"\n### tree churn, {args.seconds:g} s, {args.readers} readers ({args.mmap:.0%} by mmap), {_where(spec)}\n")
    headers = ["reader", "reads", "wrong", "failed", "readers killed", "ENOENT at open", "examples", "route"]
    print(markdown_table(headers, rows, (0, 3, 6, 7)), flush=True)


# -- files ----------------------------------------------------------------------------------------
@dataclass
class Version:
    number: int
    size: int
    written: float  # monotonic time it was written
    replaced: float | None = None  # monotonic time a newer version (or a delete) replaced it


def run_files(root: str, top: str, args: argparse.Namespace) -> Tally:
    rng = random.Random(args.seed)
    history: dict[str, list[Version]] = {}
    live: dict[str, Version] = {}
    tally = Tally()
    number = 0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        number += 1
        name = f"f{rng.randrange(FILE_NAMES)}.bin"
        size = rng.choice(FILE_SIZES)
        data = stamped(name, number, size)
        target = os.path.join(top, name)
        if rng.random() < args.inplace and name in live:
            with open(target, "r+b") as f:  # rewritten in place: same inode
                f.truncate(0)
                f.write(data)
        else:
            tmp = os.path.join(top, f".{name}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
            os.rename(tmp, target)
        now = time.monotonic()
        if name in live:
            live[name].replaced = now
        live[name] = Version(number, size, now)
        history.setdefault(name, []).append(live[name])
        if len(live) > FILE_LIVE:
            victim = rng.choice(sorted(live))
            os.unlink(os.path.join(top, victim))
            live.pop(victim).replaced = time.monotonic()
        for _ in range(FILE_READS):
            name = rng.choice(sorted(live))
            _check_file(root, name, live[name], history[name], rng.random() < args.mmap, tally)
        if rng.random() < FILE_LISTING:
            os.listdir(root)
    return tally


def _check_file(root: str, name: str, current: Version, versions: list[Version], by_mmap: bool, tally: Tally) -> None:
    tally.reads += 1
    try:
        data = read_whole(os.path.join(root, name), by_mmap)
    except OSError as e:
        key = _errname(e)
        tally.errors[key] = tally.errors.get(key, 0) + 1
        return
    except KilledReadError as e:
        key = f"mapped read {e}"
        tally.errors[key] = tally.errors.get(key, 0) + 1
        return
    if data == stamped(name, current.number, current.size):
        return
    now = time.monotonic()
    for v in versions:
        if v is not current and len(data) == v.size and data == stamped(name, v.number, v.size):
            age = now - (v.replaced if v.replaced is not None else now)
            tally.oldest = max(tally.oldest, age)
            if age > BOUND:
                tally.stale_beyond += 1
            else:
                tally.stale += 1
            return
    tally.wrong += 1
    if len(tally.examples) < 3:
        tally.examples.append(f"{name}: {check_stamped(name, data) or 'a version never current'}")


def scenario_files(args: argparse.Namespace, spec: StorageSpec | None, work: str, contenders: list[Contender]) -> None:
    rows = []
    for c in contenders:
        top = os.path.join(work, f"files-{c.label.replace(' ', '-')}")
        os.makedirs(top)
        with reader_root(c, spec, top) as root:
            tally = run_files(root, top, args)
        rows.append(
            [
                c.label,
                tally.reads,
                tally.wrong,
                tally.stale,
                tally.stale_beyond,
                f"{tally.oldest:.2f}",
                tally.failed(),
                "; ".join(tally.examples) or "-",
                route_note(c),
            ]
        )
        log(f"files, {c.label}: {tally.reads} reads, {tally.wrong} mixed, {tally.stale_beyond} older beyond the bound")
    print(
        f"\n### file churn, {args.seconds:g} s ({args.inplace:.0%} of the writes in place, "
        f"{args.mmap:.0%} of the reads by mmap), {_where(spec)}\n"
    )
    headers = [
        "reader",
        "reads",
        "wrong (mix)",
        f"older version, <= {BOUND:g} s",
        f"older, > {BOUND:g} s",
        "oldest (s)",
        "failed",
        "examples",
        "route",
    ]
    print(markdown_table(headers, rows, (0, 6, 7, 8)), flush=True)


# -- main -----------------------------------------------------------------------------------------
@contextlib.contextmanager
def reader_root(c: Contender, spec: StorageSpec | None, top: str) -> Iterator[str]:
    """Where contender *c* reads directory *top*: the storage mounted over it (or *top* itself), directly
    or through fastfs."""
    with storage_over(spec, top) as st, c.root(storage_mnt(st, top), mountpoint(FASTFS_MOUNT)) as root:
        yield root


def _where(spec: StorageSpec | None) -> str:
    return "local directory" if spec is None else spec.describe()


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help=f"comma-separated scenarios of: {', '.join(SCENARIOS)}")
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="seconds per reader and scenario")
    p.add_argument("--readers", type=int, default=2, help="reader processes of the tree scenario")
    p.add_argument("--mmap", type=float, default=0.2, help="share of the reads made by mmap")
    p.add_argument("--inplace", type=float, default=0.2, help="share of the file writes made in place")
    p.add_argument("--seed", type=int, default=3, help="seed of the writers and readers")
    p.add_argument("--storage", default="local", help="local, emu:SPEC, sshfs or rclone")
    p.add_argument("--ram-dir", default=RAM_ROOT, help="data directory in RAM (tmpfs)")
    add_fastfs_options(p)
    args = p.parse_args(argv)
    args.scenarios = selected(args, SCENARIOS)
    if args.seconds <= 0 or args.readers < 1 or not 0 <= args.mmap <= 1 or not 0 <= args.inplace <= 1:
        p.error("--seconds > 0, --readers >= 1, and --mmap, --inplace between 0 and 1, please")
    args.extra = extra_options(args)
    return p, args


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--tree-reader":
        root, seconds, seed, share = sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
        print(json.dumps(tree_reader(root, seconds, seed, share)))
        return 0
    p, args = parse_args(argv)
    spec = parse_storage(p, args.storage)
    require_root()
    work = os.path.join(args.ram_dir, f"churn-{os.getpid()}")
    os.makedirs(work)
    try:
        if "tree" in args.scenarios:
            scenario_tree(args, spec, work, make_contenders(args.extra))
        if "files" in args.scenarios:
            scenario_files(args, spec, work, make_contenders(args.extra))
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
