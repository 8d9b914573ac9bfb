"""Names of a mount's control channel, in one place for the daemon, the commands and the benchmarks.

A fastfs mount answers a few reserved names besides the source's own files:

* the hidden directory ``/.fastfs`` of the mount root, holding ``stats`` (a JSON snapshot). The name
  is reserved: a ``.fastfs`` entry in the source root is not shown and cannot be reached through the
  mount (the daemon logs a warning at start when the source has one), and warms skip it;
* extended attributes read with ``getxattr`` (``setxattr`` never reaches the daemon: the mount is
  read-only and the kernel answers EROFS itself, so every control request is a read):

  - ``user.fastfs.stats`` on the mount root: the stats snapshot (what ``fastfs stats`` reads);
  - ``user.fastfs.warm`` on a file or directory: start a background warm of it as the caller and
    answer at once with ``{"job": ID}``;
  - ``user.fastfs.warm.ID`` on the mount root: progress of warm job ID (only its caller and root);
  - ``user.fastfs.warm.cancel.ID`` on the mount root: stop warm job ID and answer its report;
  - ``user.fastfs.cached`` on a file: how much of it is in the RAM cache now (fetches nothing);
  - ``user.fastfs.evict`` on a file: drop its cached blocks, answer how many bytes were dropped;
  - ``user.fastfs.disk.warm``, ``user.fastfs.disk.cached``, ``user.fastfs.disk.evict``: the same three
    for the disk cache tier (``cache.disk_dir``; ENOTSUP on a mount without one). A disk warm job
    reports through ``user.fastfs.warm.ID`` like any other.

Every answer is JSON of at most :data:`XATTR_MAX` bytes (the kernel's limit of one xattr value).
"""

from __future__ import annotations

import os

CONTROL_NAME = ".fastfs"
STATS_NAME = "stats"
STATS_RELPATH = os.path.join(CONTROL_NAME, STATS_NAME)
# FUSE paths of the control directory and the stats file.
STATS_DIR = "/" + CONTROL_NAME
STATS_FILE = STATS_DIR + "/" + STATS_NAME

XATTR_STATS = "user.fastfs.stats"
XATTR_WARM = "user.fastfs.warm"
XATTR_WARM_JOB = XATTR_WARM + "."  # followed by the job id
XATTR_WARM_CANCEL = XATTR_WARM + ".cancel."  # followed by the job id
XATTR_CACHED = "user.fastfs.cached"
XATTR_EVICT = "user.fastfs.evict"
XATTR_DISK_WARM = "user.fastfs.disk.warm"
XATTR_DISK_CACHED = "user.fastfs.disk.cached"
XATTR_DISK_EVICT = "user.fastfs.disk.evict"

# Largest value one getxattr can return (the kernel's XATTR_SIZE_MAX): answers are bounded to it.
XATTR_MAX = 65536
# Files listed in a stats snapshot at most (`fastfs stats --top` can show no more).
STATS_TOP_FILES = 50


def is_control_path(path: str) -> bool:
    """True for the FUSE path of the control directory or anything under it."""
    return path == STATS_DIR or path.startswith(STATS_DIR + "/")


def warm_job_xattr(job: int) -> str:
    """The xattr name reporting the progress of warm job *job*."""
    return f"{XATTR_WARM_JOB}{job}"


def warm_cancel_xattr(job: int) -> str:
    """The xattr name that stops warm job *job*."""
    return f"{XATTR_WARM_CANCEL}{job}"
