"""The window's progress bar and ETA follow a run whose length changed while it trains (issue 32):
the engine's settings_applied for epochs or max steps, and its re-planned lr_planned, move the
run's end; the config's length is what a run that never changed counts to. Qt-free (RunModel and
ProgressTracker, as the status bar reads them)."""
from __future__ import annotations

import pytest

from app.model.epoch_progress import ProgressTracker
from app.model.notes import Note
from app.model.runmodel import RunModel


def rows(first: int, last: int, t0: float) -> list[dict]:
    """One second a step, 10 samples a step, 100 steps an epoch."""
    return [{"step": s, "epoch": 1 + (s - 1) // 100, "loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "accum": 1,
             "clip": 0.0, "micro_batch": 10, "samples": 10, "tokens": 10, "step_time": 1.0, "nonfinite": 0,
             "time": t0 + (s - first)} for s in range(first, last + 1)]


def model(config: dict, total_samples: int) -> RunModel:
    m = RunModel()
    m.ingest([Note("run_started", 0, 1, "", {"config": config}, 1000.0),
              Note("lr_planned", 0, 1, "", {"total_samples": total_samples}, 1000.0)])
    m.ingest(rows(1, 50, 1000.0), dict.get)
    return m


def changed(m: RunModel, name: str, old, new, total_samples: int) -> None:
    m.ingest([Note("settings_applied", 50, 1, "", {"changes": [[name, old, new]], "at": "step"}, 1050.0),
              Note("lr_planned", 50, 1, "", {"total_samples": total_samples, "replanned": True}, 1050.0)])


def test_epochs_extended_move_the_run_eta():
    m = model({"epochs": 2}, 2000)
    p = ProgressTracker().progress(m)
    assert p.run_eta == pytest.approx(150.0)  # 150 steps left of 2 x 100
    changed(m, "epochs", 2, 4, 4000)
    p = ProgressTracker().progress(m)
    assert p.total == 100 and p.run_eta == pytest.approx(350.0)  # the epoch's size kept, two epochs more


def test_max_steps_moves_the_bar_and_the_eta():
    m = model({"epochs": 10, "max_steps": 80, "micro_batch": 10, "accum": 1}, 800)
    tracker = ProgressTracker()
    p = tracker.progress(m)
    assert p.by_steps and p.max_steps == 80 and p.fraction == pytest.approx(50 / 80)
    changed(m, "max_steps", 80, 200, 2000)
    p = tracker.progress(m)
    assert p.max_steps == 200 and p.fraction == pytest.approx(50 / 200) and p.run_eta == pytest.approx(150.0)
