"""fastfs's own implementation of the kernel's FUSE protocol (no libfuse).

:mod:`.abi` holds the message layouts and constants of ``include/uapi/linux/fuse.h``,
:mod:`.negotiate` the INIT negotiation (pure), :mod:`.fusemount` the kernel mount (mount(2) as root,
``fusermount3`` otherwise), :mod:`.session` the request loop over cloned device descriptors, the
watchdog, notifications and passthrough backing files, :mod:`.requests` the typed request of each
opcode and :mod:`.replies` the reply encoders (both pure). :mod:`fastfs.daemon.ops` is the operations
adapter the session calls.
"""
