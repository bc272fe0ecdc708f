"""--strategy ddp and fsdp under torchrun on CPU (gloo): the update equals one process's on the
same global windows, variable lengths and a short (or, on 4 ranks, partly empty) last window;
the wrappers are really used."""
from __future__ import annotations

import pytest

from engine.store import RunReader
from tests.ddp.harness import max_diff, single_process, torchrun_worker

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


@pytest.mark.parametrize("reduce", ["last", "every"])
def test_fsdp_on_two_ranks_equals_one_process_and_shards(tmp_path, reference, reduce):
    logs, weights = torchrun_worker(tmp_path, count_hook=1, strategy="fsdp", fsdp_reduce=reduce, samples=SAMPLES)
    assert max_diff(weights[0], weights[1]) == 0.0
    assert max_diff(weights[0], reference) < 1e-6
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
