"""Checkpoints of sharded runs (torch.distributed.checkpoint folders): written by 2 ranks,
continued on 1 process and on 4 ranks with the effective batch kept, exact against a run that
never changed world size; headroom-export makes one weights_only file of any checkpoint."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from engine.store import RunReader
from tests.ddp.harness import ROOT, Launch, Scenario, env, group, max_diff, scenario, single_process

if TYPE_CHECKING:
    from tests.ddp.harness import Weights

SAMPLES = 61  # windows of 8: a short last window of 5


def two_rank_scenarios(base: Path, request: pytest.FixtureRequest) -> dict[str, Scenario]:
    """This file's runs on 2 ranks (tests/ddp/conftest.py trains them in the launch it shares
    between the files): `sharded`, --strategy fsdp stopped after step 3 of 8 (checkpoints/last/
    and step-2/); `ddp`, stopped after step 3 (checkpoints/last.pt); `ddp_to_fsdp`, that ddp run
    continued under fsdp."""
    common = dict(samples=SAMPLES, momentum=1)
    return {
        "sharded": scenario(strategy="fsdp", max_steps=3, checkpoint_every=2, **common),
        "ddp": scenario(strategy="ddp", max_steps=3, **common),
        "ddp_to_fsdp": scenario(strategy="fsdp", resume=1, run=str(base / "ddp" / "run"), **common),
    }


def four_rank_scenarios(base: Path, request: pytest.FixtureRequest) -> dict[str, Scenario]:
    """`resumed`: a copy of the sharded run (the other tests read it as it was) continued on 4
    ranks. None if the sharded run failed (the tests that read it say why)."""
    try:
        sharded = request.getfixturevalue("every_two_rank_run").within(group(__name__))["sharded"].out / "run"
    except AssertionError:
        return {}
    copy_run(sharded, base / "resumed" / "run")
    return {"resumed": scenario(strategy="fsdp", samples=SAMPLES, momentum=1, resume=1)}


@pytest.fixture
def sharded_run(two_ranks: Launch) -> Path:
    """2 ranks, --strategy fsdp, stopped after step 3 of 8 (checkpoints/last/ and step-2/)."""
    return two_ranks["sharded"].out / "run"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Weights:
    """One process, 8x1, the whole epoch: what an uninterrupted run on any number of ranks ends at."""
    return single_process(tmp_path_factory.mktemp("ref") / "run", samples=SAMPLES, momentum=True)


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def engine_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str]:
    """`python -m engine ARGS` in this process, from the repository (the runs name their task
    file relative to it), on this file's data: its exit code and what it wrote to stderr. What
    these tests check is the continued run and its console line, not the process."""
    from engine.cli import main
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HEADROOM_TEST_SAMPLES", str(SAMPLES))
    monkeypatch.setenv("HEADROOM_TEST_MOMENTUM", "1")
    monkeypatch.setattr(sys, "path", sys.path[:])  # the engine puts the task's folder first on it
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


def test_the_checkpoint_is_a_folder_per_name(sharded_run: Path) -> None:
    ckpts = sharded_run / "checkpoints"
    assert sorted(os.listdir(ckpts)) == ["last", "step-2"]  # no temporary or old folder left
    for name in ("last", "step-2"):
        files = set(os.listdir(ckpts / name))
        assert {".metadata", "meta.pt", "__0_0.distcp", "__1_0.distcp"} <= files  # each rank wrote its shards
    meta = torch.load(ckpts / "last" / "meta.pt", weights_only=True)
    assert meta["step"] == 3 and meta["world_size"] == 2 and meta["config"]["strategy"] == "fsdp"


def test_resumed_on_one_process_equals_the_uninterrupted_run(sharded_run: Path, reference: Weights, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(sharded_run, tmp_path / "run")
    rc, err = engine_in_process(monkeypatch, capsys, "--resume", run)
    assert rc == 0, err[-3000:]
    assert "[settings_applied] world_size 2 -> 1; accum 2 -> 4" in err  # the console says so
    event = RunReader(str(run)).events(kinds={"settings_applied"})[-1]
    assert event["step"] == 3 and [list(c) for c in event["data"]["changes"]] == [["world_size", 2, 1],
                                                                                   ["accum", 2, 4]]
    rows = RunReader(str(run)).metrics()
    assert [r["step"] for r in rows] == list(range(1, 9)) and rows[-1]["samples"] == 5
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)  # one process: a single file
    assert not (run / "checkpoints" / "last").exists()  # the name is one checkpoint, not two
    assert state["step"] == 8 and state["settings"]["accum"] == 4
    assert max_diff(state["model"], reference) < 1e-6


def test_resumed_on_four_ranks_equals_the_uninterrupted_run(four_ranks: Launch, reference: Weights) -> None:
    logs, weights, _, _ = four_ranks["resumed"]
    assert [e["step"] for e in logs[0]] == list(range(4, 9))
    assert all(e["accum"] == 1 and e["micro"] == 2 for e in logs[0])  # 2 x 1 x 4 ranks = 2 x 2 x 2 ranks
    assert all(e["local_numel"] * 4 == e["total_numel"] for e in logs[0])
    assert max_diff(weights[0], reference) < 1e-6


def test_export_of_a_sharded_checkpoint_loads_with_weights_only(sharded_run: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from engine.export import main as export_main
    out = tmp_path / "step2.pt"
    assert export_main([f"{sharded_run}@step-2", str(out)]) == 0, capsys.readouterr().err
    state = torch.load(out, weights_only=True)
    assert state["step"] == 2
    at_2 = single_process(tmp_path / "ref2", samples=SAMPLES, momentum=True, max_steps=2)
    assert max_diff(state["model"], at_2) < 1e-6  # whole tensors, the model's own names
    # a file export is a checkpoint like last.pt: a run folder holding it continues from it
    assert sorted(state["optimizer"]) == ["param_groups", "state"]
    assert sorted(state["optimizer"]["state"]) == list(range(len(at_2)))  # momentum, by parameter index
    # the real command line: exit 2, one error line
    bad = subprocess.run([sys.executable, "-m", "engine.export", f"{sharded_run}@step-9", str(tmp_path / "x.pt")],
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1
    assert not (tmp_path / "x.pt").exists()


def test_a_ddp_checkpoint_continues_sharded(two_ranks: Launch, reference: Weights) -> None:
    """DDP's single file (rank 0's last.pt) into FSDP on 2 ranks: the optimizer state by
    parameter index becomes by name, each rank keeps its shards."""
    assert "last.pt" in two_ranks["ddp"].checkpoints  # what the ddp run left
    logs, weights, _, _ = two_ranks["ddp_to_fsdp"]
    assert [e["step"] for e in logs[0]] == list(range(4, 9))
    assert max_diff(weights[0], reference) < 1e-6
    run = two_ranks.outs["ddp"] / "run"
    assert os.path.isdir(run / "checkpoints" / "last")
    assert not (run / "checkpoints" / "last.pt").exists()


def test_negative_control_a_fork_on_one_process_that_keeps_accum_2_differs(sharded_run: Path, reference: Weights,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--accum 2 given for the fork: windows of 2 x 2 x 1 = 4 samples, not 8; the run ends elsewhere."""
    fork = tmp_path / "fork"
    rc, err = engine_in_process(monkeypatch, capsys, "--fork", sharded_run, "--accum", "2", "--max-steps", "100",
                                "--run-dir", fork)
    assert rc == 0, err[-3000:]
    assert "world_size" not in err
    state = torch.load(fork / "checkpoints" / "last.pt", weights_only=True)
    assert state["settings"]["accum"] == 2 and state["step"] > 8  # 4 more samples a step: more steps
    assert max_diff(state["model"], reference) > 1e-4
