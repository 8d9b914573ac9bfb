"""The network sources' spec options (benchmarks/benchkit/netsources.py), without starting a client."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from benchkit.netsources import NetOptions, s3fs_source, sshfs_source  # noqa: E402


def test_options_parse() -> None:
    o = NetOptions.parse("delay=2,keep=1,dircache=1")
    assert (o.delay_ms, o.keep_client, o.dir_cache_s, o.subtype) == (2.0, True, 1.0, "")
    assert "directory cache 1 s" in o.describe()
    assert NetOptions.parse("").dir_cache_s is None  # the client's own default


@pytest.mark.parametrize("text", ["dircache=-1", "dircache=x", "delay=-2"])
def test_bad_values_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bad value"):
        NetOptions.parse(text)


def test_an_unknown_option_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="dircache=S"):
        NetOptions.parse("cache=1")


@pytest.mark.parametrize("source", [sshfs_source, s3fs_source])
def test_dircache_is_rclones_alone(source, tmp_path) -> None:
    with (
        pytest.raises(ValueError, match="rclone's mount only"),
        source(str(tmp_path), str(tmp_path / "m"), NetOptions(dir_cache_s=1)),
    ):
        pass
