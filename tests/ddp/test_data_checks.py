"""torchrun ranks that build data sets of different lengths (issue 23): each would plan other
windows from its own length and the ranks would fall out of step, one waiting in a collective
until the 120 s timeout. Set-up compares the lengths, as it compares the models: one error line
on every rank naming the ranks and lengths, exit 2 on every rank, no run.db."""
from __future__ import annotations

import subprocess
import textwrap

from tests.ddp.harness import ROOT, TORCHRUN, env, exit_codes

TASK = textwrap.dedent("""
    import os, torch
    import torch.nn.functional as F
    from engine import Task

    def loss(model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="sum"), len(y)

    def build_task(seed, val_differs=False):
        rank = int(os.environ.get("RANK", "0"))
        n = 48 if rank == 1 and not val_differs else 64  # a shard read from a list that differs by rank
        g = torch.Generator().manual_seed(1)
        x = torch.randn(n, 4, generator=g)
        data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long())
        v = 16 - 4 * rank if val_differs else 16
        val = torch.utils.data.TensorDataset(x[:v], (x[:v, 0] > 0).long())
        torch.manual_seed(seed)
        return Task(model=torch.nn.Linear(4, 2), train_data=data, val_data=val, loss=loss)
""")


def run(tmp_path, *extra):
    task = tmp_path / "rank_task.py"
    task.write_text(TASK)
    args = TORCHRUN + ["-m", "engine", "--task", str(task), "--epochs", "1", "--micro-batch", "4", "--device", "cpu",
                       "--run-dir", str(tmp_path / "run"), *extra]
    return subprocess.run(args, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)


def test_ranks_that_build_data_sets_of_different_lengths_are_bad_input(tmp_path):
    r = run(tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if "error: " in ln]
    assert len(lines) == 2, r.stderr[-3000:]  # one per rank, the same
    assert all("every rank must build the same data sets" in ln and
               "train_data: 64 samples on rank 0; 48 samples on rank 1" in ln for ln in lines), lines
    assert sorted(exit_codes(r.stderr)) == [2, 2], r.stderr[-3000:]  # every rank (not -15 or -6: issue 31)
    assert "terminate called" not in r.stderr
    assert not (tmp_path / "run" / "run.db").exists()


def test_ranks_whose_validation_sets_differ_are_bad_input(tmp_path):
    r = run(tmp_path, "--task-arg", "val_differs=true")
    lines = [ln for ln in r.stderr.splitlines() if "error: " in ln]
    assert len(lines) == 2 and all("val_data: 16 samples on rank 0; 12 samples on rank 1" in ln
                                   for ln in lines), r.stderr[-3000:]
    assert "train_data" not in lines[0]
