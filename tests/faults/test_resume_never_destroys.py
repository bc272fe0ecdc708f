"""Resume never destroys (issue 12), end to end through the engine's command line (engine.cli.main,
in this process: the process is not what is tested): a missing last.pt resumes from the newest
epoch checkpoint with every row kept; a checkpoint that does not fit the task is bad input with
the run untouched."""
from __future__ import annotations

import os
import sqlite3
import textwrap

import pytest

from engine_in_process import engine
from testkit import ROOT

pytestmark = pytest.mark.slow  # each test trains (in this process)

TASK = os.path.join(ROOT, "tests", "faults", "fault_task.py")


cli = engine


def rows(run_dir, table="metrics"):
    db = sqlite3.connect(str(run_dir / "run.db"))
    try:
        return db.execute(f"SELECT step, loss FROM {table} ORDER BY step").fetchall()
    finally:
        db.close()


def test_a_missing_last_checkpoint_resumes_from_the_newest_epoch_and_keeps_every_row(tmp_path):
    run_dir = tmp_path / "run"
    r = cli("--task", TASK, "--epochs", "2", "--micro-batch", "8", "--accum", "2", "--run-dir", str(run_dir))
    assert r.returncode == 0, r.stderr
    before = rows(run_dir)
    os.unlink(run_dir / "checkpoints" / "last.pt")  # a crash between epoch-2.pt and last.pt, or a user
    os.unlink(run_dir / "checkpoints" / "epoch-2.pt")  # and the newest epoch file too: epoch-1 is left
    r = cli("--resume", str(run_dir), "--epochs", "3")
    assert r.returncode == 0, r.stderr
    after = rows(run_dir)
    per_epoch = len(before) // 2
    assert [s for s, _ in after] == list(range(1, 3 * per_epoch + 1))  # continued from epoch 1's end
    assert after[:per_epoch] == before[:per_epoch]  # epoch 1's rows untouched
    discarded = rows(run_dir, "discarded_metrics")
    assert discarded == before[per_epoch:]  # epoch 2's first run, kept apart, not deleted


def test_a_checkpoint_that_does_not_fit_the_task_is_bad_input_and_the_run_untouched(tmp_path):
    run_dir = tmp_path / "run"
    r = cli("--task", TASK, "--epochs", "1", "--micro-batch", "8", "--accum", "2", "--run-dir", str(run_dir))
    assert r.returncode == 0, r.stderr
    other = tmp_path / "other.py"
    other.write_text(textwrap.dedent("""
        import torch
        import torch.nn.functional as F
        from engine import Task
        def build_task(seed):
            x = torch.randn(64, 5)
            return Task(model=torch.nn.Linear(5, 3), train_data=torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()),
                        loss=lambda m, b: (F.cross_entropy(m(b[0]), b[1], reduction="sum"), len(b[1])))
    """))
    db = sqlite3.connect(str(run_dir / "run.db"))
    status = db.execute("SELECT value FROM run WHERE key='status'").fetchone()
    db.close()
    def files():  # the lock file records who last held the folder: not the run's data
        return {p: p.stat().st_size for p in run_dir.rglob("*")
                if p.is_file() and not p.name.endswith(("-wal", "-shm", ".writer.lock"))}
    snapshot = files()
    r = cli("--resume", str(run_dir), "--task", str(other), "--epochs", "2")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "task" in lines[0], r.stderr
    db = sqlite3.connect(str(run_dir / "run.db"))
    assert db.execute("SELECT value FROM run WHERE key='status'").fetchone() == status  # not marked failed
    db.close()
    assert files() == snapshot
