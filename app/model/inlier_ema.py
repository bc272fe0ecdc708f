"""The loss EMA over the inliers: what "Ignore outliers" draws as the EMA.

A spike of 1e+30 folded into an EMA with beta 0.9 keeps it above every real loss for some 650
steps, so the smoothed curve leaves the plot for the rest of the run. This EMA holds its last
value across outliers (outside Tukey's fences of the whole loss column, app/model/outliers.py)
as the plain one holds across non-finite steps. The fences move as rows arrive, a little with
every batch; the ones in use change only when new ones are off by more than a quarter of
their span (MOVE), so a long run's column is not classed and computed again on every frame
(at a million steps that was 0.2-0.56 s a batch, the GUI's whole budget). While the fences
in use stay, new rows only extend the column; when they change and a value changes sides,
the column is computed again (vectorised: a million values in tens of ms).
It is the plots' one smoothing (app/model/smoothing.py, the user's weight) fed only the
inliers, not a second average of its own. Qt-free.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .growable import GrowableArray
from .outliers import fences, inliers

SAMPLE = 16384  # the fences come from at most this many evenly spaced values (a percentile of a million is slow)
MOVE = 0.25  # the fences in use change when new ones move by more than this share of their span


def moved(used: Optional[tuple[float, float]], new: Optional[tuple[float, float]]) -> bool:
    """New fences worth using: none were in use, or either fence moved by more than MOVE of
    the span between the ones in use."""
    if used is None or new is None:
        return used != new
    reach = MOVE * (used[1] - used[0])
    return abs(new[0] - used[0]) > reach or abs(new[1] - used[1]) > reach


class InlierEma:
    def __init__(self, ema_factory) -> None:
        self._new_ema = ema_factory
        self._ema = ema_factory()
        self._bounds: Optional[tuple[float, float]] = None
        self._mask = np.empty(0, dtype=bool)  # which values were fed in (the rest held)

    def rebuild(self, out: GrowableArray, loss: np.ndarray) -> bool:
        """Bring `out` up to `loss` (the whole column). True when it was computed again from
        the start (its earlier values changed: a plot's pyramid of it must be rebuilt)."""
        n_done = len(self._mask)
        step = max(1, len(loss) // SAMPLE)
        new = fences(loss[::step])
        if n_done > len(loss) or moved(self._bounds, new):  # earlier values may change sides
            bounds = new
            mask = inliers(loss, bounds)
            again = n_done > len(loss) or bool((mask[:n_done] != self._mask).any())
        else:  # the fences in use stay: the earlier values keep their sides, only new rows are classed
            bounds = self._bounds
            mask = np.concatenate([self._mask, inliers(loss[n_done:], bounds)])
            again = False
        if again:
            self._ema = self._new_ema()
            n_done = 0
        fed = np.where(mask[n_done:], loss[n_done:], np.nan)
        out.set_tail(n_done, self._ema.run(fed))
        self._bounds, self._mask = bounds, mask
        return again and len(out) > 0

    def reset(self) -> None:
        self._ema = self._new_ema()
        self._bounds, self._mask = None, np.empty(0, dtype=bool)
