"""The kernel's FUSE protocol (``include/uapi/linux/fuse.h``, protocol 7.45) as Python values.

Every message layout fastfs sends or receives is one named :class:`struct.Struct` (little-endian,
native sizes of the 64-bit ABI, which is the only one the kernel speaks to a 64-bit server), every
opcode and flag a named constant. Nothing here does I/O: the session (:mod:`.session`) reads
requests into buffers and parses them with these structs, and builds replies with ``pack``.

Layouts are given field by field in the comment beside each struct; offsets follow the C header
(all structs are padded to 8 bytes there, which the formats below reproduce explicitly).
"""

from __future__ import annotations

import enum
import struct

KERNEL_VERSION = 7
# The protocol minor fastfs is written against (kernel 6.18); older kernels answer with theirs.
KERNEL_MINOR_VERSION = 45
# Oldest minor fastfs runs on: 7.31 (Linux 5.10) has MAX_PAGES, CACHE_SYMLINKS, NO_OPENDIR_SUPPORT.
MIN_MINOR_VERSION = 31
ROOT_ID = 1
# The kernel requires a read buffer of at least this size.
MIN_READ_BUFFER = 8192


class Op(enum.IntEnum):
    """Request opcodes (``enum fuse_opcode``)."""

    LOOKUP = 1
    FORGET = 2  # no reply
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    GETLK = 31
    SETLK = 32
    SETLKW = 33
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    BMAP = 37
    DESTROY = 38
    IOCTL = 39
    POLL = 40
    NOTIFY_REPLY = 41
    BATCH_FORGET = 42  # no reply
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47
    SETUPMAPPING = 48
    REMOVEMAPPING = 49
    SYNCFS = 50
    TMPFILE = 51
    STATX = 52
    COPY_FILE_RANGE_64 = 53


# Operations that would change the tree or a file: a read-only mirror answers EROFS.
WRITE_OPS = frozenset(
    {Op.SETATTR, Op.SYMLINK, Op.MKNOD, Op.MKDIR, Op.UNLINK, Op.RMDIR, Op.RENAME, Op.LINK, Op.WRITE}
    | {Op.SETXATTR, Op.REMOVEXATTR, Op.CREATE, Op.FALLOCATE, Op.RENAME2, Op.COPY_FILE_RANGE, Op.TMPFILE}
    | {Op.COPY_FILE_RANGE_64}
)
# Requests the kernel expects no reply to.
NO_REPLY_OPS = frozenset({Op.FORGET, Op.BATCH_FORGET})


class Notify(enum.IntEnum):
    """Notification codes (sent with unique 0, the code in the header's error field)."""

    POLL = 1
    INVAL_INODE = 2
    INVAL_ENTRY = 3
    STORE = 4
    RETRIEVE = 5
    DELETE = 6


class Init(enum.IntFlag):
    """INIT capability flags; bits 32..63 travel in the messages' ``flags2`` word."""

    ASYNC_READ = 1 << 0
    POSIX_LOCKS = 1 << 1
    FILE_OPS = 1 << 2
    ATOMIC_O_TRUNC = 1 << 3
    EXPORT_SUPPORT = 1 << 4
    BIG_WRITES = 1 << 5
    DONT_MASK = 1 << 6
    SPLICE_WRITE = 1 << 7
    SPLICE_MOVE = 1 << 8
    SPLICE_READ = 1 << 9
    FLOCK_LOCKS = 1 << 10
    HAS_IOCTL_DIR = 1 << 11
    AUTO_INVAL_DATA = 1 << 12
    DO_READDIRPLUS = 1 << 13
    READDIRPLUS_AUTO = 1 << 14
    ASYNC_DIO = 1 << 15
    WRITEBACK_CACHE = 1 << 16
    NO_OPEN_SUPPORT = 1 << 17
    PARALLEL_DIROPS = 1 << 18
    HANDLE_KILLPRIV = 1 << 19
    POSIX_ACL = 1 << 20
    ABORT_ERROR = 1 << 21
    MAX_PAGES = 1 << 22
    CACHE_SYMLINKS = 1 << 23
    NO_OPENDIR_SUPPORT = 1 << 24
    EXPLICIT_INVAL_DATA = 1 << 25
    MAP_ALIGNMENT = 1 << 26
    SUBMOUNTS = 1 << 27
    HANDLE_KILLPRIV_V2 = 1 << 28
    SETXATTR_EXT = 1 << 29
    INIT_EXT = 1 << 30
    INIT_RESERVED = 1 << 31
    SECURITY_CTX = 1 << 32
    HAS_INODE_DAX = 1 << 33
    CREATE_SUPP_GROUP = 1 << 34
    HAS_EXPIRE_ONLY = 1 << 35
    DIRECT_IO_ALLOW_MMAP = 1 << 36
    PASSTHROUGH = 1 << 37
    NO_EXPORT_SUPPORT = 1 << 38
    HAS_RESEND = 1 << 39
    ALLOW_IDMAP = 1 << 40
    OVER_IO_URING = 1 << 41
    REQUEST_TIMEOUT = 1 << 42


# -- OPEN reply flags ----------------------------------------------------------------------------
FOPEN_DIRECT_IO = 1 << 0
FOPEN_KEEP_CACHE = 1 << 1
FOPEN_NONSEEKABLE = 1 << 2
FOPEN_CACHE_DIR = 1 << 3
FOPEN_STREAM = 1 << 4
FOPEN_NOFLUSH = 1 << 5
FOPEN_PARALLEL_DIRECT_WRITES = 1 << 6
FOPEN_PASSTHROUGH = 1 << 7

GETATTR_FH = 1 << 0  # fuse_getattr_in.getattr_flags: the request names an open file (fstat)
RELEASE_FLUSH = 1 << 0

# -- /dev/fuse ioctls ----------------------------------------------------------------------------
_IOC_WRITE, _IOC_READ = 1, 2
IOC_MAGIC = 229


def _ioc(direction: int, number: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (IOC_MAGIC << 8) | number


DEV_IOC_CLONE = _ioc(_IOC_READ, 0, 4)  # arg: uint32 session fd
DEV_IOC_BACKING_OPEN = _ioc(_IOC_WRITE, 1, 16)  # arg: struct fuse_backing_map; returns the backing id
DEV_IOC_BACKING_CLOSE = _ioc(_IOC_WRITE, 2, 4)  # arg: uint32 backing id

# -- message layouts -----------------------------------------------------------------------------
# fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
IN_HEADER = struct.Struct("<IIQQIIIHH")
# fuse_out_header: len, error (negative errno or notify code), unique
OUT_HEADER = struct.Struct("<IiQ")
# fuse_init_in: major, minor, max_readahead, flags, flags2, unused[11]
INIT_IN = struct.Struct("<IIIII44x")
# the part of fuse_init_in the kernels before 7.36 send (no flags2)
INIT_IN_COMPAT = struct.Struct("<IIII")
# fuse_init_out: major, minor, max_readahead, flags, max_background, congestion_threshold, max_write,
# time_gran, max_pages, map_alignment, flags2, max_stack_depth, request_timeout, unused[11]
INIT_OUT = struct.Struct("<IIIIHHIIHHIIH22x")
# fuse_attr: ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec, mode, nlink,
# uid, gid, rdev, blksize, flags
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
# fuse_entry_out: nodeid, generation, entry_valid, attr_valid, entry_valid_nsec, attr_valid_nsec, attr
ENTRY_OUT = struct.Struct("<QQQQII" + ATTR.format[1:])
# fuse_attr_out: attr_valid, attr_valid_nsec, dummy, attr
ATTR_OUT = struct.Struct("<QII" + ATTR.format[1:])
# fuse_getattr_in: getattr_flags, dummy, fh
GETATTR_IN = struct.Struct("<IIQ")
# fuse_forget_in: nlookup
FORGET_IN = struct.Struct("<Q")
# fuse_batch_forget_in: count, dummy; followed by count fuse_forget_one (nodeid, nlookup)
BATCH_FORGET_IN = struct.Struct("<II")
FORGET_ONE = struct.Struct("<QQ")
# fuse_open_in: flags, open_flags
OPEN_IN = struct.Struct("<II")
# fuse_open_out: fh, open_flags, backing_id
OPEN_OUT = struct.Struct("<QIi")
# fuse_read_in: fh, offset, size, read_flags, lock_owner, flags, padding
READ_IN = struct.Struct("<QQIIQII")
# fuse_release_in: fh, flags, release_flags, lock_owner
RELEASE_IN = struct.Struct("<QIIQ")
# fuse_flush_in: fh, unused, padding, lock_owner
FLUSH_IN = struct.Struct("<QIIQ")
# fuse_getxattr_in (also listxattr): size, padding
GETXATTR_IN = struct.Struct("<II")
# fuse_getxattr_out: size, padding
GETXATTR_OUT = struct.Struct("<II")
# fuse_access_in: mask, padding
ACCESS_IN = struct.Struct("<II")
# fuse_interrupt_in: unique
INTERRUPT_IN = struct.Struct("<Q")
# fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare[6]
STATFS_OUT = struct.Struct("<QQQQQIIII24x")
# fuse_dirent: ino, off, namelen, type; then the name, padded to 8 bytes
DIRENT = struct.Struct("<QQII")
# fuse_notify_inval_inode_out: ino, off, len
NOTIFY_INVAL_INODE_OUT = struct.Struct("<Qqq")
# fuse_notify_inval_entry_out: parent, namelen, flags; then the name and a NUL
NOTIFY_INVAL_ENTRY_OUT = struct.Struct("<QII")
# fuse_notify_store_out: nodeid, offset, size, padding; then the data
NOTIFY_STORE_OUT = struct.Struct("<QQII")
# fuse_backing_map: fd, flags, padding
BACKING_MAP = struct.Struct("<iIQ")

assert IN_HEADER.size == 40 and OUT_HEADER.size == 16 and ATTR.size == 88
assert ENTRY_OUT.size == 128 and ATTR_OUT.size == 104 and INIT_OUT.size == 64 and INIT_IN.size == 64
assert READ_IN.size == 40 and RELEASE_IN.size == 24 and STATFS_OUT.size == 80 and OPEN_OUT.size == 16


def rec_align(n: int) -> int:
    """FUSE_REC_ALIGN: variable-length records (dirents) are padded to 8 bytes."""
    return (n + 7) & ~7


def split_flags(flags: int) -> tuple[int, int]:
    """64 INIT flags -> (flags, flags2) as the two 32-bit words of the messages."""
    return flags & 0xFFFFFFFF, flags >> 32


def flag_names(flags: int) -> list[str]:
    """Names of the set INIT flags, lowest bit first (for logs and stats)."""
    return [f.name for f in Init if flags & f and f.name]
