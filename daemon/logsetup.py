"""Logging setup of the daemon and the command line, and where a background daemon's log goes.

Under systemd (``JOURNAL_STREAM`` or ``INVOCATION_ID`` set) lines go to stderr without timestamps
and carry ``<N>`` syslog priority prefixes, which journald turns into priorities. Otherwise lines
are timestamped. ``file`` sends them to a file instead (appended; the directory must exist).

Log rotation. SIGUSR2 makes the daemon call :func:`reopen`: the log file is opened again by name,
so after logrotate moved it (``postrotate``: ``kill -USR2 PID``) new lines go to a new file. A
background daemon logs through its stdout and stderr (pointed at its log file when it forked, so
that even a crash's last words land there); :func:`log_std_streams_to` names that file and
:func:`reopen` points both descriptors at it again. ``copytruncate`` works without a signal, as
the file is opened with ``O_APPEND``.

Log files. A background daemon without ``log.file`` / ``--log-file`` logs to
:func:`default_log_file`: one file per mount point (its basename plus a hash of its real path, so
two mounts never share a file) in a directory of the user who mounts: ``<state dir>/logs`` when
``state.dir`` or ``$STATE_DIRECTORY`` is set, else ``/var/log/fastfs`` for root and
``$XDG_STATE_HOME/fastfs/logs`` (``~/.local/state/fastfs/logs``) for other users. That directory
is created 0700 and must be owned by the user and writable by nobody else, so no one else can
plant a file or a symlink in it. Every log file, default or not, is opened by
:func:`open_log_file`: without following a symlink (``O_NOFOLLOW``), created with mode 0600, and
only if it is a regular file (a default one must also belong to the user).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import sys
from typing import Any

# Syslog priorities journald reads from a "<N>" line prefix.
SYSLOG_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
ROOT = "fastfs"
# Default log directory of root when no state directory is configured.
ROOT_LOG_DIR = "/var/log/fastfs"
# Hex digits of the mount-point hash in a default log file name (no collisions in practice).
LOG_HASH_CHARS = 12
# Mode of log files the daemon creates, and of the directories it creates for them.
LOG_FILE_MODE = 0o600
LOG_DIR_MODE = 0o700


class LogFileError(Exception):
    """A log file or its directory cannot be used safely (one-line message)."""


def default_log_dir(state_dir: str = "") -> str:
    """The directory of default log files (see the module docstring); *state_dir* is ``state.dir``."""
    base = state_dir or os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if base:
        return os.path.join(base, "logs")
    if os.geteuid() == 0:
        return ROOT_LOG_DIR
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(xdg, "fastfs", "logs")


def default_log_file(mountpoint: str, state_dir: str = "") -> str:
    """Default log file of the mount on *mountpoint*: unique per mount point, in :func:`default_log_dir`."""
    real = os.path.realpath(mountpoint)
    name = os.path.basename(real.rstrip("/")) or "root"
    digest = hashlib.sha256(os.fsencode(real)).hexdigest()[:LOG_HASH_CHARS]
    return os.path.join(default_log_dir(state_dir), f"{name}-{digest}.log")


def _safe_dir(path: str) -> None:
    """Create *path* (mode 0700) if missing; raise LogFileError unless it is a real directory owned by
    this user (or root) that nobody else may write to."""
    try:
        os.makedirs(path, mode=LOG_DIR_MODE, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise LogFileError(f"log directory {path}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise LogFileError(f"log directory {path} is not a directory")
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise LogFileError(f"log directory {path} is not safe: others own it or may write to it (use --log-file)")


def open_log_file(path: str, default: bool = False) -> int:
    """Open *path* for appending: never through a symlink, created 0600, a regular file only (and, for
    a *default* log, one in a safe directory and owned by this user). Returns the descriptor."""
    if default:
        _safe_dir(os.path.dirname(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_NONBLOCK, LOG_FILE_MODE)  # no blocking open of a planted FIFO
    except OSError as e:
        why = "it is a symlink" if e.errno == errno.ELOOP else e.strerror
        raise LogFileError(f"log file {path}: {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LogFileError(f"log file {path} is not a regular file")
        if default and st.st_uid != os.geteuid():
            raise LogFileError(f"log file {path} belongs to another user")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prio = SYSLOG_PRIORITY.get(record.levelno, 6)
        return f"<{prio}>{super().format(record)}"


def under_systemd() -> bool:
    """True when stderr is read by journald."""
    return bool(os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"))


class _ReopenableHandler(logging.StreamHandler):
    """A handler writing to a log file that :func:`reopen` can replace (logrotate moved the file)."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(self._open())

    def _open(self) -> Any:
        return open(open_log_file(self.path), "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - owned here

    def reopen(self) -> None:
        stream = self._open()  # first, so a failure keeps the old file
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            old, self.stream = self.stream, stream
        old.close()


# The file behind this process's stdout and stderr (a background daemon's log), for reopen().
_std_streams_file: list[tuple[str, bool]] = []


def log_std_streams_to(path: str, default: bool = False) -> None:
    """Remember that stdout and stderr were pointed at log file *path* (*default*: a default log
    file, checked as :func:`open_log_file` does), so :func:`reopen` points them at it again."""
    _std_streams_file[:] = [(path, default)]


def reopen() -> list[str]:
    """Reopen the log files (SIGUSR2, after logrotate moved them): the ``fastfs`` logger's file and
    the file behind stdout/stderr; returns their paths. Raises LogFileError when one cannot be opened
    (the old one is then kept)."""
    done = []
    for handler in logging.getLogger(ROOT).handlers:
        if isinstance(handler, _ReopenableHandler):
            handler.reopen()
            done.append(handler.path)
    for path, default in _std_streams_file:
        fd = open_log_file(path, default=default)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        finally:
            os.close(fd)
        done.append(path)
    return done


def setup(level: str = "info", file: str | None = None, journal: bool | None = None) -> logging.Logger:
    """Configure the ``fastfs`` logger; safe to call again (replaces its handlers).

    *journal* forces (True) or suppresses (False) the journald format; None detects systemd.
    """
    logger = logging.getLogger(ROOT)
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    if file:
        handler: logging.Handler = _ReopenableHandler(file)
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
    return logger


def set_level(level: str) -> None:
    """Change the level live (config reload)."""
    logging.getLogger(ROOT).setLevel(LEVELS.get(level, logging.INFO))
