"""Outliers of a curve, by Tukey's fences: what "Ignore outliers" leaves out of the y range
and out of the loss EMA drawn with it. Qt-free."""
from __future__ import annotations

from typing import Optional

import numpy as np

OUTLIER_QUANTILES = (5.0, 95.0)  # Tukey's fences around these, 1.5 times their distance out
OUTLIER_FENCE = 1.5
MIN_VALUES = 8  # fewer finite values than this: too few to tell an outlier


def fences(y: np.ndarray) -> Optional[tuple[float, float]]:
    """Tukey's fences of a curve's finite values: the 5th and 95th percentiles, 1.5 times the
    distance between them further out. A spike of 1e+36 among losses near 1 is outside; a
    loss that falls from 2.3 to 0.1 is all inside. None: too few values to tell."""
    y = np.asarray(y, dtype=np.float64)
    y = y[np.isfinite(y)]
    if len(y) < MIN_VALUES:
        return None
    q_lo, q_hi = np.percentile(y, OUTLIER_QUANTILES)
    reach = OUTLIER_FENCE * (q_hi - q_lo)
    return float(q_lo - reach), float(q_hi + reach)


def inliers(y: np.ndarray, bounds: Optional[tuple[float, float]]) -> np.ndarray:
    """Which values are finite and within bounds (all finite ones when bounds is None)."""
    y = np.asarray(y)
    with np.errstate(invalid="ignore"):
        keep = np.isfinite(y)
        if bounds is not None:
            keep &= (y >= bounds[0]) & (y <= bounds[1])
    return keep
