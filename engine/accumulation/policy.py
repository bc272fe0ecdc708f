"""How an epoch is cut into accumulation windows and a window into micro-batches.

Two policies behind one interface:

- `FixedWindows`: a window is micro-batch x accumulation x world size samples.
- `TokenBudgetWindows` (--token-budget N): a window closes once it holds N counted
  items (tokens); its number of micro-batches follows from the data, so
  accumulation is not a setting there and a `set_accum` is refused.

Either way the order of samples is a function of (seed, epoch) only (sampling.py),
so two runs that differ only in how a window is split see the same windows.
Torch is used only for the seeded permutation.
"""
from __future__ import annotations

from typing import Callable, Optional, Protocol, Sequence

from engine.declarations.settings import LiveSettings

from . import sampling


class WindowPolicy(Protocol):
    def windows(self, epoch: int, settings: LiveSettings, world: int, start: int = 0) -> list[list[int]]:
        """The epoch's windows (all ranks) from its `start`-th sample on, as sample indices,
        in training order. A change at a step boundary cuts the rest of the epoch again from
        where the last window ended: the sample order never changes, only how it is cut."""

    def split(self, share: Sequence[int], settings: LiveSettings) -> list[list[int]]:
        """This rank's share of a window, as micro-batches."""

    def refusal(self, setting: str) -> Optional[str]:
        """Why this policy cannot take a change of `setting`, or None if it can."""

    def window_size(self, settings: LiveSettings) -> float:
        """The effective batch per rank under `settings`, in the policy's own unit (what the
        lr scaling rule compares before and after a change)."""


class FixedWindows:
    """micro-batch x accumulation x world size samples a window; the last may be short."""

    def __init__(self, n_samples: int, seed: int) -> None:
        self.n, self.seed = n_samples, seed

    def windows(self, epoch: int, settings: LiveSettings, world: int, start: int = 0) -> list[list[int]]:
        return sampling.fixed_windows(sampling.epoch_order(self.n, self.seed, epoch)[start:], settings.window_samples * world)

    def split(self, share: Sequence[int], settings: LiveSettings) -> list[list[int]]:
        return sampling.micro_batches(share, settings.micro_batch)

    def refusal(self, setting: str) -> Optional[str]:
        return None

    def window_size(self, settings: LiveSettings) -> float:
        return settings.window_samples


class TokenBudgetWindows:
    """A window holds `budget` counted items; micro-batches of `micro_batch` samples each."""

    def __init__(self, n_samples: int, seed: int, budget: int, length: Callable[[int], int],
                 micro_tokens: Optional[int] = None) -> None:
        self.n, self.seed, self.budget, self.length = n_samples, seed, budget, length
        self.micro_tokens = micro_tokens

    def windows(self, epoch: int, settings: LiveSettings, world: int, start: int = 0) -> list[list[int]]:
        return sampling.token_windows(sampling.epoch_order(self.n, self.seed, epoch)[start:], self.budget, self.length)

    def split(self, share: Sequence[int], settings: LiveSettings) -> list[list[int]]:
        """At most micro_batch samples and (with --micro-tokens) at most micro_tokens counted
        items a micro-batch, so one of long sequences costs the memory of one of short ones.
        A sample longer than micro_tokens is a micro-batch of its own."""
        if self.micro_tokens is None:
            return sampling.micro_batches(share, settings.micro_batch)
        out: list[list[int]] = []
        current: list[int] = []
        held = 0
        for i in share:
            n = self.length(i)
            if current and (len(current) == settings.micro_batch or held + n > self.micro_tokens):
                out.append(current)
                current, held = [], 0
            current.append(i)
            held += n
        if current:
            out.append(current)
        return out

    def refusal(self, setting: str) -> Optional[str]:
        if setting == "accum":
            return (f"accumulation follows from --token-budget {self.budget} (a window closes when it holds "
                    f"{self.budget} counted items); change the micro-batch instead")
        return None

    def window_size(self, settings: LiveSettings) -> float:
        return self.budget  # the micro-batch only splits a window: the effective batch stays
