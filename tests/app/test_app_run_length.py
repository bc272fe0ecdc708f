"""A run's length changed from the window while it trains (issue 32): the live fields hold epochs
and max steps (from the engine's declaration, like the other live settings), Apply sends the
change, the run ends at the new length and the status bar counts to it."""
from __future__ import annotations

import pytest
from app_helpers import run_to_end, start, wait_until

from app.model.epoch_progress import ProgressTracker

pytestmark = pytest.mark.slow  # a real run changed while it trains


def test_epochs_extended_from_the_window(qtbot, make_window, tmp_path):
    w = make_window()
    start(w, epochs=2, micro_batch=32, run_dir=str(tmp_path / "run"))  # 64 steps an epoch
    wait_until(qtbot, lambda: w.model.step >= 3, 90, "a few steps")
    c = w.controls
    assert c.engine["epochs"] == 2
    c.epochs.setValue(3)
    w.apply_changes()
    wait_until(qtbot, lambda: c.status_text("epochs").startswith("applied"), 90, "the new length applied")
    wait_until(qtbot, lambda: any(n.kind == "settings_applied" for n in w.model.notes), 30, "the change in the model")
    assert ProgressTracker().planned(w.model, "epochs") == 3  # what the status bar's progress and ETA count to
    outcome = run_to_end(qtbot, w)
    assert outcome["reason"] == "completed"
    assert int(w.model.metrics.view("epoch")[-1]) == 3 and w.model.step == 3 * 64
    plans = [n for n in w.model.notes if n.kind == "lr_planned"]
    assert plans[-1].data["replanned"] is True and plans[-1].data["total_samples"] == 3 * 4096
