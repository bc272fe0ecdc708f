"""The learning-rate schedule: a function of samples seen, never of optimizer steps.

So changing accumulation or the micro-batch mid-run neither stretches the warmup nor
shifts the decay (the bug behind Lightning issue 1476, where warmup ran 16x too short
under accumulation). The peak is the live `lr` setting: `set_lr` moves the peak and the
curve keeps its shape. Torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from .config import LR_SCHEDULES  # noqa: F401 - the one declaration of the names


@dataclass(frozen=True)
class LrSchedule:
    kind: str  # constant | linear | cosine
    warmup: float  # samples of linear warmup from 0 to the peak
    total: float  # the run's samples in all
    min_ratio: float  # linear and cosine end at min_ratio x peak
    # A run whose length changed while it trained: from `from_samples` on, the decay goes from
    # `from_factor` to min_ratio at the new `total` (re-planned, below); `before` is the plan
    # the samples before that point trained with (the lr plot's past). 0 / 1.0 / None: as planned.
    from_samples: float = 0.0
    from_factor: float = 1.0
    before: Optional["LrSchedule"] = None

    @classmethod
    def for_run(cls, kind: str, min_ratio: float, total_samples: float, *, warmup_samples: float = 0,
             warmup_fraction: float = 0.0) -> "LrSchedule":
        """The warmup is a number of samples or a fraction of the run's samples (TrainConfig
        allows one of the two)."""
        w = warmup_samples or warmup_fraction * total_samples
        return cls(kind, float(w), float(max(total_samples, 1)), float(min_ratio))

    def replanned(self, samples_now: float, total: float) -> "LrSchedule":
        """The schedule for a run whose length changed to `total` samples after `samples_now`.
        The rule: the samples trained keep their lr; in the warmup, the warmup keeps its
        length in samples and the decay after it spans the new length; past the warmup, the
        lr goes on from where it is (this factor) and decays with the same shape (linear or
        cosine) to min_lr_ratio x peak at the new end. No jump at the change."""
        total = float(max(total, samples_now + 1, 1))
        if self.kind == "constant" or samples_now <= max(self.warmup, self.from_samples):
            return replace(self, total=total)  # the decay has not begun: it starts where it would have
        return LrSchedule(self.kind, self.warmup, total, self.min_ratio, float(samples_now),
                          self.factor(samples_now), self)

    def factor(self, samples: float) -> float:
        """The multiple of the peak lr for a step that starts after `samples` samples."""
        if self.before is not None and samples < self.from_samples:
            return self.before.factor(samples)  # before a re-plan: what those samples trained with
        if self.warmup > 0 and samples < self.warmup:
            return (samples + 1) / (self.warmup + 1)  # never exactly 0: the first step moves
        if self.kind == "constant":
            return 1.0
        start = max(self.warmup, self.from_samples)
        span = max(self.total - start, 1.0)
        t = min(max((samples - start) / span, 0.0), 1.0)
        top = self.from_factor
        if self.kind == "linear":
            return top - (top - self.min_ratio) * t
        return self.min_ratio + (top - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))

    def curve(self, peak: float, points: int = 120) -> tuple[tuple[float, float], ...]:
        """(samples, lr) over the whole run, for the app's lr plot ahead of the run."""
        xs = sorted({0.0, self.warmup, self.from_samples, self.total}
                    | {self.total * k / (points - 1) for k in range(points)})
        return tuple((x, peak * self.factor(x)) for x in xs if x <= self.total)
