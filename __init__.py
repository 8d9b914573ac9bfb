"""fastfs: a read-ahead FUSE filesystem for machine-learning data.

The package maps three folders into one namespace: :mod:`fastfs.daemon` (the process and kernel
boundary: it speaks the kernel's FUSE protocol itself, in :mod:`fastfs.daemon.kernel`, with no FUSE
library; the client commands in :mod:`fastfs.daemon.cli`), :mod:`fastfs.fsio` (the I/O engine, free
of FUSE) and :mod:`fastfs.config` (YAML schema and loader).
"""

__version__ = "0.1.0"
