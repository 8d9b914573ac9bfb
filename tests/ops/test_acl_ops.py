"""GETXATTR / LISTXATTR of POSIX ACLs through the operations adapter, driven by a fake kernel (no mount).

With FUSE_POSIX_ACL the kernel asks for ``system.posix_acl_access`` before it decides a non-owner's
access: the answer must be the source's ACL (as the ownership options show it), ENODATA when there is
none, also on a source that keeps no ACLs at all (any other error fails every such access).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernelclient import FakeKernel, entry_nodeid, init_body, lookup
from posixacl import acl_bytes, set_acl

from fastfs.config.loader import load_config
from fastfs.daemon.kernel import abi
from fastfs.daemon.kernel.abi import Op
from fastfs.daemon.kernel.negotiate import Wishes
from fastfs.daemon.kernel.session import Session
from fastfs.daemon.ops import KernelOps
from fastfs.fsio.access import ACL_ACCESS
from fastfs.fsio.engine import Engine

pytestmark = pytest.mark.usefixtures("request_loop")  # every test on both request loops

SPEC = "u::rw-,u:65534:---,g::r--,m::r--,o::r--"


class Served:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.ops = KernelOps(engine, {"source": "SRC", "mountpoint": "/mnt/test"})
        self.fk = FakeKernel()
        self.session = Session(self.fk.fd, self.ops.handlers(), Wishes(posix_acl=True), threads=2)
        self.ops.session = self.session
        unique = self.fk.send(Op.INIT, init_body())
        self.session.start()
        assert self.fk.reply(unique)[0] == 0

    def node(self, name: str) -> int:
        err, payload = lookup(self.fk, 1, name)
        assert err == 0, errno.errorcode.get(err)
        return entry_nodeid(payload)

    def getxattr(self, nodeid: int, name: str) -> tuple[int, bytes]:
        return self.fk.call(Op.GETXATTR, abi.GETXATTR_IN.pack(4096, 0) + name.encode() + b"\0", nodeid)

    def listxattr(self, nodeid: int) -> list[str]:
        err, payload = self.fk.call(Op.LISTXATTR, abi.GETXATTR_IN.pack(4096, 0), nodeid)
        assert err == 0
        return [n.decode() for n in payload.split(b"\0") if n]

    def close(self) -> None:
        self.fk.close()  # the session's reads end (the socket's peer is gone)
        self.session.wait(5)
        self.session.close()
        self.engine.close()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    for name in ("acl.bin", "plain.bin"):
        (root / name).write_bytes(b"x" * 100)
        os.chmod(root / name, 0o644)
    set_acl(root / "acl.bin", SPEC)
    return root


def serve(tree: Path, **overrides: str) -> Served:
    config = load_config(None, {"cache.budget": "64M", "readahead.learn": "false", **overrides}, use_default_path=False)
    return Served(Engine(str(tree), config))


@pytest.fixture
def served(tree: Path) -> Iterator[Served]:
    s = serve(tree)
    try:
        yield s
    finally:
        s.close()


def test_the_source_acl_is_answered_and_none_is_enodata(served: Served) -> None:
    assert served.getxattr(served.node("acl.bin"), ACL_ACCESS) == (0, acl_bytes(SPEC))
    assert ACL_ACCESS in served.listxattr(served.node("acl.bin"))
    assert served.getxattr(served.node("plain.bin"), ACL_ACCESS)[0] == errno.ENODATA


@pytest.mark.parametrize("err", [errno.EOPNOTSUPP, errno.ENOSYS])
def test_a_source_without_acls_answers_enodata(served: Served, monkeypatch, err: int) -> None:
    node = served.node("acl.bin")

    def unsupported(path: str, name: str) -> bytes:
        raise OSError(err, os.strerror(err), path)

    monkeypatch.setattr(served.engine.source, "getxattr", unsupported)
    assert served.getxattr(node, ACL_ACCESS)[0] == errno.ENODATA  # no ACL: the mode decides
    assert served.getxattr(node, "user.other")[0] == err  # other names: as the source says


def test_another_error_is_passed_on(served: Served, monkeypatch) -> None:
    node = served.node("acl.bin")

    def failing(path: str, name: str) -> bytes:
        raise OSError(errno.EIO, "I/O error", path)

    monkeypatch.setattr(served.engine.source, "getxattr", failing)
    assert served.getxattr(node, ACL_ACCESS)[0] == errno.EIO  # (the kernel then denies: fail closed)


def test_ownership_options_shape_the_acl(tree: Path) -> None:
    s = serve(tree, **{"fuse.umask": "0004"})
    try:
        assert s.getxattr(s.node("acl.bin"), ACL_ACCESS) == (0, acl_bytes("u::rw-,u:65534:---,g::r--,m::r--,o::---"))
    finally:
        s.close()
    s = serve(tree, **{"fuse.file_mode": "0644"})
    try:
        assert s.getxattr(s.node("acl.bin"), ACL_ACCESS)[0] == errno.ENODATA
        assert ACL_ACCESS not in s.listxattr(s.node("acl.bin"))
    finally:
        s.close()
