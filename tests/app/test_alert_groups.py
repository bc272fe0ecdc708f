"""Repeated alerts of one kind are one row: "Non-finite x 19", steps first-last, the latest message,
updated in place as more come (issue 28: a task non-finite every 97th micro-batch made 218 rows in
19 s). The row still zooms the plots (double-click: the latest step; its menu: the first), and the
Alerts tab comes forward, and the dock title's count changes, once for a kind, not per repeat.

One real engine run (in this process) serves the module: every 13th micro-batch of tests/app/every_97th_task.py is
NaN, with --nonfinite skip (64 steps of 4 micro-batches, 19 of them non-finite: steps 4 to 62)."""
from __future__ import annotations

import os

import pytest

from app.model.notes import Note
from engine.store import RunReader
from engine_in_process import trained

pytestmark = pytest.mark.slow
TASK = os.path.join(os.path.dirname(__file__), "every_97th_task.py")


@pytest.fixture(scope="module")
def nonfinite_run(tmp_path_factory) -> str:
    """The module's run, trained in this process (engine_in_process: no engine process to start)."""
    base = tmp_path_factory.mktemp("alerts")
    run_dir = str(base / "every-13th")
    trained(base, "--task", TASK, "--task-arg", "every=13", "--micro-batch", "8", "--epochs", "1", "--nonfinite", "skip",
            "--device", "cpu", "--run-dir", run_dir)
    return run_dir


def nonfinite_events(run_dir: str) -> list[dict]:
    reader = RunReader(run_dir)
    try:
        return reader.events(kinds=("nonfinite",))
    finally:
        reader.close()


def test_a_run_folders_repeated_alerts_are_one_row_with_count_and_steps(qtbot, make_window, nonfinite_run):
    events = nonfinite_events(nonfinite_run)
    steps = [e["step"] for e in events]
    assert len(steps) == 19 and steps[0] == 4 and steps[-1] == 62  # the run made what the test is about
    w = make_window()
    assert w.open_run(nonfinite_run)
    a = w.alerts
    assert a.kinds().count("nonfinite") == 1  # one row for the kind (was 19)
    row = a.kinds().index("nonfinite")
    assert a.table.item(row, 2).text() == "Non-finite \u00d7 19"
    assert a.table.item(row, 1).text() == "4\u201362" and a.steps(row) == (4, 62)
    assert a.table.item(row, 3).text() == events[-1]["message"]  # the latest message
    assert "first at step 4" in a.table.item(row, 1).toolTip()
    assert a.by_kind["nonfinite"] == 19 and "Non-finite: 19" in a.summary.text()
    assert a.summary.text().startswith(f"{a.total} alerts") and a.total == sum(a.by_kind.values())
    assert w.alerts_dock.windowTitle() == f"Alerts ({a.table.rowCount()})"
    # Double-click zooms the plots to the latest; the menu offers the first too.
    clicked: list[int] = []
    a.step_clicked.connect(clicked.append)
    a.table.cellDoubleClicked.emit(row, 1)
    assert clicked == [62]
    lo, hi = w.plots.parts.plot_set.loss.viewRange()[0]
    assert lo < 62 < hi and hi - lo < 40  # the window zoomed there
    menu = a.zoom_menu(row)
    texts = [act.text() for act in menu.actions()]
    assert texts == ["Zoom to the first (step 4)", "Zoom to the latest (step 62)"]
    menu.actions()[0].trigger()
    assert clicked == [62, 4]


def test_repeats_update_the_row_in_place_and_ask_for_attention_once(qtbot, make_window, nonfinite_run):
    notes = [Note.from_row(e) for e in nonfinite_events(nonfinite_run)]
    w = make_window()
    a = w.alerts
    raised: list[int] = []
    counts: list[int] = []
    a.serious_added.connect(lambda: raised.append(1))
    a.count_changed.connect(counts.append)
    signals = w.driver.signals
    signals.alerts_added.emit(notes[:1])  # the session's news, as it comes: one alert a frame
    assert a.table.rowCount() == 1 and a.table.item(0, 2).text() == "Non-finite"
    assert a.table.item(0, 1).text() == "4"
    for n in notes[1:]:
        signals.alerts_added.emit([n])
    assert a.table.rowCount() == 1  # one row, updated in place
    assert a.table.item(0, 2).text() == "Non-finite \u00d7 19" and a.table.item(0, 1).text() == "4\u201362"
    assert raised == [1] and counts == [1]  # once for the kind, not 19 times
    assert w.alerts_dock.windowTitle() == "Alerts (1)"
    other = Note("clip_saturation", 63, 1, "clipped 50 of the last 50 steps", {}, notes[-1].time)
    signals.alerts_added.emit([other])
    assert a.kinds() == ["nonfinite", "clip_saturation"] and raised == [1, 1] and counts == [1, 2]
    signals.alerts_added.emit([Note("lr_hint", 64, 1, "an lr hint", {}, notes[-1].time)])
    assert raised == [1, 1] and counts == [1, 2, 3]  # an info row is counted, but asks for no attention
    a.clear()
    assert counts[-1] == 0 and w.alerts_dock.windowTitle() == "Alerts"
    signals.alerts_added.emit(notes[:2])  # after Clear, a kind is news again
    assert a.table.item(0, 2).text() == "Non-finite \u00d7 2" and raised == [1, 1, 1]


def test_a_kinds_different_wordings_stay_readable(qtbot, make_window):
    w = make_window()
    damaged = [Note("run_damaged", 0, 0, "metrics: only the first 40 rows could be read", {}, 1.0),
               Note("run_damaged", 0, 0, "no checkpoint: this run cannot be resumed", {}, 2.0)]
    w.alerts.add(damaged)
    [(kind, step, text)] = w.alerts.rows()
    assert kind == "run_damaged" and text.splitlines() == [d.message for d in damaged]
    assert "only the first 40 rows" in w.alerts.table.item(0, 3).toolTip()
