"""The source shape: override, local sources, known stream-oriented clients, the jump probe; the
mount table's type of the source's mount; the shaper's probe states; the setting."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from fastfs.config import Config, ConfigError, load_config, parse_overrides
from fastfs.config.reload import apply_live, needs_remount
from fastfs.fsio import shape, source
from fastfs.fsio.shape import PARALLEL, SEQUENTIAL, SourceFacts


@pytest.mark.parametrize(
    ("facts", "override", "kind"),
    [
        (SourceFacts("ext4", local=True), "auto", PARALLEL),
        (SourceFacts("nfs4"), "auto", PARALLEL),
        (SourceFacts("lustre"), "auto", PARALLEL),
        (SourceFacts("fuse.sshfs"), "auto", PARALLEL),
        (SourceFacts("fuse.rclone"), "auto", SEQUENTIAL),
        (SourceFacts("fuse.s3fs"), "auto", SEQUENTIAL),
        (SourceFacts("fuse.gcsfuse"), "auto", SEQUENTIAL),
        (SourceFacts("fuse.mountpoint-s3"), "auto", SEQUENTIAL),
        # a client whose protocol reads by offset is parallel whatever a probe measured next to a
        # loader on a busy link (over sshfs: jump 3.6 ms, continuing read 0.8 ms, once)
        (SourceFacts("fuse.sshfs", continue_seconds=0.0008, jump_seconds=0.0036), "auto", PARALLEL),
        (SourceFacts("fuse.ceph-fuse"), "auto", PARALLEL),
        (SourceFacts("fuse.sshfs"), "sequential", SEQUENTIAL),
        (SourceFacts("fuse.rclone"), "parallel", PARALLEL),  # the setting wins
        (SourceFacts("nfs4"), "sequential", SEQUENTIAL),
        (SourceFacts("ext4", local=True), "sequential", SEQUENTIAL),
        # the probe, for clients the table does not know
        (SourceFacts("fuse.unknown", continue_seconds=0.0005, jump_seconds=0.030), "auto", SEQUENTIAL),
        (SourceFacts("fuse.unknown", continue_seconds=0.0015, jump_seconds=0.0016), "auto", PARALLEL),
        # a large ratio of tiny costs is noise
        (SourceFacts("fuse.unknown", continue_seconds=0.00001, jump_seconds=0.0005), "auto", PARALLEL),
        (SourceFacts(""), "auto", PARALLEL),
    ],
)
def test_choose_table(facts, override, kind):
    chosen = shape.choose(facts, override)
    assert chosen.kind == kind
    assert chosen.reason  # always says why


@pytest.mark.parametrize(
    ("mount_type", "client"),
    [("fuse.rclone", "rclone"), ("fuseblk.ntfs", "ntfs"), ("fuse", ""), ("nfs4", ""), ("ext4", ""), ("", "")],
)
def test_client_of(mount_type, client):
    assert shape.client_of(mount_type) == client


@pytest.mark.parametrize(
    ("mount_type", "kept"),
    [
        ("fuse.rclone", False),  # object-store clients: directories made up from key prefixes
        ("fuse.s3fs", False),
        ("fuse.gcsfuse", False),
        ("fuse.sshfs", True),  # SFTP gives the server's directory times
        ("nfs4", True),
        ("ext4", True),
        ("fuse", True),  # an unknown FUSE source: taken at its word
        ("", True),
    ],
)
def test_dir_times_kept(mount_type: str, kept: bool) -> None:
    assert shape.dir_times_kept(mount_type) is kept


@pytest.mark.parametrize(
    ("mount_type", "lists"),
    [
        ("fuse.s3fs", False),  # its listing HEADs every object
        ("fuse.glusterfs", True),  # READDIRPLUS: the client then opens without a lookup of its own
        ("fuse.rclone", True),  # one PROPFIND
        ("fuse.sshfs", True),
        ("nfs4", True),
        ("ext4", True),
        ("", True),
    ],
)
def test_replay_lists(mount_type: str, lists: bool) -> None:
    assert shape.replay_lists(mount_type) is lists
    # a scan lists before its reader did on the same sources (s3fs: only after the reader's listing)
    assert shape.scan_lists_first(mount_type) is lists


# -- the mount table: which mount holds the source ----------------------------------------------------
MOUNTINFO = """\
22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:26 / /mnt rw,nosuid shared:7 - tmpfs tmpfs rw
41 30 0:45 / /mnt/models rw,nosuid,nodev,relatime shared:20 - fuse.rclone webdav: rw,user_id=0,group_id=0
42 30 0:46 / /mnt/models2 rw,relatime shared:21 - nfs4 srv:/export rw
43 22 0:47 / /data/my\\040bucket rw,relatime shared:22 - fuse.s3fs s3fs rw,user_id=0
44 41 0:48 / /mnt/models rw,relatime shared:23 - fuse.gcsfuse bucket rw,user_id=0
malformed line without separator
"""


@pytest.mark.parametrize(
    ("path", "mount_type"),
    [
        ("/", "ext4"),
        ("/home/user/data", "ext4"),
        ("/mnt", "tmpfs"),
        ("/mnt/x", "tmpfs"),
        ("/mnt/models2/ckpt", "nfs4"),  # the longest mount point, not a string prefix of another
        ("/mnt/models2", "nfs4"),
        ("/mnt/models", "fuse.gcsfuse"),  # two mounts on one point: the later covers the earlier
        ("/mnt/models/llama/x.safetensors", "fuse.gcsfuse"),
        ("/mnt/modelsX", "tmpfs"),
        ("/data/my bucket/a", "fuse.s3fs"),  # octal escapes of the mount point
        ("/data/my", "ext4"),
    ],
)
def test_mount_type_of_longest_mount_point(path, mount_type):
    assert source.mount_type_of(path, MOUNTINFO) == mount_type


def test_mount_type_unreadable_table_is_unknown(tmp_path):
    assert source.read_mount_type("/", str(tmp_path / "missing")) == ""
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTINFO)
    assert source.read_mount_type("/mnt/models/a", str(table)) == "fuse.gcsfuse"


@pytest.mark.parametrize(
    ("mount_type", "line_type", "kind", "probe"),
    [
        ("fuse.rclone", "fuse.rclone", SEQUENTIAL, shape.PROBE_NONE),  # a known stream client: no probe
        ("nfs4", "nfs4", PARALLEL, shape.PROBE_NONE),  # a kernel filesystem: no probe
        ("fuse.sshfs", "fuse.sshfs", PARALLEL, shape.PROBE_NONE),  # reads by offset (SFTP): no probe
        ("fuse.unknownfs", "fuse.unknownfs", SEQUENTIAL, shape.PROBE_DUE),  # an unknown FUSE client: probed
        ("fuse", "fuse", SEQUENTIAL, shape.PROBE_DUE),  # FUSE without a subtype: probed too
    ],
)
def test_mount_table_line_to_shape(tmp_path, mount_type, line_type, kind, probe):
    """A mount table line for the source's mount -> the facts -> the shape in force and the probe."""
    table = f"22 1 252:1 / / rw - ext4 /dev/vda rw\n50 22 0:60 / {tmp_path} rw - {line_type} src rw\n"
    facts = SourceFacts(source.mount_type_of(str(tmp_path / "sub"), table))
    assert facts.mount_type == mount_type
    shaper = shape.Shaper(facts)
    assert (shaper.shape.kind, shaper.probe_state) == (kind, probe)
    assert shaper.report()["shape"] == kind and shaper.report()["mount_type"] == mount_type


# -- the jump probe's plan and the shaper's states ------------------------------------------------------
def test_probe_reads_plan():
    read = shape.PROBE_READ
    assert shape.probe_reads(shape.PROBE_MIN_SIZE - 1) == []
    size = 64 * 1024 * 1024 + 5
    reads = shape.probe_reads(size)
    kinds = [kind for kind, _ in reads]
    assert kinds == [shape.START, shape.CONTINUE, shape.JUMP, shape.CONTINUE, shape.JUMP, shape.CONTINUE]
    for (kind, offset), (_, previous) in zip(reads[1:], reads[:-1], strict=True):
        assert offset % read == 0 and offset + read <= size
        if kind == shape.CONTINUE:
            assert offset == previous + read  # continues the last read on the handle
        else:
            assert abs(offset - (previous + read)) >= 16 * 1024 * 1024  # far from where the handle stands


def test_shaper_probe_lifecycle():
    shaper = shape.Shaper(SourceFacts("fuse.unknownfs"))
    assert shaper.sequential and shaper.probe_state == shape.PROBE_DUE  # in order until the probe tells
    assert shaper.provisional
    assert not shaper.claim_probe(1024 * 1024)  # too small to probe
    assert shaper.claim_probe(shape.PROBE_MIN_SIZE)
    assert shaper.provisional  # running: still only waiting for the answer
    assert not shaper.claim_probe(shape.PROBE_MIN_SIZE)  # once
    shaper.unclaim_probe()  # could not be started: due again
    assert shaper.claim_probe(shape.PROBE_MIN_SIZE)
    chosen = shaper.probed(0.0015, 0.0016)
    assert chosen.kind == PARALLEL and not shaper.sequential and not shaper.provisional
    report = shaper.report()
    assert report["probe"] == shape.PROBE_DONE
    assert (report["probe_continue_ms"], report["probe_jump_ms"]) == (1.5, 1.6)
    assert not shaper.claim_probe(shape.PROBE_MIN_SIZE)  # done

    stream = shape.Shaper(SourceFacts("fuse.unknownfs"))
    assert stream.claim_probe(shape.PROBE_MIN_SIZE)
    assert stream.probed(0.0005, 0.030).kind == SEQUENTIAL
    assert "30.0 ms" in stream.report()["reason"]
    assert stream.sequential and not stream.provisional  # settled: a stream
    assert stream.stream and not shaper.stream
    assert not shape.Shaper(SourceFacts("fuse.rclone")).provisional  # a known client needs no probe
    assert shape.Shaper(SourceFacts("fuse.rclone")).stream
    assert not shape.Shaper(SourceFacts("fuse.unknownfs")).stream  # sequential only until the probe tells


def test_shaper_stream_verdict_is_rechecked_at_later_opens():
    """A stream verdict stays in force but is probed again at the next PROBE_CONFIRMS large files'
    opens (never by a fill); the cheapest continuing read and jump of all probes decide, so one quiet
    probe undoes a verdict a busy link made (noise never makes a jump cheap)."""
    big = shape.PROBE_MIN_SIZE
    noisy = shape.Shaper(SourceFacts("fuse.unknownfs"))
    assert noisy.claim_probe(big, at_open=True, path="/a")
    assert noisy.probed(0.0008, 0.0036).kind == SEQUENTIAL  # over sshfs next to a loader, once
    assert noisy.probe_state == shape.PROBE_RECHECK
    assert noisy.stream and not noisy.provisional  # the verdict is in force meanwhile
    assert not noisy.claim_probe(big, path="/b")  # not by a fill
    assert not noisy.claim_probe(big, at_open=True, path="/a")  # nor the loader's next open of /a
    assert noisy.claim_probe(big, at_open=True, path="/b")
    noisy.unclaim_probe()  # could not be started: the recheck is due again
    assert noisy.probe_state == shape.PROBE_RECHECK
    assert noisy.claim_probe(big, at_open=True, path="/b")
    chosen = noisy.probed(0.0012, 0.0012)  # a quiet probe
    assert chosen.kind == PARALLEL and noisy.probe_state == shape.PROBE_DONE
    report = noisy.report()
    assert (report["probe_continue_ms"], report["probe_jump_ms"], report["probes"]) == (0.8, 1.2, 2)
    assert not noisy.claim_probe(big, at_open=True, path="/c")

    stream = shape.Shaper(SourceFacts("fuse.unknownfs"))
    for probe in range(1, shape.PROBE_CONFIRMS + 2):
        assert stream.claim_probe(big, at_open=True, path=f"/{probe}")
        assert stream.probed(0.0005, 0.030 + probe / 1000).kind == SEQUENTIAL
    assert stream.probe_state == shape.PROBE_DONE and stream.report()["probes"] == shape.PROBE_CONFIRMS + 1
    assert "31.0 ms" in stream.report()["reason"]  # the cheapest jump of all
    assert not stream.claim_probe(big, at_open=True, path="/other")

    failing = shape.Shaper(SourceFacts("fuse.unknownfs"))
    assert failing.claim_probe(big, path="/a") and failing.probed(0.0005, 0.030).kind == SEQUENTIAL
    assert failing.claim_probe(big, at_open=True, path="/b")
    assert failing.probe_failed("EIO (/x)").kind == SEQUENTIAL  # a recheck that fails keeps the verdict
    assert failing.probe_state == shape.PROBE_DONE and not failing.claim_probe(big, at_open=True, path="/c")


@pytest.mark.parametrize("ending", ["probed", "failed", "unclaimed"])
def test_shaper_wait_settled_wakes_when_the_running_probe_ends(ending: str) -> None:
    shaper = shape.Shaper(SourceFacts("fuse.unknownfs"))
    assert shaper.wait_settled(0)  # due, not running: nothing to wait for
    assert shaper.claim_probe(shape.PROBE_MIN_SIZE)
    assert not shaper.wait_settled(0.01)  # running: the wait times out
    end = {
        "probed": lambda: shaper.probed(0.001, 0.001),
        "failed": lambda: shaper.probe_failed("EIO (/x)"),
        "unclaimed": shaper.unclaim_probe,
    }[ending]
    timer = threading.Timer(0.05, end)
    timer.start()
    try:
        assert shaper.wait_settled(10)  # woken by the end, long before the bound
    finally:
        timer.join()
    assert shaper.probe_state != shape.PROBE_RUNNING


def test_shaper_failed_probes_settle_without_one():
    shaper = shape.Shaper(SourceFacts("fuse.unknownfs"))
    for attempt in range(1, shape.PROBE_ATTEMPTS + 1):
        assert shaper.claim_probe(shape.PROBE_MIN_SIZE)
        chosen = shaper.probe_failed("No such file or directory (/gone.bin)")
        if attempt < shape.PROBE_ATTEMPTS:
            assert shaper.probe_state == shape.PROBE_DUE and chosen.kind == SEQUENTIAL
    assert shaper.probe_state == shape.PROBE_FAILED
    assert chosen.kind == PARALLEL and "jump probe failed" in chosen.reason
    assert shaper.report()["probe_error"].startswith("No such file")
    assert not shaper.claim_probe(shape.PROBE_MIN_SIZE)


@pytest.mark.parametrize(
    ("facts", "override", "probe"),
    [
        (SourceFacts("fuse.unknownfs"), "auto", True),
        (SourceFacts("fuse.unknownfs"), "parallel", False),  # the setting decides
        (SourceFacts("fuse.rclone"), "auto", False),
        (SourceFacts("fuse.unknownfs", continue_seconds=0.001, jump_seconds=0.001), "auto", False),  # probed
        (SourceFacts("fuse.unknownfs", local=True), "auto", False),
        (SourceFacts("nfs4"), "auto", False),
    ],
)
def test_needs_probe(facts, override, probe):
    assert shape.needs_probe(facts, override) is probe


# -- the setting ----------------------------------------------------------------------------------------
def test_source_shape_setting_is_validated_and_needs_a_remount():
    assert Config().readahead.source_shape == "auto"
    for value in ("auto", "parallel", "sequential"):
        config = load_config(overrides=parse_overrides([f"readahead.source_shape={value}"]), use_default_path=False)
        assert config.readahead.source_shape == value
    with pytest.raises(ConfigError, match=r"readahead.source_shape: must be one of auto, parallel, sequential"):
        load_config(overrides=parse_overrides(["readahead.source_shape=stream"]), use_default_path=False)
    new = dataclasses.replace(Config(), readahead=dataclasses.replace(Config().readahead, source_shape="sequential"))
    assert needs_remount(Config(), new) == ["readahead.source_shape"]
    assert apply_live(Config(), new).readahead.source_shape == "auto"


@pytest.mark.parametrize(
    ("mount_type", "waste"),
    [
        ("fuse.rclone", True),  # a jump restarts a download the server reads ahead for
        ("fuse.s3fs", False),  # a jump is one ranged request, nothing dropped
        ("fuse.unknownfs", True),  # found a stream by the jump probe: assumed wasteful
        ("nfs4", True),  # sequential only by override: assumed wasteful
    ],
)
def test_jumps_waste_everywhere_but_the_cheap_jump_clients(mount_type: str, waste: bool) -> None:
    shaper = shape.Shaper(shape.SourceFacts(mount_type=mount_type), override="sequential")
    assert shaper.jumps_waste is waste
