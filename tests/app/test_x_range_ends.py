"""The x axis of an ended run ends at its last step: after accumulation was raised, the room a
live run keeps ahead of it read as steps still to come that never would."""
from __future__ import annotations

import pytest
from test_marker_labels import run_with_a_late_change


@pytest.mark.slow
def test_an_ended_run_is_drawn_to_its_last_step_and_a_live_one_has_room(qtbot, make_window, tmp_path):
    w = make_window()
    assert w.open_run(run_with_a_late_change(tmp_path / "late"))  # 120 steps, accum 4 -> 8 at 110
    p = w.plots
    qtbot.wait(50)
    p.refresh(force=True)
    (x0, x1), _ = p.parts.plot_set.loss.getViewBox().viewRange()
    assert x0 == 0 and 120 <= x1 <= 122, x1  # to the last step (a marker's width past it)
    p.set_live(True)  # as while the run trains: room to grow into (negative control)
    (x0, x1), _ = p.parts.plot_set.loss.getViewBox().viewRange()
    assert x1 >= 140, x1
    p.set_live(False)
    (x0, x1), _ = p.parts.plot_set.loss.getViewBox().viewRange()
    assert 120 <= x1 <= 122, x1
