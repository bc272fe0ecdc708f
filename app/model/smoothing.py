"""The plots' one smoothing: TensorBoard's debiased exponential moving average, its weight the user's.

TensorBoard smooths a scalar series y_1, y_2, ... with a weight w in [0, 1):

    last = last * w + (1 - w) * y_k        over the finite values only (a NaN or inf is skipped:
    smoothed_k = last / (1 - w ** n_k)     the curve carries its last value across it),

where n_k counts the finite values so far; the division takes away the pull toward the 0 the
average started from. w = 0 is the series itself; 0.999 averages over about a thousand steps.

There is one smoothing in the app, not two competing ones. The metrics buffer's smoothed
columns (app/model/metrics.py: `loss_ema`, `throughput_ema`, `grad_norm_ema` for the runs
compared, and `loss_ema_inliers`, the same average fed only the inliers when "Ignore outliers"
is on, app/model/inlier_ema.py) are all this average with the user's weight
(MetricsBuffer.set_smoothing, from the plot toolbar's Smoothing control; DEFAULT_WEIGHT until
the user picks one). They grow as steps arrive (`Ema.run` on the new values only, carrying its
state), so a million-step run costs a few tens of milliseconds once, when the weight changes.
Qt-free.
"""
from __future__ import annotations

import math

import numpy as np

DEFAULT_WEIGHT = 0.9  # the app's EMA before the weight could be set (TensorBoard's default is 0.6)
MAX_WEIGHT = 0.999  # as TensorBoard's slider
WEIGHT_DECIMALS = 3


def clamp_weight(weight: object) -> float:
    """A weight as the control and the buffers take it: a number in [0, MAX_WEIGHT] with
    WEIGHT_DECIMALS places; anything else (a damaged preference) is DEFAULT_WEIGHT."""
    try:
        w = float(weight)  # type: ignore[arg-type]  # any stored value: what float() refuses is caught below
    except (TypeError, ValueError, OverflowError):
        return DEFAULT_WEIGHT
    if not math.isfinite(w):
        return DEFAULT_WEIGHT
    return round(min(MAX_WEIGHT, max(0.0, w)), WEIGHT_DECIMALS)


class Ema:
    """TensorBoard's debiased EMA (see the module doc), fed in batches as rows arrive.

    Vectorised in blocks of BLOCK values: within a block, one matrix product; between blocks,
    the carry (a million values in a few tens of milliseconds, no Python loop per value)."""

    BLOCK = 64

    def __init__(self, beta: float = DEFAULT_WEIGHT) -> None:
        self.beta = beta
        b = self.BLOCK
        i = np.arange(b)
        expo = i[None, :] - i[:, None]  # [j, i] = i - j
        self._m = np.where(expo >= 0, (1 - beta) * np.power(beta, np.maximum(expo, 0), dtype=np.float64), 0.0)
        self._carry_pw = np.power(beta, i + 1, dtype=np.float64)
        self._debias_span = int(math.ceil(math.log(1e-17) / math.log(beta))) if 0 < beta < 1 else 1 << 62
        self._last_raw = 0.0
        self.reset()

    def reset(self) -> None:
        self.value, self.n = 0.0, 0

    def _smooth(self, x: np.ndarray) -> np.ndarray:
        """The raw (not debiased) averages after each of the finite values x."""
        if self.beta == 0.0:  # no smoothing: the values themselves (and no matrix product)
            self._last_raw = float(x[-1])
            return x.astype(np.float64, copy=True)
        b = self.BLOCK
        m = len(x)
        nb = -(-m // b)
        xb = np.zeros(nb * b)
        xb[:m] = x
        local = (xb.reshape(nb, b) @ self._m)  # each block as if it started from 0
        ends = local[:, -1].tolist()
        q = self.beta ** b
        carries = [0.0] * nb
        c = self.value
        for r in range(nb):  # the value entering block r
            carries[r] = c
            c = ends[r] + c * q
        local += np.asarray(carries)[:, None] * self._carry_pw[None, :]
        raw = local.reshape(-1)[:m]
        self._last_raw = float(raw[-1])
        return raw

    def run(self, values: np.ndarray) -> np.ndarray:
        """The smoothed values after each of `values` (the next ones of the series)."""
        v = np.asarray(values, dtype=np.float64)
        n_all = len(v)
        out = np.full(n_all, math.nan)
        if n_all == 0:
            return out
        before = self.value / (1 - self.beta ** self.n) if self.n else math.nan
        fin = np.isfinite(v)
        all_finite = bool(fin.all())
        x = v if all_finite else v[fin]
        if len(x):
            raw = self._smooth(x)
            # Debias: 1 - beta^n, which is 1.0 in float64 once beta^n < 1e-17.
            k = min(len(x), max(0, self._debias_span - self.n))
            if k and self.beta > 0.0:
                counts = self.n + np.arange(1, k + 1, dtype=np.float64)
                raw[:k] /= 1 - np.power(self.beta, counts)
            if all_finite:
                out = raw
            else:
                out[fin] = raw
            self.value, self.n = float(self._last_raw), self.n + len(x)
        if not all_finite:
            last = np.where(fin, np.arange(n_all), -1)
            np.maximum.accumulate(last, out=last)
            held = ~fin
            out[held & (last >= 0)] = out[last[held & (last >= 0)]]
            out[held & (last < 0)] = before
        return out


def debiased_ema(values: np.ndarray, weight: float) -> np.ndarray:
    """The whole series smoothed at once (what Ema gives fed in any pieces)."""
    return Ema(weight).run(values)
