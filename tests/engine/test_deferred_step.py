"""The sync-free step used on CUDA (fused optimizer skips bad windows on the device, the
step's numbers are read one step later), run here on CPU through HEADROOM_STEP_MODE."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.declarations.config import TrainConfig
from engine.declarations.events import NonFinite, StepMetrics
from engine.tasks.task import Task
from engine.trainer.trainer import Trainer


def task(nan_at: set[int]) -> Task:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(96, 6, generator=g)
    y = torch.randint(0, 3, (96,), generator=g)
    state = {"window": 0}

    def loss(m, batch):
        xb, yb = batch
        s = F.cross_entropy(m(xb), yb, reduction="sum")
        if m.training and state["window"] in nan_at:
            s = s * float("nan")
        return s, len(yb)

    t = Task(model=model, train_data=torch.utils.data.TensorDataset(x, y), loss=loss,
             optimizer=lambda p, lr: torch.optim.AdamW(p, lr=lr, fused=True), name="fused")
    t.state = state  # type: ignore[attr-defined]  # a test-only attribute on the Task
    return t


def run(tmp_path, monkeypatch, mode: str, nan_at=frozenset()):
    monkeypatch.setenv("HEADROOM_STEP_MODE", mode)
    tk = task(set(nan_at))
    events, weights = [], {}
    trainer = Trainer(TrainConfig(run_dir=str(tmp_path / mode), micro_batch=8, accum=2, epochs=2, lr=0.05, clip=0.5),
                      task=tk, sink=events.append)
    original = trainer.train_window

    def counting(micro, n):  # snapshot the weights before each window, and tell the task which one runs
        tk.state["window"] = trainer.step + 1
        weights[trainer.step] = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
        return original(micro, n)

    trainer.train_window = counting
    trainer.run()
    weights[trainer.step] = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
    assert trainer.deferred == (mode == "deferred")
    return trainer, events, weights


def test_deferred_equals_sync(tmp_path, monkeypatch):
    t_sync, ev_sync, w_sync = run(tmp_path, monkeypatch, "sync")
    t_def, ev_def, w_def = run(tmp_path, monkeypatch, "deferred")
    steps_sync = [e for e in ev_sync if isinstance(e, StepMetrics)]
    steps_def = [e for e in ev_def if isinstance(e, StepMetrics)]
    assert [e.step for e in steps_def] == list(range(1, 13))  # every step reported, in order, once
    for a, b in zip(steps_sync, steps_def):
        assert (a.loss, a.grad_norm, a.clipped, a.tokens) == (b.loss, b.grad_norm, b.clipped, b.tokens)
    assert torch.equal(w_sync[12], w_def[12])
    # Epoch ends come after all of the epoch's steps were reported.
    kinds = [e.kind for e in ev_def if e.kind in ("step", "epoch_end")]
    assert kinds.index("epoch_end") == 6 and kinds[-1] == "epoch_end"


def test_deferred_nan_skip_is_on_the_device_and_bit_identical(tmp_path, monkeypatch):
    trainer, events, weights = run(tmp_path, monkeypatch, "deferred", nan_at={3, 8})
    nonfinite = [e for e in events if isinstance(e, NonFinite)]
    assert [e.step for e in nonfinite] == [3, 8] and all(e.params for e in nonfinite)
    steps = {e.step: e for e in events if isinstance(e, StepMetrics)}
    assert steps[3].nonfinite and math.isnan(steps[3].loss)
    assert torch.equal(weights[2], weights[3])  # window 3 changed no weight
    assert not torch.equal(weights[3], weights[4])
    assert trainer.nonfinite_steps == 2
    # Optimizer state skipped too: a run whose bad windows were never there would differ only
    # by data, so compare step counts: AdamW's own step counter excludes the two skipped windows.
    state = trainer.optimizer.state[next(iter(trainer.model.parameters()))]
    assert int(state["step"]) == 12 - 2


def test_deferred_nonfinite_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADROOM_STEP_MODE", "deferred")
    tk = task({5})
    tk.state["window"] = 0
    trainer = Trainer(TrainConfig(run_dir=str(tmp_path / "stop"), micro_batch=8, accum=2, epochs=2, nonfinite="stop"),
                      task=tk)
    original = trainer.train_window

    def counting(micro, n):
        tk.state["window"] = trainer.step + 1
        return original(micro, n)

    trainer.train_window = counting
    result = trainer.run()
    assert result.reason == "nonfinite"
    from engine.checkpoints.files import last_path, load
    state = load(last_path(str(tmp_path / "stop")))
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    # Step 5 is known bad only once step 6 was launched (numbers are read a step late); step 6
    # was a good step, so the saved weights are still the last good ones.
    assert state["step"] == 6 and result.steps == 6
