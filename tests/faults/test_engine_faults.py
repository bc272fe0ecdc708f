"""Faults on purpose: the engine keeps every metric and its last good weights and says
plainly what went wrong (issue: nothing lost)."""
from __future__ import annotations

import json
import os
import pickle
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine.store import RunReader
from engine_in_process import copy_run, engine, trained
from testkit import ROOT, run_engine
from tests.faults.bad_tasks import CASES

TASK = os.path.join(ROOT, "tests", "faults", "fault_task.py")


cli = run_engine  # a real `python -m engine` process: cli(*args, env=None, timeout=180, preexec_fn=None)


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def steps_in(run_dir) -> list[int]:
    return [r["step"] for r in RunReader(str(run_dir)).metrics()]


# -- bad task files: one line, exit 2, nothing written --------------------------------------------
# In this process (engine_in_process.engine): what is checked is the engine's answer, not the process.
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_task_file_is_one_error_line_and_writes_nothing(tmp_path, case):
    text, words = CASES[case]
    path = tmp_path / f"{case}.py"
    if text is not None:
        path.write_text(text)
    run_dir = tmp_path / "run"
    r = engine("--task", str(path), "--run-dir", str(run_dir), "--micro-batch", "4", "--accum", "1")
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert words in line
    assert str(path) in line or path.name in line or case in ("nonscalar_loss", "no_count", "no_parameters",
                                                                "empty_data", "loss_raises", "not_a_dataset")
    assert not run_dir.exists()


def test_micro_batch_larger_than_data_set(tmp_path):
    r = engine("--task", TASK, "--micro-batch", "1000", "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2 and "larger than the data set" in one_error_line(r.stderr)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args", [["--accum", "0"], ["--micro-batch", "0"], ["--epochs", "0"], ["--lr", "-1"],
                                  ["--lr", "inf"], ["--clip", "-0.5"], ["--clip", "nan"], ["--device", "tpu"],
                                  ["--precision", "fp8"], ["--max-steps", "0"], ["--memory-margin", "1.5"],
                                  ["--vram-limit", "lots"], ["--oom-recovery", "maybe"], ["--seed", "-1"],
                                  ["--find-micro-batch"]])
def test_bad_values_exit_2(tmp_path, args):
    r = cli("--task", "mlp", "--run-dir", str(tmp_path / "run"), *args)
    assert r.returncode == 2
    one_error_line(r.stderr)
    assert not (tmp_path / "run").exists()


def test_resume_of_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "junk").mkdir()
    r = engine("--resume", str(tmp_path / "junk"))
    assert r.returncode == 2 and "not a run folder" in one_error_line(r.stderr)
    assert os.listdir(tmp_path / "junk") == []


# -- checkpoints: weights only ------------------------------------------------------------------
class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def finished_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished 1-epoch run for the module, made once in this process; tests change copies."""
    home = tmp_path_factory.mktemp("finished")
    run_dir = home / "run"
    trained(home, "--task", TASK, "--epochs", "1", "--micro-batch", "8", "--accum", "2", "--run-dir", str(run_dir))
    return run_dir


@pytest.fixture
def finished(finished_template: Path, tmp_path: Path) -> Path:
    """This test's own copy of the finished run."""
    return copy_run(finished_template, tmp_path / "run")


@pytest.mark.slow  # trains (in this process)
def test_checkpoint_with_pickled_code_is_refused_and_never_runs(tmp_path, finished):
    run_dir = finished
    marker = tmp_path / "pwned"
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    state["extra"] = _Evil(str(marker))
    with open(run_dir / "checkpoints" / "last.pt", "wb") as f:
        torch.save(state, f, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    r = engine("--resume", str(run_dir), "--epochs", "2")
    assert r.returncode == 2
    assert "refused" in one_error_line(r.stderr)
    assert not marker.exists()


@pytest.mark.slow  # trains (in this process)
def test_truncated_checkpoint_is_a_clear_error(finished):
    # Issue 12: resume continues from the newest checkpoint that loads; only when none does is
    # it bad input. Here every checkpoint of the run is cut in half.
    run_dir = finished
    for path in (run_dir / "checkpoints").glob("*.pt"):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    r = engine("--resume", str(run_dir), "--epochs", "2")
    assert r.returncode == 2
    assert "damaged or truncated" in one_error_line(r.stderr)


@pytest.mark.slow  # trains (in this process)
def test_a_truncated_last_checkpoint_resumes_from_the_newest_that_loads(finished):
    run_dir = finished
    path = run_dir / "checkpoints" / "last.pt"
    path.write_bytes(path.read_bytes()[:1000])
    r = engine("--resume", str(run_dir), "--epochs", "2")
    assert r.returncode == 0, r.stderr
    from engine.store import RunReader
    reader = RunReader(str(run_dir))
    assert [m["epoch"] for m in reader.metrics()][-1] == 2 and reader.metrics()[0]["step"] == 1
    notes = reader.events(kinds={"store_problem"})
    assert notes and "last.pt" in notes[0]["message"] and "damaged or truncated" in notes[0]["message"]


# -- faults during a run ----------------------------------------------------------------------
@pytest.mark.slow  # trains (in this process)
@pytest.mark.parametrize("fault", [{"HEADROOM_FAULT_DATA_AT": "77"}, {"HEADROOM_FAULT_COLLATE_AFTER": "40"}])
def test_data_or_collate_raising_mid_epoch_fails_the_run_and_keeps_everything(tmp_path, fault):
    run_dir = tmp_path / "run"
    r = engine("--task", TASK, "--epochs", "3", "--micro-batch", "4", "--accum", "2", "--run-dir", str(run_dir),
            env=fault)
    assert r.returncode == 1
    line = one_error_line(r.stderr.replace("[", "\n[").split("\n[run_failed]")[0].strip().splitlines()[-1]
                          if False else [l for l in r.stderr.splitlines() if l.startswith("error: ")][0])
    assert "corrupt" in line or "tokenizer crashed" in line
    assert sum(l.startswith("error: ") for l in r.stderr.splitlines()) == 1
    assert "Traceback" not in r.stderr
    reader = RunReader(str(run_dir))
    failed = reader.events(kinds={"run_failed"})
    assert len(failed) == 1 and ("corrupt" in failed[0]["message"] or "tokenizer" in failed[0]["message"])
    steps = steps_in(run_dir)
    assert steps == list(range(1, len(steps) + 1)) and steps  # every step so far, no gap
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == steps[-1]  # the last good weights


@pytest.mark.slow  # trains (in this process)
def test_nonfinite_stop_saves_last_good_weights(tmp_path):
    # --lr at its upper limit (1e4, engine/declarations/limits.py) makes the loss overflow within a few steps;
    # stop mode ends the run at the first bad step.
    run_dir = tmp_path / "run"
    r = engine("--task", TASK, "--epochs", "3", "--lr", "1e4", "--optimizer", "sgd", "--clip", "0",
            "--nonfinite", "stop", "--run-dir", str(run_dir))
    assert r.returncode == 1
    assert "non-finite" in one_error_line([l for l in r.stderr.splitlines() if l.startswith("error")][0])
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    reader = RunReader(str(run_dir))
    assert len(reader.events(kinds={"nonfinite"})) == 1
    assert reader.events(kinds={"run_finished"})[0]["data"]["reason"] == "nonfinite"


def _start(run_dir, *extra, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("HEADROOM_FAULT_")}
    e.update(env or {"HEADROOM_FAULT_SLOW": "0.01"})
    return subprocess.Popen([sys.executable, "-m", "engine", "--task", TASK, "--micro-batch", "8", "--accum", "2",
                             "--run-dir", str(run_dir), "--json", *extra], cwd=ROOT, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_sigkill_loses_at_most_the_last_second_and_resume_continues_without_gap(tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, "--epochs", "6", env={"HEADROOM_FAULT_SLOW": "0.04"})
    seen: list[tuple[float, int]] = []
    try:
        epoch2_end = None
        for line in proc.stdout:
            event = json.loads(line)
            now = time.monotonic()
            if event["kind"] == "step":
                seen.append((now, event["step"]))
            if event["kind"] == "epoch_end" and event["epoch"] == 2:
                epoch2_end = now
            # Kill in epoch 3, over a second after the epoch-2 checkpoint.
            if epoch2_end is not None and now - epoch2_end > 1.3:
                break
        proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    db = sqlite3.connect(str(run_dir / "run.db"))
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()
    steps = steps_in(run_dir)
    assert steps == list(range(1, len(steps) + 1))
    older = [s for t, s in seen if t < killed_at - 1.0]
    assert not older or steps[-1] >= max(older)  # all but at most the last second
    assert steps[-1] > 32  # rows past the epoch-2 checkpoint exist, to be superseded
    # The SIGKILL is the subprocess's; the resume and the reference run need no process of their own.
    r = engine("--resume", str(run_dir))
    assert r.returncode == 0, r.stderr
    steps = steps_in(run_dir)
    assert steps == list(range(1, 16 * 6 + 1))  # no gap, no duplicate
    # The resumed run's losses equal an uninterrupted run's.
    ref = tmp_path / "ref"
    r = engine("--task", TASK, "--micro-batch", "8", "--accum", "2", "--epochs", "6", "--run-dir", str(ref))
    assert r.returncode == 0
    a = [m["loss"] for m in RunReader(str(run_dir)).metrics()]
    b = [m["loss"] for m in RunReader(str(ref)).metrics()]
    assert a == pytest.approx(b, rel=0, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sigint_and_sigterm_stop_at_the_next_step_with_a_checkpoint(tmp_path, sig):
    run_dir = tmp_path / "run"
    # 0.05 s a micro-batch: the test reads step 5 and signals well before step 8 even on a loaded machine.
    proc = _start(run_dir, "--epochs", "50", env={"HEADROOM_FAULT_SLOW": "0.05"})
    try:
        for line in proc.stdout:
            event = json.loads(line)
            if event["kind"] == "step" and event["step"] == 5:
                break
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    kinds = [json.loads(l)["kind"] for l in out.splitlines()]
    assert kinds[-1] == "run_finished"
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    steps = steps_in(run_dir)
    assert state["step"] == steps[-1] and steps[-1] <= 8
    assert RunReader(str(run_dir)).events(kinds={"run_finished"})[0]["data"]["reason"] == "stopped"


@pytest.mark.slow
def test_disk_full_stops_with_a_clear_message_and_keeps_the_last_checkpoint(finished):
    run_dir = finished
    good = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    size = os.path.getsize(run_dir / "checkpoints" / "last.pt")

    limit = size * 9 // 10

    def small_disk():  # no file may grow to a checkpoint's size: the next checkpoint write fails
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = cli("--resume", str(run_dir), "--epochs", "3", preexec_fn=small_disk)  # the rlimit: its own
    assert r.returncode == 1
    line = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
    assert len(line) == 1 and "could not write checkpoint" in line[0] and "Traceback" not in r.stderr
    after = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)  # still loadable
    assert after["step"] == good["step"]
    assert not [f for f in os.listdir(run_dir / "checkpoints") if f.startswith(".tmp-")]  # no half-written file
    db = sqlite3.connect(str(run_dir / "run.db"))
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


@pytest.mark.slow  # trains (in this process)
def test_run_folder_becoming_unwritable_stops_the_run(tmp_path):
    run_dir = tmp_path / "run"
    moved: list[int] = []

    def unwritable_after_epoch_1(event) -> None:
        # epoch 1's checkpoint is saved before its epoch_end is shown: then the checkpoints
        # folder is replaced by a file, and no checkpoint can be written there any more.
        if event.kind == "epoch_end" and not moved:
            ckpts = run_dir / "checkpoints"
            os.rename(ckpts, run_dir / "moved")
            ckpts.write_text("not a folder")
            moved.append(event.epoch)

    r = engine("--task", TASK, "--micro-batch", "8", "--accum", "2", "--run-dir", str(run_dir), "--json",
               "--epochs", "4", env={"HEADROOM_FAULT_SLOW": "0.01"}, watch=unwritable_after_epoch_1)
    assert moved == [1]
    assert r.returncode == 1
    lines = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1 and "could not write checkpoint" in lines[0]
    assert torch.load(run_dir / "moved" / "last.pt", weights_only=True)["epoch"] == 2
    assert RunReader(str(run_dir)).events(kinds={"run_failed"})
