"""Alerts: one row per kind (its count, first and latest step, messages), with time and details; never a dialog."""
from __future__ import annotations

import pytest
from app_helpers import run_to_end, start
from app_tasks import tiny_task


@pytest.mark.slow
def test_nan_task_raises_alert_entries_and_marks_the_steps(qtbot, make_window, tmp_path):
    # 1024 samples / (64 x 2) = 8 steps an epoch. Loss calls 5 and 12 are NaN: steps 3 and 6.
    task = tiny_task(tmp_path, n=1024, bad_calls=(5, 12))
    w = make_window()
    start(w, task=task, epochs=7, clip=1e-4, run_dir=str(tmp_path / "run"))
    outcome = run_to_end(qtbot, w, 90)
    assert outcome["reason"] == "completed"
    rows = w.alerts.rows()
    [nonfinite] = [msg for kind, _step, msg in rows if kind == "nonfinite"]  # both steps, one row
    assert w.alerts.steps(w.alerts.kinds().index("nonfinite")) == (3, 6) and w.alerts.by_kind["nonfinite"] == 2
    assert "skipped" in nonfinite and "0.weight" in nonfinite, nonfinite
    # 56 steps, every finite one clipped at 1e-4: the engine warns once, when its window holds
    # 50 finite steps: step 52 (steps 3 and 6 were skipped).
    saturation = [step for kind, step, _m in rows if kind == "clip_saturation"]
    assert saturation == [52]
    assert w.alerts.summary.text().startswith(f"{w.alerts.total} alerts") and w.alerts.total == 2 + len(rows) - 1
    assert not w.dialogs  # alerts go to the panel, not into dialogs
    # The non-finite steps are marked on the loss and norm plots, where they happened.
    marked = sorted({line.value() for _plot, line in w.plots.parts.marks.nonfinite_lines})
    assert marked == [3, 6]
    assert len(w.plots.parts.marks.nonfinite_lines) == 4
    assert list(w.model.metrics.nonfinite_steps) == [3, 6]
    # Table columns: time, step, alert, details.
    assert w.alerts.table.item(0, 0).text().count(":") == 2


@pytest.mark.slow
def test_batchnorm_small_batch_alert(qtbot, make_window, tmp_path):
    w = make_window()
    start(w, task="cnn-bn", micro_batch=8, accum=1, max_steps=1, epochs=1, run_dir=str(tmp_path / "run"))
    run_to_end(qtbot, w, 90)
    assert "batchnorm_small_batch" in w.alerts.kinds()
    assert w.alerts_dock.windowTitle().startswith("Alerts (")
