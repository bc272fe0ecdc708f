"""Nothing lost, round 3 (issue 23): a crash between an epoch's checkpoint and its run.db row
loses no epoch; a rollback is made durable before training goes on (a crash and --resume go on
from the rollback, with its lr); a full disk (ENOSPC) or the file-size limit (EFBIG) during a
checkpoint says so, with the checkpoint kept and the space the next one needs. Real engine
processes where the process is the point, crashed with os._exit (crash_at.py) or capped with
RLIMIT_FSIZE (fsize.py); the runs before and after them in this process (engine_in_process.engine)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from engine.checkpoints import files as ckpt
from engine.store import RunReader
from engine_in_process import engine
from testkit import ROOT, subprocess_env

HERE = os.path.join(ROOT, "tests", "faults")
TASK = os.path.join(HERE, "ckpt_task.py")


def crash_at(kind: str, **config) -> int:
    r = subprocess.run([sys.executable, os.path.join(HERE, "crash_at.py"), kind, json.dumps(config)],
                       env=subprocess_env(), cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 9, r.stderr  # it crashed where asked
    return r.returncode


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def epochs(run_dir) -> list[tuple]:
    return [(e["epoch"], e["step"], e["train_loss"], e["val_loss"]) for e in RunReader(str(run_dir)).epochs()]


@pytest.mark.slow  # the crash: a process of its own
def test_a_crash_between_the_epoch_checkpoint_and_its_row_loses_no_epoch(tmp_path):
    common = dict(task=TASK, device="cpu", micro_batch=8, accum=1, task_args={"n": 64})
    reference = tmp_path / "reference"
    r = engine("--task", TASK, "--device", "cpu", "--micro-batch", "8", "--accum", "1", "--task-arg", "n=64",
               "--epochs", "2", "--run-dir", str(reference))
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / "run"
    crash_at("checkpoint", epochs=2, run_dir=str(run_dir), **common)  # epoch 1's checkpoint is on disk
    assert epochs(run_dir) == []  # ... and its row is not: the crash came between the two
    r = engine("--resume", run_dir)
    assert r.returncode == 0, r.stderr
    assert epochs(run_dir) == epochs(reference)  # epoch 1's train and val loss, from its checkpoint
    notes = [e["message"] for e in RunReader(str(run_dir)).events(kinds={"store_problem"})]
    assert any("epoch 1's row was not in run.db" in n for n in notes), notes


@pytest.mark.slow  # the crash: a process of its own
def test_a_crash_after_a_rollback_resumes_from_the_rollback_with_its_lr(tmp_path):
    run_dir = tmp_path / "run"
    # NaN at steps 9 and 12: step-10.pt is saved in between (after the trouble began); the
    # rollback goes to step-5.pt. The process dies as it announces the rollback.
    crash_at("rolled_back", task=TASK, device="cpu", epochs=1, micro_batch=8, accum=1, checkpoint_every=5,
             task_args={"bad": [9, 12]}, nonfinite="rollback", lr=0.002, run_dir=str(run_dir))
    state = ckpt.load(ckpt.last_path(str(run_dir)))
    assert state["step"] == 5 and state["settings"]["lr"] == pytest.approx(0.001)  # not step 10's, lr 0.002
    r = engine("--resume", run_dir, "--max-steps", "9")
    assert r.returncode == 0, r.stderr
    reader = RunReader(str(run_dir))
    after = [m for m in reader.metrics() if m["step"] > 5]
    assert [m["step"] for m in after] == [6, 7, 8, 9] and all(m["lr"] == pytest.approx(0.001) for m in after)
    assert {d["step"] for d in reader.discarded()} >= {6, 7, 8, 9, 10}  # the diverged rows, kept apart
    assert state["samples"] == 12 * 8  # the data moved on past the skipped windows


def mlp(*args) -> tuple:
    return ("--task", "mlp", "--device", "cpu", "--micro-batch", "64", "--accum", "1", *args)


@pytest.mark.slow  # the rlimit: a process of its own
def test_the_file_size_limit_during_a_checkpoint_says_so_and_what_was_kept(tmp_path):
    run_dir = tmp_path / "run"
    r = engine(*mlp("--max-steps", "2", "--run-dir", run_dir))
    assert r.returncode == 0, r.stderr
    size = os.path.getsize(ckpt.last_path(str(run_dir)))
    limit = size // 2  # run.db fits, a checkpoint does not
    r = subprocess.run([sys.executable, os.path.join(HERE, "fsize.py"), str(limit),
                        "--resume", str(run_dir), "--max-steps", "4"],
                       env=subprocess_env(), cwd=ROOT, capture_output=True, text=True, timeout=180)
    line = one_error_line(r.stderr)
    assert r.returncode == 1, r.stderr
    assert line.startswith("error: file too large: could not write checkpoint last.pt at step 4"), line
    assert "the newest checkpoint kept is last.pt (step 2)" in line, line
    assert "needs about 1.2 MiB" in line and "ulimit -f" in line, line
    assert "enforce fail" not in line and "unexpected pos" not in line
    assert ckpt.load(ckpt.last_path(str(run_dir)))["step"] == 2  # kept, whole
    assert os.listdir(run_dir / "checkpoints") == ["last.pt"]  # no temporary file left behind
    assert RunReader(str(run_dir)).info()["status"] == "failed"


@contextlib.contextmanager
def small_disk(path, size: str):
    """A tmpfs of `size` at `path` (a full disk that says ENOSPC); the test is skipped where
    mounting one is not allowed (not root)."""
    path.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a small disk needs mount (root)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"mount tmpfs: {r.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.mark.slow  # trains (in this process)
def test_a_full_disk_during_a_checkpoint_says_so_and_what_was_kept(tmp_path):
    with small_disk(tmp_path / "disk", "2200k") as disk:  # run.db and one mlp checkpoint (1.2 MiB)
        run_dir = disk / "run"
        r = engine(*mlp("--micro-batch", "256", "--epochs", "2", "--run-dir", run_dir))
        line = one_error_line(r.stderr)
        assert r.returncode == 1, r.stderr
        assert line.startswith("error: disk full: could not write checkpoint last.pt at step 16"), line
        assert "the newest checkpoint kept is epoch-1.pt (step 16)" in line and "needs about" in line, line
        assert "free in" in line and "unexpected pos" not in line, line
        assert sorted(os.listdir(run_dir / "checkpoints")) == ["epoch-1.pt"]
        assert ckpt.load(str(run_dir / "checkpoints" / "epoch-1.pt"))["step"] == 16


@pytest.mark.slow  # trains (in this process)
def test_rotation_fits_a_disk_that_holds_what_was_asked(tmp_path):
    """--keep-checkpoints 2: two step files and last.pt at rest, one more while one is written
    (4 mlp checkpoints, 4.8 MiB); the old order needed 5 and failed at the first rotation."""
    with small_disk(tmp_path / "disk", "5600k") as disk:
        run_dir = disk / "run"
        r = engine(*mlp("--max-steps", "6", "--checkpoint-every", "1", "--keep-checkpoints", "2",
                        "--run-dir", run_dir))
        assert r.returncode == 0, r.stderr
        assert sorted(os.listdir(run_dir / "checkpoints")) == ["last.pt", "step-4.pt", "step-5.pt"]
        assert ckpt.load(ckpt.last_path(str(run_dir)))["step"] == 6  # the stop at --max-steps
