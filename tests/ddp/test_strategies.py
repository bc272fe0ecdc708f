"""--strategy ddp and fsdp under torchrun on CPU (gloo): the update equals one process's on the
same global windows, variable lengths and a short (or, on 4 ranks, partly empty) last window;
the wrappers are really used.

The runs on 2 ranks share one torchrun launch, those on 4 ranks another, with the other files'
runs (tests/ddp/conftest.py: a launch costs each rank seconds of imports, a run a fraction of
that); each test reads its own.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from engine.store import RunReader
from tests.ddp.harness import Launch, Scenario, max_diff, scenario, single_process

if TYPE_CHECKING:
    from tests.ddp.harness import Weights

# 61 samples, windows of 8: seven full windows and a short one of 5 (shares of 2 and 3).
SAMPLES = 61
CLIP = 0.38  # the reference's norms are 0.32 to 0.42: about half the windows are clipped


def two_rank_scenarios(base: Path, request: pytest.FixtureRequest) -> dict[str, Scenario]:
    """This file's runs on 2 ranks (tests/ddp/conftest.py trains them in the launch it shares
    between the files)."""
    return {
        "ddp": scenario(count_hook=1, strategy="ddp", samples=SAMPLES),
        "ddp_no_sum_hook": scenario(strategy="ddp", samples=SAMPLES, no_sum_hook=1),
        "local_count": scenario(local_count=1, samples=SAMPLES),
        "fsdp_last": scenario(count_hook=1, strategy="fsdp", fsdp_reduce="last", samples=SAMPLES, clip=CLIP),
        "fsdp_every": scenario(count_hook=1, strategy="fsdp", fsdp_reduce="every", samples=SAMPLES, clip=CLIP),
        "fsdp_local_norm": scenario(strategy="fsdp", samples=SAMPLES, clip=CLIP, local_norm=1),
        "fsdp_nan": scenario({"HEADROOM_TEST_NAN_AT": "1:3"}, strategy="fsdp"),
        "config_ddp": scenario(task="config", strategy="ddp"),
        "config_fsdp": scenario(task="config", strategy="fsdp"),
    }


def four_rank_scenarios(base: Path, request: pytest.FixtureRequest) -> dict[str, Scenario]:
    """57 samples in windows of 8 (4 ranks x 2), per strategy."""
    return {strategy: scenario(strategy=strategy, samples=57, micro=2, accum=1) for strategy in ("ddp", "fsdp")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Weights:
    return single_process(tmp_path_factory.mktemp("ref") / "run", samples=SAMPLES)


def test_ddp_2x2_on_two_ranks_equals_one_process_8x1(two_ranks: Launch, reference: Weights) -> None:
    logs, weights, _, out = two_ranks["ddp"]
    assert max_diff(weights[0], weights[1]) == 0.0  # ranks hold identical weights
    assert max_diff(weights[0], reference) < 1e-6
    for log in logs:
        assert [e["step"] for e in log] == list(range(1, 9))
        assert all(e["ddp_wrappers"] == 1 for e in log)
        for e in log:
            mbs = e["micro_batches"]
            assert mbs and all(m["inside_ddp"] for m in mbs)  # the user's forward runs inside DDP's forward
            assert [m["sync"] for m in mbs] == [False] * (len(mbs) - 1) + [True]  # no_sync but the last
    rows = RunReader(str(out / "run")).metrics()
    assert len({r["tokens"] for r in rows}) > 1  # variable lengths: the update depends on the global count
    assert rows[-1]["samples"] == 5  # the short last window


def test_ddp_without_the_sum_hook_averages_and_differs(two_ranks: Launch, reference: Weights) -> None:
    """Negative control: DDP's own hook divides by the world size; the engine's sums."""
    weights = two_ranks["ddp_no_sum_hook"].weights
    assert max_diff(weights[0], reference) > 1e-4


def test_negative_control_without_global_count_differs(two_ranks: Launch, reference: Weights) -> None:
    weights = two_ranks["local_count"].weights
    assert max_diff(weights[0], reference) > 1e-4


@pytest.fixture(scope="module")
def clipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Weights, list[dict]]:
    run = tmp_path_factory.mktemp("clipped") / "run"
    return single_process(run, samples=SAMPLES, clip=CLIP), RunReader(str(run)).metrics()


@pytest.mark.parametrize("reduce", ["last", "every"])
def test_fsdp_on_two_ranks_equals_one_process_and_shards(two_ranks: Launch, clipped: tuple[Weights, list[dict]],
                                                         reduce: str) -> None:
    """With clipping: the norm (and so the clip coefficient) is the global one, over every
    rank's shards."""
    reference, ref_rows = clipped
    logs, weights, _, out = two_ranks[f"fsdp_{reduce}"]
    assert max_diff(weights[0], weights[1]) == 0.0
    assert max_diff(weights[0], reference) < 1e-6
    rows = RunReader(str(out / "run")).metrics()
    assert all(abs(r["grad_norm"] - q["grad_norm"]) <= 1e-5 * q["grad_norm"] for r, q in zip(rows, ref_rows))
    assert any(q["grad_norm"] > CLIP for q in ref_rows) and any(q["grad_norm"] <= CLIP for q in ref_rows)
    for log in logs:
        assert [e["step"] for e in log] == list(range(1, 9))
        assert all(e["ddp_wrappers"] == 0 for e in log)
        # each rank holds half of every parameter (DTensor shards), whole only inside the forward
        assert all(e["local_numel"] * 2 == e["total_numel"] for e in log)
    info = RunReader(str(out / "run")).info()
    assert info["world_size"] == 2 and info["config"]["strategy"] == "fsdp" and info.get("strategy") == "fsdp"


@pytest.fixture(scope="module")
def reference_57(tmp_path_factory: pytest.TempPathFactory) -> Weights:
    return single_process(tmp_path_factory.mktemp("ref57") / "run", samples=57)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_four_ranks_with_empty_shares_equal_one_process(four_ranks: Launch, reference_57: Weights,
                                                        strategy: str) -> None:
    """57 samples in windows of 8 (4 ranks x 2): the last window holds one sample, so three ranks
    have nothing to train; they join the window's reduction with a zero-weighted stand-in."""
    logs, weights, _, _ = four_ranks[strategy]
    assert all(max_diff(weights[0], w) == 0.0 for w in weights[1:])
    assert max_diff(weights[0], reference_57) < 1e-6
    if strategy == "fsdp":
        assert all(e["local_numel"] * 4 == e["total_numel"] for log in logs for e in log)


def test_fsdp_negative_control_a_norm_of_the_local_shards_differs(two_ranks: Launch,
                                                                   clipped: tuple[Weights, list[dict]]) -> None:
    reference, _ = clipped
    weights = two_ranks["fsdp_local_norm"].weights
    assert max_diff(weights[0], reference) > 1e-4


def test_nan_on_one_rank_skips_the_step_on_both_under_fsdp(two_ranks: Launch) -> None:
    logs, _, _, out = two_ranks["fsdp_nan"]
    for log in logs:
        by_step = {e["step"]: e for e in log}
        assert by_step[3]["nonfinite"] and not by_step[2]["nonfinite"] and not by_step[4]["nonfinite"]
        assert by_step[3]["wsum"] == by_step[2]["wsum"]  # this rank's shards did not move
    events = RunReader(str(out / "run")).events(kinds={"nonfinite"})
    assert [e["step"] for e in events] == [3] and events[0]["data"]["params"]  # named, from global norms


@pytest.fixture(scope="module")
def config_reference(tmp_path_factory: pytest.TempPathFactory) -> Weights:
    return single_process(tmp_path_factory.mktemp("config_ref") / "run", task="config")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_loss_that_reads_model_config_and_calls_a_model_method(two_ranks: Launch, config_reference: Weights,
                                                                 strategy: str) -> None:
    """tests/ddp/config_task.py: model.config.vocab_size and model.next_token_logits(x), which
    calls forward directly. Under either wrapper the run (2 ranks x 2 x 2) equals one process's (8 x 1)."""
    logs, weights, _, out = two_ranks[f"config_{strategy}"]
    assert max_diff(weights[0], weights[1]) == 0.0
    assert max_diff(weights[0], config_reference) < 1e-6
    assert RunReader(str(out / "run")).info()["config"]["strategy"] == strategy
