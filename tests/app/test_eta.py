"""The ETA around a pause: while paused the status bar says the clock is stopped (not "ETA after
epoch 1"), after it the pace is the steps' own (a pause between two steps does not triple the
ETA); a run stopped mid-epoch says so beside the epoch's share."""
from __future__ import annotations

import pytest
from app_helpers import LONG_EPOCHS, run_to_end, start, wait_until

from app.model.epoch_progress import seconds_per_window
from app.model.notes import Note
from app.model.runmodel import RunModel
from app.model.state import RunState


def rows(first: int, last: int, t0: float, every: float) -> list[dict]:
    return [{"step": s, "epoch": 1 + (s - 1) // 100, "loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "accum": 1, "clip": 0.0,
             "micro_batch": 10, "samples": 10, "tokens": 10, "step_time": 0.5, "nonfinite": 0,
             "time": t0 + (s - first) * every} for s in range(first, last + 1)]


def paused_model() -> RunModel:
    m = RunModel()
    m.ingest([Note("run_started", 0, 1, "", {"config": {"epochs": 3}}, 1000.0),
              Note("lr_planned", 0, 1, "", {"total_samples": 3000}, 1000.0)])
    m.ingest(rows(1, 30, 1000.0, 1.0), dict.get)
    m.ingest(rows(31, 45, 1000.0 + 29 + 600.0, 1.0), dict.get)  # ten minutes paused between steps 30 and 31
    return m


@pytest.mark.slow
def test_a_pause_does_not_change_the_pace_and_a_paused_run_says_so(qtbot, make_window):
    m = paused_model()
    assert abs(seconds_per_window(m) - 1.0) < 1e-9  # one second a step, the pause aside
    w = make_window()
    w.status.update_from(m, RunState.TRAINING, "Training")
    eta = w.status.eta.text()
    # 300 steps planned (3 epochs x 100), 45 done: about 255 s to go, not ten times that.
    minutes, seconds = eta.removeprefix("ETA ").split(":")
    assert 240 <= int(minutes) * 60 + int(seconds) <= 270, eta
    w.status.update_from(m, RunState.PAUSED, "Paused after epoch 1")
    assert w.status.eta.text() == "ETA: paused"
    assert w.status.epoch_text.text().endswith("paused")


@pytest.mark.slow
def test_a_run_stopped_mid_epoch_says_it_stopped_there(qtbot, make_window, tmp_path):
    w = make_window()
    start(w, epochs=2, **LONG_EPOCHS, run_dir=str(tmp_path / "run"))
    wait_until(qtbot, lambda: w.model.step >= 4, 90, "a few steps")
    w.stop_run()
    run_to_end(qtbot, w)
    w.views.update_status()
    text = w.status.epoch_text.text()
    assert text.startswith("epoch 1: ") and not text.startswith("epoch 1: 100%") and text.endswith("stopped"), text
