"""The source shape: override, local sources, known stream-oriented clients, the jump probe."""

from __future__ import annotations

import pytest

from fastfs.fsio import shape
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
