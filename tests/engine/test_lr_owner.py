"""One writer of the learning rate (engine.steering.lr): a new peak rescales a torch scheduler
so that it goes on exactly as a run started at that peak would, and the engine's own
schedule writes schedule x peak from the step a set_lr applies."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from engine_helpers import RecordingSGD, make_task, run_trainer  # noqa: E402 - after the sys.path set-up above

from engine.declarations.commands import SetLr
from engine.declarations.schedule import LrSchedule
from engine.steering.lr import LrControl, rescale

S = torch.optim.lr_scheduler


def schedulers(kind: str, steps: int = 16):
    """A scheduler factory: its shape follows the optimizer's lr when it is built (the peak)."""
    if kind == "onecycle":
        return lambda opt: S.OneCycleLR(opt, max_lr=[g["lr"] for g in opt.param_groups], total_steps=steps)
    if kind == "sequential":  # a warmup, then a decay that starts from the base lrs at the milestone
        return lambda opt: S.SequentialLR(opt, [S.LinearLR(opt, 0.1, 1.0, total_iters=5), S.ExponentialLR(opt, 0.8)],
                                          milestones=[5])
    return lambda opt: S.LambdaLR(opt, lambda t: min(1.0, (t + 1) / 4) * 0.9 ** t)


def built_at(peak: float, kind: str):
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": params[:1], "lr": peak}, {"params": params[1:], "lr": peak / 5}])
    return opt, schedulers(kind)(opt)


def lrs_ahead(opt, sched, n: int) -> list[float]:
    """The lrs of the next n steps, every param group's, in one flat list."""
    out = []
    for _ in range(n):
        out += [g["lr"] for g in opt.param_groups]
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("kind", ["onecycle", "sequential", "lambda"])
def test_a_rescaled_scheduler_goes_on_as_one_started_at_the_new_peak(kind):
    moved, moved_sched = built_at(0.1, kind)
    lrs_ahead(moved, moved_sched, 4)
    LrControl(moved, LrSchedule.for_run("constant", 0.0, 1), moved_sched).new_peak(0.1, 0.04)
    assert moved_sched.get_last_lr() == [g["lr"] for g in moved.param_groups]
    fresh, fresh_sched = built_at(0.04, kind)  # a run started at the new peak, at the same step
    lrs_ahead(fresh, fresh_sched, 4)
    assert lrs_ahead(moved, moved_sched, 12) == pytest.approx(lrs_ahead(fresh, fresh_sched, 12), rel=1e-9)
    # Negative control: the schedule left at the old peak is another curve.
    kept, kept_sched = built_at(0.1, kind)
    lrs_ahead(kept, kept_sched, 4)
    fresh, fresh_sched = built_at(0.04, kind)
    lrs_ahead(fresh, fresh_sched, 4)
    assert lrs_ahead(kept, kept_sched, 12) != pytest.approx(lrs_ahead(fresh, fresh_sched, 12), rel=1e-3)


def test_rescale_from_zero_sets_the_lr_outright():
    opt, sched = built_at(0.1, "lambda")
    for g in opt.param_groups:
        g["lr"] = 0.0
    rescale(opt, None, 0.3, sched)
    assert [g["lr"] for g in opt.param_groups] == [0.3, 0.3] and sched.base_lrs == [0.3, 0.3]


def test_a_task_scheduler_after_set_lr_at_a_step_follows_a_run_started_at_that_peak(tmp_path):
    def task():
        t = make_task(24, optimizer=RecordingSGD)
        t.scheduler = lambda opt: S.OneCycleLR(opt, max_lr=opt.param_groups[0]["lr"], total_steps=8)
        return t

    def on_event(e, trainer):
        if e.kind == "step" and e.step == 3:
            trainer.send(SetLr(0.05, at="step"))

    moved = run_trainer(task(), tmp_path / "moved", on_event=on_event, lr=0.2, epochs=2, micro_batch=2, accum=3)
    started = run_trainer(task(), tmp_path / "started", lr=0.05, epochs=2, micro_batch=2, accum=3)
    [applied] = moved.of("settings_applied")
    k = applied.from_step - 1  # steps trained at the old peak
    assert k >= 3 and len(moved.steps) == 8
    lrs, ref = moved.trainer.optimizer.lrs, started.trainer.optimizer.lrs
    assert lrs == [m.lr for m in moved.steps]
    assert lrs[k:] == pytest.approx(ref[k:], rel=1e-9)
    assert lrs[:k] == pytest.approx([x * 4 for x in ref[:k]], rel=1e-9)  # before: the 0.2 curve


def test_the_engines_lr_after_a_set_lr_at_a_step_is_the_schedule_times_the_new_peak(tmp_path):
    task = make_task(32, optimizer=RecordingSGD)

    def on_event(e, trainer):
        if e.kind == "step" and e.step == 3:
            trainer.send(SetLr(0.05, at="step"))

    run = run_trainer(task, tmp_path / "r", on_event=on_event, lr=0.2, epochs=2, lr_schedule="cosine", warmup=12,
                      min_lr_ratio=0.1, micro_batch=2, accum=2)
    [planned, replanned] = run.of("lr_planned")
    schedule = LrSchedule.for_run(planned.schedule, planned.min_lr_ratio, planned.total_samples, warmup_samples=planned.warmup_samples)
    [applied] = run.of("settings_applied")
    assert applied.changes == (("lr", 0.2, 0.05),) and replanned.peak == 0.05
    seen, want = 0, []
    for m in run.steps:
        want.append((0.2 if m.step < applied.from_step else 0.05) * schedule.factor(seen))
        seen += m.samples
    assert run.trainer.optimizer.lrs == pytest.approx(want, rel=1e-12)
    assert [m.lr for m in run.steps] == run.trainer.optimizer.lrs
    # Negative control: the old peak's curve is not what ran after the change.
    after = [i for i, m in enumerate(run.steps) if m.step >= applied.from_step]
    assert after and all(abs(run.trainer.optimizer.lrs[i] - want[i] * 4) > 1e-6 for i in after)


def test_a_reference_batch_scales_a_task_schedulers_peak_too(tmp_path):
    task = make_task(24, optimizer=RecordingSGD)
    task.scheduler = lambda opt: S.LambdaLR(opt, lambda t: 0.5 ** t)
    run = run_trainer(task, tmp_path / "r", lr=0.1, micro_batch=4, accum=2, epochs=1, lr_scaling="linear",
                      reference_batch=2)  # tuned for 2, trained at 8: the peak is 0.4
    assert run.trainer.optimizer.lrs == pytest.approx([0.4 * 0.5 ** k for k in range(3)], rel=1e-12)
