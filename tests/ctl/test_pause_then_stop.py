"""A stop sent to a paused run ends it, and its row says applied (issue 31: it stayed "received":
the paused wait took the stop from the inbox and settled nothing)."""
from __future__ import annotations

from ctlkit import LiveRun, ctl

from engine.store import RunReader


def test_a_stop_sent_while_paused_is_applied(tmp_path):
    run_dir = str(tmp_path / "run")
    live = LiveRun(run_dir, "--micro-batch", "64")  # 32 steps an epoch: the pause comes within seconds
    try:
        live.wait_live(rows=2)
        paused = ctl("pause", run_dir, "--wait", "--timeout", "120")
        assert paused.returncode == 0 and "paused" in paused.stdout, paused.stdout + paused.stderr
        stopped = ctl("stop", run_dir, "--wait", "--timeout", "120")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert live.proc.wait(120) == 0
    finally:
        live.end()
    with RunReader(run_dir) as reader:
        rows = {r["kind"]: r["status"] for r in reader.commands()}
        status = reader.info()["status"]
    assert rows == {"pause": "applied", "stop": "applied"}, rows
    assert status in ("stopped", "finished")
