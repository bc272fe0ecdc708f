"""The lr schedule is a function of samples seen: warmup and decay land at the same samples
whatever the accumulation, set_lr moves the peak, and the optimizer gets the lr the
metrics row reports."""
from __future__ import annotations

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from engine_helpers import RecordingSGD, make_task, run_trainer  # noqa: E402 - after the sys.path set-up above

from engine.declarations.commands import SetLr
from engine.declarations.schedule import LrSchedule


def test_shapes():
    s = LrSchedule.for_run("cosine", 0.2, 1000, warmup_fraction=0.1)
    assert s.warmup == 100 and s.total == 1000
    assert s.factor(0) == pytest.approx(1 / 101) and s.factor(99) == pytest.approx(100 / 101)
    assert s.factor(100) == pytest.approx(1.0)
    assert s.factor(550) == pytest.approx(0.2 + 0.8 * 0.5)  # half way through the decay
    assert s.factor(1000) == pytest.approx(0.2) and s.factor(5000) == pytest.approx(0.2)
    lin = LrSchedule.for_run("linear", 0.0, 100)
    assert [lin.factor(x) for x in (0, 50, 100)] == pytest.approx([1.0, 0.5, 0.0])
    assert LrSchedule.for_run("constant", 0.1, 100, warmup_samples=10).factor(50) == 1.0
    assert LrSchedule.for_run("cosine", 0.1, 100, warmup_samples=32).warmup == 32  # samples, not a fraction
    curve = s.curve(2.0)
    assert curve[0][0] == 0 and curve[-1] == (1000.0, pytest.approx(0.4))


def lrs_by_samples(run) -> dict[int, float]:
    """lr of each step keyed by the samples seen before it."""
    out, seen = {}, 0
    for m in run.steps:
        out[seen] = m.lr
        seen += m.samples
    return out


def test_lr_at_equal_samples_is_equal_across_accumulations(tmp_path):
    common = dict(lr=0.1, epochs=3, lr_schedule="cosine", warmup=0.25, min_lr_ratio=0.1, micro_batch=4)
    a = run_trainer(make_task(32), tmp_path / "a", accum=2, **common)  # 8 samples a step
    b = run_trainer(make_task(32), tmp_path / "b", accum=4, **common)  # 16 samples a step
    la, lb = lrs_by_samples(a), lrs_by_samples(b)
    shared = sorted(set(la) & set(lb))
    assert len(shared) == 6 and len(la) == 12
    for x in shared:
        assert la[x] == pytest.approx(lb[x], rel=1e-12)
    assert max(la.values()) == pytest.approx(0.1, rel=0.05) and min(la.values()) < 0.05
    # Negative control: a schedule over optimizer steps (warmup = a quarter of the steps)
    # puts b's lr at a different point of the curve for the same samples.
    by_step = LrSchedule.for_run("cosine", 0.1, len(b.steps), warmup_fraction=0.25)
    step_based = {x: 0.1 * by_step.factor(k) for k, x in enumerate(sorted(lb))}
    assert any(abs(step_based[x] - lb[x]) > 0.01 for x in shared)


def test_the_optimizer_gets_the_scheduled_lr_the_row_reports(tmp_path):
    task = make_task(24, optimizer=RecordingSGD)
    run = run_trainer(task, tmp_path / "r", lr=0.2, epochs=2, lr_schedule="linear", warmup=8, min_lr_ratio=0.0,
                      micro_batch=2, accum=2)
    assert task.model is run.trainer.model
    assert run.trainer.optimizer.lrs == [m.lr for m in run.steps]
    assert run.steps[0].lr == pytest.approx(0.2 / 9) and run.steps[-1].lr < 0.02
    planned = run.of("lr_planned")
    assert len(planned) == 1 and planned[0].total_samples == 48 and planned[0].warmup_samples == 8


def test_set_lr_moves_the_peak_and_the_curve_keeps_its_shape(tmp_path):
    def on_event(e, trainer):
        if e.kind == "step" and e.step == 2:
            trainer.send(SetLr(0.05))

    common = dict(epochs=3, lr_schedule="cosine", warmup=0, min_lr_ratio=0.1, micro_batch=2, accum=3)
    run = run_trainer(make_task(24), tmp_path / "r", on_event=on_event, lr=0.2, **common)
    plain = run_trainer(make_task(24), tmp_path / "p", lr=0.2, **common)
    epoch = [m.epoch for m in run.steps]
    for m, p in zip(run.steps, plain.steps):
        want = p.lr if m.epoch == 1 else p.lr * 0.25  # same factor of the curve, a quarter of the peak
        assert m.lr == pytest.approx(want, rel=1e-12)
    assert epoch.count(1) == 4 and len(run.of("lr_planned")) == 2
    assert run.of("lr_planned")[1].peak == 0.05
    assert not math.isclose(run.steps[-1].lr, run.steps[4].lr)  # still decaying after the change


def test_a_task_brings_its_own_scheduler_stepped_once_per_optimizer_step(tmp_path):
    import torch
    task = make_task(24, optimizer=RecordingSGD)
    task.scheduler = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)

    def on_event(e, trainer):
        if e.kind == "step" and e.step == 4:
            trainer.send(SetLr(0.4))  # at epoch 2: the schedule keeps its shape at twice the peak

    run = run_trainer(task, tmp_path / "own", on_event=on_event, lr=0.2, epochs=2, micro_batch=2, accum=3)
    lrs = [m.lr for m in run.steps]
    assert run.trainer.optimizer.lrs == lrs  # the row says what the optimizer used
    want = [0.2 * 0.5 ** (k // 3) for k in range(4)] + [0.4 * 0.5 ** (k // 3) for k in range(4, 8)]
    assert lrs == pytest.approx(want, rel=1e-12)
    from engine.checkpoints import files as ckpt
    assert ckpt.load(ckpt.last_path(run.run_dir))["scheduler"]["last_epoch"] == 8


def test_a_task_scheduler_with_an_engine_schedule_is_bad_input(tmp_path):
    import torch

    from engine.declarations.config import ConfigError
    task = make_task(24)
    task.scheduler = lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    with pytest.raises(ConfigError, match="own lr scheduler"):
        run_trainer(task, tmp_path / "both", lr_schedule="cosine")
    assert not (tmp_path / "both" / "run.db").exists()


@pytest.mark.parametrize("rule,factor", [("linear", 4.0), ("sqrt", 2.0), ("none", 1.0)])
def test_reference_batch_scales_the_given_lr_to_the_runs_batch(tmp_path, rule, factor):
    run = run_trainer(make_task(24), tmp_path / rule, lr=0.1, micro_batch=4, accum=2, epochs=1,
                      lr_scaling=rule, reference_batch=2)  # tuned for 2, trained at 8
    assert all(m.lr == pytest.approx(0.1 * factor) for m in run.steps)
    if rule != "none":
        applied = run.of("settings_applied")[0]
        assert applied.at == "start" and applied.changes == (("lr", 0.1, pytest.approx(0.1 * factor)),)
