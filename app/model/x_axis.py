"""What the plots' x axis counts: optimizer steps, samples seen, tokens seen or wall time.

The names are declared once here (the combo box, the axis label, the preference). Two runs
with different accumulation line up only by samples or tokens: a step of one is not a step
of the other.

`XColumns` gives, for one metrics buffer, the x value of every row on each axis: the
running sums of the per-step `samples` and `tokens` columns and the `time` column as seconds
since the run's first row are the buffer's own derived columns (app/model/metrics.py:
samples_seen, tokens_seen, wall, kept up to date as rows arrive); here they are mapped to
the axes, and to the places that are steps (clipped steps, markers, the planned lr ahead).
A fork's rows continue its parent's samples, tokens and time: `set_offsets` shifts its axes
by what came before its first row (app/model/lineage.py), so the branches line up.
Qt-free.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .growable import GrowableArray
from .metrics import CUMULATIVE_COLUMNS, MetricsBuffer

# The buffer's column each axis reads (the step axis: the step column itself).
AXIS_COLUMNS = {"samples": "samples_seen", "tokens": "tokens_seen", "time": "wall"}
assert set(AXIS_COLUMNS.values()) <= set(CUMULATIVE_COLUMNS)
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
    """One buffer's rows on every x axis."""

    def __init__(self, buf: MetricsBuffer) -> None:
        self._buf = weakref.ref(buf)
        self._clipped = {k: GrowableArray(64) for k in AXIS_COLUMNS}
        self._clipped_last: dict[str, float] = {}  # the last clipped step mapped, per axis
        self.offsets: dict[str, float] = {}  # axis key -> what came before the first row (a fork)
        self._shifted: dict[str, GrowableArray] = {}  # the axis column plus its offset, kept up to date

    def set_offsets(self, offsets: dict[str, float]) -> None:
        """Samples, tokens and seconds before this run's first row, by axis key (a fork's parents')."""
        self.offsets = {k: float(v) for k, v in offsets.items() if k in AXIS_COLUMNS and v}
        self._shifted.clear()
        for arr in self._clipped.values():
            arr.clear()

    def _buffer(self) -> MetricsBuffer:
        buf = self._buf()
        assert buf is not None
        return buf

    # -- reading -------------------------------------------------------------------------
    def values(self, key: str) -> np.ndarray:
        """Every row's x on axis `key` (a zero-copy view; the step column itself for steps)."""
        v = self._buffer().view(AXIS_COLUMNS.get(key, "step"))
        off = self.offsets.get(key)
        if not off:
            return v
        arr = self._shifted.get(key)
        if arr is None:
            arr = self._shifted[key] = GrowableArray(max(16, len(v)))
        m = len(arr)
        if m > len(v) or (m and arr.view()[m - 1] != v[m - 1] + off):  # the buffer was cut or refilled
            arr.clear()
            m = 0
        if m < len(v):
            arr.extend(v[m:] + off)
        return arr.view()

    def clipped(self, key: str) -> np.ndarray:
        """The clipped steps' x on axis `key` (the buffer's clipped_x holds their steps); new
        ones are mapped as they come, all again only after the buffer was cut."""
        buf = self._buffer()
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
        buf = self._buffer()
        if key == "step" or not len(buf):
            return steps
        # Before the first row: the axis' origin one step earlier (a fork's point is its parent's last step).
        first = float(buf.view("step")[0])
        origin = self.offsets.get(key, 0.0)
        return np.interp(steps, np.concatenate(([first - 1.0], buf.view("step"))),
                         np.concatenate(([origin], self.values(key))))

    def samples_to_x(self, key: str, samples: np.ndarray) -> Optional[np.ndarray]:
        """Points given in samples seen on axis `key`: through the rows trained so far, then ahead
        of them at the run's current rate (its last RATE_ROWS steps). None where no step has told
        the rate yet (any axis but samples)."""
        samples = np.asarray(samples, dtype=np.float64)
        if key == "samples":
            return samples
        buf = self._buffer()
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
        buf = self._buffer()
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


def nearest(xs: np.ndarray, x: float) -> int:
    """The index of the value of sorted xs nearest x (xs not empty): an x axis' row under a point."""
    i = int(np.searchsorted(xs, x))
    if i >= len(xs):
        return len(xs) - 1
    if i > 0 and abs(xs[i - 1] - x) <= abs(xs[i] - x):
        return i - 1
    return i


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
