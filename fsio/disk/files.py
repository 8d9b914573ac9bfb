"""The disk store's data files: one sparse file per entry under ``data/XX/``, and the start-up sweep.

An entry's data file (``data/XX/NNNNNNNNNNNNNNNN``, its id in hex, ``XX`` the id's low byte: see
:mod:`fastfs.fsio.disk.directory`) has the source file's size and holds the cached bytes at their
source offsets (holes elsewhere), so a complete data file is byte for byte the source file.
:class:`DataFiles` reaches them through descriptors of ``data/`` and of the 256 fan-out
directories, opened once (``O_NOFOLLOW | O_DIRECTORY``) and kept until close; files are opened with
``O_NOFOLLOW`` and created with ``O_EXCL``, mode 0600, so no symlink is ever followed.

Entry ids are never reused, so a data file name always means one entry; data files no live entry
names (superseded or dropped entries whose unlink a crash lost, files of records a crash lost) are
removed by :meth:`DataFiles.sweep`, which writer thread 0 runs first thing after open.

Locks: a fan-out descriptor slot is installed under the catalog lock (two threads opening the same
directory keep one descriptor); a new fan-out directory is charged to the space accounting through
``charge_dir``. The sweep plan is set at open (before any thread) and used once by writer thread 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable

from fastfs.fsio.disk import directory

log = logging.getLogger("fastfs.diskcache")

FANOUT = 256  # fan-out directories (an id's low byte)
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class DataFiles:
    """The data files of one store's directory (see the module docstring)."""

    def __init__(self, lock: threading.Lock, path: str, charge_dir: Callable[[], None]) -> None:
        self._lock = lock
        self._path = path
        self._charge_dir = charge_dir
        self._data_fd = -1
        self._sub_fds = [-1] * FANOUT  # slots installed under the catalog lock
        self._sweep_ids: set[int] | None = None
        self._sweep_limit = 0
        self._stale: list[int] = []

    def open(self, root_fd: int) -> int:
        """Open (creating) ``data/``; returns the number of fan-out directories it holds."""
        self._data_fd = directory.open_subdir(root_fd, directory.DATA, create=True)
        return len([n for n in os.listdir(self._data_fd) if len(n) == 2])

    def plan_sweep(self, live: set[int], limit: int, stale: list[int]) -> None:
        """What :meth:`sweep` removes: the ``stale`` ids' files, and files of ids below ``limit``
        that are not ``live``."""
        self._sweep_ids, self._sweep_limit, self._stale = live, limit, stale

    def subdir(self, entry_id: int, create: bool) -> int:
        """The descriptor of ``entry_id``'s fan-out directory (kept open; ``create``: made if missing)."""
        slot = entry_id & 0xFF
        fd = self._sub_fds[slot]
        if fd >= 0:
            return fd
        name = directory.fanout_name(entry_id)
        try:
            fd = directory.open_subdir(self._data_fd, name, create=False)
        except FileNotFoundError:
            if not create:
                raise
            fd = directory.open_subdir(self._data_fd, name, create=True)
            self._charge_dir()
        with self._lock:
            if self._sub_fds[slot] < 0:
                self._sub_fds[slot] = fd
                return fd
            other = self._sub_fds[slot]
        os.close(fd)
        return other

    def open_read(self, entry_id: int) -> int:
        """A new read-only descriptor of the data file (raises OSError when it cannot be opened)."""
        return os.open(directory.data_name(entry_id), READ_FLAGS, dir_fd=self.subdir(entry_id, create=False))

    def open_write(self, entry_id: int) -> int:
        """A new write-only descriptor of the existing data file (FileNotFoundError when it vanished)."""
        sub = self.subdir(entry_id, create=True)
        return os.open(directory.data_name(entry_id), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sub)

    def create(self, entry_id: int, size: int) -> int:
        """Create the data file (replacing an orphan of a crashed run whose records were lost), extended
        to ``size`` bytes when ``size`` > 0; a new write-only descriptor."""
        sub = self.subdir(entry_id, create=True)
        name = directory.data_name(entry_id)
        try:
            fd = os.open(name, os.O_WRONLY | directory.FILE_CREATE, directory.FILE_MODE, dir_fd=sub)
        except FileExistsError:
            os.unlink(name, dir_fd=sub)
            fd = os.open(name, os.O_WRONLY | directory.FILE_CREATE, directory.FILE_MODE, dir_fd=sub)
        if size > 0:
            try:
                os.ftruncate(fd, size)
            except BaseException:
                os.close(fd)
                os.unlink(name, dir_fd=sub)
                raise
        return fd

    def unlink(self, entry_id: int) -> None:
        """Remove the data file if it exists (a failure other than ENOENT is logged, not raised)."""
        try:
            os.unlink(directory.data_name(entry_id), dir_fd=self.subdir(entry_id, create=False))
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("disk cache %s: cannot remove a data file: %s", self._path, e.strerror)

    def sweep(self) -> None:
        """Remove data files no entry names (stale entries, files of a crashed run's lost records)."""
        live, limit = self._sweep_ids, self._sweep_limit
        self._sweep_ids = None
        for entry_id in self._stale:
            self.unlink(entry_id)
        self._stale = []
        if live is None or (not live and limit <= 1):
            return
        try:
            subs = [n for n in os.listdir(self._data_fd) if len(n) == 2]
        except OSError:
            return
        for sub in subs:
            try:
                fd = directory.open_subdir(self._data_fd, sub, create=False)
            except OSError:
                continue
            try:
                for name in os.listdir(fd):
                    found = directory.parse_data_name(name)
                    if found is None or found >= limit or found in live:
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=fd)
            except OSError:
                pass
            finally:
                os.close(fd)

    def close(self) -> None:
        for fd in [*self._sub_fds, self._data_fd]:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._sub_fds = [-1] * FANOUT
        self._data_fd = -1
