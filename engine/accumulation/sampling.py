"""Which samples go into which window and micro-batch.

The order of samples in an epoch is a function of (seed, epoch) only. A window is
a run of consecutive samples in that order: a fixed number of samples
(micro-batch x accumulation x world size), or, in token-budget mode, as many
samples as it takes to hold the budget of counted items. Two runs that differ
only in how a window is split into micro-batches therefore see the same windows.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63))
    return torch.randperm(n, generator=g).tolist()


def fixed_windows(order: Sequence[int], global_samples: int) -> list[list[int]]:
    """Consecutive windows of `global_samples`; the last may be short."""
    return [list(order[i:i + global_samples]) for i in range(0, len(order), global_samples)]


def token_windows(order: Sequence[int], budget: int, length: Callable[[int], int]) -> list[list[int]]:
    """Close a window once it holds `budget` counted items (the last may hold fewer)."""
    out: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i in order:
        current.append(i)
        held += length(i)
        if held >= budget:
            out.append(current)
            current, held = [], 0
    if current:
        out.append(current)
    return out


def rank_share(window: Sequence[int], rank: int, world: int) -> list[int]:
    """This rank's contiguous share of a window (shares differ by at most one sample)."""
    n = len(window)
    lo = rank * n // world
    hi = (rank + 1) * n // world
    return list(window[lo:hi])


def micro_batches(share: Sequence[int], micro: int) -> list[list[int]]:
    return [list(share[i:i + micro]) for i in range(0, len(share), micro)]


def epoch_windows(n: int, seed: int, epoch: int, global_samples: int, token_budget: Optional[int] = None,
                  length: Optional[Callable[[int], int]] = None) -> list[list[int]]:
    order = epoch_order(n, seed, epoch)
    if token_budget is not None:
        assert length is not None
        return token_windows(order, token_budget, length)
    return fixed_windows(order, global_samples)
