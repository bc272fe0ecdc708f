"""Task and flag checks before anything is written (issue 23): a data set whose __len__ is larger
than what __getitem__ holds, a warmup longer than the run, --task-arg given again with --resume
or --fork (merged into the saved set, recorded as a change), and --lr-scaling under
--token-budget (a micro-batch change does not change the effective batch, so not the lr)."""
from __future__ import annotations

import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from engine_helpers import make_task, run_trainer  # noqa: E402 - after the sys.path set-up above

from engine.cli import main
from engine.declarations.commands import SetMicroBatch
from engine.store import RunReader

TASK = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from engine import Task

    class Data(torch.utils.data.Dataset):
        def __init__(self, n, holds):
            g = torch.Generator().manual_seed(n)
            self.x = torch.randn(holds, 4, generator=g)
            self.n = n
        def __len__(self):
            return self.n  # may say more than it holds
        def __getitem__(self, i):
            return self.x[i], (self.x[i, 0] > 0).long()

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="sum"), len(y)

    def build_task(seed, n=32, short="", tag="none"):
        torch.manual_seed(seed)
        train = Data(n, n - 3 if short == "train" else n)
        val = Data(8, 7 if short == "val" else 8)
        return Task(model=torch.nn.Linear(4, 2), train_data=train, val_data=val, loss=loss)
""")


@pytest.fixture()
def task(tmp_path):
    path = tmp_path / "checked_task.py"
    path.write_text(TASK)
    return str(path)


def refused(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


@pytest.mark.parametrize("short, said", [
    ("train", "train_data says it holds 32 samples (len) but reading the last, train_data[31], failed: IndexError"),
    ("val", "val_data says it holds 8 samples (len) but reading the last, val_data[7], failed: IndexError")])
def test_a_data_set_shorter_than_its_len_is_bad_input(tmp_path, task, capsys, short, said):
    run_dir = tmp_path / "run"
    line = refused(capsys, ["--task", task, "--task-arg", f"short={short}", "--device", "cpu",
                            "--run-dir", str(run_dir)])
    assert said in line, line
    assert not run_dir.exists()


def test_a_warmup_longer_than_the_run_is_bad_input(tmp_path, task, capsys):
    run_dir = tmp_path / "run"
    line = refused(capsys, ["--task", task, "--warmup-samples", "1000000", "--micro-batch", "4", "--epochs", "1", "--device", "cpu",
                            "--run-dir", str(run_dir)])
    assert "--warmup-samples 1000000 is longer than the whole run" in line and "trains 32 samples" in line, line
    assert not run_dir.exists()
    line = refused(capsys, ["--task", task, "--warmup", "100", "--max-steps", "2", "--micro-batch", "4", "--accum", "2",
                            "--device", "cpu", "--run-dir", str(run_dir)])
    assert "trains 16 samples (2 steps x 8 samples)" in line, line
    # Negative control: a warmup of the whole run is taken.
    assert main(["--task", task, "--warmup-samples", "32", "--micro-batch", "4", "--epochs", "1", "--device", "cpu",
                 "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()


def samples_by_epoch(run_dir):
    out: dict[int, int] = {}
    for m in RunReader(str(run_dir)).metrics():
        out[m["epoch"]] = out.get(m["epoch"], 0) + m["samples"]
    return out


def test_task_args_given_again_with_resume_or_fork_change_only_the_keys_named(tmp_path, task, capsys):
    run_dir = tmp_path / "run"
    common = ["--micro-batch", "4", "--accum", "2", "--epochs", "1", "--device", "cpu"]
    assert main(["--task", task, "--task-arg", "n=48", "--task-arg", "tag=a", "--run-dir", str(run_dir), *common]) == 0
    assert main(["--resume", str(run_dir), "--task-arg", "tag=b", "--epochs", "2"]) == 0
    assert samples_by_epoch(run_dir) == {1: 48, 2: 48}  # n=48 kept (it was 32, the default, before)
    reader = RunReader(str(run_dir))
    assert reader.info()["config"]["task_args"] == {"n": 48, "tag": "b"}
    [applied] = reader.events(kinds={"settings_applied"})
    assert applied["step"] == 6 and applied["data"]["changes"] == [["task_args", {"n": 48, "tag": "a"},
                                                                     {"n": 48, "tag": "b"}]]
    fork = tmp_path / "fork"
    assert main(["--fork", f"{run_dir}@epoch-1", "--task-arg", "tag=c", "--run-dir", str(fork)]) == 0
    info = RunReader(str(fork)).info()
    assert info["config"]["task_args"] == {"n": 48, "tag": "c"}
    assert info["parent"]["changed"] == {"task_args": {"n": 48, "tag": "c"}}
    assert samples_by_epoch(fork) == {2: 48}
    capsys.readouterr()


def test_lr_scaling_under_a_token_budget_follows_the_budget_not_the_micro_batch(tmp_path):
    def on_event(e, trainer):
        if e.kind == "step" and e.step == 1:
            trainer.send(SetMicroBatch(2, at="step"))

    run = run_trainer(make_task(24), tmp_path / "run", on_event=on_event, micro_batch=4, accum=1, lr=0.1,
                      token_budget=60, lr_scaling="linear")
    [applied] = run.of("settings_applied")
    assert applied.changes == (("micro_batch", 4, 2),)  # the lr is not among the changes
    assert {m.lr for m in run.steps} == {0.1} and run.steps[-1].micro_batch == 2
    # Negative control: fixed windows, where the micro-batch is half the effective batch, do rescale.
    fixed = run_trainer(make_task(24), tmp_path / "fixed", on_event=on_event, micro_batch=4, accum=1, lr=0.1,
                        lr_scaling="linear")
    assert fixed.steps[-1].lr == pytest.approx(0.05)
