"""libfuse's own low-level passthrough example as the reference daemon: found, built, mounted.

The floor every fastfs request is measured against (issue 23) is ``example/passthrough_ll.c`` of the
libfuse the system ships, built with ``gcc -O2`` against the system's ``libfuse3-dev`` and mounted
with ``-o cache=always``. Nothing of it is kept in the repository: the source is found or downloaded
and the binary built at run time into a cache directory, named by a hash of its source and flags, so
a change of either builds anew.

Where the source comes from, first hit wins:

1. ``--libfuse-src DIR`` (DIR or DIR/example holding ``passthrough_ll.c``);
2. the copy ``libfuse3-dev`` itself installs (Debian's package ships the examples of its source
   package under ``/usr/share/doc/libfuse3-dev/examples/``: same source package as the headers);
3. Debian's source package of fuse3 at the installed ``libfuse3-dev`` version, fetched with
   ``apt-get source --download-only`` and unpacked with ``dpkg-source -x`` (Debian's patches
   applied). apt runs with a private sources list, lists and cache directory under the cache
   directory: the system's apt configuration and state are never changed. The deb-src lines are the
   system's own Debian ``deb`` entries (same mirrors, suites and components, from
   ``apt-get indextargets``), checked with the Debian archive keyring.

``--reference-bin PATH`` skips all of it. A missing tool or package is a :class:`ReferenceUnavailableError`
with the command that fixes it; installing ``libfuse3-dev`` does not pull Debian's ``fuse`` package
(which conflicts with ``fuse3``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence

from .system import force_unmount, is_mounted

# The example and the helper header it includes (both from the same directory of the source).
EXAMPLE = "passthrough_ll.c"
EXAMPLE_FILES = (EXAMPLE, "passthrough_helpers.h")
# Where Debian's libfuse3-dev installs the examples of its source package.
INSTALLED_EXAMPLES = "/usr/share/doc/libfuse3-dev/examples"
# Debian's source package of libfuse 3 and the binary package whose version it must match.
SOURCE_PACKAGE = "fuse3"
DEV_PACKAGE = "libfuse3-dev"
# Key that signs Debian's archives (package debian-archive-keyring).
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Compiler flags: the optimisation a packaged C daemon gets.
CFLAGS = ("-O2", "-Wall")
# Mount options of the reference, as issue 23 measured it: kernel caches kept (keep_cache, 86400 s
# entry and attribute timeouts), the most a C passthrough daemon lets the kernel answer alone.
REFERENCE_OPTIONS = "cache=always"
# Seconds allowed for the reference to appear in the mount table, and to exit after its unmount.
MOUNT_TIMEOUT = 30.0
EXIT_TIMEOUT = 30.0
# Poll interval (s) while waiting for the mount or the process.
POLL_INTERVAL = 0.02
# Seconds allowed for one apt-get, dpkg-source or gcc run.
TOOL_TIMEOUT = 600.0


class ReferenceUnavailableError(RuntimeError):
    """The reference cannot be built here; the message says what to install or pass."""


def default_cache_dir() -> str:
    """/var/cache/fastfs-bench for root, else $XDG_CACHE_HOME (or ~/.cache)/fastfs-bench."""
    if os.geteuid() == 0:
        return "/var/cache/fastfs-bench"
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastfs-bench")


def _run(cmd: Sequence[str], what: str, cwd: str | None = None) -> str:
    """Run *cmd*; its stdout, or ReferenceUnavailableError with the tail of its output."""
    try:
        res = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False)
    except FileNotFoundError:
        raise ReferenceUnavailableError(f"{what}: {cmd[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise ReferenceUnavailableError(f"{what}: {cmd[0]} did not finish within {TOOL_TIMEOUT:.0f} s") from None
    if res.returncode != 0:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-5:]
        raise ReferenceUnavailableError(f"{what} failed ({' '.join(cmd[:3])} ...): {' / '.join(tail)}")
    return res.stdout


def dev_version() -> str:
    """The installed libfuse3-dev's Debian version; ReferenceUnavailableError (how to install it) if absent."""
    try:
        res = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status} ${Version}", DEV_PACKAGE], capture_output=True, text=True, check=False
        )
        status, _, version = res.stdout.rpartition(" ")
    except FileNotFoundError:
        status, version = "", ""
    if "install ok installed" not in status or not version:
        raise ReferenceUnavailableError(
            f"{DEV_PACKAGE} is not installed (the reference daemon is built against its headers): "
            f"run `make system-deps` or `apt-get install -y {DEV_PACKAGE} gcc pkg-config`"
        )
    return version


def _has_example(directory: str) -> bool:
    return all(os.path.isfile(os.path.join(directory, f)) for f in EXAMPLE_FILES)


def find_source(libfuse_src: str | None, cache_dir: str, download: bool = False) -> tuple[str, str]:
    """(directory holding the example, where it came from) per the order in the module docstring."""
    if libfuse_src:
        for directory in (libfuse_src, os.path.join(libfuse_src, "example")):
            if _has_example(directory):
                return directory, f"--libfuse-src {directory}"
        raise ReferenceUnavailableError(
            f"--libfuse-src {libfuse_src}: no {EXAMPLE} (with its header) in it or its example/"
        )
    version = dev_version()
    if not download and _has_example(INSTALLED_EXAMPLES):
        return INSTALLED_EXAMPLES, f"{DEV_PACKAGE} {version} ({INSTALLED_EXAMPLES})"
    return download_source(version, cache_dir), f"Debian source package {SOURCE_PACKAGE} {version} (apt-get source)"


def _debian_deb_src_lines() -> list[str]:
    """deb-src lines for the Debian archives the system installs packages from (its own mirrors)."""
    out = _run(
        [
            "apt-get",
            "indextargets",
            "--format",
            "$(REPO_URI) $(RELEASE) $(COMPONENT)",
            "Created-By: Packages",
            "Origin: Debian",
        ],
        "listing the system's package sources",
    )
    lines = []
    for entry in sorted(set(out.split("\n"))):
        parts = entry.split()
        if len(parts) == 3:
            uri, release, component = parts
            lines.append(f"deb-src [signed-by={DEBIAN_KEYRING}] {uri} {release} {component}")
    if not lines:
        raise ReferenceUnavailableError(
            "no package sources known to apt (run `apt-get update`), or pass --libfuse-src DIR / --reference-bin PATH"
        )
    return lines


def download_source(version: str, cache_dir: str) -> str:
    """Debian's fuse3 source at *version*, unpacked under *cache_dir* (reused when already there)."""
    top = os.path.join(cache_dir, "libfuse", f"{SOURCE_PACKAGE}-{version}")
    unpacked = os.path.join(top, "src")
    if _has_example(os.path.join(unpacked, "example")):
        return os.path.join(unpacked, "example")
    apt = os.path.join(cache_dir, "apt")
    for sub in ("lists/partial", "cache/archives/partial", "empty"):
        os.makedirs(os.path.join(apt, sub), exist_ok=True)
    with open(os.path.join(apt, "sources.list"), "w") as f:
        f.write("\n".join(_debian_deb_src_lines()) + "\n")
    private = [
        f"-o=Dir::Etc::SourceList={apt}/sources.list",
        f"-o=Dir::Etc::SourceParts={apt}/empty",
        f"-o=Dir::State::Lists={apt}/lists",
        f"-o=Dir::Cache={apt}/cache",
    ]
    _run(["apt-get", *private, "-qq", "update"], "apt-get update of the private source lists")
    download = os.path.join(top, "download")
    shutil.rmtree(download, ignore_errors=True)
    os.makedirs(download)
    _run(
        ["apt-get", *private, "-qq", "source", "--download-only", f"{SOURCE_PACKAGE}={version}"],
        f"downloading Debian's {SOURCE_PACKAGE} {version} source",
        cwd=download,
    )
    dsc = glob.glob(os.path.join(download, f"{SOURCE_PACKAGE}_*.dsc"))
    if len(dsc) != 1:
        raise ReferenceUnavailableError(f"apt-get source left {len(dsc)} .dsc files in {download}")
    shutil.rmtree(unpacked, ignore_errors=True)
    # apt checked every file's hash against the signed index; --no-check skips dpkg-source's own gpg
    # check of the .dsc's signature (the maintainer's key is not in any keyring here).
    _run(["dpkg-source", "--no-check", "-x", dsc[0], unpacked], "unpacking the source (dpkg-source, package dpkg-dev)")
    if not _has_example(os.path.join(unpacked, "example")):
        raise ReferenceUnavailableError(f"{unpacked}/example has no {EXAMPLE}")
    return os.path.join(unpacked, "example")


def build(source_dir: str, cache_dir: str) -> str:
    """``gcc -O2 EXAMPLE $(pkg-config --cflags --libs fuse3)`` into *cache_dir*; the binary's path."""
    flags = _run(["pkg-config", "--cflags", "--libs", "fuse3"], f"pkg-config fuse3 (package {DEV_PACKAGE})").split()
    digest = hashlib.sha256()
    for name in EXAMPLE_FILES:
        with open(os.path.join(source_dir, name), "rb") as f:
            digest.update(f.read())
    digest.update(" ".join([*CFLAGS, *flags]).encode())
    out_dir = os.path.join(cache_dir, "libfuse")
    binary = os.path.join(out_dir, f"passthrough_ll-{digest.hexdigest()[:12]}")
    if os.access(binary, os.X_OK):
        return binary
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{binary}.tmp{os.getpid()}"
    _run(["gcc", *CFLAGS, os.path.join(source_dir, EXAMPLE), "-o", tmp, *flags], f"building {EXAMPLE} (gcc)")
    os.replace(tmp, binary)
    return binary


def reference_binary(
    reference_bin: str | None, libfuse_src: str | None, cache_dir: str, download: bool = False
) -> tuple[str, str]:
    """(path of the reference daemon, what it was built from); builds it when needed."""
    if reference_bin:
        if not os.access(reference_bin, os.X_OK):
            raise ReferenceUnavailableError(f"--reference-bin {reference_bin}: not an executable file")
        return reference_bin, f"--reference-bin {reference_bin}"
    source_dir, origin = find_source(libfuse_src, cache_dir, download)
    return build(source_dir, cache_dir), origin


@contextlib.contextmanager
def reference_mount(binary: str, src: str, mnt: str, options: str = REFERENCE_OPTIONS) -> Iterator[str]:
    """The reference daemon serving *src* on *mnt* (foreground child, multi-threaded as by default)
    for the duration of the block; always unmounted and waited for (killed if it hangs)."""
    os.makedirs(mnt, exist_ok=True)
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [binary, "-f", "-o", f"source={src},{options}", mnt], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + MOUNT_TIMEOUT
            while not is_mounted(mnt):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace").strip().splitlines()[-3:]
                    raise RuntimeError(f"{os.path.basename(binary)} did not mount {mnt}: {' / '.join(tail)}")
                time.sleep(POLL_INTERVAL)
            yield mnt
        finally:
            if is_mounted(mnt):
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(["fusermount3", "-u", mnt], capture_output=True, timeout=EXIT_TIMEOUT, check=False)
            force_unmount(mnt)
            try:
                proc.wait(EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
