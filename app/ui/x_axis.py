"""What the plots' x axis counts: optimizer steps, samples seen, tokens seen or wall time.

The names are declared once here (the combo box, the axis label, the preference). Two runs
with different accumulation line up only by samples or tokens: a step of one is not a step
of the other.

`XColumns` gives, for one metrics buffer, the x value of every row on each axis: the
running sums of the per-step `samples` and `tokens` columns, and the `time` column as
seconds since the run's first row. Where the buffer keeps those as derived columns
(app/model/metrics.py: samples_seen, tokens_seen, wall) they are read from it; otherwise
they are kept here, growing with the buffer (each new row costs O(1), never a pass over the
whole run) and starting over only when the buffer was cut (a resumed run superseding rows).
Qt-free.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..model import metrics as _metrics
from ..model.growable import GrowableArray
from ..model.metrics import MetricsBuffer

# The buffer's own derived columns for the axes, where it has them.
_NATIVE = {k: c for k, c in (("samples", "samples_seen"), ("tokens", "tokens_seen"), ("time", "wall"))
           if c in getattr(_metrics, "CUMULATIVE_COLUMNS", ())}
RATE_ROWS = 50  # the run's current rate (for the planned lr curve ahead of it): over the last 50 steps


@dataclass(frozen=True)
class XAxis:
    key: str  # kept in the preferences
    name: str  # the choice as the combo box shows it
    label: str  # the bottom axis' label
    unit: str = ""  # for a cursor readout


X_AXES: tuple[XAxis, ...] = (
    XAxis("step", "Optimizer step", "optimizer step"),
    XAxis("samples", "Samples seen", "samples seen"),
    XAxis("tokens", "Tokens seen", "tokens seen"),
    XAxis("time", "Wall time", "wall time (h:mm:ss)", "s"),
)
BY_KEY: dict[str, XAxis] = {a.key: a for a in X_AXES}
DEFAULT_AXIS = "step"
COMPARE_HINT = "Runs with different accumulation line up only by samples or tokens seen."


def axis_or_default(key: object) -> str:
    """A saved preference as an axis key (anything unknown is the default)."""
    return key if isinstance(key, str) and key in BY_KEY else DEFAULT_AXIS


class XColumns:
    """One buffer's rows on every x axis, brought up to date on demand."""

    def __init__(self, buf: MetricsBuffer) -> None:
        self._buf = weakref.ref(buf)
        self._cols = {k: GrowableArray(max(1024, len(buf))) for k in ("samples", "tokens", "time")}
        self._clipped = {k: GrowableArray(64) for k in ("samples", "tokens", "time")}
        self._clipped_last: dict[str, float] = {}  # the last clipped step mapped, per axis
        self._version = -1
        self._reset()

    def _reset(self) -> None:
        for arr in list(self._cols.values()) + list(self._clipped.values()):
            arr.clear()
        self._done = 0
        self._last: tuple[float, float] = (math.nan, math.nan)  # (step, time) of the last row folded in
        self._sums = {"samples": 0.0, "tokens": 0.0}
        self._t0: Optional[float] = None
        self._t_last = 0.0

    def _buffer(self) -> MetricsBuffer:
        buf = self._buf()
        assert buf is not None
        return buf

    def update(self) -> MetricsBuffer:
        """Fold the buffer's new rows into the columns kept here (those it lacks)."""
        buf = self._buffer()
        if buf.version == self._version or len(_NATIVE) == 3:
            return buf
        self._version = buf.version
        n, done = len(buf), self._done
        if done and (n < done or not self._same_row(buf, done - 1)):
            self._reset()  # cut and refilled since: start over (rare, O(n) once)
            done = 0
        if n > done:
            for k in ("samples", "tokens"):
                v = np.nan_to_num(buf.view(k)[done:n], nan=0.0)
                sums = np.cumsum(v) + self._sums[k]
                self._cols[k].extend(sums)
                self._sums[k] = float(sums[-1])
            self._cols["time"].extend(self._relative_time(buf.view("time")[done:n]))
            self._done = n
            self._last = (float(buf.view("step")[n - 1]), float(buf.view("time")[n - 1]))
        return buf

    def _same_row(self, buf: MetricsBuffer, i: int) -> bool:
        step, t = float(buf.view("step")[i]), float(buf.view("time")[i])
        return step == self._last[0] and (t == self._last[1] or (math.isnan(t) and math.isnan(self._last[1])))

    def _relative_time(self, t: np.ndarray) -> np.ndarray:
        """Seconds since the first row, never going back (a missing time holds the last one)."""
        if self._t0 is None:
            finite = t[np.isfinite(t)]
            if not len(finite):
                return np.full(len(t), self._t_last)
            self._t0 = float(finite[0])
        rel = np.fmax.accumulate(np.concatenate(([self._t_last], t - self._t0)))[1:]
        rel = np.where(np.isfinite(rel), rel, self._t_last)
        self._t_last = float(rel[-1])
        return rel

    # -- reading -------------------------------------------------------------------------
    def values(self, key: str) -> np.ndarray:
        """Every row's x on axis `key` (a zero-copy view; the step column itself for steps)."""
        if key == "step":
            return self._buffer().view("step")
        if key in _NATIVE:
            return self._buffer().view(_NATIVE[key])
        self.update()
        return self._cols[key].view()

    def clipped(self, key: str) -> np.ndarray:
        """The clipped steps' x on axis `key` (the buffer's clipped_x holds their steps); new
        ones are mapped as they come, all again only after the buffer was cut."""
        buf = self.update()
        steps = buf.clipped_x.view()
        if key == "step":
            return steps
        arr, m = self._clipped[key], len(self._clipped[key])
        if m and (m > len(steps) or steps[m - 1] != self._clipped_last.get(key)):
            arr.clear()
            m = 0
        if m < len(steps):
            idx = np.searchsorted(buf.view("step"), steps[m:])
            arr.extend(self.values(key)[np.minimum(idx, len(buf) - 1)])
            self._clipped_last[key] = float(steps[-1])
        return arr.view()

    def at_steps(self, key: str, steps: np.ndarray) -> np.ndarray:
        """x of step positions (fractional ones too: 12.5 lies between steps 12 and 13)."""
        steps = np.asarray(steps, dtype=np.float64)
        buf = self.update()
        if key == "step" or not len(buf):
            return steps
        return np.interp(steps, buf.view("step"), self.values(key))

    def samples_to_x(self, key: str, samples: np.ndarray) -> Optional[np.ndarray]:
        """Points given in samples seen on axis `key`: through the rows trained so far, then ahead
        of them at the run's current rate (its last RATE_ROWS steps). None where no step has told
        the rate yet (any axis but samples)."""
        samples = np.asarray(samples, dtype=np.float64)
        if key == "samples":
            return samples
        buf = self.update()
        n = len(buf)
        if n == 0:
            return None
        seen, xs = self.values("samples"), self.values(key)
        rate = self.rate(key)
        if rate is None:
            return None
        x = np.interp(samples, np.concatenate(([0.0], seen)), np.concatenate(([xs[0] - rate * seen[0]], xs)))
        ahead = samples > seen[-1]
        x[ahead] = xs[-1] + (samples[ahead] - seen[-1]) * rate
        return x

    def rate(self, key: str) -> Optional[float]:
        """x per sample over the last RATE_ROWS steps (None when it cannot be told)."""
        buf = self.update()
        n = len(buf)
        if n == 0:
            return None
        k = min(RATE_ROWS, n)
        per_step = np.nan_to_num(buf.view("samples")[-k:], nan=0.0)
        d_samples = float(per_step.sum())
        if d_samples <= 0:
            return None
        if key == "step":
            return k / d_samples
        if key == "tokens":
            return float(np.nan_to_num(buf.view("tokens")[-k:], nan=0.0).sum()) / d_samples
        t = self.values("time")
        if k >= 2 and t[-1] > t[-k]:
            return float(t[-1] - t[-k]) / float(per_step[1:].sum() or d_samples)
        secs = float(np.nan_to_num(buf.view("step_time")[-k:], nan=0.0).sum())
        return secs / d_samples if secs > 0 else None


_COLUMNS: "weakref.WeakKeyDictionary[MetricsBuffer, XColumns]" = weakref.WeakKeyDictionary()


def columns(buf: MetricsBuffer) -> XColumns:
    """The buffer's XColumns (one per buffer, dropped with it)."""
    c = _COLUMNS.get(buf)
    if c is None:
        c = _COLUMNS[buf] = XColumns(buf)
    return c


def fmt_clock(seconds: float) -> str:
    """Seconds as m:ss or h:mm:ss for the wall-time axis."""
    s = int(round(seconds))
    sign = "-" if s < 0 else ""
    h, rem = divmod(abs(s), 3600)
    m, sec = divmod(rem, 60)
    return f"{sign}{h}:{m:02d}:{sec:02d}" if h else f"{sign}{m}:{sec:02d}"
