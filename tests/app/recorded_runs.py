"""Finished run folders for the plot tests, written through the engine's run store (real SQLite, no
torch, a few ms each), as the engine records them:

- plot_run: a validation loss well above the training loss, an lr that decays within a decade, a
  gradient norm over three decades (the log scale and range tests);
- gpu_run: a CUDA run's device memory and memory by kind every step;
- write_run: a noisy loss with validation per epoch, optionally non-finite steps, setting changes
  and continues (resumes): the hover, smoothing, compare and marker tests."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from engine.declarations.events import EpochEnd, RunFinished, RunStarted, SettingsApplied, StepMetrics
from engine.store import RunStore


def plot_run(run_dir: Path, steps: int = 120, epochs: int = 3, val_loss: float = 8.0, scale: float = 1.0,
             parent: Optional[dict[str, Any]] = None) -> str:
    """A finished CPU run whose validation loss (`val_loss`) sits well above its training loss
    (1.55 falling to 0.05, times `scale`), whose lr decays within a decade (1e-4 to 8e-5: log
    ticks between two decades) and whose gradient norm spans three decades; accum 2 -> 4 half way;
memory by kind as a CPU run records it. `parent`: the run
    table's record of a fork ({run_dir, checkpoint, step, changed})."""
    run_dir.mkdir(parents=True, exist_ok=True)
    store = RunStore(str(run_dir))
    cfg = {"task": "mlp", "micro_batch": 64, "accum": 2, "lr": 1e-4, "clip": 0.0, "epochs": epochs, "device": "cpu"}
    store.set_info(config=cfg, task="mlp", device="cpu", device_name="cpu", world_size=1, status="finished", pid=1,
                   started=time.time() - 60, **({"parent": parent} if parent else {}))
    store.record(RunStarted(0, 1, run_dir=str(run_dir), task="mlp", device="cpu", device_name="cpu",
                            torch_version="-", world_size=1, resumed=False, config=cfg))
    per_epoch = steps // epochs
    for s in range(1, steps + 1):
        e = min(epochs, 1 + (s - 1) // per_epoch)
        loss = scale * (0.05 + 1.5 * math.exp(-s / 30))
        store.record(StepMetrics(s, e, loss=loss, grad_norm=10 ** (-1 + 3 * ((s * 7) % 11) / 10), clipped=False,
                                 lr=1e-4 - 2e-5 * s / steps, accum=2, clip=0.0, micro_batch=64, samples=128,
                                 tokens=128, step_time=0.01, throughput=12800.0 + 100 * (s % 5), nonfinite=False,
                                 scaler_skipped=False, mem_params=400_000, mem_grads=400_000, mem_optimizer=800_000))
        if s == steps // 2:  # a marker on every plot
            store.record(SettingsApplied(s, e, changes=(("accum", 2, 4),), at="step", from_step=s + 1))
        if s % per_epoch == 0:
            store.record(EpochEnd(s, e, train_loss=loss, val_loss=val_loss, seconds=1.0))
    store.record(RunFinished(steps, epochs, reason="completed"))
    store.close()
    return str(run_dir)


def gpu_run(run_dir: Path, steps: int = 300) -> str:
    """A finished CUDA run as the engine records one: device memory and memory by kind every step."""
    run_dir.mkdir(parents=True, exist_ok=True)
    store = RunStore(str(run_dir))
    store.set_info(status="finished", task="mlp", device="cuda:0", device_name="NVIDIA H100")
    gib = 2 ** 30
    for s in range(1, steps + 1):
        store.record(StepMetrics(s, 1, loss=2.0 / (1 + s / 30), grad_norm=1 + 0.3 * math.sin(s / 5), clipped=False,
                                 lr=1e-3, accum=4, clip=1.0, micro_batch=16, samples=64, tokens=64, step_time=0.02,
                                 throughput=3200.0, nonfinite=False, scaler_skipped=False, mem_allocated=20 * gib,
                                 mem_reserved=24 * gib, mem_peak=30 * gib, mem_used=32 * gib, mem_total=80 * gib,
                                 mem_params=4 * gib, mem_grads=4 * gib, mem_optimizer=8 * gib,
                                 mem_activations=12 * gib))
    store.record(RunFinished(steps, 1, reason="completed"))
    store.close()
    return str(run_dir)


def started(run_dir: Path, step: int, resumed: bool) -> RunStarted:
    """run_started as engine/trainer/opening.py writes it (a resume: at the checkpoint's step, resumed)."""
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
