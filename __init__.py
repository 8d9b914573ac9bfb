"""fastfs: a read-ahead FUSE filesystem for machine-learning data.

The package maps three folders into one namespace: :mod:`fastfs.daemon` (process and kernel
boundary, the only code importing the FUSE binding), :mod:`fastfs.fsio` (the pure I/O engine)
and :mod:`fastfs.config` (YAML schema and loader).
"""

__version__ = "0.1.0"
