"""Issue 15 in the run: the per-step memory breakdown columns, activation checkpointing as a
live setting, and a snapshot at an out-of-memory error, on CPU."""
from __future__ import annotations

import os
import pickle
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from engine_helpers import make_task, run_trainer  # noqa: E402 - after the sys.path set-up above

from engine.declarations.commands import SetCheckpointing, SetPrecision
from engine.declarations.config import ConfigError, TrainConfig
from engine.memory.activation_checkpointing import checkpoint_modules
from engine.memory.breakdown import count
from engine.store import RunReader
from engine.tasks.task import Task
from engine.trainer.trainer import Trainer


def test_every_row_has_the_exact_breakdown(tmp_path):
    run = run_trainer(make_task(24, optimizer=lambda p, lr: torch.optim.AdamW(p, lr=lr)), tmp_path / "r",
                      micro_batch=2, accum=3, epochs=1)
    model = run.trainer.model
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    rows = RunReader(run.run_dir).metrics()
    assert rows and all(r["mem_params"] == param_bytes for r in rows)
    assert all(r["mem_grads"] == trainable for r in rows)  # every trainable gradient held at the window's end
    # AdamW: exp_avg and exp_avg_sq per parameter plus a scalar step tensor each.
    n = len([p for p in model.parameters() if p.requires_grad])
    step_bytes = sum(s["step"].numel() * s["step"].element_size() for s in run.trainer.optimizer.state.values())
    assert all(r["mem_optimizer"] == 2 * trainable + step_bytes for r in rows) and step_bytes == 4 * n or step_bytes
    assert all(r["mem_activations"] is None for r in rows)  # CPU: no peak to take them from
    assert count(model, run.trainer.optimizer).optimizer == rows[-1]["mem_optimizer"]


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(3))
        self.head = nn.Linear(6, 2)
        self.calls = 0
        self.blocks[0][0].register_forward_pre_hook(self._count)

    def _count(self, *_):
        self.calls += 1

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def block_task(switchable=True):
    torch.manual_seed(1)
    x = torch.randn(48, 6)
    y = (x[:, 0] > 0).long()

    def loss(m, batch):
        xb, yb = batch
        return F.cross_entropy(m(xb), yb, reduction="sum"), len(yb)

    model = Blocks()
    return Task(model=model, train_data=torch.utils.data.TensorDataset(x, y), loss=loss, name="blocks",
                checkpointing=(lambda m, on: checkpoint_modules(m.blocks, on)) if switchable else None)


def test_checkpointing_is_a_live_setting_that_recomputes_and_keeps_the_gradients(tmp_path):
    calls = {}

    def on_event(e, trainer):
        if e.kind == "step":
            calls[e.step] = trainer.model.calls
        if e.kind == "step" and e.step == 2:
            trainer.send(SetCheckpointing(True, at="step"))

    on = run_trainer(block_task(), tmp_path / "on", on_event=on_event, micro_batch=4, accum=2, epochs=1,
                     optimizer="sgd")
    per_step = {k: calls[k] - calls.get(k - 1, 1) for k in sorted(calls)}  # 1: the pre-flight forward
    assert per_step[1] == per_step[2] == 2  # two micro-batches, one forward each
    assert all(per_step[k] == 4 for k in range(4, 7))  # checkpointed: each forward runs again in backward
    applied = on.of("settings_applied")
    assert applied[0].changes == (("checkpointing", False, True),) and applied[0].at == "step"
    off = run_trainer(block_task(), tmp_path / "off", micro_batch=4, accum=2, epochs=1, optimizer="sgd")
    for a, b in zip(on.trainer.model.parameters(), off.trainer.model.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    assert [m.loss for m in on.steps] == pytest.approx([m.loss for m in off.steps], rel=1e-6)


def test_checkpointing_without_a_switch_is_refused_with_a_reason(tmp_path):
    def on_event(e, trainer):
        if e.kind == "step" and e.step == 1:
            trainer.send(SetCheckpointing(True, at="step"))
            trainer.send(SetPrecision("bf16", at="step"))

    run = run_trainer(block_task(switchable=False), tmp_path / "r", on_event=on_event, micro_batch=4, accum=2,
                      epochs=1)
    refused = {e.command: e.reason for e in run.of("command_refused")}
    assert "checkpointing" in refused["set_checkpointing"] and "restarts" in refused["set_precision"]
    assert not run.of("settings_applied")
    with pytest.raises(ConfigError, match="--activation-checkpointing on"):
        Trainer(TrainConfig(checkpointing=True, device="cpu", run_dir=str(tmp_path / "x")),
                task=block_task(switchable=False))


class OomAt(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.n = nn.Linear(6, 2), 0

    def forward(self, x):
        self.n += 1
        if self.n == 3 and x.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (injected)")
        return self.inner(x)


def test_an_out_of_memory_error_writes_a_snapshot_where_the_gpu_would(tmp_path):
    task = block_task()
    task.model, task.checkpointing = OomAt(), None
    events = []
    trainer = Trainer(TrainConfig(memory_snapshot="on-oom", device="cpu", micro_batch=4, accum=2, epochs=1,
                                  run_dir=str(tmp_path / "run")), task=task, sink=events.append)
    trainer.parts.snapshots.dump = lambda path: pickle.dump({"segments": [], "oom": True}, open(path, "wb"))
    trainer.run()
    snaps = [e for e in events if e.kind == "memory_snapshot"]
    assert len(snaps) == 1 and snaps[0].path == str(tmp_path / "run" / "memory" / "oom-step-1.pickle")
    with open(snaps[0].path, "rb") as f:
        assert pickle.load(f)["oom"] is True
    assert [e.kind for e in events].index("memory_snapshot") < [e.kind for e in events].index("oom_recovered")
    # Without --memory-snapshot nothing is written.
    task2 = block_task()
    task2.model, task2.checkpointing = OomAt(), None
    Trainer(TrainConfig(device="cpu", micro_batch=4, accum=2, epochs=1, run_dir=str(tmp_path / "plain")),
            task=task2).run()
    assert not (tmp_path / "plain" / "memory").exists()


def test_the_levers_watcher_publishes_the_table_when_a_new_size_is_measured():
    from engine.declarations.events import StepMetrics
    from engine.declarations.settings import LiveSettings
    from engine.trainer.watchers import LeversWatcher
    w = LeversWatcher("bf16", 1, None, 0.0, None, layers=12, can_checkpoint=True)
    s = LiveSettings(8, 8, 1e-3, 1.0, "none")
    GiB = 2**30

    def step(k, micro, peak):
        return StepMetrics(k, 1, loss=1.0, grad_norm=1.0, clipped=False, lr=1e-3, accum=64 // micro, clip=1.0,
                           micro_batch=micro, samples=64, tokens=64, step_time=0.1, throughput=1.0, nonfinite=False,
                           scaler_skipped=False, mem_peak=peak, mem_used=peak + GiB, mem_reserved=peak, mem_total=24 * GiB,
                           mem_params=GiB // 2, mem_grads=GiB // 2, mem_optimizer=GiB)
    first = w.on_step(step(1, 8, 6 * GiB), s)
    assert len(first) == 1 and first[0].kind == "memory_levers"
    assert w.on_step(step(2, 8, 6 * GiB), s) == []  # nothing new measured: no new table
    table = w.on_step(step(3, 16, 10 * GiB), s.with_(micro_batch=16, accum=4))[0]
    rows = {(r[0], r[1], r[2]): r for r in table.rows}
    measured = rows[(16, "bf16", False)]
    assert measured[3] == 10 * GiB and measured[6] == "measured" and measured[7]  # current cell
    line = rows.get((32, "bf16", False))
    assert line is not None and line[6] == "fit" and line[3] == 18 * GiB  # 2 + 0.5 x 32 GiB from the two points
    assert line[4] == (18 * GiB <= table.capacity)
    assert any(r[6] == "extrapolated" for r in table.rows)  # other precisions and checkpointing
    assert table.capacity == 24 * GiB - GiB
