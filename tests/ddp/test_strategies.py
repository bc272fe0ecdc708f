"""--strategy ddp and fsdp under torchrun on CPU (gloo): the update equals one process's on the
same global windows, variable lengths and a short (or, on 4 ranks, partly empty) last window;
the wrappers are really used."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from engine.store import RunReader
from tests.ddp.harness import ROOT, TORCHRUN, env, max_diff, single_process, torchrun_worker

# 61 samples, windows of 8: seven full windows and a short one of 5 (shares of 2 and 3).
SAMPLES = 61


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return single_process(tmp_path_factory.mktemp("ref") / "run", samples=SAMPLES)


def test_ddp_2x2_on_two_ranks_equals_one_process_8x1(tmp_path, reference):
    logs, weights = torchrun_worker(tmp_path, count_hook=1, strategy="ddp", samples=SAMPLES)
    assert max_diff(weights[0], weights[1]) == 0.0  # ranks hold identical weights
    assert max_diff(weights[0], reference) < 1e-6
    for log in logs:
        assert [e["step"] for e in log] == list(range(1, 9))
        assert all(e["ddp_wrappers"] == 1 for e in log)
        for e in log:
            mbs = e["micro_batches"]
            assert mbs and all(m["inside_ddp"] for m in mbs)  # the user's forward runs inside DDP's forward
            assert [m["sync"] for m in mbs] == [False] * (len(mbs) - 1) + [True]  # no_sync but the last
    rows = RunReader(str(tmp_path / "run")).metrics()
    assert len({r["tokens"] for r in rows}) > 1  # variable lengths: the update depends on the global count
    assert rows[-1]["samples"] == 5  # the short last window


def test_ddp_without_the_sum_hook_averages_and_differs(tmp_path, reference):
    """Negative control: DDP's own hook divides by the world size; the engine's sums."""
    _, weights = torchrun_worker(tmp_path, strategy="ddp", samples=SAMPLES, no_sum_hook=1)
    assert max_diff(weights[0], reference) > 1e-4


def test_negative_control_without_global_count_differs(tmp_path, reference):
    _, weights = torchrun_worker(tmp_path, local_count=1, samples=SAMPLES)
    assert max_diff(weights[0], reference) > 1e-4


CLIP = 0.38  # the reference's norms are 0.32 to 0.42: about half the windows are clipped


@pytest.fixture(scope="module")
def clipped(tmp_path_factory):
    run = tmp_path_factory.mktemp("clipped") / "run"
    return single_process(run, samples=SAMPLES, clip=CLIP), RunReader(str(run)).metrics()


@pytest.mark.parametrize("reduce", ["last", "every"])
def test_fsdp_on_two_ranks_equals_one_process_and_shards(tmp_path, clipped, reduce):
    """With clipping: the norm (and so the clip coefficient) is the global one, over every
    rank's shards."""
    reference, ref_rows = clipped
    logs, weights = torchrun_worker(tmp_path, count_hook=1, strategy="fsdp", fsdp_reduce=reduce, samples=SAMPLES,
                                    clip=CLIP)
    assert max_diff(weights[0], weights[1]) == 0.0
    assert max_diff(weights[0], reference) < 1e-6
    rows = RunReader(str(tmp_path / "run")).metrics()
    assert all(abs(r["grad_norm"] - q["grad_norm"]) <= 1e-5 * q["grad_norm"] for r, q in zip(rows, ref_rows))
    assert any(q["grad_norm"] > CLIP for q in ref_rows) and any(q["grad_norm"] <= CLIP for q in ref_rows)
    for log in logs:
        assert [e["step"] for e in log] == list(range(1, 9))
        assert all(e["ddp_wrappers"] == 0 for e in log)
        # each rank holds half of every parameter (DTensor shards), whole only inside the forward
        assert all(e["local_numel"] * 2 == e["total_numel"] for e in log)
    info = RunReader(str(tmp_path / "run")).info()
    assert info["world_size"] == 2 and info["config"]["strategy"] == "fsdp" and info.get("strategy") == "fsdp"


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_four_ranks_with_empty_shares_equal_one_process(tmp_path, strategy):
    """57 samples in windows of 8 (4 ranks x 2): the last window holds one sample, so three ranks
    have nothing to train; they join the window's reduction with a zero-weighted stand-in."""
    logs, weights = torchrun_worker(tmp_path, nproc=4, timeout=240, strategy=strategy, samples=57, micro=2,
                                    accum=1)
    ref = single_process(tmp_path / "ref", samples=57)
    assert all(max_diff(weights[0], w) == 0.0 for w in weights[1:])
    assert max_diff(weights[0], ref) < 1e-6
    if strategy == "fsdp":
        assert all(e["local_numel"] * 4 == e["total_numel"] for log in logs for e in log)


def test_fsdp_negative_control_a_norm_of_the_local_shards_differs(tmp_path, clipped):
    reference, _ = clipped
    _, weights = torchrun_worker(tmp_path, strategy="fsdp", samples=SAMPLES, clip=CLIP, local_norm=1)
    assert max_diff(weights[0], reference) > 1e-4


def test_nan_on_one_rank_skips_the_step_on_both_under_fsdp(tmp_path):
    logs, _ = torchrun_worker(tmp_path, strategy="fsdp", extra_env={"HEADROOM_TEST_NAN_AT": "1:3"})
    for log in logs:
        by_step = {e["step"]: e for e in log}
        assert by_step[3]["nonfinite"] and not by_step[2]["nonfinite"] and not by_step[4]["nonfinite"]
        assert by_step[3]["wsum"] == by_step[2]["wsum"]  # this rank's shards did not move
    events = RunReader(str(tmp_path / "run")).events(kinds={"nonfinite"})
    assert [e["step"] for e in events] == [3] and events[0]["data"]["params"]  # named, from global norms


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_loss_that_reads_model_config_and_calls_a_model_method(tmp_path, strategy):
    """tests/ddp/config_task.py: model.config.vocab_size and model.next_token_logits(x), which
    calls forward directly. Under either wrapper the run equals one process's."""
    common = ["-m", "engine", "--task", "tests/ddp/config_task.py", "--epochs", "1", "--device", "cpu",
              "--lr", "0.05", "--clip", "0"]
    one = subprocess.run([sys.executable] + common + ["--micro-batch", "8", "--accum", "1", "--run-dir",
                         str(tmp_path / "one")], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run(TORCHRUN + common + ["--micro-batch", "2", "--accum", "2", "--strategy", strategy,
                         "--run-dir", str(tmp_path / "two")], cwd=ROOT, env=env(), capture_output=True, text=True,
                         timeout=300)
    assert two.returncode == 0, two.stderr[-2000:]
    ref = torch.load(tmp_path / "one" / "checkpoints" / "last.pt", weights_only=True)["model"]
    if strategy == "fsdp":
        out = tmp_path / "two.pt"
        r = subprocess.run([sys.executable, "-m", "engine.export", str(tmp_path / "two"), str(out)], cwd=ROOT,
                           env=env(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        got = torch.load(out, weights_only=True)["model"]
    else:
        got = torch.load(tmp_path / "two" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert max_diff(got, ref) < 1e-6
