"""torchrun on CPU (gloo), two processes, the default strategy (DDP): agreement between the
ranks (stop, NaN, commands, rollback), the start from rank 0's model, failures.

The launcher is PyTorch's own (`python -m torch.distributed.run`); the worker
(tests/ddp/worker.py) drives the real engine and records what each rank saw. Exactness of
each strategy against one process: test_strategies.py.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from engine.declarations.commands import SETTING_COMMANDS, SetLr
from engine.store import RunReader
from tests.ddp.harness import ROOT, TORCHRUN, Launch, Scenario, env, exit_codes, max_diff, scenario

if TYPE_CHECKING:
    from tests.ddp.harness import Weights


def two_rank_scenarios(base: Path, request: pytest.FixtureRequest) -> dict[str, Scenario]:
    """This file's runs that end cleanly (tests/ddp/conftest.py trains them in the launch it
    shares between the files; the tests only read the results). The first two get a command
    through run.db while they train; the fork continues the rollback run, which comes before it."""
    return {
        "command": scenario({"HEADROOM_TEST_SLOW": "0.03"}, send=(1, SetLr(0.01)), epochs=4),  # at the next epoch
        "step_lr": scenario({"HEADROOM_TEST_SLOW": "0.15"}, send=(2, SetLr(0.01, at="step")), task="config", micro=1,
                            accum=2),  # at the next step
        "nan": scenario({"HEADROOM_TEST_NAN_AT": "1:3"}),
        # Rank 1's third loss call is the first micro-batch of window 2.
        "oom": scenario({"HEADROOM_TEST_OOM_AT": "1:3"}),
        "batch_norm": scenario({"HEADROOM_TEST_BATCH_NORM": "1"}),
        "batch_norm_apart": scenario({"HEADROOM_TEST_BATCH_NORM": "1"}, no_buffer_sync=1),
        "rank_init": scenario({"HEADROOM_TEST_RANK_INIT": "1"}),
        "rank_init_apart": scenario({"HEADROOM_TEST_RANK_INIT": "1"}, no_share=1),
        "rollback": scenario({"HEADROOM_TEST_NAN_AT": "1:5,1:6"}, epochs=2, checkpoint_every=2,
                             nonfinite="rollback", nan_by_call=1),
        "fork": scenario(epochs=2, fork=f"{base / 'rollback' / 'run'}@step-8", run="fork"),
        # In the last of 2 epochs: extended to 3, applied where the run would have ended (issue 32).
        "length": scenario({"HEADROOM_TEST_SLOW": "0.2"}, send=(9, SETTING_COMMANDS["epochs"](3)), epochs=2),
    }


def test_nan_on_one_rank_skips_the_step_on_both(two_ranks: Launch) -> None:
    logs, weights, _, out = two_ranks["nan"]
    for log in logs:
        by_step = {e["step"]: e for e in log}
        assert by_step[3]["nonfinite"] and not by_step[2]["nonfinite"] and not by_step[4]["nonfinite"]
        assert by_step[3]["wsum"] == by_step[2]["wsum"]  # nothing moved on either rank
    assert max_diff(weights[0], weights[1]) == 0.0
    events = RunReader(str(out / "run")).events(kinds={"nonfinite"})
    assert [e["step"] for e in events] == [3]


def test_oom_on_one_rank_is_recovered_on_both(two_ranks: Launch, reference_64: Weights) -> None:
    logs, weights, _, out = two_ranks["oom"]
    for log in logs:
        assert log[0]["micro"] == 2 and all(e["micro"] == 1 and e["accum"] == 4 for e in log[1:])
    assert max_diff(weights[0], weights[1]) == 0.0
    assert max_diff(weights[0], reference_64) < 1e-6  # the redone window is exact
    events = RunReader(str(out / "run")).events(kinds={"oom_recovered"})
    assert len(events) == 1 and events[0]["data"]["new_micro_batch"] == 1


def test_batch_norm_statistics_are_rank_0s_on_every_rank(two_ranks: Launch) -> None:
    """DDP does not broadcast buffers before each forward here (forward_sync_buffers=False): they go
    from rank 0 once a window, after its gradients, and both ranks end with the same running
    statistics. Negative control: without that broadcast they differ."""
    weights = two_ranks["batch_norm"].weights
    assert "norm.running_mean" in weights[0]
    assert max_diff(weights[0], weights[1]) == 0.0
    apart = two_ranks["batch_norm_apart"].weights
    assert float((apart[0]["norm.running_mean"] - apart[1]["norm.running_mean"]).abs().max()) > 1e-4


def test_every_rank_starts_from_rank_0s_model(two_ranks: Launch, reference_64: Weights) -> None:
    """Each rank initialises its model from its own seed: the run starts from rank 0's values on
    every rank (as DDP's constructor made it), so the result is one process's with rank 0's
    seed. Negative control: without that, the ranks train apart."""
    weights = two_ranks["rank_init"].weights
    assert max_diff(weights[0], weights[1]) == 0.0
    assert max_diff(weights[0], reference_64) < 1e-6
    apart = two_ranks["rank_init_apart"].weights
    assert max_diff(apart[0], apart[1]) > 1e-3


def test_ranks_that_build_different_models_are_bad_input(tmp_path):
    """Rank 1 builds a wider model: one error line on every rank, exit 2, no run.db (DDP's
    constructor refused such a job with a multi-line shape error)."""
    run_dir = tmp_path / "run"
    args = TORCHRUN + ["-m", "engine", "--task", "tests/ddp/varlen_task.py", "--epochs", "1", "--micro-batch", "2",
                       "--device", "cpu", "--run-dir", str(run_dir)]
    r = subprocess.run(args, cwd=ROOT, env=env(HEADROOM_TEST_RANK_WIDTH="1"), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if "error: under torchrun every rank must build the same model" in line]
    assert len(lines) == 2, r.stderr[-3000:]  # one per rank
    assert sorted(exit_codes(r.stderr)) == [2, 2], r.stderr[-3000:]  # every rank (not -15 or -6: issue 31)
    assert not (run_dir / "run.db").exists()


def test_oom_in_the_optimizer_step_of_one_rank_stops_every_rank(tmp_path):
    """Rank 1 runs out of memory in its third optimizer step, after the gradients were summed:
    rank 0 has stepped and moved on, so rank 1 cannot redo the window (it would pair its
    collectives with rank 0's next window, same shapes, silently). It stops with one error line
    saying why, rank 0 stops too, promptly, and run.db and the checkpoint hold step 3 (rank 0's,
    whole). Before the fix rank 1 redid the window, its collectives no longer paired with
    rank 0's and the job hung until the process group's 120 s timeout."""
    run_dir = tmp_path / "run"
    args = TORCHRUN + ["-m", "engine", "--task", "tests/ddp/varlen_task.py", "--epochs", "2", "--micro-batch", "2",
                       "--accum", "2", "--device", "cpu", "--run-dir", str(run_dir)]
    t0 = time.time()
    r = subprocess.run(args, cwd=ROOT, env=env(HEADROOM_TEST_STEP_OOM_AT="1:3"), capture_output=True, text=True,
                       timeout=150)
    assert time.time() - t0 < 120
    assert r.returncode != 0
    assert "error: out of memory on rank 1 in the optimizer step" in r.stderr
    db = sqlite3.connect(str(run_dir / "run.db"))
    assert [s for (s,) in db.execute("SELECT step FROM metrics ORDER BY step")] == [1, 2, 3]
    assert db.execute("SELECT count(*) FROM events WHERE kind = 'run_failed'").fetchone() == (1,)
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert state["step"] == 3


def test_command_in_run_db_applies_on_both_ranks_at_the_same_boundary(two_ranks: Launch) -> None:
    logs, _, _, out = two_ranks["command"]
    changed = [next(e["step"] for e in log if e["lr"] == 0.01) for log in logs]
    assert changed[0] == changed[1]
    assert (changed[0] - 1) % 8 == 0 and changed[0] > 1  # the first step of an epoch (8 steps per epoch)
    applied = RunReader(str(out / "run")).events(kinds={"settings_applied"})
    assert len(applied) == 1 and applied[0]["step"] == changed[0] - 1
    assert RunReader(str(out / "run")).commands()[0]["status"] == "applied"


def test_a_run_extended_in_its_last_epoch_goes_on_on_both_ranks(two_ranks: Launch) -> None:
    logs, _, _, out = two_ranks["length"]
    assert [[(e["step"], e["epoch"]) for e in log] for log in logs] == [[(s, 1 + (s - 1) // 8)
                                                                         for s in range(1, 25)]] * 2
    assert [e["lr"] for e in logs[0]] == [e["lr"] for e in logs[1]]
    applied = RunReader(str(out / "run")).events(kinds={"settings_applied"})
    assert [e["step"] for e in applied] == [16]  # after epoch 2's last step, on both ranks alike
    assert RunReader(str(out / "run")).commands()[0]["status"] == "applied"


def test_killing_one_rank_ends_the_run_with_run_failed(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    run_dir = tmp_path / "run"
    args = TORCHRUN + ["-m", "engine", "--task", "tests/ddp/varlen_task.py", "--epochs", "1000", "--micro-batch", "2",
                       "--accum", "2", "--device", "cpu", "--run-dir", str(run_dir)]
    proc = subprocess.Popen(args, cwd=ROOT, env=env(HEADROOM_TEST_SLOW="0.02", HEADROOM_TEST_PIDS=str(pids)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                if len(RunReader(str(run_dir)).metrics()) >= 10:
                    break
            except Exception:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("the run never got going")
        os.kill(int((pids / "rank-1.pid").read_text()), signal.SIGKILL)
        t0 = time.time()
        _, err = proc.communicate(timeout=60)
        assert time.time() - t0 < 60
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "error: " in err and "another rank" in err
    db = sqlite3.connect(str(run_dir / "run.db"))
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    kinds = [k for (k,) in db.execute("SELECT kind FROM events ORDER BY id")]
    assert "run_failed" in kinds
    assert (run_dir / "checkpoints" / "last.pt").exists()


def test_a_loss_reading_model_config_and_a_step_level_change_under_torchrun(two_ranks: Launch) -> None:
    """The loss reads model.config (works in one process, so it must under torchrun), and a
    set_lr with at="step" sent through run.db mid-epoch applies on every rank at the same step."""
    logs, _, _, out = two_ranks["step_lr"]
    run_dir = out / "run"
    assert [[e["lr"] for e in log] for log in logs[1:]] == [[e["lr"] for e in logs[0]]]  # the same step on every rank
    rows = RunReader(str(run_dir)).metrics()
    assert len(rows) == 16 and {r["epoch"] for r in rows} == {1}
    lrs = [r["lr"] for r in rows]
    k = lrs.index(0.01)
    assert 2 <= k < 16 and lrs[:k] == [0.05] * k and lrs[k:] == [0.01] * (16 - k)  # within the epoch
    applied = RunReader(str(run_dir)).events(kinds={"settings_applied"})
    assert applied[0]["data"]["at"] == "step" and applied[0]["data"]["from_step"] == k + 1


def test_rollback_and_fork_agree_on_every_rank(two_ranks: Launch) -> None:
    """NaN on rank 1 only, twice in a row: both ranks roll back to the same checkpoint with the
    same lr; a fork of the rolled-back run (torchrun again) reproduces the parent's steps."""
    logs, weights, _, a = two_ranks["rollback"]
    assert max_diff(weights[0], weights[1]) == 0.0
    assert [(e["step"], e["lr"], e["wsum"]) for e in logs[0]] == [(e["step"], e["lr"], e["wsum"]) for e in logs[1]]
    reader = RunReader(str(a / "run"))
    rolled = reader.events(kinds={"rolled_back"})
    assert len(rolled) == 1 and rolled[0]["data"]["to_step"] == 4 and rolled[0]["data"]["new_lr"] == 0.025
    assert {d["step"] for d in reader.discarded()} >= {5, 6}
    parent = {m["step"]: m["loss"] for m in reader.metrics()}
    _, weights_b, _, b = two_ranks["fork"]
    assert max_diff(weights_b[0], weights_b[1]) == 0.0
    fork = {m["step"]: m["loss"] for m in RunReader(str(b / "fork")).metrics()}
    assert min(fork) == 9 and fork and all(fork[s] == parent[s] for s in fork)
    assert max_diff(weights_b[0], weights[0]) == 0.0  # the fork ends where the parent ended
