"""A setting marker's label stays inside its plot: near the right edge it is drawn to the left
of its line (it was cut: "accum 4->")."""
from __future__ import annotations

import pytest

from engine.declarations.events import SettingsApplied, StepMetrics
from engine.store import RunStore


def run_with_a_late_change(path) -> str:
    path.mkdir(parents=True)
    store = RunStore(str(path))
    store.set_info(status="finished", task="mlp", device="cpu")
    for s in range(1, 121):
        store.record(StepMetrics(s, 1, loss=1.0 / s, grad_norm=1.0, clipped=False, lr=1e-3, accum=4 if s <= 110 else 8,
                                 clip=1.0, micro_batch=16, samples=64, tokens=64, step_time=0.01, throughput=1.0,
                                 nonfinite=False, scaler_skipped=False))
    store.record(SettingsApplied(110, 1, changes=(("accum", 4, 8),), at="step", from_step=111))
    store.close()
    return str(path)


@pytest.mark.slow
def test_a_marker_label_near_the_right_edge_stays_inside(qtbot, make_window, tmp_path):
    w = make_window()
    assert w.open_run(run_with_a_late_change(tmp_path / "late"))
    p = w.plots
    p.follow = False  # as after zooming with the mouse
    p.parts.plot_set.loss.setXRange(0, 112, padding=0)  # the marker (110.5) close to the right edge
    qtbot.wait(50)
    lines = [line for plot, line in p.parts.marks.marker_lines if plot is p.parts.plot_set.loss]
    assert lines
    label = lines[0].label
    label.updatePosition()
    assert "accum" in label.toPlainText()
    view = p.parts.plot_set.loss.getViewBox().sceneBoundingRect()
    box = label.sceneBoundingRect()
    assert box.right() <= view.right() + 1 and box.left() >= view.left() - 1, (box, view)
