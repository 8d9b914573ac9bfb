"""The disk cache tier's directory: creation, ownership checks, the marker, clearing what is ours.

The user names a directory (``cache.disk_dir``); the store keeps everything it creates in it:

* ``FASTFS-DISKCACHE``: the marker, written first when the directory is initialised. Its text names
  the format version. Without it, a non-empty directory is *foreign* (the user's files, or another
  program's) and is refused, never cleared. With a marker of another version, or one that cannot be
  parsed (a torn first write), the directory is ours but unusable: :func:`clear_ours` removes the
  names the store creates (marker, journal, ``data/`` fan-out directories and data files whose names
  match the store's pattern) and nothing else, then the directory is initialised afresh.
* ``journal`` / ``journal.new``: see :mod:`fastfs.fsio.disk.journal`.
* ``data/XX/NNNNNNNNNNNNNNNN``: one data file per cached source-file version, named by its entry
  id (16 hex digits; ``XX`` = the id's low byte, 256 fan-out directories).

Security: the directory must be owned by the daemon's effective uid and not writable by group or
others (created 0700 when missing); its files are created with ``O_CREAT | O_EXCL | O_NOFOLLOW``
and mode 0600, its subdirectories 0700, and everything is reached through directory descriptors
opened with ``O_NOFOLLOW | O_DIRECTORY``, so no symlink is ever followed inside it.
:func:`check_placement` refuses a cache directory inside the source or the mountpoint (or around
them), so nothing in it is ever reachable through the mount.

Every problem is a :class:`DiskCacheError` with a one-line message that starts with the path.
"""

from __future__ import annotations

import errno
import os
import re
import stat

MARKER = "FASTFS-DISKCACHE"
JOURNAL = "journal"
JOURNAL_NEW = "journal.new"
DATA = "data"
# Version of the on-disk layout (marker, journal format, data naming); another version is cleared.
FORMAT = 1
MARKER_TEXT = "fastfs disk cache: every file here was created by fastfs and may be deleted by it.\nformat {version}\n"
# Names a fresh filesystem's root holds: a directory containing only these counts as empty.
IGNORED_NAMES = frozenset({"lost+found"})
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_MODE = 0o600
DIR_MODE = 0o700
_FANOUT_RE = re.compile(r"^[0-9a-f]{2}$")
_DATA_RE = re.compile(r"^[0-9a-f]{16}$")
_FORMAT_RE = re.compile(r"^format (\d+)$", re.MULTILINE)


class DiskCacheError(Exception):
    """The disk cache directory cannot be used; the message is one line starting with the path."""


def fanout_name(entry_id: int) -> str:
    return f"{entry_id & 0xFF:02x}"


def data_name(entry_id: int) -> str:
    return f"{entry_id:016x}"


def parse_data_name(name: str) -> int | None:
    """Entry id of a data file name, or None when the name is not one the store creates."""
    return int(name, 16) if _DATA_RE.match(name) else None


def open_root(path: str) -> tuple[int, str]:
    """Open (creating 0700 if missing) and check the cache directory; returns (descriptor, real path)."""
    if not path:
        raise DiskCacheError("cache.disk_dir: empty path")
    real = os.path.realpath(path)
    try:
        fd = os.open(real, DIR_FLAGS)
    except FileNotFoundError:
        try:
            os.makedirs(os.path.dirname(real), exist_ok=True)
            os.mkdir(real, DIR_MODE)
        except FileExistsError:
            pass
        except OSError as e:
            raise DiskCacheError(f"{real}: cannot create the disk cache directory: {e.strerror}") from None
        try:
            fd = os.open(real, DIR_FLAGS)
        except OSError as e:
            raise DiskCacheError(f"{real}: cannot open the disk cache directory: {e.strerror}") from None
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != DIR_MODE:
            os.fchmod(fd, DIR_MODE)  # the umask may have taken bits the owner needs
    except NotADirectoryError:
        raise DiskCacheError(f"{real}: not a directory") from None
    except OSError as e:
        raise DiskCacheError(f"{real}: cannot open the disk cache directory: {e.strerror}") from None
    try:
        check_owner(fd, real)
    except BaseException:
        os.close(fd)
        raise
    return fd, real


def check_owner(fd: int, path: str) -> None:
    """Refuse a directory owned by another user, or writable by group or others."""
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise DiskCacheError(f"{path}: not a directory")
    euid = os.geteuid()
    if st.st_uid != euid:
        raise DiskCacheError(
            f"{path}: owned by uid {st.st_uid}, not by the daemon's user (uid {euid}); use a directory of your own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DiskCacheError(
            f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); chmod 700 it or use another"
        )


def read_marker(root_fd: int) -> int | None:
    """Format version in the marker; None when there is no marker; -1 when it is unreadable (torn)."""
    try:
        fd = os.open(MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=root_fd)
    except FileNotFoundError:
        return None
    except OSError:
        return -1  # a symlink (ELOOP) or something else odd under our name: treat as corrupt
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return -1
        text = os.read(fd, 4096).decode("utf-8", "replace")
    finally:
        os.close(fd)
    m = _FORMAT_RE.search(text)
    if not text.startswith("fastfs disk cache") or m is None:
        return -1
    return int(m.group(1))


def write_marker(root_fd: int) -> None:
    """Write the marker (first thing in a new cache directory), durably."""
    try:
        os.unlink(MARKER, dir_fd=root_fd)
    except FileNotFoundError:
        pass
    fd = os.open(MARKER, os.O_WRONLY | FILE_CREATE, FILE_MODE, dir_fd=root_fd)
    try:
        os.write(fd, MARKER_TEXT.format(version=FORMAT).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.fsync(root_fd)


def foreign_names(root_fd: int) -> list[str]:
    """Names in the directory besides the ones a fresh filesystem holds (sorted)."""
    return sorted(n for n in os.listdir(root_fd) if n not in IGNORED_NAMES)


def clear_ours(root_fd: int) -> int:
    """Remove what the store creates (and only that); returns files removed. Anything else stays."""
    removed = 0
    for name in (JOURNAL, JOURNAL_NEW):
        removed += _unlink_file(root_fd, name)
    try:
        data_fd = os.open(DATA, DIR_FLAGS, dir_fd=root_fd)
    except OSError:
        data_fd = -1
    if data_fd >= 0:
        try:
            for sub in os.listdir(data_fd):
                if not _FANOUT_RE.match(sub):
                    continue
                try:
                    sub_fd = os.open(sub, DIR_FLAGS, dir_fd=data_fd)
                except OSError:
                    continue
                try:
                    for name in os.listdir(sub_fd):
                        if parse_data_name(name) is not None:
                            removed += _unlink_file(sub_fd, name)
                finally:
                    os.close(sub_fd)
                _rmdir_if_empty(data_fd, sub)
        finally:
            os.close(data_fd)
        _rmdir_if_empty(root_fd, DATA)
    removed += _unlink_file(root_fd, MARKER)
    os.fsync(root_fd)
    return removed


def _unlink_file(dir_fd: int, name: str) -> int:
    """Unlink ``name`` if it is a regular file or symlink (never a directory); 1 if removed."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    if stat.S_ISDIR(st.st_mode):
        return 0
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return 0
    return 1


def _rmdir_if_empty(dir_fd: int, name: str) -> None:
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.ENOTDIR):
            raise


def open_subdir(dir_fd: int, name: str, create: bool) -> int:
    """Open a subdirectory of ours without following symlinks, creating it 0700 if asked."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(name, DIR_MODE, dir_fd=dir_fd)
    except FileExistsError:
        pass
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def check_placement(disk_dir: str, *others: str) -> None:
    """Refuse a cache directory inside (or around) the source or the mountpoint: its files must
    never be reachable through the mount, and the mount must never hide it."""
    real = os.path.realpath(disk_dir)
    for other in others:
        if not other:
            continue
        o = os.path.realpath(other)
        if _within(real, o) or _within(o, real):
            raise DiskCacheError(f"{real}: the disk cache directory must be outside {o} (and not contain it)")
