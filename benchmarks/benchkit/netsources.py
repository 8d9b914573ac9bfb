"""Real network clients as benchmark sources: rclone, sshfs and s3fs, each over its own loopback server.

Issue 21: fastfs over a stream-oriented client (a handle is one ranged download) behaves unlike
fastfs over the emulator, so the matrix runs over the real thing too. Each source here is a
context manager that starts a server on a free loopback port with a private configuration in a
temporary directory, mounts the client on it, and always tears both down (client unmounted, server
stopped, the directory removed), never touching the system's own configuration:

* ``rclone``: ``rclone serve webdav`` of the data directory, ``rclone mount`` of it with
  ``--vfs-cache-mode off`` (rclone's defaults: each handle one chunked ranged GET stream, 128 MiB
  chunks growing); config file, logs in the temporary directory;
* ``sshfs``: a private ``sshd`` (its own host key, authorized key and config, ``-f`` on a free port,
  in a private mount namespace whose ``/run`` is a tmpfs, so the privilege separation directory it
  insists on never touches the system's ``/run``), ``sshfs`` with a private ``ssh -F`` config;
  the sftp-server logs each request (``-l DEBUG1``);
* ``s3fs``: moto's S3 server (``python -m moto.server``) holding a bucket the harness uploads the
  data set's files into, ``s3fs`` with a private password file and path-style requests;
* ``gluster``: a GlusterFS brick process (``glusterfsd``) over a private brick directory, started
  from a volume file of its own (no ``glusterd``, no system volume), and GlusterFS's FUSE client
  (``glusterfs``) with the client graph ``glusterd`` generates for a one-brick volume (GlusterFS
  10's defaults: md-cache, quick-read, open-behind, write-behind, io-threads). The harness copies
  the data set's files into the volume through a client mount first (a brick's files carry
  GlusterFS's own ids). The brick counts the requests it answers by kind (its ``io-stats``
  translator, dumped every second); its bytes are counted on the wire by a delay line always in
  front of it, as moto's are (quick-read returns small files with their lookups).

What the *source* sees is counted where the server can tell (:meth:`NetSource.counters`,
cumulative; the harness diffs them around each run): requests by kind from the server's own log
(rclone serve's ``METHOD from`` lines, the sftp-server's per-request lines, moto's access log) and
the bytes the serving process read and wrote (``/proc/PID/io`` rchar / wchar / read_bytes).
``source_bytes`` is the server's data volume: rchar for rclone serve and sftp-server (they read
the files and write them to a socket or pipe), and for moto the bytes it sent on the wire
(``wire_down``: it answers with ``send()``, which /proc io does not count, and reads objects from
its memory), counted by a :mod:`.delayline` always in front of it (delay 0 unless asked). With a
delay (``delay=MS``) every client reaches its server through a delay line, whose counters are added.

Spec strings (``--storage``): ``rclone``, ``sshfs``, ``s3fs``, ``gluster``, each optionally ``:delay=MS``
(one-way delay in ms, so a round trip costs 2 x MS more), ``keep=1`` (do not remount the client
before each cold run) and, for rclone, ``dircache=S`` (``--dir-cache-time`` of its mount and of
``rclone serve``, whose own VFS lists directories too; default 5 min, in which files made on the
server meanwhile stay unseen: soaks of a changing source set 1).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .delayline import DelayLine, delay_line
from .system import force_unmount, is_mounted

# Seconds to wait for a server's port to accept connections.
SERVER_TIMEOUT = 30.0
# Seconds to wait for a client mount to appear (s3fs checks the bucket first, sshfs logs in).
MOUNT_TIMEOUT = 60.0
# Seconds a stopped client or server gets to exit before SIGKILL.
EXIT_TIMEOUT = 15.0
# Poll interval (s) while waiting for ports and mounts.
POLL_INTERVAL = 0.05
# Pause (s) before reading the servers' logs and counters after a run: their last request lines
# are written right after the last response (outside any timing).
LOG_SETTLE = 0.1
# Parallel uploads into the S3 server (moto serves each PUT on its own thread).
UPLOAD_THREADS = 8
# Objects above this go up as multipart uploads of this part size (boto3's transfer manager).
UPLOAD_PART = 64 << 20
# The fake credentials and bucket of the private S3 server (never real ones).
S3_ACCESS_KEY = "fastfsbench"
S3_SECRET_KEY = "fastfsbench-secret"
S3_BUCKET = "bench"
S3_REGION = "us-east-1"
# Where sshd's helper lives on Debian.
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
SSHD = "/usr/sbin/sshd"
# What each source is, for table titles.
ABOUT = {
    "rclone": "rclone mount (--vfs-cache-mode off) of rclone serve webdav",
    "sshfs": "sshfs (its defaults) to a private loopback sshd",
    "s3fs": "s3fs (its defaults) over a private moto S3 server",
    "gluster": "GlusterFS's FUSE client (its defaults) of a private one-brick volume",
}
# The Debian packages each client needs (for the error message of a missing tool).
PACKAGES = {
    "rclone": "rclone",
    "sshfs": "sshfs openssh-server",
    "s3fs": "s3fs (and pip: moto[server], boto3)",
    "gluster": "glusterfs-server glusterfs-client",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, log_path: str, what: str, timeout: float = SERVER_TIMEOUT) -> None:
    """Wait until 127.0.0.1:*port* accepts a connection; raise with the log's tail if *proc* died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {_tail(log_path)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(POLL_INTERVAL)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout} s: {_tail(log_path)}")


def _tail(path: str, n: int = 600) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:].strip().replace("\n", " | ")
    except OSError:
        return "(no log)"


def require_tools(kind: str, tools: Iterable[str]) -> None:
    missing = [t for t in tools if shutil.which(t) is None and not os.path.exists(t)]
    if missing:
        raise RuntimeError(f"{kind} needs {', '.join(missing)}: install {PACKAGES.get(kind, kind)} (make bench-deps)")


# -- process facts -------------------------------------------------------------------------------
IO_FIELDS = ("rchar", "wchar", "read_bytes")


def proc_io(pid: int) -> dict[str, int] | None:
    """rchar / wchar / read_bytes of *pid* (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            pairs = (line.split(":", 1) for line in f)
            values = {k.strip(): int(v) for k, v in pairs}
    except (OSError, ValueError):
        return None
    return {k: values.get(k, 0) for k in IO_FIELDS}


def descendants(pid: int) -> list[int]:
    """*pid* and every process below it (psutil)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=True))]
    except psutil.Error:
        return []


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class IoTotals:
    """Cumulative /proc io of a set of server processes that may come and go (sftp-server per login).

    Every poll records each live process's counters; a process's last seen counters stay in the
    total after it exits. Processes are found by :meth:`pids` (a subclass picks which ones count).
    """

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self._pids = pids
        self._last: dict[int, dict[str, int]] = {}

    def poll(self) -> dict[str, int]:
        for pid in self._pids():
            io = proc_io(pid)
            if io is not None:
                self._last[pid] = io
        return {k: sum(v[k] for v in self._last.values()) for k in IO_FIELDS}


class LogCounts:
    """Counts of request kinds in a growing server log: each new line is matched once, in order."""

    def __init__(self, path: str, classify: Callable[[str], str | None]) -> None:
        self.path = path
        self.classify = classify
        self._offset = 0
        self._partial = b""
        self.counts: dict[str, int] = {}

    def poll(self) -> dict[str, int]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return dict(self.counts)
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next poll
        for raw in lines:
            kind = self.classify(raw.decode(errors="replace"))
            if kind:
                self.counts[kind] = self.counts.get(kind, 0) + 1
        return dict(self.counts)


# -- classifiers of server log lines -------------------------------------------------------------
RCLONE_LINE = re.compile(r"INFO\s+: .*?: ([A-Z]+) from \S+$")
SFTP_REQUEST = re.compile(r"request \d+: (read|readdir|fstat|stat|lstat|realpath|close|open|opendir) ")
SFTP_SENT = re.compile(r"request \d+: sent (status|data|attrib|handle|names)")
SFTP_INFO = re.compile(r'^(open|opendir|lstat name|stat name|close|closedir) "')
MOTO_LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/[\d.]+" (\d{3})')


def rclone_kind(line: str) -> str | None:
    """``get`` / ``propfind`` / ``head`` ... of an rclone serve INFO line."""
    m = RCLONE_LINE.search(line)
    return m.group(1).lower() if m else None


def sftp_kind(line: str) -> str | None:
    """An sftp-server log line: every reply is one request (``requests``); reads, opens, stats, listings."""
    if SFTP_SENT.search(line):
        return "requests"
    m = SFTP_REQUEST.search(line)
    if m and m.group(1) == "read":
        return "read"
    if m and m.group(1) == "readdir":
        return "readdir"
    if m and m.group(1) == "fstat":
        return "stat"
    m = SFTP_INFO.search(line.strip())
    if m:
        word = m.group(1)
        return {"lstat name": "stat", "stat name": "stat"}.get(word, word)
    return None


def moto_kind(line: str) -> str | None:
    """``get`` (an object), ``list`` (a bucket listing), ``head``, ``put`` ... of a moto access log line."""
    m = MOTO_LINE.search(line)
    if not m:
        return None
    method, path = m.group(1), m.group(2)
    if method == "GET":
        bucket_level = path.split("?", 1)[0].strip("/").count("/") == 0
        return "list" if bucket_level or "list-type" in path else "get"
    return method.lower()


# -- the sources ---------------------------------------------------------------------------------
@dataclass
class NetOptions:
    """Per-source options of a spec string (``rclone:delay=5,keep=1``)."""

    delay_ms: float = 0.0
    """One-way delay between client and server (ms; 0: none, no proxy)."""
    keep_client: bool = False
    """Keep the client mounted across cold runs (default: remounted, so its own caches start cold)."""
    dir_cache_s: float | None = None
    """rclone's ``--dir-cache-time`` in seconds, of its mount and its server (None: its default)."""
    subtype: str = ""
    """The client's FUSE subtype (its mount type becomes fuse.SUBTYPE; libfuse clients, sshfs and s3fs,
    only): fastfs then knows nothing of the client and must find its shape by probing."""

    @classmethod
    def parse(cls, text: str) -> NetOptions:
        out = cls()
        for item in (p.strip() for p in text.split(",") if p.strip()):
            key, sep, value = item.partition("=")
            try:
                if key == "delay" and sep:
                    out.delay_ms = float(value)
                    if out.delay_ms < 0:
                        raise ValueError
                elif key == "keep" and sep:
                    out.keep_client = value not in ("0", "no", "false")
                elif key == "dircache" and sep:
                    out.dir_cache_s = float(value)
                    if out.dir_cache_s < 0:
                        raise ValueError
                elif key == "subtype" and sep:
                    if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
                        raise ValueError
                    out.subtype = value
                else:
                    raise KeyError
            except KeyError:
                raise ValueError(
                    f"bad network source option {item!r}: use delay=MS, keep=0|1, dircache=S or subtype=NAME"
                ) from None
            except ValueError:
                raise ValueError(f"bad value in network source option {item!r}") from None
        return out

    def describe(self) -> str:
        where = f", {self.delay_ms:g} ms one-way delay" if self.delay_ms else ", loopback (no added delay)"
        cache = f", directory cache {self.dir_cache_s:g} s" if self.dir_cache_s is not None else ""
        return where + cache + (f", mounted as fuse.{self.subtype}" if self.subtype else "")

    def client_options(self) -> list[str]:
        """Extra ``-o`` options of a libfuse client's mount command."""
        return ["-o", f"subtype={self.subtype}"] if self.subtype else []


@dataclass
class NetSource:
    """A running network source: server(s) up, client mounted at ``mnt`` (see the module docstring)."""

    kind: str
    data_dir: str
    mnt: str
    work: str
    options: NetOptions
    data_counter: str
    """What counts the server's data volume: a /proc io field (``rchar``) or ``wire_down`` (the delay line)."""
    mount_client: Callable[[], subprocess.Popen]
    logs: list[LogCounts | GlusterStats] = field(default_factory=list)
    io: IoTotals | None = None
    delay: DelayLine | None = None
    client: subprocess.Popen | None = None
    about: str = ""

    def describe(self) -> str:
        return self.about + self.options.describe()

    # client lifecycle
    def start_client(self) -> None:
        self.client = self.mount_client()
        deadline = time.monotonic() + MOUNT_TIMEOUT
        log_path = os.path.join(self.work, f"{self.kind}-client.log")
        while not is_mounted(self.mnt):
            if self.client.poll() is not None:
                raise RuntimeError(f"{self.kind} client exited with {self.client.returncode}: {_tail(log_path)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.kind} did not mount {self.mnt} within {MOUNT_TIMEOUT} s: {_tail(log_path)}")
            time.sleep(POLL_INTERVAL)
        os.listdir(self.mnt)  # the first listing answers: the client is logged in and serving

    def stop_client(self) -> None:
        if self.client is not None:
            stop_process(self.client, unmount=self.mnt)
            self.client = None
        force_unmount(self.mnt)

    def reset(self) -> None:
        """Before a cold run: remount the client (its own caches empty) unless ``keep=1``."""
        if not self.options.keep_client:
            self.stop_client()
            self.start_client()

    def counters(self) -> dict[str, float]:
        """Cumulative: requests by kind (server logs), server /proc io, and the delay line's bytes."""
        time.sleep(LOG_SETTLE)
        out: dict[str, float] = {}
        for log in self.logs:
            for k, v in log.poll().items():
                out[k] = out.get(k, 0) + v
        if "requests" not in out:  # HTTP servers: one log line per request
            out["requests"] = float(sum(out.values()))
        out["data_requests"] = out.get("get", out.get("read", 0))
        if self.io is not None:
            out.update({f"src_{k}": float(v) for k, v in self.io.poll().items()})
        if self.delay is not None:
            dl = self.delay.counters()
            out["wire_down"], out["wire_up"], out["connections"] = dl["bytes_down"], dl["bytes_up"], dl["connections"]
        out["source_bytes"] = out.get(self.data_counter, out.get(f"src_{self.data_counter}", 0.0))
        return out


def stop_process(proc: subprocess.Popen, unmount: str | None = None) -> None:
    """Unmount *unmount* (if given), then SIGTERM the process group, SIGKILL if it lingers."""
    if unmount is not None and is_mounted(unmount):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["fusermount3", "-u", "-q", unmount], timeout=EXIT_TIMEOUT, capture_output=True, check=False)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=EXIT_TIMEOUT)
    if unmount is not None:
        force_unmount(unmount)


def _spawn(cmd: Sequence[str], log_path: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(cmd), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
        )


@contextlib.contextmanager
def _maybe_delayed(port: int, options: NetOptions, work: str) -> Iterator[tuple[int, DelayLine | None]]:
    """The port the client should use: the server's, or a delay line's in front of it."""
    if not options.delay_ms:
        yield port, None
        return
    with delay_line(port, options.delay_ms, work) as dl:
        yield dl.port, dl


@contextlib.contextmanager
def _workdir(kind: str, parent: str | None) -> Iterator[str]:
    work = tempfile.mkdtemp(prefix=f"fastfs-bench-{kind}.", dir=parent)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _source(src: NetSource) -> Iterator[NetSource]:
    try:
        src.start_client()
        yield src
    finally:
        src.stop_client()


# -- rclone ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def rclone_source(data_dir: str, mnt: str, options: NetOptions | None = None) -> Iterator[NetSource]:
    """``rclone mount --vfs-cache-mode off`` of ``rclone serve webdav DATA`` on loopback."""
    options = options or NetOptions()
    require_tools("rclone", ["rclone"])
    with _workdir("rclone", None) as work:
        conf = os.path.join(work, "rclone.conf")
        port = free_port()
        serve_log = os.path.join(work, "rclone-serve.log")
        base = ["rclone", "--config", conf]
        server = _spawn(
            [
                *base,
                "serve",
                "webdav",
                data_dir,
                "--addr",
                f"127.0.0.1:{port}",
                "--read-only",
                "--log-level",
                "INFO",
                "--log-file",
                serve_log,
                # (the server's own VFS lists directories for its cache time as well)
                *(["--dir-cache-time", f"{options.dir_cache_s:g}s"] if options.dir_cache_s is not None else []),
            ],
            os.path.join(work, "rclone-serve.out"),
        )
        try:
            wait_port(port, server, serve_log, "rclone serve webdav")
            with _maybe_delayed(port, options, work) as (client_port, dl):
                with open(conf, "w") as f:
                    f.write(f"[src]\ntype = webdav\nurl = http://127.0.0.1:{client_port}/\nvendor = other\n")
                os.makedirs(mnt, exist_ok=True)
                client_log = os.path.join(work, "rclone-client.log")

                if options.subtype:
                    raise RuntimeError("rclone mount cannot be given another FUSE subtype (sshfs and s3fs can)")

                def mount() -> subprocess.Popen:
                    cmd = [*base, "mount", "src:", mnt, "--vfs-cache-mode", "off", "--read-only"]
                    if options.dir_cache_s is not None:
                        cmd += ["--dir-cache-time", f"{options.dir_cache_s:g}s"]
                    return _spawn([*cmd, "--log-file", client_log], client_log)

                src = NetSource(
                    "rclone",
                    data_dir,
                    mnt,
                    work,
                    options,
                    "rchar",
                    mount,
                    logs=[LogCounts(serve_log, rclone_kind)],
                    io=IoTotals(lambda: [server.pid]),
                    delay=dl,
                    about=ABOUT["rclone"],
                )
                with _source(src):
                    yield src
        finally:
            stop_process(server)


# -- sshfs -----------------------------------------------------------------------------------------
SSHD_CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {work}/host_key
AuthorizedKeysFile {work}/authorized_keys
PidFile {work}/sshd.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
AllowUsers {user}
LogLevel VERBOSE
Subsystem sftp {sftp} -e -l DEBUG1 2>>{work}/sftp-server.log
"""
SSH_CONFIG = """\
Host fastfs-bench
  HostName 127.0.0.1
  Port {port}
  User {user}
  IdentityFile {work}/client_key
  IdentitiesOnly yes
  UserKnownHostsFile {work}/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
"""
# sshd refuses to start without its privilege separation directory (/run/sshd); it runs in a private
# mount namespace whose /run is a fresh tmpfs holding that directory, so the system's /run is untouched.
SSHD_WRAPPER = (
    "mount -t tmpfs -o mode=755 fastfs-bench-sshd /run && mkdir -m 755 /run/sshd && exec {sshd} -D -e -f {conf}"
)


@contextlib.contextmanager
def sshfs_source(data_dir: str, mnt: str, options: NetOptions | None = None) -> Iterator[NetSource]:
    """``sshfs`` to a private loopback ``sshd`` (own keys and config) serving the data directory."""
    import getpass

    options = options or NetOptions()
    if options.dir_cache_s is not None:
        raise ValueError("dircache= is an option of rclone's mount only")
    require_tools("sshfs", ["sshfs", "ssh", "ssh-keygen", "unshare", SSHD, SFTP_SERVER])
    user = getpass.getuser()
    with _workdir("sshfs", None) as work:
        for key in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(work, key)],
                check=True,
                capture_output=True,
            )
        shutil.copyfile(os.path.join(work, "client_key.pub"), os.path.join(work, "authorized_keys"))
        os.chmod(os.path.join(work, "authorized_keys"), 0o600)
        port = free_port()
        conf = os.path.join(work, "sshd_config")
        with open(conf, "w") as f:
            f.write(SSHD_CONFIG.format(port=port, work=work, user=user, sftp=SFTP_SERVER))
        sshd_log = os.path.join(work, "sshd.log")
        server = _spawn(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", SSHD_WRAPPER.format(sshd=SSHD, conf=conf)],
            sshd_log,
        )
        try:
            wait_port(port, server, sshd_log, "sshd")
            with _maybe_delayed(port, options, work) as (client_port, dl):
                with open(os.path.join(work, "host_key.pub")) as f:
                    host_key = f.read().strip()
                with open(os.path.join(work, "known_hosts"), "w") as f:
                    f.write(f"[127.0.0.1]:{client_port} {host_key}\n")
                ssh_conf = os.path.join(work, "ssh_config")
                with open(ssh_conf, "w") as f:
                    f.write(SSH_CONFIG.format(port=client_port, work=work, user=user))
                os.makedirs(mnt, exist_ok=True)
                client_log = os.path.join(work, "sshfs-client.log")

                def mount() -> subprocess.Popen:
                    cmd = ["sshfs", f"fastfs-bench:{data_dir}", mnt, "-f", "-F", ssh_conf, "-o", "ro"]
                    cmd += options.client_options()
                    return _spawn(cmd, client_log)

                def sftp_pids() -> list[int]:
                    return [p for p in descendants(server.pid) if _comm(p) == "sftp-server"]

                src = NetSource(
                    "sshfs",
                    data_dir,
                    mnt,
                    work,
                    options,
                    "rchar",
                    mount,
                    logs=[LogCounts(os.path.join(work, "sftp-server.log"), sftp_kind)],
                    io=IoTotals(sftp_pids),
                    delay=dl,
                    about=ABOUT["sshfs"],
                )
                with _source(src):
                    yield src
        finally:
            stop_process(server)


# -- s3fs ------------------------------------------------------------------------------------------
def _s3_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_ACCESS_KEY,
        aws_secret_access_key=S3_SECRET_KEY,
        region_name=S3_REGION,
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=UPLOAD_THREADS * 2),
    )


def _tree_files(data_dir: str, paths: Iterable[str]) -> list[str]:
    """The files at *paths* (relative to *data_dir*; a directory's files, all the way down), relative."""
    files: list[str] = []
    for rel in sorted(set(paths)):
        full = os.path.join(data_dir, rel)
        if os.path.isdir(full):
            for d, _, names in os.walk(full):
                files += [os.path.relpath(os.path.join(d, n), data_dir) for n in names]
        elif os.path.exists(full):
            files.append(rel)
    return files


def _put_each(put: Callable[[str], int], files: list[str], threads: int) -> int:
    """``put`` every file on *threads* threads; the sum of what it returns (bytes)."""
    with ThreadPoolExecutor(threads) as ex:
        return sum(ex.map(put, files))


def upload_tree(endpoint: str, data_dir: str, paths: Iterable[str]) -> int:
    """Upload files (and directories' files) at *paths* (relative to *data_dir*) as keys; returns bytes."""
    from boto3.s3.transfer import TransferConfig

    files = _tree_files(data_dir, paths)
    client = _s3_client(endpoint)
    cfg = TransferConfig(multipart_threshold=UPLOAD_PART, multipart_chunksize=UPLOAD_PART, max_concurrency=4)

    def put(rel: str) -> int:
        full = os.path.join(data_dir, rel)
        client.upload_file(full, S3_BUCKET, rel.replace(os.sep, "/"), Config=cfg)
        return os.path.getsize(full)

    return _put_each(put, files, UPLOAD_THREADS)


@contextlib.contextmanager
def s3fs_source(
    data_dir: str,
    mnt: str,
    options: NetOptions | None = None,
    paths: Iterable[str] = (".",),
    ram_dir: str | None = None,
) -> Iterator[NetSource]:
    """``s3fs`` over a private moto S3 server holding *paths* of the data directory (uploaded first).

    *ram_dir*: parent of the server's temporary files (moto spills objects over 8 MiB to them), so
    they live in RAM like the emulator's data; default: the system's temporary directory.
    """
    options = options or NetOptions()
    if options.dir_cache_s is not None:
        raise ValueError("dircache= is an option of rclone's mount only")
    require_tools("s3fs", ["s3fs"])
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"s3fs source needs moto[server] and boto3 (make bench-deps): {e}") from None
    with _workdir("s3fs", ram_dir) as work:
        port = free_port()
        tmp = os.path.join(work, "tmp")
        os.makedirs(tmp)
        moto_log = os.path.join(work, "moto.log")
        env = dict(
            os.environ,
            TMPDIR=tmp,
            AWS_CONFIG_FILE=os.devnull,
            AWS_SHARED_CREDENTIALS_FILE=os.devnull,
            PYTHONUNBUFFERED="1",
        )
        launcher = os.path.join(os.path.dirname(os.path.abspath(__file__)), "s3server.py")
        server = _spawn([sys.executable, launcher, "127.0.0.1", str(port)], moto_log, env)
        try:
            wait_port(port, server, moto_log, "moto S3 server")
            endpoint = f"http://127.0.0.1:{port}"
            _s3_client(endpoint).create_bucket(Bucket=S3_BUCKET)
            uploaded = upload_tree(endpoint, data_dir, paths)
            # moto answers with socket send() calls, which /proc/PID/io does not count: its bytes are
            # counted on the wire by a delay line, always in front of it (delay 0 unless asked).
            with delay_line(port, options.delay_ms, work) as dl:
                client_port = dl.port
                passwd = os.path.join(work, "passwd-s3fs")
                with open(passwd, "w") as f:
                    f.write(f"{S3_ACCESS_KEY}:{S3_SECRET_KEY}\n")
                os.chmod(passwd, 0o600)
                os.makedirs(mnt, exist_ok=True)
                client_log = os.path.join(work, "s3fs-client.log")
                opts = f"url=http://127.0.0.1:{client_port},use_path_request_style,passwd_file={passwd},ro"

                def mount() -> subprocess.Popen:
                    cmd = ["s3fs", S3_BUCKET, mnt, "-f", "-o", opts, *options.client_options()]
                    return _spawn(cmd, client_log, env)

                src = NetSource(
                    "s3fs",
                    data_dir,
                    mnt,
                    work,
                    options,
                    "wire_down",
                    mount,
                    logs=[LogCounts(moto_log, moto_kind)],
                    io=IoTotals(lambda: [server.pid]),
                    delay=dl,
                    about=f"{ABOUT['s3fs']} ({uploaded / 2**20:.0f} MiB uploaded)",
                )
                with _source(src):
                    yield src
        finally:
            stop_process(server)


# -- gluster ---------------------------------------------------------------------------------------
# Where a brick's io-stats translator dumps its counters (GlusterFS's fixed directory; the file is
# named after the brick's path, so each source's is its own, and it is removed at teardown).
GLUSTER_STATS_DIR = "/var/lib/glusterd/stats"
# Seconds between the brick's dumps of its counters, and the longest wait for a dump newer than a
# counters() call (the harness reads counters outside any timing).
GLUSTER_DUMP_INTERVAL = 1
GLUSTER_DUMP_WAIT = 5.0
# Reads of a dump that lacks its closing counters (caught while written) before taking it as it is.
GLUSTER_READ_TRIES = 20
# Files copied into the volume at once (the client creates each with a few round trips).
GLUSTER_COPY_THREADS = 8
# The brick: posix storage, locks, io-threads, io-stats (counting), the server. The brick directory
# is named by its path, as glusterd names bricks.
GLUSTER_SERVER_VOL = """\
volume posix
    type storage/posix
    option directory {brick}
end-volume

volume locks
    type features/locks
    subvolumes posix
end-volume

volume io-threads
    type performance/io-threads
    subvolumes locks
end-volume

volume {brick}
    type debug/io-stats
    option count-fop-hits on
    option latency-measurement on
    option ios-dump-interval {interval}
    option ios-dump-format json
    subvolumes io-threads
end-volume

volume server
    type protocol/server
    option transport-type tcp
    option transport.address-family inet
    option transport.socket.bind-address 127.0.0.1
    option transport.socket.listen-port {port}
    option auth.addr.{brick}.allow *
    subvolumes {brick}
end-volume
"""
# The client graph glusterd (GlusterFS 10.3) generates for a one-brick volume with its defaults
# (``glv.tcp-fuse.vol``), the brick's address given outright (no glusterd to ask for its port).
GLUSTER_CLIENT_VOL = """\
volume v-client-0
    type protocol/client
    option send-gids true
    option strict-locks off
    option transport.socket.keepalive-count 9
    option transport.socket.keepalive-interval 2
    option transport.socket.keepalive-time 20
    option transport.tcp-user-timeout 0
    option transport.socket.ssl-enabled off
    option transport.address-family inet
    option transport-type tcp
    option remote-subvolume {brick}
    option remote-host 127.0.0.1
    option remote-port {port}
    option ping-timeout 42
end-volume

volume v-dht
    type cluster/distribute
    option force-migration off
    option lock-migration off
    subvolumes v-client-0
end-volume

volume v-utime
    type features/utime
    option noatime on
    subvolumes v-dht
end-volume

volume v-write-behind
    type performance/write-behind
    subvolumes v-utime
end-volume

volume v-open-behind
    type performance/open-behind
    subvolumes v-write-behind
end-volume

volume v-quick-read
    type performance/quick-read
    subvolumes v-open-behind
end-volume

volume v-md-cache
    type performance/md-cache
    subvolumes v-quick-read
end-volume

volume v-io-threads
    type performance/io-threads
    subvolumes v-md-cache
end-volume

volume v
    type debug/io-stats
    option global-threading off
    option count-fop-hits off
    option latency-measurement off
    option threads 16
    option log-level INFO
    subvolumes v-io-threads
end-volume
"""
_GLUSTER_FOP = re.compile(r'"[^"]*\.aggr\.fop\.([a-z_]+)\.count":\s*(\d+)')
_GLUSTER_READ = re.compile(r'"[^"]*\.aggr\.bytes_read":\s*(\d+)')


class GlusterStats:
    """The brick's cumulative counters from its io-stats dump: requests by kind and bytes read."""

    def __init__(self, path: str) -> None:
        self.path = path

    def poll(self) -> dict[str, int]:
        asked = time.time()
        deadline = time.monotonic() + GLUSTER_DUMP_WAIT
        while time.monotonic() < deadline:  # a dump written after this call covers every request before it
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.path).st_mtime > asked + 0.05:
                    break
            time.sleep(POLL_INTERVAL)
        text = ""
        for _ in range(GLUSTER_READ_TRIES):  # (a dump read while the brick writes it lacks its last keys)
            with contextlib.suppress(FileNotFoundError), open(self.path) as f:
                text = f.read()
            if _GLUSTER_READ.search(text):
                break
            time.sleep(POLL_INTERVAL)
        out: dict[str, int] = {}  # (the dump's "aggr" keys are cumulative since the brick started)
        for name, count in _GLUSTER_FOP.findall(text):
            if name != "weighted_fop_count":
                out[name] = max(out.get(name, 0), int(count))
        found = _GLUSTER_READ.findall(text)
        out["bytes_read"] = max((int(v) for v in found), default=0)
        out["requests"] = sum(v for k, v in out.items() if k != "bytes_read")
        return out


def _copy_into(mnt: str, data_dir: str, paths: Iterable[str]) -> int:
    """Copy *paths* (relative to *data_dir*; directories whole) into the volume mounted at *mnt*."""
    files = _tree_files(data_dir, paths)
    for rel in files:
        os.makedirs(os.path.dirname(os.path.join(mnt, rel)) or mnt, exist_ok=True)

    def put(rel: str) -> int:
        src, dst = os.path.join(data_dir, rel), os.path.join(mnt, rel)
        shutil.copyfile(src, dst)
        shutil.copystat(src, dst)
        return os.path.getsize(src)

    return _put_each(put, files, GLUSTER_COPY_THREADS)


@contextlib.contextmanager
def gluster_source(
    data_dir: str,
    mnt: str,
    options: NetOptions | None = None,
    paths: Iterable[str] = (".",),
    ram_dir: str | None = None,
) -> Iterator[NetSource]:
    """GlusterFS's FUSE client of a private one-brick volume holding *paths* of the data directory.

    *ram_dir*: parent of the brick (the volume's files live there, in RAM like the emulator's data);
    default: the system's temporary directory.
    """
    options = options or NetOptions()
    if options.dir_cache_s is not None:
        raise ValueError("dircache= is an option of rclone's mount only")
    if options.subtype:
        raise RuntimeError("GlusterFS's client cannot be given another FUSE subtype (sshfs and s3fs can)")
    require_tools("gluster", ["glusterfsd", "glusterfs"])
    with _workdir("gluster", ram_dir) as work:
        brick = os.path.join(work, "brick")
        os.makedirs(brick)
        port = free_port()
        server_vol = os.path.join(work, "server.vol")
        with open(server_vol, "w") as f:
            f.write(GLUSTER_SERVER_VOL.format(brick=brick, port=port, interval=GLUSTER_DUMP_INTERVAL))
        server_log = os.path.join(work, "brick.log")
        stats = os.path.join(GLUSTER_STATS_DIR, "glusterfsd_" + brick.replace("/", "_") + ".dump")
        os.makedirs(GLUSTER_STATS_DIR, exist_ok=True)  # (the server package makes it; a client-only machine may not)
        server = _spawn(["glusterfsd", "-N", "-f", server_vol, "-l", server_log], os.path.join(work, "brick.out"))
        try:
            wait_port(port, server, server_log, "glusterfsd")

            def client_at(client_port: int, where: str, log: str) -> Callable[[], subprocess.Popen]:
                vol = os.path.join(work, f"client-{client_port}.vol")
                with open(vol, "w") as f:
                    f.write(GLUSTER_CLIENT_VOL.format(brick=brick, port=client_port))
                return lambda: _spawn(["glusterfs", "-N", "-f", vol, "-l", log, where], log)

            # The data set goes in through a client of its own, without delay; the files keep their times.
            loader = os.path.join(work, "load")
            os.makedirs(loader)
            load_log = os.path.join(work, "load.log")
            loading = client_at(port, loader, load_log)
            load = NetSource("gluster", data_dir, loader, work, NetOptions(), "bytes_read", loading)
            with _source(load):
                copied = _copy_into(loader, data_dir, paths)
            # The bytes the brick sends are counted on the wire by a delay line always in front of it
            # (delay 0 unless asked): quick-read returns small files with their lookups, which the
            # brick's own bytes_read leaves out.
            with delay_line(port, options.delay_ms, work) as dl:
                client_port = dl.port
                os.makedirs(mnt, exist_ok=True)
                src = NetSource(
                    "gluster",
                    data_dir,
                    mnt,
                    work,
                    options,
                    "wire_down",
                    client_at(client_port, mnt, os.path.join(work, "gluster-client.log")),
                    logs=[GlusterStats(stats)],
                    io=IoTotals(lambda: [server.pid]),
                    delay=dl,
                    about=f"{ABOUT['gluster']} ({copied / 2**20:.0f} MiB copied in)",
                )
                with _source(src):
                    yield src
        finally:
            stop_process(server)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stats)


SOURCES = {"rclone": rclone_source, "sshfs": sshfs_source, "s3fs": s3fs_source, "gluster": gluster_source}
