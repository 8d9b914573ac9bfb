"""The caller of a kernel request as a :class:`~fastfs.fsio.access.Caller`.

A FUSE request carries the caller's uid, gid and pid (thread id) but not its supplementary groups;
those are read from ``/proc/<pid>/status`` (the ``Groups:`` line). When that fails (the process
already exited, or lives in another pid namespace and the kernel sent pid 0) the caller gets no
supplementary groups: the checks then err on the side of refusing. Reading ``/proc`` costs a
system call or two, so this is used only for control requests (warm, cache reports, stats), never
on the read path.
"""

from __future__ import annotations

from fastfs.fsio.access import Caller

PROC = "/proc"


def groups_of(pid: int, proc: str = PROC) -> frozenset[int]:
    """Supplementary groups of process (or thread) *pid*; empty when unknown."""
    if pid <= 0:
        return frozenset()
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:] if g.isdigit())
    except OSError:
        pass
    return frozenset()


def caller_of(uid: int, gid: int, pid: int, proc: str = PROC) -> Caller:
    """The Caller of a request from (uid, gid, pid) as the kernel reports them."""
    return Caller(int(uid), int(gid), groups_of(int(pid), proc))
