"""A checkpoint is input (issue 23): what --resume, --fork and a rollback read back passes the
same range checks as every flag and command; a bad one is refused as bad input (one `error:`
line naming the file and the field, exit 2) and never written over; a run finds out before it
trains (or at its first checkpoint) that it writes checkpoints it would refuse. In process
through `engine.cli.main` (tiny model, a few steps), with a hypothesis fuzz over the stored
progress and settings."""
from __future__ import annotations

import hashlib
import itertools
import math
import os
import shutil
import sqlite3

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.checkpoints import files as ckpt
from engine.cli import main
from engine.store import RunReader
from testkit import ROOT

TASK = os.path.join(ROOT, "tests", "faults", "ckpt_task.py")
BASE = ("--task", TASK, "--device", "cpu", "--micro-batch", "8", "--accum", "1", "--task-arg", "n=64")


def run(capsys, *args) -> tuple[int, str]:
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def rows(run_dir) -> list[tuple]:
    db = sqlite3.connect(os.path.join(run_dir, "run.db"))
    try:
        return db.execute("SELECT step, loss FROM metrics ORDER BY step").fetchall()
    finally:
        db.close()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run of 8 steps (one epoch of 64 samples): what every case copies and edits."""
    run_dir = tmp_path_factory.mktemp("base") / "run"
    assert main([*BASE, "--epochs", "1", "--run-dir", str(run_dir)]) == 0
    return run_dir


counter = itertools.count()


def copy_of(finished, tmp_path) -> str:
    out = tmp_path / f"run{next(counter)}"
    shutil.copytree(finished, out)
    return str(out)


def edit_last(run_dir: str, edit) -> str:
    path = ckpt.last_path(run_dir)
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    return path


@pytest.mark.parametrize("where, key, value, words", [
    ("settings", "lr", math.nan, "settings.lr must be a finite number"),
    ("settings", "accum", -5, "settings.accum must be an integer from 1"),
    (None, "step", -7, "step must be an integer from 0"),
    ("settings", "lr_scaling", "cubic", "settings.lr_scaling must be one of"),
    (None, "epoch_loss", math.inf, "epoch_loss"),
    (None, "epoch_offset", 65, "past the end of the data set"),
    ("settings", "micro_batch", 65, "larger than the data set"),
    (None, "settings", [1, 2], "settings must be a mapping"),
])
def test_a_checkpoint_holding_what_no_run_can_hold_is_refused_and_left_as_it_is(finished, tmp_path, capsys,
                                                                                where, key, value, words):
    run_dir = copy_of(finished, tmp_path)
    path = edit_last(run_dir, lambda s: (s[where] if where else s).__setitem__(key, value))
    before, metrics = digest(path), rows(run_dir)
    rc, err = run(capsys, "--resume", run_dir, "--epochs", "2")
    line = one_error_line(err)
    assert rc == 2 and words in line and path in line, line  # the file and the field, named
    assert digest(path) == before and rows(run_dir) == metrics  # never written over, no row moved
    assert RunReader(run_dir).info()["status"] == "finished"
    # The same reader serves --fork.
    rc, err = run(capsys, "--fork", run_dir, "--run-dir", str(tmp_path / "child"))
    assert rc == 2 and words in one_error_line(err) and not (tmp_path / "child").exists()


def test_the_same_checkpoint_with_its_values_in_range_resumes(finished, tmp_path, capsys):
    """Negative control: the edit path itself (torch.save of the loaded state) resumes fine."""
    run_dir = copy_of(finished, tmp_path)
    edit_last(run_dir, lambda s: s["settings"].__setitem__("lr", 5e-4))
    rc, err = run(capsys, "--resume", run_dir, "--epochs", "2")
    assert rc == 0, err
    assert {m["lr"] for m in RunReader(run_dir).metrics() if m["step"] > 8} == {5e-4}


def test_a_run_whose_checkpoints_could_not_load_back_is_refused_before_it_writes_anything(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc, err = run(capsys, *BASE, "--task-arg", "note=true", "--epochs", "1", "--run-dir", run_dir)
    line = one_error_line(err)
    assert rc == 2 and "could not be loaded back" in line and "_extra_state" in line and "Note" in line, line
    assert not run_dir.exists()


def test_what_only_training_puts_in_a_checkpoint_is_read_back_at_the_first_one(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc, err = run(capsys, *BASE, "--task-arg", "odd_optimizer=true", "--epochs", "2", "--run-dir", run_dir)
    line = one_error_line(err)
    assert rc == 1 and "could not load back" in line and "Note" in line, line
    reader = RunReader(str(run_dir))
    assert reader.info()["status"] == "failed" and len(reader.metrics()) == 8  # stopped at the first checkpoint


def test_a_run_folder_whose_checkpoints_is_a_file_is_bad_input(finished, tmp_path, capsys):
    run_dir = copy_of(finished, tmp_path)
    shutil.rmtree(os.path.join(run_dir, "checkpoints"))
    with open(os.path.join(run_dir, "checkpoints"), "w") as f:
        f.write("not a folder")
    rc, err = run(capsys, "--resume", run_dir, "--epochs", "2")
    line = one_error_line(err)
    assert rc == 2 and "checkpoints is not a folder" in line, line
    assert open(os.path.join(run_dir, "checkpoints")).read() == "not a folder"


# -- the fuzz: any value in the stored progress and settings ----------------------------------
PROGRESS = ["step", "epoch", "window", "epoch_offset", "samples", "nonfinite_steps", "scaler_skips", "epoch_loss",
            "epoch_count", "world_size"]
LIVE = ["micro_batch", "accum", "lr", "clip", "lr_scaling", "checkpointing"]
VALUES = st.one_of(
    st.integers(-3, 70), st.integers(-(2**70), 2**70), st.sampled_from([0, 1, 2**20, 2**20 + 1, 10**12, 10**12 + 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 1e-2), st.booleans(), st.none(),
    st.text(max_size=8), st.sampled_from(["none", "linear", "sqrt"]), st.lists(st.integers(), max_size=2),
)
EDITS = st.lists(st.tuples(st.sampled_from([None] * len(PROGRESS) + ["settings"] * len(LIVE) + ["rng"]),
                           st.integers(0, 99), VALUES), min_size=1, max_size=3)


def apply(state: dict, edits) -> None:
    for where, i, value in edits:
        if where is None:
            state[PROGRESS[i % len(PROGRESS)]] = value
        elif where == "settings":
            state["settings"][LIVE[i % len(LIVE)]] = value
        else:
            state["rng"]["torch"] = value if i % 2 else torch.full((5056,), i % 256, dtype=torch.uint8)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(edits=EDITS)
def test_any_stored_progress_or_settings_resumes_cleanly_or_is_refused(finished, tmp_path, capsys, edits):
    run_dir = copy_of(finished, tmp_path)
    path = edit_last(run_dir, lambda s: apply(s, edits))
    before = digest(path)
    rc, err = run(capsys, "--resume", run_dir, "--epochs", "2")
    assert rc in (0, 2), err  # never a failed run (a traceback, a crash after the start)
    if rc == 2:
        assert path in one_error_line(err)
        assert digest(path) == before  # refused: never written over
        return
    state = ckpt.load(path)  # a clean resume: what it saved loads back, its weights finite, ...
    assert all(torch.isfinite(t).all() for t in state["model"].values() if isinstance(t, torch.Tensor))
    for m in RunReader(run_dir).metrics():  # ... and every step it trained is finite or flagged
        assert m["nonfinite"] or math.isfinite(m["loss"]), m
