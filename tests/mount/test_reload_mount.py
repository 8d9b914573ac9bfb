"""Real-mount tests of live reload (the table and the engine side are tests/engine/test_reload.py)."""

from __future__ import annotations

from conftest import SERVED

MIB = 1024 * 1024


def test_sighup_reports_what_did_not_apply(tmp_path):
    import signal

    from conftest import mounted, wait_for

    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    (src / "f").write_bytes(b"x" * 5000)
    with mounted(src, mnt, options=[SERVED], config_text="cache:\n  budget: 32M\n") as m:
        args = list(m.proc.args)
        config = args[args.index("--config") + 1]
        with open(config, "w") as f:
            f.write("cache:\n  budget: 48M\nreadahead:\n  learn: false\n  max_window: 32M\n")
        m.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "reloaded; needs restart:" in m.log()), m.log()
        line = [x for x in m.log().splitlines() if "reloaded; needs restart:" in x][-1]
        assert line.rstrip().endswith("needs restart: readahead.learn"), line
        assert wait_for(lambda: m.stats()["gauges"]["cache_budget"] == 48 * MIB), m.stats()["gauges"]
        assert (mnt / "f").read_bytes() == b"x" * 5000
