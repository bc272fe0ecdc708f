"""A task's own lr scheduler is stepped once per optimizer step as step(), with no argument.

One whose step() needs a value (ReduceLROnPlateau's step(metrics), a scheduler of the user's
own, one of the own inside a ChainedScheduler) passed set-up and failed at step 1 with a run folder written.
Now it is refused in one line, exit 2, before anything is written; a scheduler that steps by
itself still trains (the positive control)."""
from __future__ import annotations

import os
import textwrap

import pytest

from engine.cli import main
from engine.store import RunReader

TASK = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from engine import Task

    S = torch.optim.lr_scheduler

    class OnLoss:
        '''A scheduler of the user's own whose step() wants the loss.'''
        def __init__(self, opt):
            self.optimizer = opt
        def step(self, loss):
            for g in self.optimizer.param_groups:
                g["lr"] *= 0.5 if loss > 1 else 1.0
        def state_dict(self):
            return {}
        def load_state_dict(self, state):
            pass

    KINDS = {
        "plateau": lambda opt: S.ReduceLROnPlateau(opt, factor=0.5, patience=0),
        "own": OnLoss,
        "chained": lambda opt: S.ChainedScheduler([S.LambdaLR(opt, lambda t: 1.0), OnLoss(opt)]),
        "lambda": lambda opt: S.LambdaLR(opt, lambda t: 0.9 ** t),
    }

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="sum"), len(y)

    def build_task(seed, kind="plateau"):
        torch.manual_seed(seed)
        x = torch.randn(32, 4)
        data = list(zip(x, (x[:, 0] > 0).long()))
        return Task(model=torch.nn.Linear(4, 2), train_data=data, val_data=data[:8], loss=loss,
                    scheduler=KINDS[kind])
""")


@pytest.fixture()
def task(tmp_path):
    path = tmp_path / "sched_task.py"
    path.write_text(TASK)
    return str(path)


def _argv(task, run_dir, kind):
    return ["--task", task, "--task-arg", f"kind={kind}", "--run-dir", str(run_dir), "--micro-batch", "8",
            "--epochs", "2", "--device", "cpu", "--workers", "0"]


@pytest.mark.parametrize("kind,cls,need", [("plateau", "ReduceLROnPlateau", "metrics"), ("own", "OnLoss", "loss"),
                                           ("chained", "OnLoss", "loss")])
def test_a_scheduler_that_steps_on_a_value_is_refused_before_anything_is_written(tmp_path, capsys, task, kind, cls,
                                                                                 need):
    run_dir = tmp_path / "run"
    rc = main(_argv(task, run_dir, kind))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert f"its scheduler {cls} steps on a value (step({need}))" in err and "with no argument" in err
    assert not os.path.exists(run_dir)  # nothing written


def test_a_scheduler_that_steps_by_itself_trains(tmp_path, capsys, task):
    run_dir = tmp_path / "run"
    assert main(_argv(task, run_dir, "lambda")) == 0, capsys.readouterr().err
    lrs = [m["lr"] for m in RunReader(str(run_dir)).metrics()]
    assert len(lrs) == 2 and lrs[1] == pytest.approx(lrs[0] * 0.9)  # the task's schedule, stepped per step
