"""INIT negotiation as a pure function: the kernel's offer and fastfs's wishes in, the reply out.

The kernel opens every connection with an INIT request naming its protocol version and the
capabilities it offers; the reply names the ones the file system takes. fastfs takes only what the
kernel offered (an older kernel gets a mount with fewer features, never a failed one), and only
what its design uses:

* ``ASYNC_READ``: several read requests of one file in flight (the kernel's read-ahead in parallel);
* ``PARALLEL_DIROPS``: lookups and readdirs of one directory are not serialised by the kernel;
* ``MAX_PAGES``: requests up to ``max_pages`` pages (1 MiB at 256) instead of 128 KiB;
* ``CACHE_SYMLINKS``: symlink targets cached in the page cache like file data;
* ``DO_READDIRPLUS`` + ``READDIRPLUS_AUTO``: listings carry attributes when the kernel finds it useful;
* ``EXPLICIT_INVAL_DATA``: cached pages are dropped only when fastfs asks (one inode per source
  version: a version's pages never go stale, so attribute changes must not drop them);
* ``NO_EXPORT_SUPPORT``: node ids are not stable across mounts, so no NFS export;
* ``DIRECT_IO_ALLOW_MMAP``: the stats file (direct I/O) can still be mapped;
* ``INIT_EXT`` (to send the second flags word) and ``PASSTHROUGH`` with ``max_stack_depth`` 1 when
  the daemon may hand open files to the kernel as backing files;
* ``POSIX_ACL`` on ``allow_other`` mounts: the kernel applies POSIX ACLs in its permission checks,
  asking for ``system.posix_acl_access`` / ``system.posix_acl_default`` with GETXATTR (the daemon
  answers with the source's), so another user never gets through the mount what an ACL on the
  source denies it (without it the kernel checks the mode bits alone); one GETXATTR per inode a
  user other than its owner reaches (the kernel keeps the answer with the inode). It also turns on
  ``default_permissions``, which ``allow_other`` mounts have anyway; other mounts leave it off (only
  the mounting user can use them, with the daemon's own rights on the source).

``NO_OPEN_SUPPORT`` and ``NO_OPENDIR_SUPPORT`` need no bit in the reply: offered, they mean the
kernel accepts ENOSYS to OPEN/OPENDIR as "never send these again".
"""

from __future__ import annotations

from dataclasses import dataclass

from fastfs.daemon.kernel import abi
from fastfs.daemon.kernel.abi import Init

# Read-ahead and other background requests the kernel keeps in flight (64 x 1 MiB overlaps a
# latency-bound source; the kernel's default of 12 would cap parallel read-ahead).
MAX_BACKGROUND = 64
# Background requests beyond which the kernel reports the connection congested (3/4 of the above).
CONGESTION_THRESHOLD = 48
# Largest WRITE payload: the mount is read-only, so only the request buffer size depends on it.
MAX_WRITE = 128 * 1024
# Timestamps in replies have nanosecond resolution.
TIME_GRAN = 1

# What fastfs takes whenever the kernel offers it.
BASE_FLAGS = (
    Init.ASYNC_READ
    | Init.PARALLEL_DIROPS
    | Init.MAX_PAGES
    | Init.CACHE_SYMLINKS
    | Init.EXPLICIT_INVAL_DATA
    | Init.NO_EXPORT_SUPPORT
    | Init.DIRECT_IO_ALLOW_MMAP
    | Init.INIT_EXT
)
READDIRPLUS_FLAGS = Init.DO_READDIRPLUS | Init.READDIRPLUS_AUTO


class NegotiationError(Exception):
    """The kernel speaks a protocol fastfs cannot serve (one-line reason)."""


@dataclass(frozen=True)
class Offer:
    """The kernel's INIT request."""

    major: int
    minor: int
    max_readahead: int
    flags: int  # both words: flags | flags2 << 32

    @classmethod
    def parse(cls, body: bytes | memoryview) -> Offer:
        if len(body) >= abi.INIT_IN.size:
            major, minor, max_readahead, flags, flags2 = abi.INIT_IN.unpack_from(body)
        elif len(body) >= abi.INIT_IN_COMPAT.size:
            major, minor, max_readahead, flags = abi.INIT_IN_COMPAT.unpack_from(body)
            flags2 = 0
        else:
            raise NegotiationError(f"INIT request too short ({len(body)} bytes)")
        if not flags & Init.INIT_EXT:
            flags2 = 0
        return cls(major, minor, max_readahead, flags | flags2 << 32)


@dataclass(frozen=True)
class Wishes:
    """What the daemon's configuration asks of the connection."""

    max_pages: int = 256
    passthrough: bool = False
    readdirplus: bool = True
    parallel_dirops: bool = True
    posix_acl: bool = False


@dataclass(frozen=True)
class Negotiated:
    """The connection as agreed: the reply's fields and the flags both sides use."""

    major: int
    minor: int
    flags: int
    offered: int
    """Everything the kernel offered (``NO_OPEN_SUPPORT``/``NO_OPENDIR_SUPPORT`` are used without a reply bit)."""
    max_readahead: int
    max_pages: int
    max_write: int
    max_background: int
    congestion_threshold: int
    max_stack_depth: int

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)

    def offers(self, flag: int) -> bool:
        return bool(self.offered & flag)

    @property
    def passthrough(self) -> bool:
        return self.has(Init.PASSTHROUGH)

    @property
    def max_read(self) -> int:
        """Largest READ the kernel will send (pages of 4 KiB)."""
        return self.max_pages * 4096 if self.has(Init.MAX_PAGES) else 32 * 4096

    def reply(self) -> bytes:
        """The fuse_init_out payload."""
        flags, flags2 = abi.split_flags(self.flags)
        return abi.INIT_OUT.pack(
            self.major,
            self.minor,
            self.max_readahead,
            flags,
            self.max_background,
            self.congestion_threshold,
            self.max_write,
            TIME_GRAN,
            self.max_pages if self.has(Init.MAX_PAGES) else 0,
            0,  # map_alignment (DAX only)
            flags2,
            self.max_stack_depth,
            0,  # request_timeout: the kernel never aborts a slow request on its own
        )


def negotiate(offer: Offer, wishes: Wishes) -> Negotiated:
    """The reply to *offer*; raises :class:`NegotiationError` for a protocol fastfs cannot serve.

    A kernel with a newer major version is answered with fastfs's major (the kernel then falls
    back); an older major, or a minor below :data:`abi.MIN_MINOR_VERSION`, is refused.
    """
    if offer.major < abi.KERNEL_VERSION:
        raise NegotiationError(f"kernel FUSE protocol {offer.major}.{offer.minor} is too old (needs 7.x)")
    if offer.major == abi.KERNEL_VERSION and offer.minor < abi.MIN_MINOR_VERSION:
        raise NegotiationError(
            f"kernel FUSE protocol 7.{offer.minor} is too old (needs 7.{abi.MIN_MINOR_VERSION}, Linux 5.10)"
        )
    minor = min(offer.minor, abi.KERNEL_MINOR_VERSION) if offer.major == abi.KERNEL_VERSION else 0
    want = BASE_FLAGS
    if wishes.readdirplus:
        want |= READDIRPLUS_FLAGS
    if not wishes.parallel_dirops:
        want &= ~Init.PARALLEL_DIROPS
    if wishes.passthrough:
        want |= Init.PASSTHROUGH
    if wishes.posix_acl:
        want |= Init.POSIX_ACL
    flags = int(want) & offer.flags
    if not flags & Init.INIT_EXT:
        flags &= 0xFFFFFFFF  # without INIT_EXT there is no second word to send
    max_pages = max(1, min(wishes.max_pages, 0xFFFF))
    return Negotiated(
        major=abi.KERNEL_VERSION,
        minor=minor,
        flags=flags,
        offered=offer.flags,
        max_readahead=offer.max_readahead,
        max_pages=max_pages,
        max_write=MAX_WRITE,
        max_background=MAX_BACKGROUND,
        congestion_threshold=CONGESTION_THRESHOLD,
        max_stack_depth=1 if flags & Init.PASSTHROUGH else 0,
    )
