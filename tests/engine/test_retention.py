"""Retention keeps what a rollback may need, and rotation makes room first (issue 23): with
step checkpoints at the defaults' spacing the autopilot never picks a file rotation removed;
rotation prunes before it writes (the disk holds K step files and last.pt, one more while one is
written); a rollback target that no longer loads is passed over, with a note, for an older one.

Epoch checkpoints are kept bounded (issue 30, engine/checkpoints/retention.py): after 60 epochs the
default keeps the newest 3, the best by validation loss (however old) and last.pt; `all` keeps
all 60; a resumed run still knows its best; a checkpoint a fork beside the run continues from
stays through the parent's later epochs (step checkpoints too)."""
from __future__ import annotations

import math
import os

import pytest

from engine.checkpoints import files as ckpt
from engine.checkpoints.forks import ForkFinder, named_by_forks
from engine.checkpoints.retention import epochs_to_remove
from engine.declarations.config import TrainConfig
from engine.store import RunReader
from engine.trainer.autopilot import Autopilot, Trouble
from engine.trainer.trainer import Trainer
from engine_in_process import copy_run, trained
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


# -- epoch checkpoints (issue 30) -----------------------------------------------------------------
# 16 samples at micro-batch 8, accum 1: 2 steps an epoch (2 training forwards). val_low_at=F makes
# the validation loss |forwards - F| + 1 (ckpt_task.py): lowest at the end of epoch F / 2.
TINY = ("--task", TASK, "--device", "cpu", "--micro-batch", "8", "--accum", "1", "--task-arg", "n=16")
BEST_AT_5 = ("--task-arg", "val_low_at=10")
FALLING = ("--task-arg", "val_low_at=1000000")  # the val loss falls every epoch: the best is the newest


def kept(run_dir) -> list[str]:
    names = os.listdir(os.path.join(run_dir, "checkpoints"))
    return sorted(names, key=lambda n: (n.split("-")[0], int(n.split("-")[1][:-3]) if "-" in n else 0))


def epochs(*numbers: int) -> list[str]:
    return [f"epoch-{n}.pt" for n in numbers]


def steps(*numbers: int) -> list[str]:
    return [f"step-{n}.pt" for n in numbers]


@pytest.fixture(scope="module")
def sixty(tmp_path_factory):
    """60 epochs with the default retention (3), the best validation loss at epoch 5."""
    folder = tmp_path_factory.mktemp("sixty")
    trained(folder, *TINY, *BEST_AT_5, "--epochs", "60", "--run-dir", folder / "run")
    return folder / "run"


def test_the_rule_keeps_the_newest_the_best_and_the_spared():
    paths = [f"/r/checkpoints/epoch-{e}.pt" for e in (1, 2, 3, 10, 4, 5)] + ["/r/checkpoints/last.pt",
                                                                             "/r/checkpoints/step-7.pt"]
    losses = {1: 0.9, 2: 0.2, 3: math.nan, 4: 0.5, 5: 0.4, 10: 0.3}
    names = [os.path.basename(p) for p in epochs_to_remove(paths, losses, 2, spared={"epoch-1"})]
    assert names == epochs(3, 4)  # kept: 5 and 10 (newest), 2 (best), 1 (spared); last and step never
    assert epochs_to_remove(paths, losses, None) == []  # all
    assert [os.path.basename(p) for p in epochs_to_remove(paths, {3: math.nan, 4: math.inf}, 1)] == \
        epochs(1, 2, 3, 4, 5)  # no finite loss: no best, the newest alone
    tie = epochs_to_remove(paths, {2: 0.1, 4: 0.1}, 1, spared={"/elsewhere/epoch-3"})
    assert [os.path.basename(p) for p in tie] == epochs(1, 2, 5)  # the newer of two equal bests; a path spares by name


def test_sixty_epochs_keep_the_newest_three_the_best_and_last(sixty):
    assert kept(sixty) == epochs(5, 58, 59, 60) + ["last.pt"]
    rows = RunReader(str(sixty)).epochs()
    assert len(rows) == 60 and min(rows, key=lambda r: r["val_loss"])["epoch"] == 5  # the best is old


def test_keep_all_keeps_every_epoch_checkpoint(tmp_path):
    trained(tmp_path, *TINY, *BEST_AT_5, "--epochs", "60", "--keep-epoch-checkpoints", "all",
            "--run-dir", tmp_path / "run")
    assert kept(tmp_path / "run") == epochs(*range(1, 61)) + ["last.pt"]


def test_a_chosen_number_is_kept(tmp_path):
    trained(tmp_path, *TINY, "--task-arg", "val_low_at=6", "--epochs", "20", "--keep-epoch-checkpoints", "5",
            "--run-dir", tmp_path / "run")
    assert kept(tmp_path / "run") == epochs(3, 16, 17, 18, 19, 20) + ["last.pt"]


def test_a_resumed_run_still_keeps_its_old_best(sixty, tmp_path):
    """The epochs before the resume are read from run.db: epoch 5 stays the best, not the best
    of the epochs the resumed process ended itself."""
    run = copy_run(sixty, tmp_path / "run")
    trained(tmp_path, "--resume", run, "--epochs", "63")
    assert kept(run) == epochs(5, 61, 62, 63) + ["last.pt"]


def test_a_checkpoint_a_fork_continues_from_is_kept(tmp_path):
    """Two forks beside the parent, from its epoch-2 and its step-5; the parent resumed for 5
    more epochs keeps both (it would remove them otherwise: the newest is the best). Folders
    beside it that are not readable runs name nothing and stop nothing."""
    runs = tmp_path / "runs"
    parent = runs / "parent"
    trained(tmp_path, *TINY, *FALLING, "--epochs", "3", "--checkpoint-every", "1", "--keep-checkpoints", "2",
            "--run-dir", parent)
    assert kept(parent) == epochs(1, 2, 3) + ["last.pt"] + steps(5, 6)
    finder = ForkFinder(str(parent))  # made before the forks: what it read is kept, new folders are read
    assert finder.named() == set()
    trained(tmp_path, "--fork", f"{parent}@epoch-2", "--max-steps", "5", "--run-dir", runs / "fork-a")
    trained(tmp_path, "--fork", f"{parent}@step-5", "--max-steps", "6", "--run-dir", runs / "fork-b")
    (runs / "junk").mkdir()
    (runs / "junk" / "run.db").write_bytes(b"not a database" * 100)
    (runs / "empty").mkdir()
    (runs / "a-file").write_text("not a run\n")
    assert named_by_forks(str(parent)) == finder.named() == {"epoch-2", "step-5"}
    trained(tmp_path, "--resume", parent, "--epochs", "8")
    assert kept(parent) == epochs(2, 6, 7, 8) + ["last.pt"] + steps(5, 15, 16)


def test_a_run_saved_before_the_setting_resumes_keeping_all(tmp_path):
    """A run started when every epoch checkpoint was kept is not pruned by a resume; one that
    saved the setting resumes with it, and a flag given again wins either way."""
    from engine.cli import build_parser, config_from_args
    from engine.store import RunStore

    def resumed(saved: dict, *flags: str) -> TrainConfig:
        run_dir = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        run_dir.mkdir()
        store = RunStore(str(run_dir))
        store.set_info(config=saved)
        store.close()
        return config_from_args(build_parser().parse_args(["--resume", str(run_dir), *flags]))
    old = {k: v for k, v in TrainConfig().to_dict().items() if k != "keep_epoch_checkpoints"}
    assert resumed(old).keep_epoch_checkpoints is None
    assert resumed(old, "--keep-epoch-checkpoints", "4").keep_epoch_checkpoints == 4
    assert resumed({**old, "keep_epoch_checkpoints": 7}).keep_epoch_checkpoints == 7
    assert resumed({**old, "keep_epoch_checkpoints": None}, "--keep-epoch-checkpoints", "2").keep_epoch_checkpoints == 2
