"""follow and status on a run written through the store's API (no training): a run longer than
follow's page comes whole and in order; the store's reader methods headroom-ctl uses."""
from __future__ import annotations

from ctlkit import ctl, db_events, db_rows, records, replay, written_run

from engine.ctl.follow import PAGE
from engine.store import RunReader


def test_a_run_longer_than_a_page_follows_whole_and_in_order(tmp_path):
    run_dir = written_run(str(tmp_path / "long"), 2 * PAGE + 7)
    r = ctl("follow", run_dir, "--json")
    assert r.returncode == 0, r.stderr
    recs = records(r.stdout)
    rows, events = replay(recs)
    assert rows == db_rows(run_dir) and len(rows) == 2 * PAGE + 7
    assert events == db_events(run_dir) and recs[-2]["kind"] == "event"  # the checkpoint after the last row
    assert recs[-1] == {"kind": "end", "status": "finished", "step": 2 * PAGE + 7, "last_event": events[-1]["id"]}


def test_the_readers_tail_page_and_command_row(tmp_path):
    run_dir = written_run(str(tmp_path / "r"), 30)
    reader = RunReader(run_dir)
    try:
        assert [m["step"] for m in reader.last_metrics(3)] == [28, 29, 30]
        assert [m["step"] for m in reader.metrics(after_step=10, limit=4)] == [11, 12, 13, 14]
        assert reader.metrics(after_step=10, limit=4) == reader.metrics(after_step=10)[:4]
        assert reader.command(1) is None
    finally:
        reader.close()
    from engine.declarations.commands import SetLr
    from engine.store import send_command
    row = send_command(run_dir, SetLr(0.5, at="step"))
    reader = RunReader(run_dir)
    try:
        assert reader.command(row)["status"] == "pending" and reader.command(row)["kind"] == "set_lr"
    finally:
        reader.close()
