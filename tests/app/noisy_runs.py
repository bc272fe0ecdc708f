"""Finished run folders the hover, smoothing, compare and marker tests look at, written through the
engine's run store (real SQLite, no torch): a noisy loss with validation per epoch, optionally
non-finite steps, setting changes and a continue (resume) as the engine records them."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from engine.declarations.events import EpochEnd, RunStarted, SettingsApplied, StepMetrics
from engine.store import RunStore


def started(run_dir: Path, step: int, resumed: bool) -> RunStarted:
    """run_started as engine/loop/opening.py writes it (a resume: at the checkpoint's step, resumed)."""
    return RunStarted(step, 1, run_dir=str(run_dir), task="mlp", device="cpu", device_name="cpu",
                      torch_version="-", world_size=1, resumed=resumed, config={"task": "mlp", "epochs": 3})


def write_run(path: Path, steps: int = 120, scale: float = 1.0, seed: int = 0, per_epoch: int = 40,
              nonfinite_every: int = 0, changes_at: Sequence[int] = (), resumed_at: Sequence[int] = ()) -> str:
    """A finished run: loss ~ scale * 2 / (1 + step/20), noisy; grad norm, lr, throughput per step;
    validation loss at each epoch's end. Every `nonfinite_every`th step is non-finite (its loss NaN
    and inf in turn); a settings change after each step of `changes_at`; the run continued (a
    resume) from each step of `resumed_at`."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    store = RunStore(str(path))
    store.set_info(status="finished", task="mlp", device="cpu", config={"task": "mlp", "epochs": 3})
    store.record(started(path, 0, False))
    accum = 4
    for s in range(1, steps + 1):
        if s - 1 in resumed_at:
            store.record(started(path, s - 1, True))
        bad = bool(nonfinite_every) and s % nonfinite_every == 0
        loss = scale * 2.0 / (1 + s / 20) * (1 + 0.15 * rng.standard_normal())
        if bad:
            loss = math.nan if (s // nonfinite_every) % 2 else math.inf
        store.record(StepMetrics(s, 1 + (s - 1) // per_epoch, loss=loss, grad_norm=scale * (0.5 + rng.random()),
                                 clipped=False, lr=1e-3 * scale, accum=accum, clip=1.0, micro_batch=16,
                                 samples=16 * accum, tokens=16 * accum, step_time=0.01,
                                 throughput=1000.0 * scale + 50 * rng.standard_normal(), nonfinite=bad,
                                 scaler_skipped=False))
        if s in changes_at:
            store.record(SettingsApplied(s, 1, changes=(("accum", accum, accum + 1),), at="step", from_step=s + 1))
            accum += 1
        if s % per_epoch == 0:
            store.record(EpochEnd(s, s // per_epoch, train_loss=2.0, val_loss=scale * 2.4 / (1 + s / 20), seconds=1.0))
    store.close()
    return str(path)
