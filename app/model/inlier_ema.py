"""The loss EMA over the inliers: what "Ignore outliers" draws as the EMA.

A spike of 1e+30 folded into an EMA with beta 0.9 keeps it above every real loss for some 650
steps, so the smoothed curve leaves the plot for the rest of the run. This EMA holds its last
value across outliers (outside Tukey's fences of the whole loss column, app/model/outliers.py)
as the plain one holds across non-finite steps. The fences move as rows arrive; while they
class every earlier value as before, new rows only extend the column, and when a value
changes sides the column is computed again (vectorised: a million values in tens of ms).
It is the plots' one smoothing (app/model/smoothing.py, the user's weight) fed only the
inliers, not a second average of its own. Qt-free.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .growable import GrowableArray
from .outliers import fences, inliers

SAMPLE = 16384  # the fences come from at most this many evenly spaced values (a percentile of a million is slow)


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
        bounds = fences(loss[::step])
        mask = inliers(loss, bounds)
        again = n_done > len(loss) or bool((mask[:n_done] != self._mask).any())
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
