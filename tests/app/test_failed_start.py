"""A Start that fails (a task file that does not load) keeps the last run on the plots, under
its name, and the form as the user filled it."""
from __future__ import annotations

import pytest
from app_helpers import run_to_end, start
from app_tasks import broken_task
from test_window_layout import synthetic_run


@pytest.mark.slow
def test_a_failed_start_keeps_the_last_runs_plots(qtbot, make_window, tmp_path):
    shown = synthetic_run(tmp_path / "runs" / "last-run")
    w = make_window()
    assert w.open_run(shown)
    assert w.model.step == 120 and "last-run" in w.windowTitle()
    bad = broken_task(tmp_path)
    start(w, task=bad)
    outcome = run_to_end(qtbot, w, 60)
    assert outcome["status"] == "bad_input" and w.last_error[0] == "Could not start the run"
    assert w.model.step == 120 and len(w.model.metrics) == 120  # the plots still show it
    x, _y = w.plots.curve_data("loss")
    assert len(x) and x[-1] == 120
    assert "last-run" in w.windowTitle()
    assert w.controls.task_spec() == bad  # the form keeps what was being started
