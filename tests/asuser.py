"""Run test code as an unprivileged user, and a directory that user can reach.

:func:`run_as` forks the test process, drops to the given uid, gid and supplementary groups in the
child (``setgroups``, ``setgid``, ``setuid``: no way back), runs a function there and sends its
result (anything JSON can carry) or its exception back through a pipe. No program is executed, so
the child keeps the modules the test process already imported; the interpreter's own files need
not be readable by that user (on this machine they live under a 0700 home). Exceptions come back as
:class:`ChildError` with the errno of an ``OSError``. The child is killed when it does not answer
within the timeout.

:func:`shared_dir` makes a 0755 directory under ``/tmp`` (pytest's temporary root is 0700 and owned
by root, so another user cannot traverse it) and removes it afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

NOBODY = 65534
NOGROUP = 65534
# Seconds a child may run before it is killed and the call fails.
DEFAULT_TIMEOUT = 60.0


class ChildError(Exception):
    """An exception raised in the child; ``errno`` is set for an OSError."""

    def __init__(self, kind: str, message: str, errno_value: int | None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.errno = errno_value


def run_as(
    fn: Callable[[], Any],
    uid: int = NOBODY,
    gid: int = NOGROUP,
    groups: tuple[int, ...] = (),
    timeout: float = DEFAULT_TIMEOUT,
    capture: bool = False,
) -> Any:
    """``fn()`` run in a child process as *uid*/*gid*/*groups*; its result, or :class:`ChildError`.

    With *capture* the child's stdout and stderr are collected and the result is
    ``{"value": ..., "stdout": str, "stderr": str}``.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    out_path = err_path = None
    if capture:
        fd, out_path = tempfile.mkstemp(prefix="asuser-out-")
        os.close(fd)
        fd, err_path = tempfile.mkstemp(prefix="asuser-err-")
        os.close(fd)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            os.close(read_fd)
            if capture:
                for path, target in ((out_path, 1), (err_path, 2)):
                    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
                    os.dup2(fd, target)
                    os.close(fd)
                # pytest's capture replaced sys.stdout/sys.stderr: write to the descriptors instead
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            os.setgroups(list(groups))
            os.setgid(gid)
            os.setuid(uid)
            try:
                reply = {"value": fn()}
            except BaseException as e:  # noqa: BLE001 - sent to the parent
                reply = {
                    "error": type(e).__name__,
                    "message": str(e),
                    "errno": getattr(e, "errno", None),
                    "trace": traceback.format_exc(),
                }
            sys.stdout.flush()
            sys.stderr.flush()
            os.write(write_fd, json.dumps(reply).encode())
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"child as uid {uid} did not finish within {timeout}s")
            ready, _, _ = select.select([read_fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    captured = {}
    if capture:
        captured = {"stdout": Path(out_path).read_text(), "stderr": Path(err_path).read_text()}
        os.unlink(out_path)
        os.unlink(err_path)
    if not data:
        raise AssertionError(f"child as uid {uid} died without an answer {captured}")
    reply = json.loads(data)
    if "error" in reply:
        raise ChildError(reply["error"], reply["message"] + "\n" + reply["trace"], reply["errno"])
    if capture:
        return {"value": reply["value"], **captured}
    return reply["value"]


@contextlib.contextmanager
def shared_dir(prefix: str = "fastfs-shared-") -> Iterator[Path]:
    """A fresh 0755 directory under /tmp that every user can traverse; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
