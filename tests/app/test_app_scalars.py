"""The Scalars plot: what a framework logged (run.db's `scalars`) drawn from a picker kept per run,
and in the CSV export."""
from __future__ import annotations

import csv
import os

import numpy as np
import pytest
from app_helpers import discard
from PySide6.QtWidgets import QApplication

from engine.declarations.events import RunStarted, StepMetrics
from engine.store import RunStore


def scalar_run(path, steps: int = 12) -> str:
    """A finished run folder as an integration writes it: steps, and scalars at some of them."""
    os.makedirs(path)
    store = RunStore(str(path))
    store.set_info(status="finished", task="hf-bert", device="cpu", integration="transformers")
    store.record(RunStarted(0, 1, run_dir=str(path), task="hf-bert", device="cpu", device_name="cpu",
                            torch_version="x", world_size=1, resumed=False))
    for s in range(1, steps + 1):
        store.record(StepMetrics(s, 1, loss=1.0 / s, grad_norm=0.5, clipped=False, lr=1e-3, accum=4, clip=1.0,
                                 micro_batch=4, samples=16, tokens=16, step_time=0.01, throughput=1000.0,
                                 nonfinite=False, scaler_skipped=False))
        store.log_scalars(s, 1, {"loss": 1.0 / s, "learning_rate": 1e-3})
        if s % 4 == 0:
            store.log_scalars(s, 1, {"eval_accuracy": s / 16, "eval_f1": s / 20, "eval_loss": 2.0 / s,
                                     "eval_runtime": 0.1})
    store.log_scalars(steps + 3, 1, {"train_runtime": 9.0})  # after the last step: a row of its own
    store.close()
    return str(path)


@pytest.mark.slow
def test_scalars_plot_picker_kept_per_run_and_csv(qtbot, make_window, tmp_path):
    run = scalar_run(tmp_path / "run")
    w = make_window()
    assert w.open_run(run)
    sp = w.plots.scalars
    qtbot.waitUntil(lambda: sp.isVisible(), timeout=5000)
    assert sp.picked == ["eval_accuracy", "eval_f1", "eval_loss"]  # the evaluations' metrics, not bookkeeping
    assert [a.text() for a in sp.menu.actions()] == sorted(["eval_accuracy", "eval_f1", "eval_loss", "eval_runtime",
                                                            "learning_rate", "loss", "train_runtime"])
    x, y = sp.curve("eval_accuracy")
    assert list(y) == [0.25, 0.5, 0.75] and list(x) == list(w.plots.steps_to_x(np.array([4.0, 8.0, 12.0])))
    sp.pick("eval_f1", False)
    sp.pick("loss", True)
    w.plots.refresh(force=True)
    assert sp.curve("eval_f1")[1].size == 0 and sp.curve("loss")[1].size == 12
    out = tmp_path / "m.csv"
    assert w.export_csv(str(out)) == 13  # 12 steps and the step with scalars only
    # The pick is kept for this run: a new window opening it shows the same.
    discard(w)
    w2 = make_window()
    assert w2.open_run(run)
    qtbot.waitUntil(lambda: w2.plots.scalars.isVisible(), timeout=5000)
    assert w2.plots.scalars.picked == ["eval_accuracy", "eval_loss", "loss"]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[3]["step"] == "4" and float(rows[3]["eval_accuracy"]) == 0.25 and rows[2]["eval_accuracy"] == ""
    assert rows[-1]["step"] == "15" and float(rows[-1]["train_runtime"]) == 9.0 and rows[-1]["loss"] == ""
    assert float(rows[1]["logged_loss"]) == 0.5 and float(rows[1]["loss"]) == 0.5  # both, under their own names
    QApplication.processEvents()


@pytest.mark.slow
def test_an_engine_run_has_no_scalars_plot(qtbot, make_window, tmp_path):
    from test_window_layout import synthetic_run
    w = make_window()
    assert w.open_run(synthetic_run(tmp_path / "run"))
    w.plots.refresh(force=True)
    assert not w.plots.scalars.isVisible() and w.plots.scalars.picked == []


@pytest.mark.slow
def test_compare_draws_the_other_runs_scalars_too(qtbot, make_window, tmp_path):
    """Ticking another run in Compare overlays its loss and, dashed in the Scalars plot, its
    picked scalars on the same x axis; unticking takes both away."""
    root = tmp_path / "runs"  # the runs folder Run history lists (tests/conftest.py)
    here, other = scalar_run(root / "here"), scalar_run(root / "other", steps=8)
    w = make_window()
    assert w.open_run(here)
    sp = w.plots.scalars
    qtbot.waitUntil(lambda: sp.isVisible(), timeout=5000)
    w.history.refresh()
    w.history.set_checked(other, True)
    name = next(iter(w.plots.overlays))
    w.plots.refresh(force=True)
    x, y = sp.curve("eval_accuracy", run=name)
    assert list(y) == [0.25, 0.5] and list(x) == [4.0, 8.0]  # its own steps 4 and 8
    assert sp.curve("eval_accuracy")[1].size == 3  # and this run's own curve stays
    w.history.set_checked(other, False)
    w.plots.refresh(force=True)
    assert sp.curve("eval_accuracy", run=name)[1].size == 0 and not sp.compared
