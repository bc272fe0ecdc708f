"""Predict peak memory for other micro-batch sizes from the peaks measured so far.

Peak memory of a training step is, to a good approximation, a fixed part (weights,
gradients, optimizer state, workspace) plus a part proportional to the micro-batch
(activations). A least-squares line through the measured (micro-batch, peak)
points gives both; with one point, the fixed part is unknown and nothing is said.
"""
from __future__ import annotations

import math
from typing import Optional


class MemoryModel:
    def __init__(self) -> None:
        self.points: dict[int, int] = {}  # micro-batch -> largest peak seen at it

    def add(self, micro_batch: int, peak: int) -> None:
        if peak > 0:
            self.points[micro_batch] = max(peak, self.points.get(micro_batch, 0))

    def fit(self) -> Optional[tuple[float, float]]:
        """(fixed bytes, bytes per sample), or None with fewer than two sizes seen."""
        if len(self.points) < 2:
            return None
        xs, ys = zip(*sorted(self.points.items()))
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        slope = max(slope, 1.0)
        return my - slope * mx, slope

    def predict(self, micro_batch: int) -> Optional[float]:
        f = self.fit()
        return None if f is None else f[0] + f[1] * micro_batch

    def largest_fitting(self, capacity: float, margin: float = 0.0) -> Optional[int]:
        f = self.fit()
        if f is None:
            return None
        fixed, per_sample = f
        usable = capacity * (1.0 - margin) - fixed
        return max(0, int(math.floor(usable / per_sample)))
