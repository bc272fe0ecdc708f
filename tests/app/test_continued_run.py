"""A continued run is one run: Run history shows its first start and the time all its segments
trained, the status bar's elapsed time counts every segment (viewed, and while the window
continues it), and a segment whose process died ends at its last row. Before, a run continued
with --resume showed its last segment: its start, its duration, an elapsed time from 0.

One real run serves the module: 10 steps, then --resume to step 20 (two engine runs, two segments,
in this process).
Its first segment is then moved to two hours earlier and made ten minutes long (its events' and
rows' times), as a run trained for ten minutes and continued after lunch."""
from __future__ import annotations

import os
import sqlite3
import time

import pytest
from app_helpers import run_to_end, wait_until

from app.core.runs import summarize
from app.model.epoch_progress import fmt_duration
from app.model.run_time import Mark, run_time
from app.model.state import RunState
from app.ui.runs.run_columns import INDEX as COL
from engine_in_process import trained as engine_run

pytestmark = pytest.mark.slow
EARLIER, LONGER = 7200.0, 600.0  # the first segment: two hours before, ten minutes longer


def segment_times(run_dir: str) -> list[tuple[str, float]]:
    db = sqlite3.connect(os.path.join(run_dir, "run.db"))
    try:
        return db.execute("SELECT kind, time FROM events WHERE kind IN ('run_started', 'run_finished') "
                          "ORDER BY id").fetchall()
    finally:
        db.close()


@pytest.fixture(scope="module")
def continued(tmp_path_factory) -> str:
    """The module's run (see the docstring above), both segments trained in this process (engine_in_process)."""
    base = tmp_path_factory.mktemp("continued")
    run_dir = str(base / "run")
    engine_run(base, "--task", "mlp", "--micro-batch", "16", "--epochs", "2", "--max-steps", "10", "--device", "cpu",
               "--run-dir", run_dir)
    engine_run(base, "--resume", run_dir, "--max-steps", "20", "--device", "cpu")
    db = sqlite3.connect(os.path.join(run_dir, "run.db"))
    with db:
        (second,) = db.execute("SELECT min(id) FROM events WHERE kind = 'run_started' AND id > "
                               "(SELECT min(id) FROM events WHERE kind = 'run_started')").fetchone()
        (resumed_at,) = db.execute("SELECT time FROM events WHERE id = ?", (second,)).fetchone()
        db.execute("UPDATE events SET time = time - ? WHERE id < ?", (EARLIER, second))
        db.execute("UPDATE events SET time = time - ? WHERE kind = 'run_started' AND id < ?", (LONGER, second))
        for table in ("metrics", "discarded_metrics", "epochs"):
            db.execute(f"UPDATE {table} SET time = time - ? WHERE time < ?", (EARLIER, resumed_at))
    db.close()
    return run_dir


def trained(run_dir: str) -> tuple[float, float]:
    """The first start and the seconds both segments trained, from the events themselves."""
    (s1, t1), (e1, f1), (s2, t2), (e2, f2) = segment_times(run_dir)
    assert (s1, e1, s2, e2) == ("run_started", "run_finished") * 2
    return t1, (f1 - t1) + (f2 - t2)


def test_run_history_shows_the_first_start_and_the_time_all_segments_trained(qtbot, make_window, continued):
    first, seconds = trained(continued)
    assert seconds > LONGER
    w = make_window()
    w.history.add_extra(continued)
    w.history.refresh()
    item = w.history.item_for(continued)
    assert item.text(COL["started"]) == time.strftime("%m-%d %H:%M", time.localtime(first))  # was the second start
    assert item.text(COL["duration"]) == fmt_duration(seconds)  # was the second segment's few seconds
    assert item.toolTip(COL["duration"]).startswith("Continued 1 time (--resume): trained ")
    assert item.text(COL["steps"]) == "20" and item.text(COL["status"]) == "Reached max steps"


def test_a_segment_whose_process_died_ends_at_its_last_row(tmp_path, continued):
    import shutil
    run_dir = str(tmp_path / "crashed")
    shutil.copytree(continued, run_dir)
    db = sqlite3.connect(os.path.join(run_dir, "run.db"))
    with db:  # the first engine was killed: it wrote its rows, not its end
        db.execute("DELETE FROM events WHERE id = (SELECT min(id) FROM events WHERE kind = 'run_finished')")
        (last_row,) = db.execute("SELECT max(time) FROM metrics WHERE step <= 10").fetchone()
    db.close()
    r = summarize(run_dir)
    rt = run_time(Mark(*m) for m in r.marks)
    (_k, s1), (_k2, s2), (_k3, f2) = segment_times(run_dir)
    assert [(s.started, s.ended) for s in rt.segments] == [(s1, last_row), (s2, f2)]
    assert rt.seconds() == pytest.approx((last_row - s1) + (f2 - s2))


def test_the_elapsed_time_counts_every_segment_viewed_and_continued(qtbot, make_window, continued, tmp_path):
    import shutil
    _first, seconds = trained(continued)
    w = make_window()
    assert w.open_run(continued)
    w.views.update_status()
    assert w.status.elapsed.text() == f"elapsed {fmt_duration(seconds)}"  # was the second segment's
    # Continue run (the window's own engine, --resume): the clock goes on from there, not from 0.
    run_dir = str(tmp_path / "again")
    shutil.copytree(continued, run_dir)
    assert w.open_run(run_dir)
    w.controls.set_values({"max_steps": 200})  # it stopped at its step limit (20): a longer one, as a user gives
    assert w.continue_run(run_dir), w.last_error
    wait_until(qtbot, lambda: w.session.state is RunState.TRAINING and w.model.step > 20, 90, "the continued steps")
    w.views.update_status()
    shown = w.status.elapsed.text().removeprefix("elapsed ")
    clock = 0
    for part in shown.split(":"):  # m:ss or h:mm:ss
        clock = clock * 60 + int(part)
    assert clock >= int(seconds), shown
    w.stop_run()
    run_to_end(qtbot, w)
