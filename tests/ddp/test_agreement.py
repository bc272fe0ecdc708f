"""Every rank runs the same job (issue 31): the ranks' settings and data sets are compared right
after the process group starts, and a difference is refused on every rank alike: one line naming
the flag and the ranks, exit 2 on every rank (none killed by the agent or aborted by gloo at
exit), no run.db. The refusal leaves the group torn down (the in-launch scenarios check it in
the process: no group, no gloo thread), so the same ranks can train the next run.

A rank whose own task fails leaves its error for rank 0, which writes it to run.db (not only
"another rank died")."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.store import RunReader
from tests.ddp.harness import ROOT, TORCHRUN, Launch, Scenario, env, exit_codes, scenario

REFUSED = {  # scenario -> (its options, the line every rank refuses it with)
    "lr": (dict(by_rank=json.dumps({"lr": [0.001, 0.5]})),
           "ranks disagree on --lr: rank 0 has 0.001, rank 1 has 0.5"),
    "several": (dict(by_rank=json.dumps({"accum": [2, 4], "micro": [2, 1]})),
                "ranks disagree on --micro-batch: rank 0 has 2, rank 1 has 1; and on --accum: rank 0 has 2, "
                "rank 1 has 4"),
    "data": (dict(by_rank=json.dumps({"samples": [64, 48]})),
             "train_data: 64 samples on rank 0; 48 samples on rank 1"),
    "fsdp-finder": (dict(strategy="fsdp", find_micro_batch=8),
                    "--find-micro-batch does not work with --strategy fsdp"),
    # the same class, refused by every rank alike but decided outside any collective (while sharding)
    "bad-blocks": (dict(strategy="fsdp", env=dict(HEADROOM_TEST_BAD_BLOCKS="1")),
                   "the task's blocks(model) must return submodules of the model"),
}


def two_rank_scenarios(base: Path, request: pytest.FixtureRequest) -> dict[str, Scenario]:
    """Refused runs, one after another in the same ranks (each must leave the group torn down
    for the next), then one that trains."""
    runs = {name: scenario(refused=1, **opts) for name, (opts, _) in REFUSED.items()}  # (env: the task's switches)
    return {**runs, "then-trains": scenario()}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_run_the_ranks_disagree_on_is_refused_on_every_rank_and_the_group_torn_down(two_ranks: Launch,
                                                                                     name: str) -> None:
    out = two_ranks[name].out
    said = [(out / f"refused-{rank}.txt").read_text() for rank in range(2)]
    assert said[0] == said[1] and REFUSED[name][1] in said[0], said
    assert not (out / "run" / "run.db").exists()


def test_the_same_ranks_train_after_the_refusals(two_ranks: Launch) -> None:
    logs = two_ranks["then-trains"].logs
    assert [e["step"] for e in logs[0]] == list(range(1, 9)) and logs[0] == logs[1]


def cli(tmp_path: Path, per_rank: list[list[str]], **extra_env: str) -> subprocess.CompletedProcess:
    base = ["--task", "tests/ddp/varlen_task.py", "--epochs", "1", "--micro-batch", "2", "--accum", "2",
            "--device", "cpu", "--run-dir", str(tmp_path / "run")]
    args = TORCHRUN + [str(ROOT / "tests" / "ddp" / "rank_cli.py")]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env=env(HEADROOM_TEST_RANK_ARGS=json.dumps([base + a for a in per_rank]), **extra_env))


def test_two_ranks_started_with_different_lrs_both_exit_2_naming_the_flag(tmp_path: Path) -> None:
    r = cli(tmp_path, [["--lr", "0.001"], ["--lr", "0.5"]])
    lines = [ln for ln in r.stderr.splitlines() if "error: " in ln]
    assert lines == ["error: ranks disagree on --lr: rank 0 has 0.001, rank 1 has 0.5"] * 2, r.stderr[-3000:]
    assert sorted(exit_codes(r.stderr)) == [2, 2], r.stderr[-3000:]  # every rank: no -15, no -6
    assert "terminate called" not in r.stderr
    assert not (tmp_path / "run" / "run.db").exists()


def test_a_ranks_own_error_reaches_run_db(tmp_path: Path) -> None:
    r = cli(tmp_path, [[], []], HEADROOM_TEST_RAISE_AT="1:3")
    assert r.returncode != 0
    failed = RunReader(str(tmp_path / "run")).events(kinds={"run_failed"})
    assert len(failed) == 1, r.stderr[-3000:]
    error = failed[0]["data"]["error"]
    assert error.startswith("rank 1 of this 2-process job failed: ValueError: sample shard of rank 1 is corrupt"), error
    assert "varlen_task.py" in error  # where, in the task's own code
    assert "ValueError: sample shard of rank 1 is corrupt" in failed[0]["data"]["detail"]  # rank 1's traceback


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
