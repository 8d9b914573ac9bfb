#!/usr/bin/env python3
"""The hop of one random read over a real network client: direct, libfuse's C example, fastfs.

A random 4 KiB read gains nothing from a read-ahead filesystem; what it costs is the hop through
the daemon. This probe measures that hop against the floor any FUSE daemon pays, on a real client:
sshfs to a private loopback sshd (``benchkit/netsources.py``) serving a file of random bytes, read
by ``--count`` 4 KiB preads of distinct pages (``POSIX_FADV_RANDOM``: no kernel read-ahead, so each
pread is one request all the way down) on three contenders in the same run, in rotated order each
round:

* ``direct``: the sshfs mount itself;
* ``libfuse``: libfuse 3's ``example/passthrough_ll.c`` (built as ``bench_floor.py`` builds it, see
  ``benchkit/libfuse.py``) mounted over the sshfs mount with ``-o cache=always``;
* ``fastfs``: fastfs mounted over the sshfs mount, served (``fuse.passthrough=off``), the source
  read in parallel (sshfs's own shape); ``-o`` adds options (``fuse.direct_reads=false`` compares the
  engine's path).

It prints microseconds per read (median of the rounds, and each round), the ratio of each daemon to
direct, and how many reads fastfs's request loop answered itself (``reads_direct``).

``--small N`` measures instead the hop on many small files read by parallel threads (issue 21's "16
threads over the 10,000 small files"): ``--threads`` threads open, read and close each of N files of
``--kib`` KiB in name order, as the matrix's ``threads16_small`` row (``--shuffle``: in a shuffled
order, where no scan knows the order ahead), a cold pass per contender and round (the client remounted, the page
cache dropped, each daemon mounted afresh, fastfs on its default route and settings). It prints the
time per file, the ratio to direct, and the requests sftp-server answered. On a host where the
client, sshd and sftp-server already keep the cores busy, every daemon's own CPU per request is the
whole difference; libfuse's C example is the floor any FUSE daemon pays there.

Run: ``python benchmarks/probe_hop.py [--count 1500] [--rounds 3] [--mib 256] [-o k=v,...]``,
``python benchmarks/probe_hop.py --small 10000 [--threads 16] [--kib 3] [--shuffle] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchkit import libfuse  # noqa: E402
from benchkit.cli import RAM_ROOT  # noqa: E402
from benchkit.mounts import fastfs_mount  # noqa: E402
from benchkit.netsources import sshfs_source  # noqa: E402
from benchkit.system import drop_caches  # noqa: E402

PAGE = 4096
# Random preads per contender and round (each a distinct page: none is a page cache hit).
DEFAULT_COUNT = 1500
# Rounds; the median is reported.
DEFAULT_ROUNDS = 3
# Size of the file read (MiB): many more pages than reads, so the reads stay far apart.
DEFAULT_MIB = 256
# Threads of the parallel small-file pass (--small): the matrix's threads16_small row.
DEFAULT_THREADS = 16
# Size of each small file (KiB): the matrix's small files.
DEFAULT_KIB = 3


def random_reads(path: str, count: int, size: int, seed: int) -> float:
    """Microseconds per pread of *count* distinct random pages of *path*."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        pages = random.Random(seed).sample(range(size // PAGE), count)
        t0 = time.perf_counter()
        for page in pages:
            os.pread(fd, PAGE, page * PAGE)
        return (time.perf_counter() - t0) / count * 1e6
    finally:
        os.close(fd)


def read_whole(path: str) -> int:
    """open, read to the end, close: what a loader does with one small file (as the matrix reads it)."""
    with open(path, "rb", buffering=0) as f:
        return len(f.read())


def parallel_pass(root: str, names: list[str], threads: int) -> float:
    """Seconds for *threads* threads to read every file of *names* under *root* once."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(read_whole, [os.path.join(root, n) for n in names]))
    return time.perf_counter() - t0


def small_files(args: argparse.Namespace, binary: str, origin: str, work: str) -> int:
    """The --small probe (see the module docstring): prints its table, returns 0."""
    data = os.path.join(work, "data")
    os.mkdir(data)
    names = [f"f{i:06d}.bin" for i in range(args.small)]
    for name in names:
        with open(os.path.join(data, name), "wb") as f:
            f.write(os.urandom(args.kib * 1024))
    if args.shuffle:
        random.Random(0).shuffle(names)
    ssh = os.path.join(work, "sshfs")
    options = [*filter(None, args.options.split(","))]
    contenders = ("direct", "libfuse", "fastfs")
    times: dict[str, list[float]] = {name: [] for name in contenders}
    requests: dict[str, list[float]] = {name: [] for name in contenders}
    with sshfs_source(data, ssh) as src:
        for r in range(args.rounds):
            for i in range(len(contenders)):
                name = contenders[(i + r) % len(contenders)]
                src.reset()
                drop_caches()
                with contextlib.ExitStack() as stack:
                    root = ssh
                    if name == "libfuse":
                        root = stack.enter_context(libfuse.reference_mount(binary, ssh, os.path.join(work, "ll")))
                    elif name == "fastfs":
                        root = stack.enter_context(fastfs_mount(ssh, os.path.join(work, "ff"), options)).mnt
                    before = src.counters().get("requests", 0.0)
                    times[name].append(parallel_pass(root, names, args.threads))
                    requests[name].append(src.counters().get("requests", 0.0) - before)
    direct = statistics.median(times["direct"])
    print(
        f"{args.threads} threads over {args.small} files of {args.kib} KiB (open, read, close), "
        f"{'shuffled' if args.shuffle else 'in name order'}, "
        f"over loopback sshfs, cold, {args.rounds} rounds"
    )
    print(f"libfuse: {origin}; fastfs options: {','.join(options) or 'defaults'}")
    for name in contenders:
        med = statistics.median(times[name])
        each = ", ".join(f"{t:.2f}" for t in times[name])
        ratio = "" if name == "direct" else f"  direct/{name} {direct / med:.2f}x"
        reqs = ", ".join(f"{q:.0f}" for q in requests[name])
        print(f"  {name:8} {med / args.small * 1e6:7.1f} us/file ({each} s){ratio}  sftp requests {reqs}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=DEFAULT_COUNT, help="random 4 KiB preads per contender and round")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds (median reported)")
    p.add_argument("--mib", type=int, default=DEFAULT_MIB, help="size of the file read, MiB")
    p.add_argument("-o", dest="options", default="", help="extra fastfs options, k=v[,k=v]")
    p.add_argument("--cache-dir", default=libfuse.default_cache_dir(), help="where the libfuse example is built")
    p.add_argument("--small", type=int, default=0, help="instead: a parallel pass over this many small files")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="threads of the --small pass")
    p.add_argument("--kib", type=int, default=DEFAULT_KIB, help="size of each --small file, KiB")
    p.add_argument("--shuffle", action="store_true", help="the --small pass in a shuffled order (else name order)")
    args = p.parse_args(argv)
    binary, origin = libfuse.reference_binary(None, None, args.cache_dir)
    size = args.mib << 20
    os.makedirs(RAM_ROOT, exist_ok=True)
    if args.small > 0:
        with tempfile.TemporaryDirectory(dir=RAM_ROOT, prefix="probe-hop.") as work:
            return small_files(args, binary, origin, work)
    with tempfile.TemporaryDirectory(dir=RAM_ROOT, prefix="probe-hop.") as work:
        data = os.path.join(work, "data")
        os.mkdir(data)
        with open(os.path.join(data, "r.bin"), "wb") as f:
            f.write(os.urandom(size))
        ssh = os.path.join(work, "sshfs")
        options = ["fuse.passthrough=off", "readahead.source_shape=parallel", *filter(None, args.options.split(","))]
        times: dict[str, list[float]] = {"direct": [], "libfuse": [], "fastfs": []}
        with sshfs_source(data, ssh) as src:
            src.start_client()
            with (
                libfuse.reference_mount(binary, ssh, os.path.join(work, "ll")) as ll,
                fastfs_mount(ssh, os.path.join(work, "ff"), options) as ff,
            ):
                roots = {"direct": ssh, "libfuse": ll, "fastfs": ff.mnt}
                names = list(roots)
                for r in range(args.rounds):
                    for i in range(len(names)):
                        name = names[(i + r) % len(names)]
                        path = os.path.join(roots[name], "r.bin")
                        times[name].append(random_reads(path, args.count, size, r * 7 + i))
                served = ff.stats()["counters"].get("reads_direct", 0)
    direct = statistics.median(times["direct"])
    print(f"random {PAGE // 1024} KiB preads over loopback sshfs, {args.count} per round, {args.rounds} rounds")
    print(f"libfuse: {origin}; fastfs options: {','.join(options)}")
    for name, ts in times.items():
        med = statistics.median(ts)
        each = ", ".join(f"{t:.1f}" for t in ts)
        ratio = "" if name == "direct" else f"  direct/{name} {direct / med:.2f}x"
        print(f"  {name:8} {med:7.1f} us/read ({each}){ratio}")
    print(f"  fastfs's request loop answered {served} of {args.count * args.rounds} reads itself")
    return 0


if __name__ == "__main__":
    sys.exit(main())
