"""Creating and removing the kernel mount of a FUSE connection.

As root the daemon opens ``/dev/fuse`` and calls mount(2) itself with the device descriptor in the
mount data (``fd=N,rootmode=40000,user_id=U,group_id=G``), which is what libfuse does for root too.
Any other user cannot call mount(2); the setuid helper ``fusermount3`` (package fuse3) mounts for
them: it is started with one end of a socket pair in ``$_FUSE_COMMFD``, opens ``/dev/fuse``,
mounts, and sends the descriptor back over the socket (``SCM_RIGHTS``) before it exits.

Unmounting goes through ``fusermount3 -u`` for everyone (it checks that the caller owns the mount),
with ``umount -l`` as the last resort for a dead mount; callers live in :mod:`fastfs.daemon.mount`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import subprocess
from dataclasses import dataclass

from fastfs.config.loader import one_line

DEVICE = "/dev/fuse"
FUSERMOUNT = "fusermount3"
# Seconds fusermount3 may take to mount and hand over the descriptor.
FUSERMOUNT_TIMEOUT = 30.0
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOATIME = 1024

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.mount.restype = ctypes.c_int


class FuseMountError(Exception):
    """The kernel mount could not be made (one-line reason)."""


@dataclass(frozen=True)
class MountOptions:
    """What the kernel mount is told."""

    fsname: str
    """Source field of the mount table (``fastfs:/path``)."""
    subtype: str = "fastfs"
    """The mount's type is ``fuse.<subtype>``."""
    allow_other: bool = False
    """Let users other than the mounting one in."""
    default_permissions: bool = False
    """The kernel checks mode bits against the caller (always with allow_other)."""
    noatime: bool = False
    """Mount flag noatime (shown in the mount table)."""

    @property
    def fstype(self) -> str:
        return f"fuse.{self.subtype}"


def _escape(value: str) -> str:
    """fusermount3 splits options at commas; a backslash escapes a comma or a backslash."""
    return value.replace("\\", "\\\\").replace(",", "\\,")


def open_device() -> int:
    """A new descriptor of ``/dev/fuse`` (close-on-exec)."""
    try:
        return os.open(DEVICE, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise FuseMountError(f"cannot open {DEVICE}: {e.strerror}") from None


def mount(mountpoint: str, options: MountOptions) -> int:
    """Mount a new connection on *mountpoint*; returns its device descriptor.

    mount(2) directly when the process may (root), else through fusermount3.
    """
    if os.geteuid() == 0:
        fd = open_device()
        try:
            _mount_direct(fd, mountpoint, options)
            return fd
        except PermissionError:  # e.g. root of a user namespace without CAP_SYS_ADMIN over it
            os.close(fd)
        except BaseException:
            os.close(fd)
            raise
    return _mount_fusermount(mountpoint, options)


def _mount_direct(fd: int, mountpoint: str, options: MountOptions) -> None:
    data = f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()}"
    if options.allow_other:
        data += ",allow_other"
    if options.default_permissions or options.allow_other:
        data += ",default_permissions"
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV | (MS_NOATIME if options.noatime else 0)
    rc = _libc.mount(
        os.fsencode(options.fsname), os.fsencode(mountpoint), options.fstype.encode(), flags, data.encode()
    )
    if rc != 0:
        err = ctypes.get_errno()
        if err == 1:  # EPERM: let the caller fall back to fusermount3
            raise PermissionError(err, os.strerror(err))
        raise FuseMountError(f"mount(2) of {mountpoint} failed: {os.strerror(err)}")


def _mount_fusermount(mountpoint: str, options: MountOptions) -> int:
    opts = ["ro", "nosuid", "nodev", f"fsname={_escape(options.fsname)}", f"subtype={_escape(options.subtype)}"]
    if options.allow_other:
        opts.append("allow_other")
    if options.default_permissions or options.allow_other:
        opts.append("default_permissions")
    if options.noatime:
        opts.append("noatime")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        env = {**os.environ, "_FUSE_COMMFD": str(theirs.fileno())}
        try:
            proc = subprocess.Popen(
                [FUSERMOUNT, "-o", ",".join(opts), "--", mountpoint],
                env=env,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except OSError as e:
            raise FuseMountError(f"cannot run {FUSERMOUNT} (install fuse3): {e.strerror}") from None
        theirs.close()
        ours.settimeout(FUSERMOUNT_TIMEOUT)
        fds: list[int] = []
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(ours, 1, 1)
        except (OSError, TimeoutError):
            fds = []
        try:
            _out, err = proc.communicate(timeout=FUSERMOUNT_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
        if not fds:
            why = one_line(err.decode(errors="replace")) or f"exit status {proc.returncode}"
            raise FuseMountError(f"{FUSERMOUNT} could not mount {mountpoint}: {why}")
        for extra in fds[1:]:
            os.close(extra)
        os.set_inheritable(fds[0], False)
        return fds[0]
    finally:
        ours.close()
        if theirs.fileno() >= 0:
            theirs.close()
