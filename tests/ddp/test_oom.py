"""Out of memory under torchrun, per strategy: in a micro-batch with no collective in flight the
rank redoes the window alone with half the micro-batch (exact); in one with collectives in
flight every rank stops within seconds (not the process group's 120 s timeout), with one
`error:` line naming the rank and the micro-batch to try, rows committed, last checkpoint kept."""
from __future__ import annotations

import sqlite3
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from engine.store import RunReader
from tests.ddp.harness import ROOT, TORCHRUN, Launch, Scenario, env, max_diff, scenario

if TYPE_CHECKING:
    from tests.ddp.harness import Weights


REDONE = [  # (a forward OOM under ddp: test_ddp.py)
    ("ddp", "HEADROOM_TEST_BACKWARD_OOM_AT"),
    ("fsdp", "HEADROOM_TEST_OOM_AT"),
    ("fsdp", "HEADROOM_TEST_BACKWARD_OOM_AT"),
]


def two_rank_scenarios(base: Path, request: pytest.FixtureRequest) -> dict[str, Scenario]:
    """The runs that recover (tests/ddp/conftest.py trains them in the launch it shares between
    the files); those that stop end their job: one launch each."""
    return {f"{strategy}-{inject}": scenario({inject: "1:3"}, count_hook=1, strategy=strategy)
            for strategy, inject in REDONE}


@pytest.mark.parametrize("strategy, inject", REDONE)
def test_oom_in_a_micro_batch_without_collectives_is_redone_by_that_rank_alone(two_ranks: Launch,
                                                                              reference_64: Weights,
                                                                              strategy: str, inject: str) -> None:
    """Rank 1's third loss call is the first micro-batch of window 2 (of 2): under ddp it runs
    under no_sync, under fsdp (--fsdp-reduce last) with the parameters already whole and no
    reduction: no collective. Rank 1 redoes window 2 as 4 micro-batches of 1 while rank 0, which
    trained it as 2 of 2, waits in its last backward; both adopt micro-batch 1."""
    logs, weights, _, out = two_ranks[f"{strategy}-{inject}"]
    for log in logs:
        assert log[0]["micro"] == 2 and all(e["micro"] == 1 and e["accum"] == 4 for e in log[1:])
        assert [e["step"] for e in log] == list(range(1, 9))
    again = logs[1][1]["micro_batches"]
    assert len(logs[0][1]["micro_batches"]) == 2  # rank 0 trained window 2 once, as 2 micro-batches
    assert len(again) in (4, 5) and len(again[-4:]) == 4  # rank 1: (the failed forward, then) 4 of 1
    assert max_diff(weights[0], weights[1]) == 0.0
    assert max_diff(weights[0], reference_64) < 1e-6  # the redone window is exact
    events = RunReader(str(out / "run")).events(kinds={"oom_recovered"})
    assert len(events) == 1 and events[0]["data"]["new_micro_batch"] == 1


@pytest.mark.parametrize("strategy, reduce, call, which", [
    ("ddp", "last", 4, "micro-batch 2 of 2"),  # the last backward all-reduces the buckets
    ("fsdp", "last", 4, "micro-batch 2 of 2"),  # the last backward reduce-scatters
    ("fsdp", "every", 3, "micro-batch 1 of 2"),  # every backward reduce-scatters
])
def test_oom_with_collectives_in_flight_stops_every_rank_within_seconds(tmp_path, strategy, reduce, call, which):
    run_dir = tmp_path / "run"
    args = TORCHRUN + ["-m", "engine", "--task", "tests/ddp/varlen_task.py", "--epochs", "2", "--micro-batch", "2",
                       "--accum", "2", "--device", "cpu", "--run-dir", str(run_dir), "--strategy", strategy,
                       "--checkpoint-every", "1"]
    if strategy == "fsdp":
        args += ["--fsdp-reduce", reduce]
    t0 = time.time()
    r = subprocess.run(args, cwd=ROOT, env=env(HEADROOM_TEST_BACKWARD_OOM_AT=f"1:{call}"), capture_output=True,
                       text=True, timeout=200)
    elapsed = time.time() - t0
    assert r.returncode != 0
    assert elapsed < 100, f"{elapsed:.0f} s: the ranks waited for the process group's timeout"
    lines = [ln for ln in r.stderr.splitlines() if "error: out of memory on rank 1" in ln]
    assert len(lines) == 1, r.stderr[-3000:]
    assert which in lines[0] and "try --micro-batch 1" in lines[0] and f"--strategy {strategy}" in lines[0]
    db = sqlite3.connect(str(run_dir / "run.db"))
    assert [s for (s,) in db.execute("SELECT step FROM metrics ORDER BY step")] == [1]  # rows committed
    assert db.execute("SELECT count(*) FROM events WHERE kind = 'run_failed'").fetchone() == (1,)
    last = run_dir / "checkpoints" / ("last" if strategy == "fsdp" else "last.pt")
    state = torch.load(last / "meta.pt" if strategy == "fsdp" else last, weights_only=True)
    assert state["step"] == 1  # the last checkpoint, kept
