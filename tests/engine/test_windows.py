"""Sample order: a function of (seed, epoch) only, never of micro-batch or accumulation;
windows and micro-batches cut that order into consecutive runs."""
from __future__ import annotations

from engine_helpers import Recorder, make_task, run_trainer
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.accumulation import sampling

N = 30


def test_epoch_order_is_a_seeded_permutation():
    a = sampling.epoch_order(100, seed=3, epoch=1)
    assert sorted(a) == list(range(100))
    assert a == sampling.epoch_order(100, seed=3, epoch=1)
    assert a != sampling.epoch_order(100, seed=3, epoch=2)
    assert a != sampling.epoch_order(100, seed=4, epoch=1)
    assert a != list(range(100))


def test_epoch_order_ignores_global_rng():
    import torch
    torch.manual_seed(1)
    a = sampling.epoch_order(50, 0, 1)
    torch.manual_seed(2)
    torch.rand(10)
    assert sampling.epoch_order(50, 0, 1) == a


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 80), size=st.integers(1, 20))
def test_fixed_windows_cut_in_order(n, size):
    order = list(range(n))[::-1]
    ws = sampling.fixed_windows(order, size)
    assert [i for w in ws for i in w] == order
    assert all(len(w) == size for w in ws[:-1]) and 1 <= len(ws[-1]) <= size


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=60), budget=st.integers(1, 100))
def test_token_windows_close_at_budget(lengths, budget):
    order = list(range(len(lengths)))
    ws = sampling.token_windows(order, budget, lengths.__getitem__)
    assert [i for w in ws for i in w] == order
    for w in ws[:-1]:  # every full window holds the budget, and would not without its last sample
        held = sum(lengths[i] for i in w)
        assert held >= budget and held - lengths[w[-1]] < budget
    assert all(w for w in ws)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 50), world=st.integers(1, 8))
def test_rank_shares_partition_the_window(n, world):
    window = list(range(100, 100 + n))
    shares = [sampling.rank_share(window, r, world) for r in range(world)]
    assert [i for s in shares for i in s] == window
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 50), micro=st.integers(1, 9))
def test_micro_batches(n, micro):
    share = list(range(n))
    mbs = sampling.micro_batches(share, micro)
    assert [i for m in mbs for i in m] == share
    assert all(1 <= len(m) <= micro for m in mbs)
    assert len(mbs) == -(-n // micro)


def test_plan_epoch_modes():
    assert sampling.epoch_windows(10, 0, 1, 4) == sampling.fixed_windows(sampling.epoch_order(10, 0, 1), 4)
    lengths = [3] * 10
    assert sampling.epoch_windows(10, 0, 1, 4, token_budget=7, length=lengths.__getitem__) == \
        sampling.token_windows(sampling.epoch_order(10, 0, 1), 7, lengths.__getitem__)


def recorded(tmp_path, name, micro, accum, seed=0, epochs=2):
    rec = Recorder()
    run_trainer(make_task(N, recorder=rec), tmp_path / name, recorder=rec, micro_batch=micro, accum=accum,
                seed=seed, epochs=epochs)
    return rec


def test_sample_order_independent_of_micro_batch_and_accum(tmp_path):
    """The engine feeds samples in the same order whatever the split; runs with the same window
    size see the same windows; the order differs between epochs and seeds."""
    base = recorded(tmp_path, "12x1", 12, 1)
    flat = [i for w in base.windows for i in w]
    assert sorted(flat[:N]) == list(range(N)) and sorted(flat[N:]) == list(range(N))
    assert flat[:N] == sampling.epoch_order(N, 0, 1) and flat[N:] == sampling.epoch_order(N, 0, 2)
    assert flat[:N] != flat[N:]
    for micro, accum in [(1, 12), (2, 6), (3, 4), (5, 2), (4, 1), (7, 3)]:
        rec = recorded(tmp_path, f"{micro}x{accum}", micro, accum)
        assert [i for mb in rec.micro for i in mb] == flat, (micro, accum)
        assert all(len(mb) <= micro for mb in rec.micro)
        if micro * accum == 12:
            assert rec.windows == base.windows
    other_seed = recorded(tmp_path, "seed1", 12, 1, seed=1)
    assert [i for w in other_seed.windows for i in w] != flat
