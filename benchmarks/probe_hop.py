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

Run: ``python benchmarks/probe_hop.py [--count 1500] [--rounds 3] [--mib 256] [-o k=v,...]``
"""

from __future__ import annotations

import argparse
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

PAGE = 4096
# Random preads per contender and round (each a distinct page: none is a page cache hit).
DEFAULT_COUNT = 1500
# Rounds; the median is reported.
DEFAULT_ROUNDS = 3
# Size of the file read (MiB): many more pages than reads, so the reads stay far apart.
DEFAULT_MIB = 256


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=DEFAULT_COUNT, help="random 4 KiB preads per contender and round")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds (median reported)")
    p.add_argument("--mib", type=int, default=DEFAULT_MIB, help="size of the file read, MiB")
    p.add_argument("-o", dest="options", default="", help="extra fastfs options, k=v[,k=v]")
    p.add_argument("--cache-dir", default=libfuse.default_cache_dir(), help="where the libfuse example is built")
    args = p.parse_args(argv)
    binary, origin = libfuse.reference_binary(None, None, args.cache_dir)
    size = args.mib << 20
    os.makedirs(RAM_ROOT, exist_ok=True)
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
