"""Run tree (issue 13): step checkpoints and their retention; a fork with no change reproduces
its parent's following steps bit for bit; a fork with a change records and applies it from its
first step; parent links across three generations; the autopilot rolls back on repeated NaN
and on a spike, and gives up after repeated rollbacks.

The runs go through engine.cli.main in this process (engine_in_process: the same code after
argv, without a new interpreter's ~6 s of CPU each), and the parents that tests only fork from
are trained once for the module."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from engine.checkpoints import files as ckpt
from engine.store import RunReader
from engine_in_process import copy_run, engine
from testkit import isolated_env

pytestmark = pytest.mark.slow  # every test trains several runs


TASK = Path(__file__).with_name("diverging_task.py")


@pytest.fixture()
def task() -> str:
    return str(TASK)


def cli(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return engine("--device", "cpu", *args, env=env)


def losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in RunReader(str(run_dir)).metrics()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("run_tree")


def shared(runs: Path, *args: object) -> subprocess.CompletedProcess:
    """A module fixture's run: made before any test's `isolated` applies, so it is given the same
    settings, log and runs folder under `runs` itself (testkit.isolated_env)."""
    r = cli(*args, env=isolated_env(runs))
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def parent(runs: Path) -> Path:
    """Two epochs of 16 steps, a checkpoint every 5 steps, all kept: the no-change fork and the
    fork with a change both start from its step-10 (mid-epoch 1). Read-only."""
    run = runs / "parent"
    shared(runs, "--task", TASK, "--epochs", "2", "--micro-batch", "8", "--accum", "2", "--checkpoint-every", "5",
           "--keep-checkpoints", "10", "--run-dir", run)
    return run


@pytest.fixture(scope="module")
def no_change_fork(runs: Path, parent: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """`--fork parent@step-10` with no flag: the run folder and what the command said. Read-only."""
    child = runs / "child"
    return child, shared(runs, "--fork", f"{parent}@step-10", "--run-dir", child)


@pytest.fixture(scope="module")
def one_epoch(runs: Path) -> Path:
    """One epoch of 8 steps (accum 4), checkpoints at the epoch's end only: the first generation of
    the three, and the parent the bad forks name. Read-only."""
    run = runs / "one_epoch"
    shared(runs, "--task", TASK, "--epochs", "1", "--micro-batch", "8", "--accum", "4", "--run-dir", run)
    return run


def test_step_checkpoints_are_written_and_the_last_k_kept(tmp_path, task):
    run = tmp_path / "parent"
    r = cli("--task", task, "--epochs", "2", "--micro-batch", "8", "--accum", "2", "--checkpoint-every", "3",
            "--keep-checkpoints", "2", "--run-dir", run)
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(run / "checkpoints"))
    assert names == ["epoch-1.pt", "epoch-2.pt", "last.pt", "step-27.pt", "step-30.pt"]  # 16 steps an epoch
    state = ckpt.load(str(run / "checkpoints" / "step-30.pt"))
    assert (state["step"], state["epoch"], state["samples"]) == (30, 2, 30 * 16)
    assert {"model", "optimizer", "rng", "settings", "config", "epoch_offset"} <= set(state)


def test_a_fork_with_no_change_reproduces_the_parent_bit_for_bit(tmp_path, parent, no_change_fork):
    child, r = no_change_fork
    p, c = losses(parent), losses(child)
    assert sorted(c) == list(range(11, 33))  # the parent's step counter goes on
    assert all(c[s] == p[s] for s in c)  # bit for bit
    info = RunReader(str(child)).info()
    assert info["parent"] == {"run_dir": str(parent), "checkpoint": "step-10", "step": 10, "changed": {}}
    # Mid-epoch fork: step 10 is inside epoch 1 (16 steps): the rest of its epoch is the same windows.
    assert [m["samples"] for m in RunReader(str(child)).metrics()][:6] == [16] * 6
    # Its start says it is a fork, and of what (it read "resumed ..." exactly as a resume does).
    started = RunReader(str(child)).events(kinds=["run_started"])[-1]
    assert started["message"].startswith(f"forked from {parent}@step-10:"), started["message"]
    assert f"forked from {parent}@step-10" in r.stdout + r.stderr
    resumed = copy_run(child, tmp_path / "resumed")  # the shared fork stays as it was
    r = cli("--resume", resumed)  # negative control: a resume says resumed
    assert RunReader(str(resumed)).events(kinds=["run_started"])[-1]["message"].startswith("resumed ")


def test_a_fork_with_a_change_records_it_and_applies_it_from_its_first_step(tmp_path, parent, no_change_fork):
    child = tmp_path / "child"
    r = cli("--fork", f"{parent}@step-10", "--lr", "0.0005", "--accum", "4", "--run-dir", child)
    assert r.returncode == 0, r.stderr
    rows = RunReader(str(child)).metrics()
    assert rows[0]["step"] == 11 and all(m["lr"] == 0.0005 and m["accum"] == 4 for m in rows)
    assert RunReader(str(child)).info()["parent"]["changed"] == {"lr": 0.0005, "accum": 4}
    # Negative control: the same fork without the change trains differently.
    same, _ = no_change_fork
    assert losses(same)[11] == losses(parent)[11] and losses(child)[12] != losses(parent)[12]


def test_parent_links_across_three_generations(tmp_path, one_epoch):
    a, b, c = one_epoch, tmp_path / "b", tmp_path / "c"
    assert cli("--fork", a, "--epochs", "2", "--clip", "0.5", "--run-dir", b).returncode == 0
    r = cli("--fork", f"{b}@epoch-2", "--epochs", "3", "--run-dir", c)
    assert r.returncode == 0, r.stderr
    pb, pc = RunReader(str(b)).info()["parent"], RunReader(str(c)).info()["parent"]
    assert pb["run_dir"] == str(a) and pb["checkpoint"] == "last" and pb["step"] == 8
    assert pb["changed"] == {"epochs": 2, "clip": 0.5}
    assert pc["run_dir"] == str(b) and pc["checkpoint"] == "epoch-2" and pc["step"] == 16
    assert pc["changed"] == {"epochs": 3}
    assert min(losses(c)) and sorted(losses(c)) == list(range(17, 25))


def test_forks_of_what_is_not_there_are_bad_input(tmp_path, one_epoch):
    for spec, words in ((f"{one_epoch}@step-3", "no checkpoint step-3"), (str(tmp_path / "nothing"), "not a run folder")):
        r = cli("--fork", spec, "--run-dir", tmp_path / "x")
        assert r.returncode == 2 and r.stderr.startswith("error: ") and words in r.stderr, r.stderr
        assert not (tmp_path / "x").exists()


def test_rollback_on_repeated_nan_ends_finite_where_skipping_does_not(tmp_path, task):
    common = ("--task", task, "--epochs", "1", "--micro-batch", "8", "--accum", "2", "--checkpoint-every", "2",
              "--task-arg", "always_bad=true", "--task-arg", "bad_from=7")
    # Skip-only: from step 7 on every window is NaN and nothing recovers.
    skip = tmp_path / "skip"
    assert cli(*common, "--run-dir", skip).returncode == 0
    rows = RunReader(str(skip)).metrics()
    assert all(r["nonfinite"] for r in rows if r["step"] >= 7)
    # Rollback: a NaN stretch that ends (steps 7-9) is rolled back past and the run ends finite.
    roll = tmp_path / "roll"
    r = cli("--task", task, "--epochs", "1", "--micro-batch", "8", "--accum", "2", "--checkpoint-every", "2",
            "--task-arg", "bad_from=7", "--task-arg", "bad_until=10", "--nonfinite", "rollback",
            "--lr", "0.01", "--run-dir", roll)
    assert r.returncode == 0, r.stderr
    reader = RunReader(str(roll))
    events = reader.events(kinds={"rolled_back"})
    assert len(events) >= 1
    e = events[0]["data"]
    assert e["to_step"] == 6 and e["from_step"] == 8 and e["new_lr"] == pytest.approx(0.005)
    rows = reader.metrics()
    assert not rows[-1]["nonfinite"] and torch.isfinite(torch.tensor(rows[-1]["loss"]))
    assert rows[-1]["lr"] == pytest.approx(0.005)
    discarded = reader.discarded()
    assert {d["step"] for d in discarded} >= {7, 8} and all("rolled back" in d["reason"] for d in discarded)


def test_rollback_on_a_spike(tmp_path, task):
    run = tmp_path / "spike"
    r = cli("--task", task, "--epochs", "1", "--micro-batch", "8", "--accum", "2", "--checkpoint-every", "4",
            "--task-arg", "spike_at=14", "--spike-factor", "5", "--lr", "0.01", "--run-dir", run)
    assert r.returncode == 0, r.stderr
    events = RunReader(str(run)).events(kinds={"rolled_back"})
    assert len(events) == 1 and events[0]["data"]["reason"] == "spike"
    assert events[0]["data"]["from_step"] == 14 and events[0]["data"]["to_step"] == 12
    # Negative control: without --spike-factor the spike is trained on.
    plain = tmp_path / "plain"
    assert cli("--task", task, "--epochs", "1", "--micro-batch", "8", "--accum", "2", "--checkpoint-every", "4",
               "--task-arg", "spike_at=14", "--lr", "0.01", "--run-dir", plain).returncode == 0
    assert not RunReader(str(plain)).events(kinds={"rolled_back"})


def test_rollback_gives_up_after_repeated_rollbacks(tmp_path, task):
    run = tmp_path / "hopeless"
    r = cli("--task", task, "--epochs", "3", "--micro-batch", "8", "--accum", "2", "--checkpoint-every", "2",
            "--task-arg", "always_bad=true", "--task-arg", "bad_from=5", "--nonfinite", "rollback",
            "--run-dir", run)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "gave up after 3 rollbacks" in last, r.stderr
    reader = RunReader(str(run))
    assert len(reader.events(kinds={"rolled_back"})) == 3
    assert os.path.exists(run / "checkpoints" / "last.pt")


def test_a_fork_setting_a_value_back_to_the_parents_start_value_is_a_change(tmp_path, task):
    """The parent starts at accum 2, is switched to 4 during epoch 1 (through run.db, as the app
    does); a fork of a later checkpoint given --accum 2 trains at 2, and records it."""
    from engine.declarations.commands import SetAccum
    from engine.declarations.config import TrainConfig
    from engine.tasks.loader import load_task
    from engine.trainer.trainer import Trainer
    parent = tmp_path / "parent"

    def sink(e):
        if e.kind == "step" and e.step == 2:
            trainer.send(SetAccum(4, at="step"))
    trainer = Trainer(TrainConfig(task=task, epochs=1, micro_batch=8, accum=2, checkpoint_every=4, device="cpu",
                                  run_dir=str(parent)), task=load_task(task), sink=sink)
    trainer.run()
    assert ckpt.load(str(parent / "checkpoints" / "step-8.pt"))["settings"]["accum"] == 4
    same = tmp_path / "same"
    assert cli("--fork", f"{parent}@step-8", "--run-dir", same).returncode == 0
    assert {m["accum"] for m in RunReader(str(same)).metrics()} == {4}  # no flag: the checkpoint's 4
    back = tmp_path / "back"
    r = cli("--fork", f"{parent}@step-8", "--accum", "2", "--run-dir", back)
    assert r.returncode == 0, r.stderr
    assert {m["accum"] for m in RunReader(str(back)).metrics()} == {2}
    assert RunReader(str(back)).info()["parent"]["changed"] == {"accum": 2}
