"""A worker seeds `random` before each sample only once its data set has drawn from it
(engine/accumulation/workers.py, SampleSeeds): every sample's draws must still be the bits they are
when torch's, `random`'s and numpy's RNGs are all seeded before every sample, whatever the
split and the worker's past, and the micro-batch where `random` is first drawn from is read
again, seeded. In process: the worker's reads, no DataLoader."""
from __future__ import annotations

import random

import numpy as np
import torch

from engine.accumulation.workers import WATCH_FROM, WorkerData, sample_seed, seed_everything

SEED = 7


class Augmented(torch.utils.data.Dataset):
    """torch and numpy draws on every sample; `random` only from sample `from_index` on."""

    def __init__(self, from_index: int) -> None:
        self.from_index = from_index

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[float, ...]:
        r = random.random() if i >= self.from_index else -1.0
        return (float(torch.rand(())), float(np.random.rand()), r, float(i))


def reference(data: Augmented, keys: list[tuple[int, int]]) -> list[tuple[float, ...]]:
    out = []
    for epoch, i in keys:
        seed_everything(sample_seed(SEED, epoch, i))
        out.append(data[i])
    return out


def read(data: Augmented, keys: list[tuple[int, int]], micro: int) -> tuple[list[tuple[float, ...]], WorkerData]:
    worker = WorkerData(data, SEED)
    out = []
    for k in range(0, len(keys), micro):
        random.random()  # the worker's past moves the unseeded RNG between micro-batches
        out += worker.__getitems__(keys[k:k + micro])
    return out, worker


def test_random_first_drawn_mid_epoch_gives_the_fully_seeded_bits():
    data = Augmented(from_index=40)
    keys = [(2, i) for i in range(64)]
    want = reference(data, keys)
    for micro in (16, 8, WATCH_FROM - 1):
        got, worker = read(data, keys, micro)
        assert got == want, micro  # bit for bit, the `random` draws included
        assert worker._seeds.random_used == (micro >= WATCH_FROM)  # below, seeded without watching


def test_a_data_set_that_never_draws_from_random_never_seeds_it():
    data = Augmented(from_index=10**9)
    keys = [(1, i) for i in range(64)]
    got, worker = read(data, keys, 16)
    assert got == reference(data, keys)
    assert not worker._seeds.random_used  # and the negative control: another seed draws otherwise
    assert [g[:2] for g in read(data, [(1, i) for i in range(64)], 16)[0]] != \
        [g[:2] for g in [WorkerData(data, SEED + 1).__getitems__([(1, i)])[0] for i in range(64)]]
