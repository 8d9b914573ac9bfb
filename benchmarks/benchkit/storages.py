"""The storages a benchmark runs over: the latency emulator (a behaviour) or a real network client.

``--storage`` names them: ``emu:PRESET`` or ``emu:SPEC`` (a :class:`latency_fs.Behaviour` spec,
e.g. ``emu:lat=5,dirops=serial``), ``rclone``, ``sshfs``, ``s3fs``, ``gluster`` (each with ``:delay=MS``,
``keep=1``: see :mod:`.netsources`). A comma separates storages; an item without a storage name
(``dirops=serial`` after ``emu:lat=5``) continues the previous one, so specs need no quoting.

:func:`started` mounts one for the duration of a block and yields a :class:`Storage`: its mount
point (what ``direct`` reads and fastfs takes as its source), ``counters()`` (cumulative; the harness
diffs them around each timed run; always with ``requests``, ``data_requests`` and ``source_bytes``),
and ``reset()`` (before a cold run: the network clients are remounted so their own caches start
empty; the emulator has none beyond the kernel's, which the harness drops).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from . import netsources

# Behaviour presets of the emulator: name -> spec over the defaults (1.5 ms, 400 MB/s per handle,
# read-ahead 128 KiB, page cache kept, attr 1 s, parallel lookups).
PRESETS: dict[str, str] = {
    "base": "",
    "serial": "dirops=serial",
    "issue14": "dirops=serial,meta=0.8,bw=request",
    "nora": "ra=0",
    "drop": "cache=drop",
    "direct": "cache=direct",
    "perreq": "bw=request",
    "lat0.5": "lat=0.5",
    "lat5": "lat=5",
    "stream": "stream=on,dirops=serial",
}
# What each preset stands for (for --list and the README).
PRESET_NOTES: dict[str, str] = {
    "base": "NFS-like client: 1.5 ms, 400 MB/s per handle, read-ahead 128 KiB, page cache kept, parallel lookups",
    "serial": "lookups of one directory serialised (a FUSE source on libfuse 3.14: gcsfuse/s3fs/sshfs on Debian 12)",
    "issue14": "the storage of issue 14: serialised lookups, 0.8 ms per open/lookup, bandwidth per request",
    "nora": "no read-ahead on the source mount (buffered reads reach it page by page)",
    "drop": "page cache dropped at every open (no keep_cache)",
    "direct": "no page cache (direct_io): reads reach the source at the size asked; shared mmap fails",
    "perreq": "bandwidth charged per request (object-store range GETs), not per handle",
    "lat0.5": "0.5 ms per request (same rack)",
    "lat5": "5 ms per request (object store, distant server)",
    "stream": "per-handle ranged streams (rclone/s3fs/gcsfuse without file cache): an out-of-order read restarts",
}
# Storage kinds a --storage item may start with.
NETWORK_KINDS = tuple(netsources.SOURCES)
KINDS = ("emu", *NETWORK_KINDS)
# Emulator counters that are requests the storage answered (their sum is ``requests``).
EMU_REQUESTS = ("reads", "opens", "getattrs", "readdirs", "readlinks")


@dataclass(frozen=True)
class StorageSpec:
    """One ``--storage`` item: its kind, its label in tables and its option text."""

    kind: str
    label: str
    text: str = ""

    def behaviour(self) -> Any:
        """The emulator Behaviour of an ``emu`` spec (a preset name or a spec)."""
        from latency_fs import Behaviour

        return Behaviour.parse(PRESETS.get(self.text, self.text))

    def net_options(self) -> netsources.NetOptions:
        return netsources.NetOptions.parse(self.text)

    def check(self) -> None:
        """Raise ValueError (one line) if the options are bad."""
        if self.kind == "emu":
            self.behaviour()
        else:
            self.net_options()

    def describe(self) -> str:
        if self.kind == "emu":
            return f"emulator: {self.behaviour().describe()}"
        return f"{netsources.ABOUT[self.kind]}{self.net_options().describe()}"


def parse_storages(items: Iterable[str]) -> list[StorageSpec]:
    """``rclone,sshfs:delay=2,emu:issue14,emu:lat=5,dirops=serial`` -> specs (ValueError on a bad item)."""
    parts: list[str] = []
    for text in items:
        for item in (p.strip() for p in text.split(",")):
            if not item:
                continue
            head = item.split(":", 1)[0]
            if head in KINDS or not parts:
                parts.append(item)
            else:
                parts[-1] += "," + item
    specs = []
    for part in parts:
        kind, _, rest = part.partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown storage {part!r}: use emu:PRESET|SPEC, {', '.join(NETWORK_KINDS)}")
        if kind == "emu" and not rest:
            rest = "base"
        label = part if kind != "emu" else (rest if rest in PRESETS else part)
        spec = StorageSpec(kind, label, rest)
        spec.check()
        specs.append(spec)
    return specs


def emu_spec(name: str, spec_text: str) -> StorageSpec:
    """The StorageSpec of an emulator behaviour named *name* (``--behaviours`` / ``--behaviour``)."""
    s = StorageSpec("emu", name, spec_text)
    s.check()
    return s


class Storage:
    """A started storage: ``mnt``, ``counters()``, ``reset()``, ``describe()``."""

    def __init__(self, spec: StorageSpec, mnt: str, backend: Any) -> None:
        self.spec = spec
        self.mnt = mnt
        self.backend = backend

    def describe(self) -> str:
        if self.spec.kind == "emu":
            return self.spec.describe()
        return self.backend.describe()

    def counters(self) -> dict[str, float]:
        return derive(self.backend.counters())

    def reset(self) -> None:
        reset = getattr(self.backend, "reset", None)
        if reset is not None:
            reset()


def derive(c: dict[str, float]) -> dict[str, float]:
    """Counters with ``requests``, ``data_requests`` and ``source_bytes`` filled in (emulator counters)."""
    out = dict(c)
    if "requests" not in out:
        out["requests"] = float(sum(out.get(k, 0) for k in EMU_REQUESTS))
    out.setdefault("data_requests", out.get("reads", 0))
    if "source_bytes" not in out:
        out["source_bytes"] = out.get("transferred_bytes", out.get("read_bytes", 0))
    return out


@contextlib.contextmanager
def started(
    spec: StorageSpec, data_dir: str, mnt: str, paths: Sequence[str] = (".",), ram_dir: str | None = None
) -> Iterator[Storage]:
    """Mount *spec* over *data_dir* at *mnt* for the block (always torn down).

    *paths* (relative to *data_dir*): what the workloads read, uploaded to the S3 server of ``s3fs``
    or copied into the volume of ``gluster`` (the others serve the directory itself). *ram_dir*:
    where the S3 server keeps spilled objects and where the GlusterFS brick lives.
    """
    if spec.kind == "emu":
        from latency_fs import emulated

        with emulated(data_dir, mnt, behaviour=spec.behaviour()) as emu:
            yield Storage(spec, emu.mnt, emu)
        return
    factory = netsources.SOURCES[spec.kind]
    kwargs: dict[str, Any] = {"paths": paths, "ram_dir": ram_dir} if spec.kind in ("s3fs", "gluster") else {}
    with factory(data_dir, mnt, spec.net_options(), **kwargs) as src:
        yield Storage(spec, src.mnt, src)
