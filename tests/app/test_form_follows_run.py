"""The Controls panel holds the settings of the run shown (marked as such), "My settings" and
"Reset to defaults" put the user's or the engine's back, and a lr the engine lowered by itself
(a rollback) does not become the next run's lr."""
from __future__ import annotations

import pytest
from app_helpers import run_to_end, start
from test_app_run_tree import DIVERGING, ROLLBACK_ARGS

from engine.declarations.config import TrainConfig
from engine.declarations.events import RunStarted, StepMetrics
from engine.store import RunStore


def finished_run(path, config: dict) -> str:
    path.mkdir(parents=True)
    store = RunStore(str(path))
    full = {**TrainConfig().to_dict(), **config}
    store.set_info(status="finished", task=full["task"], device="cpu", config=full)
    store.record(RunStarted(0, 1, run_dir=str(path), task=full["task"], device="cpu", device_name="cpu",
                            torch_version="x", world_size=1, resumed=False, config=full))
    for s in range(1, 11):
        store.record(StepMetrics(s, 1, loss=1.0 / s, grad_norm=1.0, clipped=False, lr=full["lr"], accum=full["accum"],
                                 clip=full["clip"], micro_batch=full["micro_batch"], samples=64, tokens=64,
                                 step_time=0.01, throughput=1.0, nonfinite=False, scaler_skipped=False))
    store.close()
    return str(path)


def form(w) -> dict:
    values, err = w.controls.values()
    assert values is not None, err
    return values


@pytest.mark.slow
def test_a_viewed_run_shows_its_settings_marked_and_the_users_come_back(qtbot, make_window, tmp_path):
    run = finished_run(tmp_path / "five-epochs", {"task": "mlp", "epochs": 5, "lr_schedule": "constant", "warmup": 0.0,
                                                  "micro_batch": 32, "accum": 2, "lr": 0.003, "clip": 2.0})
    w = make_window()
    w.controls.set_values({"epochs": 100, "lr_schedule": "cosine", "warmup": 0.1, "micro_batch": 16, "accum": 4,
                           "lr": 0.001})
    assert w.open_run(run)
    shown = form(w)
    assert (shown["epochs"], shown["lr_schedule"], shown["micro_batch"], shown["accum"], shown["lr"]) == \
        (5, "constant", 32, 2, 0.003)
    banner = w.form_sync.banner
    assert banner.label.isVisible() and "five-epochs" in banner.label.text() and "started with" in banner.label.text()
    banner.mine.click()  # the user's settings back
    mine = form(w)
    assert (mine["epochs"], mine["lr_schedule"], mine["micro_batch"], mine["accum"], mine["lr"]) == \
        (100, "cosine", 16, 4, 0.001)
    assert not banner.label.isVisible()
    banner.reset.click()
    d, default = form(w), TrainConfig()
    assert (d["epochs"], d["lr_schedule"], d["micro_batch"], d["accum"], d["lr"], d["clip"]) == \
        (default.epochs, default.lr_schedule, default.micro_batch, default.accum, default.lr, default.clip)


@pytest.mark.slow
def test_a_rollbacks_lower_lr_is_not_the_next_runs_lr(qtbot, make_window, tmp_path):
    task = DIVERGING  # tests/engine/diverging_task.py
    w = make_window()
    w.base_config.update(checkpoint_every=2, nonfinite="rollback", rollback_lr_factor=0.5)
    start(w, task=str(task), run_dir=str(tmp_path / "roll"), **ROLLBACK_ARGS)
    run_to_end(qtbot, w)
    assert w.model.rollbacks, "the run rolled back"
    assert w.model.rollbacks[0].new_lr < ROLLBACK_ARGS["lr"]
    assert form(w)["lr"] == ROLLBACK_ARGS["lr"]  # the lr the user set, not the rollback's
