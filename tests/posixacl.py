"""POSIX ACLs for tests, set with ``os.setxattr`` in the kernel's binary format (no ``acl`` package).

:func:`acl_bytes` encodes a ``setfacl``-style text (``"u::rw-,u:65534:---,g::r--,m::r--,o::r--"``)
as the value of ``system.posix_acl_access`` (``linux/posix_acl_xattr.h``: a little-endian u32
version 2, then one ``u16 tag, u16 perm, u32 id`` per entry, sorted by tag then id); :func:`set_acl`
writes it on a file (the kernel then sets the mode's group bits to the mask). Written independently
of ``fastfs.fsio.access`` so that tests of its parser do not check it against itself.
"""

from __future__ import annotations

import os
import struct

ACCESS = "system.posix_acl_access"
DEFAULT = "system.posix_acl_default"
VERSION = 2
UNDEFINED_ID = 0xFFFFFFFF
# tag letters of setfacl's text form, with and without a qualifier, as the kernel's ACL_* tags
_TAGS = {("u", False): 0x01, ("u", True): 0x02, ("g", False): 0x04, ("g", True): 0x08, ("m", False): 0x10}
_OTHER = 0x20


def _perm(text: str) -> int:
    assert len(text) == 3 and all(c in "rwx-" for c in text), text
    return (4 if text[0] == "r" else 0) | (2 if text[1] == "w" else 0) | (1 if text[2] == "x" else 0)


def acl_bytes(spec: str) -> bytes:
    entries = []
    for part in spec.split(","):
        kind, qualifier, perm = part.split(":")
        tag = _OTHER if kind == "o" else _TAGS[kind, bool(qualifier)]
        entries.append((tag, int(qualifier) if qualifier else UNDEFINED_ID, _perm(perm)))
    entries.sort(key=lambda e: (e[0], e[1]))
    return struct.pack("<I", VERSION) + b"".join(struct.pack("<HHI", tag, perm, eid) for tag, eid, perm in entries)


def set_acl(path: str | os.PathLike, spec: str, name: str = ACCESS) -> None:
    os.setxattr(path, name, acl_bytes(spec), follow_symlinks=False)
