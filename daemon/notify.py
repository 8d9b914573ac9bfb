"""Minimal sd_notify client: one datagram to ``$NOTIFY_SOCKET``.

The protocol is a single ``AF_UNIX`` datagram of ``KEY=VALUE`` lines (``READY=1``, ``STATUS=...``,
``STOPPING=1``); a socket name starting with ``@`` is in the abstract namespace. The maintained
Python clients either wrap libsystemd through a C extension or add a dependency for these ten
lines, so fastfs carries its own.
"""

from __future__ import annotations

import os
import socket


def notify(message: str) -> bool:
    """Send *message* to the service manager; False when not run under one or on failure."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message.encode(), address)
    except OSError:
        return False
    return True
