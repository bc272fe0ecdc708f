"""The run's validation loss on the loss plot: one dot an epoch, drawn again when the epochs change."""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pyqtgraph as pg

from app.model.runmodel import RunModel


class ValidationDots:
    """The validation curve (its item is made with the other curves: build.py)."""

    def __init__(self, item: pg.PlotDataItem) -> None:
        self.item = item
        self.count = -1  # the epochs drawn (-1: draw them again)

    def stale(self, model: RunModel) -> bool:
        return len(model.epochs) != self.count

    def reset(self) -> None:
        self.count = -1

    def update(self, model: RunModel, to_x: Callable[[np.ndarray], np.ndarray]) -> None:
        """Draw the epochs' validation losses (the finite ones) at their steps on the x axis, if they changed."""
        if not self.stale(model):
            return
        self.count = len(model.epochs)
        pts = [(step, val) for _e, step, _t, val in model.epochs if val is not None and math.isfinite(val)]
        if pts:
            xs, ys = zip(*pts)
            self.item.setData(to_x(np.array(xs, float)), np.array(ys, float))
        else:
            self.item.setData([], [])
