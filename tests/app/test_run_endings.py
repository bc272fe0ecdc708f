"""How a run ended, said the same way in the status bar, the alerts and the run history
(completed, stopped, gave up, failed), and "Continue run" for a run with a checkpoint."""
from __future__ import annotations

import pytest
from app_helpers import LONG_EPOCHS, discard, run_to_end, start, wait_until
from test_app_run_tree import DIVERGING

from app.ui.runs.run_columns import INDEX as COL


def history_row(w, path: str):
    w.history.refresh()
    item = w.history.item_for(path)
    assert item is not None, path
    return item


def ended_alerts(w) -> list[str]:
    return [text for kind, _step, text in w.alerts.rows() if kind == "run_ended"]


@pytest.mark.slow
def test_a_stopped_run_says_stopped_and_continues_from_the_app(qtbot, make_window, tmp_path):
    run = str(tmp_path / "stopped")
    w = make_window()
    start(w, epochs=2, **LONG_EPOCHS, run_dir=run)
    wait_until(qtbot, lambda: w.model.step >= 5, 90, "a few steps")
    w.stop_run()
    run_to_end(qtbot, w)
    stopped_at = w.model.step
    assert stopped_at < 256
    assert w.status.state.text() == "Stopped"
    assert any("stopped by hand" in t for t in ended_alerts(w))
    row = history_row(w, run)
    assert row.text(COL["status"]) == "Stopped" and "can be continued" in row.toolTip(COL["status"])
    assert row.text(COL["steps"]) == f"{stopped_at:,}"
    assert "stopped" in w.controls.run_state.text().lower()
    # Continue run: the same folder, from the checkpoint, to the end.
    assert w.continue_action.isEnabled()
    w.continue_action.trigger()
    assert w.is_running()
    run_to_end(qtbot, w)
    steps = list(w.model.metrics.view("step").astype(int))
    assert steps == list(range(1, 257))  # the first steps kept, the rest trained once, no gap
    assert w.status.state.text() == "Completed"
    assert history_row(w, run).text(COL["status"]) == "Completed"
    assert not w.continue_action.isEnabled() or w.views.continuable() == run


@pytest.mark.slow
def test_a_run_that_gives_up_says_why_in_the_alerts_status_and_history(qtbot, make_window, tmp_path):
    task = DIVERGING  # tests/engine/diverging_task.py
    run = str(tmp_path / "gave-up")
    w = make_window()
    w.base_config.update(checkpoint_every=2, nonfinite="rollback")
    start(w, task=str(task), run_dir=run, epochs=1, micro_batch=8, accum=2, lr=0.01,
          task_args={"bad_from": 7, "bad_until": 10_000, "dropout": 0})  # never gets past step 7
    outcome = run_to_end(qtbot, w)
    assert outcome["reason"] == "nonfinite"
    assert w.status.state.text() == "Gave up"
    said = ended_alerts(w)
    assert said and "gave up after" in said[-1] and "rollbacks in a row" in said[-1]
    row = history_row(w, run)
    assert row.text(COL["status"]) == "Gave up" and "gave up after" in row.toolTip(COL["status"])
    # The same words for the folder opened in another window.
    discard(w)
    w2 = make_window()
    assert w2.open_run(run)
    assert w2.status.state.text() == "Viewing (gave up)"
    assert any("gave up after" in t for t in ended_alerts(w2))
