"""The names the daemon answered absent, per directory: failed lookups the kernel may still cache.

A LOOKUP of a missing name is answered with a negative entry the kernel keeps for
``fuse.negative_timeout`` (default: ``fuse.dir_timeout``). When the engine finds that the directory
changed (a new listing, :class:`~fastfs.fsio.changes.DirChange`), the names answered absent that now
exist are taken from here (:meth:`Negatives.existing`) and the kernel is told to drop them, so a file
created in the source shows at once instead of after the timeout.

Bounds: at most :data:`MAX_NAMES` names per directory and :data:`MAX_DIRS` directories, the least
recently added forgotten first. A name forgotten while the kernel still caches it keeps the
timeout's bound only; a name kept after the kernel dropped it costs one needless invalidation.

Concurrency: ``_lock`` guards ``_dirs`` and every name set in it (lookups add from many threads; the
listeners take from the thread that found the change).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection

# Directories whose failed lookups are remembered.
MAX_DIRS = 1024
# Failed lookups remembered per directory (a loader probing many missing names keeps the newest).
MAX_NAMES = 256


class Negatives:
    """Failed lookups per directory node (see the module docstring)."""

    def __init__(self, max_dirs: int = MAX_DIRS, max_names: int = MAX_NAMES) -> None:
        self.max_dirs = max_dirs
        self.max_names = max_names
        self._lock = threading.Lock()
        self._dirs: OrderedDict[int, OrderedDict[str, None]] = OrderedDict()  # dir node id -> names

    def add(self, parent: int, name: str) -> None:
        """*name* in directory node *parent* was answered absent."""
        with self._lock:
            names = self._dirs.get(parent)
            if names is None:
                names = self._dirs[parent] = OrderedDict()
                if len(self._dirs) > self.max_dirs:
                    self._dirs.popitem(last=False)
            else:
                self._dirs.move_to_end(parent)
            names[name] = None
            names.move_to_end(name)
            if len(names) > self.max_names:
                names.popitem(last=False)

    def existing(self, parent: int, present: Collection[str]) -> list[str]:
        """The names of directory node *parent* answered absent that *present* now holds (forgotten here:
        the caller tells the kernel to drop them)."""
        with self._lock:
            names = self._dirs.get(parent)
            if not names:
                return []
            found = [name for name in names if name in present]
            for name in found:
                del names[name]
            if not names:
                del self._dirs[parent]
            return found

    def __len__(self) -> int:
        with self._lock:
            return sum(len(names) for names in self._dirs.values())
