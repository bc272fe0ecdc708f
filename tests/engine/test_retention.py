"""Retention keeps what a rollback may need, and rotation makes room first (issue 23): with
step checkpoints at the defaults' spacing the autopilot never picks a file rotation removed;
rotation prunes before it writes (the disk holds K step files and last.pt, one more while one is
written); a rollback target that no longer loads is passed over, with a note, for an older one."""
from __future__ import annotations

import os

import pytest

from engine.checkpoints import files as ckpt
from engine.declarations.config import TrainConfig
from engine.store import RunReader
from engine.trainer.autopilot import Autopilot, Trouble
from engine.trainer.trainer import Trainer
from testkit import ROOT

TASK = os.path.join(ROOT, "tests", "faults", "ckpt_task.py")


def config(run_dir, **kw) -> TrainConfig:
    base = dict(task=TASK, device="cpu", epochs=1, micro_batch=8, accum=1, checkpoint_every=1,
                nonfinite="rollback", run_dir=str(run_dir))
    return TrainConfig(**{**base, **kw})


def rolled_back(run_dir) -> list[dict]:
    return [e["data"] for e in RunReader(str(run_dir)).events(kinds={"rolled_back"})]


def test_the_autopilot_never_picks_a_checkpoint_rotation_removed(tmp_path):
    """--checkpoint-every 1, 3 kept; NaN at steps 7 and 11: the trouble began at 7, so the
    target is step-6.pt, four saves back. Before: rotation had removed it and the run died
    ("step-6.pt: no such file")."""
    run_dir = tmp_path / "run"
    result = Trainer(config(run_dir, task_args={"bad": [7, 11]})).run()
    assert result.reason == "completed"
    assert [(e["from_step"], e["to_step"]) for e in rolled_back(run_dir)] == [(11, 6)]
    steps = sorted(int(ckpt.name_of(p)[5:]) for p in ckpt.candidates(str(run_dir)) if "step-" in p)
    assert len(steps) == 3  # once nothing needs the old ones, rotation keeps 3 again


def test_the_autopilot_names_what_rotation_must_keep():
    ap = Autopilot(True, None, 0, start_state={})
    for step in range(1, 7):
        ap.saved(step, f"step-{step}.pt", True)
    assert ap.needed(6) == {"step-6.pt"}  # no trouble brewing: the newest is all a rollback may pick
    ap.observe(7, float("nan"), nonfinite=True)  # one skip: a trouble may begin here
    ap.saved(7, "step-7.pt", True)
    assert ap.needed(7) == {"step-6.pt", "step-7.pt"}
    assert ap.needed(7 + 20) == {"step-7.pt"}  # the skip is too old to start a trouble
    assert ap.target(Trouble("nonfinite", 7, 11)).path == "step-6.pt"
    ap.forget("step-6.pt")  # it no longer loads: the next older one
    assert ap.target(Trouble("nonfinite", 7, 11)).path == "step-5.pt"


def test_rotation_prunes_before_it_writes(tmp_path, monkeypatch):
    """Spy on the real writer: when a step file is about to be written, at most K - 1 step files
    are on disk (the oldest went first), and last.pt is always there once one was written."""
    run_dir = tmp_path / "run"
    seen = []
    real = ckpt.save_checkpoint

    def spy(state, path):
        names = os.listdir(os.path.join(run_dir, "checkpoints"))
        if os.path.basename(path).startswith("step-"):
            seen.append((os.path.basename(path), sorted(n for n in names if n.startswith("step-")),
                         "last.pt" in names))
        return real(state, path)
    monkeypatch.setattr(ckpt, "save_checkpoint", spy)
    Trainer(config(run_dir, nonfinite="skip", keep_checkpoints=2, max_steps=6)).run()
    assert [s[0] for s in seen] == [f"step-{i}.pt" for i in range(1, 6)]  # 6 is the stop: last.pt only
    assert all(len(before) <= 1 for _, before, _ in seen), seen  # K - 1 = 1 step file while writing
    assert all(has_last for _, _, has_last in seen[1:])  # never zero good checkpoints
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["last.pt", "step-4.pt", "step-5.pt"]


def test_a_rollback_target_that_no_longer_loads_is_passed_over(tmp_path):
    run_dir = tmp_path / "run"

    def sink(event):  # a user removes step-6.pt while the trouble brews
        if event.kind == "nonfinite" and event.step == 7:
            os.unlink(run_dir / "checkpoints" / "step-6.pt")
    result = Trainer(config(run_dir, task_args={"bad": [7, 11]}), sink=sink).run()
    assert result.reason == "completed"
    back = rolled_back(run_dir)
    assert len(back) == 1 and back[0]["to_step"] < 6, back  # an older state, not a crash
    notes = [e["message"] for e in RunReader(str(run_dir)).events(kinds={"store_problem"})]
    assert any("rollback passed over" in n and "step-6.pt" in n for n in notes), notes


@pytest.mark.parametrize("keep", [1, 3])
def test_rotation_keeps_k_step_files_at_rest(tmp_path, keep):
    run_dir = tmp_path / "run"
    Trainer(config(run_dir, nonfinite="skip", keep_checkpoints=keep, max_steps=9)).run()
    names = sorted(os.listdir(run_dir / "checkpoints"))
    assert names == ["last.pt"] + [f"step-{s}.pt" for s in range(9 - keep, 9)]


def test_a_model_with_extra_state_rolls_back(tmp_path):
    """The state a rollback to the run's start restores holds the model's extra state (plain
    data) too; before, copying it failed as the run began."""
    run_dir = tmp_path / "run"
    result = Trainer(config(run_dir, checkpoint_every=None, task_args={"bad": [2, 3], "extra_state": True})).run()
    assert result.reason == "completed"
    assert [(e["from_step"], e["to_step"]) for e in rolled_back(run_dir)] == [(3, 0)]
    assert ckpt.load(ckpt.last_path(str(run_dir)))["model"]["_extra_state"]["note"] == "plain data"
