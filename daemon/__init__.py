"""The process and kernel boundary of fastfs: command line, mount lifecycle, FUSE operations, stats export.

Only :mod:`fastfs.daemon.fusebind` imports the FUSE binding, and only modules that need it import
``fusebind`` (lazily from the command line, so ``fastfs mount`` can fork before libfuse is loaded).
"""
