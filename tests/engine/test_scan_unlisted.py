"""Over a client whose listing asks about every entry (s3fs), a scan starts only in a directory listed on
this mount before (``Scanner._may_list``).

s3fs answers a listing with a HEAD of every object its stat cache lacks. A reader that knows its names
without listing (an index file, a sampler's share) and reads a tenth of a directory of 10,000 would
have its scan list all of them: over s3fs on moto (2 ms one-way delay) the first tenth in name order
took 41.96 s through fastfs against 23.77 s directly. A reader that lists the directory itself pays
that listing either way, and its scan then costs the client nothing more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from scanfiles import body, counter, make_files, read, scan_engine, settle

from fastfs.fsio import stats as m

FILES = 200
READ = 40  # the reader's files, in name order: well past the scan trigger


@pytest.mark.parametrize("mount_type", ["", "fuse.s3fs"])
def test_a_scan_over_a_per_entry_listing_client_waits_for_the_readers_listing(tmp_path: Path, mount_type: str) -> None:
    make_files(tmp_path / "src" / "d", FILES)
    engine = scan_engine(tmp_path)
    try:
        engine.source.mount_type = mount_type
        for i in range(READ):
            read(engine, f"/d/f{i:05d}", body(i))
        fetched = settle(engine)
        counters = engine.snapshot()["counters"]
        if mount_type == "fuse.s3fs":
            assert fetched == 0 and counters.get(m.SOURCE_LISTINGS, 0) == 0, counters  # (no HEAD of every object)
            assert counters.get(m.SCAN_UNLISTED, 0) == 1, counters  # (counted once, not per open)
            assert counters.get(m.SCANS, 0) == 0, counters
            # the reader lists the directory (the client learns every entry): its next opens are scanned
            assert len(engine.listing("/d")) == FILES
            for i in range(READ, 2 * READ):
                read(engine, f"/d/f{i:05d}", body(i))
            assert settle(engine) > 0
            counters = engine.snapshot()["counters"]
            assert counters.get(m.SCANS, 0) == 1, counters
        else:
            assert fetched > 0 and counters.get(m.SCAN_UNLISTED, 0) == 0, counters
            assert counters.get(m.SOURCE_LISTINGS, 0) >= 1, counters  # (the scan's own)
        for i in range(2 * READ, FILES):
            read(engine, f"/d/f{i:05d}", body(i))
        assert counter(engine, m.SCAN_UNLISTED) == (1 if mount_type else 0)
    finally:
        engine.close()
