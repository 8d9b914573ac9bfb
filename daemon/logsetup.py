"""Logging setup of the daemon and the command line.

Under systemd (``JOURNAL_STREAM`` or ``INVOCATION_ID`` set) lines go to stderr without timestamps
and carry ``<N>`` syslog priority prefixes, which journald turns into priorities. Otherwise lines
are timestamped. ``file`` sends them to a file instead (appended; the directory must exist).
The binding's own logger is held at WARNING: it would otherwise log every failed request.
"""

from __future__ import annotations

import logging
import os
import sys

# Syslog priorities journald reads from a "<N>" line prefix.
SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
ROOT = "fastfs"


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prio = SYSLOG_PRIORITY.get(record.levelno, 6)
        return f"<{prio}>{super().format(record)}"


def under_systemd() -> bool:
    """True when stderr is read by journald."""
    return bool(os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"))


def setup(level: str = "info", file: str | None = None, journal: bool | None = None) -> logging.Logger:
    """Configure the ``fastfs`` logger; safe to call again (replaces its handlers).

    *journal* forces (True) or suppresses (False) the journald format; None detects systemd.
    """
    logger = logging.getLogger(ROOT)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    if file:
        handler: logging.Handler = logging.FileHandler(file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    if journal is None:
        journal = under_systemd() and not file
    if journal:
        handler.setFormatter(_JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s fastfs[{os.getpid()}] %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    set_level(level)
    binding = logging.getLogger("fuse")
    binding.setLevel(logging.WARNING)
    binding.handlers = [handler]
    binding.propagate = False
    return logger


def set_level(level: str) -> None:
    """Change the level live (config reload)."""
    logging.getLogger(ROOT).setLevel(LEVELS.get(level, logging.INFO))
