"""The metrics buffer: one growable numpy array per column, doubling when full.

The GUI timer appends a batch of steps at a time; plots read `view(name)`, a
zero-copy slice of the filled part. Appending never touches what is already there,
so a slice handed to a plot stays valid (a regrowth leaves the old array to the plot
until its next update).

Sizes: a million-step run opened from its folder is held in about 100 MB. Each column keeps the precision it
needs (COLUMN_DTYPES): `step` as int64; `time`, `loss`, `throughput`, `lr`, `clip`,
`samples` and `tokens` as float64 (a wall clock; the loss and throughput the plots draw
exactly as run.db holds them, computed in float64 by the engine; settings the form compares
exactly; counts summed into the cumulative columns); the others (the gradient norm, which
torch computes in float32 anyway, memory bytes, step times, counts per window, flags) as
float32, which holds 7 significant digits, well past what a plot shows (and what `rows()`
gives for them). A run folder's columns arrive as
whole arrays (StepColumns) and become the storage without a copy.

Derived columns: `loss_ema`, `clip_line`, `throughput_ema` always (the smoothed ones with the
user's smoothing weight, app/model/smoothing.py: set_smoothing); `grad_norm_ema`, `samples_seen`,
`tokens_seen` (running sums of the per-step samples and tokens, a missing value counted
as 0) and `wall` (seconds since the first step's `time`, never going back, a missing time
holding the last) on first use of `view(name)` or `pyramid(name)`, then kept up
to date (x axes other than the step; a compared run's smoothed gradient norm); likewise
`loss_ema_inliers` ("Ignore outliers").
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Protocol, Sequence

import numpy as np

from engine.store import METRIC_COLUMNS

from .decimate import PeakPyramid
from .growable import GrowableArray
from .inlier_ema import InlierEma
from .smoothing import DEFAULT_WEIGHT, Ema, clamp_weight
from .stored import measured

# Columns kept per optimizer step: run.db's metrics columns, which are the StepMetrics fields
# (engine/declarations/events.py) and `time`. None (no GPU, say) is stored as NaN.
STEP_COLUMNS: tuple[str, ...] = METRIC_COLUMNS
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
COLUMN_DTYPES: dict[str, np.dtype] = {c: _F32 for c in STEP_COLUMNS}
COLUMN_DTYPES.update(step=np.dtype(np.int64), time=_F64, loss=_F64, lr=_F64, clip=_F64, samples=_F64, tokens=_F64,
                     throughput=_F64)
DERIVED_COLUMNS = {"loss_ema": _F32, "clip_line": _F32, "throughput_ema": _F32}
INLIER_EMA = "loss_ema_inliers"  # the loss EMA without outliers (app/model/inlier_ema.py), built on first use
# The smoothed columns (app/model/smoothing.py, one weight for all): column -> the column it smooths. The
# first two are kept always; grad_norm_ema (a compared run's gradient norm) is built on first use.
SMOOTHED = {"loss_ema": "loss", "throughput_ema": "throughput", "grad_norm_ema": "grad_norm"}
LAZY_SMOOTHED = ("grad_norm_ema",)
CUMULATIVE_COLUMNS = ("samples_seen", "tokens_seen", "wall")  # built on first use, float64
EMA_BETA = DEFAULT_WEIGHT  # the smoothing weight until set_smoothing


def _as_floats(a: np.ndarray) -> list[float]:
    if a.dtype != _F32:
        return a.tolist()
    f = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        frac = np.isfinite(f) & (f != np.floor(f))
    if frac.any():
        f[frac] = [float(str(v)) for v in a[frac]]
    return f.tolist()


@dataclass
class StepColumns:
    """Steps as one array per column (a read of run.db's metrics), rows i0..i1 of them: the
    reader cuts one read into pieces at the events between the steps without copying."""
    columns: dict[str, np.ndarray]
    i0: int = 0
    i1: int = -1
    claims: Optional[dict[str, int]] = None  # column -> id of the buffer whose storage it became
    loader: Any = None  # a ColumnLoader for the columns left out (a large read of run.db), or None
    counts_tokens: Optional[bool] = None  # said by the reader when `tokens` was left out

    def __post_init__(self) -> None:
        if self.i1 < 0:
            self.i1 = len(self.columns["step"])
        if self.claims is None:
            self.claims = {}

    def __len__(self) -> int:
        return self.i1 - self.i0

    def piece(self, i0: int, i1: int) -> "StepColumns":
        """Rows i0..i1 of this piece (relative to it)."""
        return StepColumns(self.columns, self.i0 + i0, self.i0 + min(i1, len(self)), self.claims, self.loader,
                           self.counts_tokens)

    def view(self, name: str) -> Optional[np.ndarray]:
        a = self.columns.get(name)
        return None if a is None else a[self.i0:self.i1]

    def steps(self) -> np.ndarray:
        """The step column (every piece has one)."""
        return self.columns["step"][self.i0:self.i1]


class ColumnLoader(Protocol):
    """Reads a column the buffer does not hold yet (app/session/rundb.py: from run.db)."""

    def column(self, name: str, steps: np.ndarray) -> np.ndarray:
        """The column at each of these steps, NaN where there is no value."""
        ...

    def value(self, name: str, step: int) -> float:
        ...


class MetricsBuffer:
    """All per-step metrics of one run, plus the loss EMA, as growable columns.

    Also keeps derived series that plots need as points: clipped steps (x, grad norm)
    and non-finite steps. Each plotted series has a peak (min/max) pyramid so a
    million-point curve is drawn from a few thousand points.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self.cols: dict[str, GrowableArray] = {c: GrowableArray(capacity, COLUMN_DTYPES[c]) for c in STEP_COLUMNS}
        for c, dt in DERIVED_COLUMNS.items():  # clip_line: the clip norm, NaN where clipping is off
            self.cols[c] = GrowableArray(capacity, dt)
        self.clipped_x = GrowableArray(64)
        self.clipped_y = GrowableArray(64)
        self.nonfinite_steps: list[int] = []
        self.smoothing = EMA_BETA  # the weight of every smoothed column (set_smoothing)
        self._emas = {c: Ema(self.smoothing) for c in SMOOTHED if c not in LAZY_SMOOTHED}
        self._inlier_ema = InlierEma(self._new_ema)
        self._pyramids: dict[str, PeakPyramid] = {}
        self._gpu = False  # some step has GPU memory figures
        self._tokens = False  # some step counted items other than samples
        self._wall0: Optional[float] = None  # `time` of the first step, the origin of `wall`
        self._lazy: dict[str, ColumnLoader] = {}  # columns not held yet: read when first asked for
        self.version = 0  # bumps on every change; plots compare it

    def __len__(self) -> int:
        return len(self.cols["step"])

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column name view() takes."""
        return (*STEP_COLUMNS, *DERIVED_COLUMNS, *LAZY_SMOOTHED, INLIER_EMA, *CUMULATIVE_COLUMNS)

    def _col(self, name: str) -> GrowableArray:
        arr = self.cols.get(name)
        if arr is None:
            if name in self._lazy:
                return self._load(name)
            if name == INLIER_EMA:
                arr = self.cols[name] = GrowableArray(max(16, len(self)), _F32)
                self._extend_inlier_ema()
                return arr
            if name in LAZY_SMOOTHED:
                arr = self.cols[name] = GrowableArray(max(16, len(self)), _F32)
                self._emas[name] = self._new_ema()
                arr.extend(self._emas[name].run(self.view(SMOOTHED[name])))
                return arr
            if name not in CUMULATIVE_COLUMNS:
                raise KeyError(name)
            arr = self.cols[name] = GrowableArray(max(16, len(self)), _F64)
            self._extend_cumulative(name, 0)
        return arr

    def _load(self, name: str) -> GrowableArray:
        """Read a column left to its loader, for every step held; from now on it is held."""
        loader = self._lazy.pop(name)
        steps = self.view("step")
        try:
            values = np.asarray(loader.column(name, steps))
            if len(values) != len(steps):
                raise ValueError(f"{len(values)} values for {len(steps)} steps")
        except Exception:  # noqa: BLE001 - whatever the loader hit (a folder gone): not known
            values = np.full(len(steps), np.nan)
        arr = self.cols[name] = GrowableArray(max(16, len(steps)), COLUMN_DTYPES[name])
        arr.extend(values)
        return arr

    def view(self, name: str) -> np.ndarray:
        return self._col(name).view()

    def holds(self, name: str) -> bool:
        """The column is in memory (not left to be read from run.db when first asked for)."""
        return name not in self._lazy

    def value_at(self, name: str, index: int) -> float:
        """One value, by step index; a column not held is asked for that row only."""
        if name in self._lazy:
            try:
                return float(self._lazy[name].value(name, int(self.view("step")[index])))
            except Exception:  # noqa: BLE001 - a lazy column that cannot be read: no value
                return math.nan
        return float(self.view(name)[index])

    def nbytes(self) -> int:
        """Bytes the columns hold (the filled parts)."""
        return sum(a.nbytes for a in self.cols.values())

    def last_step(self) -> int:
        s = self.view("step")
        return int(s[-1]) if len(s) else 0

    def pyramid(self, name: str) -> PeakPyramid:
        """The min/max pyramid of a column (or of 'clipped_y'), brought up to date."""
        p = self._pyramids.get(name)
        if p is None:
            arr = self.clipped_y if name == "clipped_y" else self._col(name)
            p = self._pyramids[name] = PeakPyramid(arr)
        p.update()
        return p

    # -- appending -----------------------------------------------------------------------
    def extend_records(self, records: Sequence[Any], get: Callable[[Any, str], Any]) -> int:
        """Append steps from StepMetrics objects (get=getattr) or run.db rows (get=dict.get).

        A step at or before the last one kept (a resumed run rewinding) truncates first.
        A value that is not a number (a damaged row) is NaN. Returns the number of steps
        appended; records without a whole step number are left out.
        """
        if not records:
            return 0
        steps = [measured(get(r, "step")) for r in records]
        if not all(math.isfinite(s) for s in steps):
            keep = [i for i, s in enumerate(steps) if math.isfinite(s)]
            records, steps = [records[i] for i in keep], [steps[i] for i in keep]
            if not records:
                return 0
        columns = {c: np.fromiter((measured(get(r, c)) for r in records), dtype=np.float64, count=len(records))
                   for c in STEP_COLUMNS if c not in ("time", "step")}
        columns["step"] = np.asarray(steps, dtype=np.float64)
        if isinstance(records[0], dict):
            columns["time"] = np.array([measured(r.get("time")) for r in records], dtype=np.float64)
        else:  # StepMetrics handed in directly carry no time: now (LiveSource gives rows with the emit time)
            columns["time"] = np.full(len(records), time.time())
        return self.extend_columns(columns)

    def reserve(self, n: int) -> None:
        """Room for n more steps in every column, exactly (a bulk load that knows its size)."""
        want = len(self) + n
        for arr in self.cols.values():
            if arr.capacity < want:
                arr.reserve(want)

    def extend_columns(self, columns: "dict[str, np.ndarray] | StepColumns") -> int:
        """Append steps given as one array per column (or a StepColumns piece). Steps at or
        before the last one kept (a resumed run rewinding) truncate first."""
        piece = columns if isinstance(columns, StepColumns) else StepColumns(
            {c: np.asarray(v) for c, v in columns.items() if v is not None})
        n = len(piece)
        if n == 0:
            return 0
        first = piece.steps()[0]
        if len(self) and first <= self.view("step")[-1]:
            self.truncate_after(int(first) - 1)
        if piece.loader is None:
            for c in list(self._lazy):  # values from elsewhere (live events) go after the rows read: read those first
                self._load(c)
        n_before = len(self)
        for c in STEP_COLUMNS:
            base = piece.columns.get(c)
            if c in self._lazy:
                continue  # run.db holds these rows too: they are read with the rest when asked for
            if base is None and piece.loader is not None:
                if n_before == 0:
                    self._lazy[c] = piece.loader  # left out of a large read: read when first asked for
                    del self.cols[c]
                    continue
                base = np.asarray(piece.loader.column(c, piece.view("step")), dtype=self.cols[c].dtype)
                self.cols[c].extend(base)
            elif base is None:
                self.cols[c].extend(np.full(n, np.nan))
            elif base.dtype == self.cols[c].dtype and piece.claims is not None \
                    and piece.claims.setdefault(c, id(self)) == id(self):
                self.cols[c].extend_from(base, piece.i0, piece.i1)  # one buffer only makes it its storage
            else:
                self.cols[c].extend(base[piece.i0:piece.i1])
        for dst, ema in self._emas.items():
            self.cols[dst].extend(ema.run(self.cols[SMOOTHED[dst]].view()[n_before:]))
        clip = self.cols["clip"].view()[n_before:]
        with np.errstate(invalid="ignore"):
            self.cols["clip_line"].extend(np.where(clip > 0, clip, np.nan))
            steps = self.cols["step"].view()[n_before:]
            clipped = self.cols["clipped"].view()[n_before:] > 0
            if clipped.any():
                self.clipped_x.extend(steps[clipped])
                self.clipped_y.extend(self.cols["grad_norm"].view()[n_before:][clipped])
            bad = self.cols["nonfinite"].view()[n_before:] > 0
            if bad.any():
                self.nonfinite_steps.extend(int(s) for s in steps[bad])
            if not self._gpu and "mem_total" in self.cols and np.isfinite(self.cols["mem_total"].view()[n_before:]).any():
                self._gpu = True
            if piece.counts_tokens:
                self._tokens = True
            if not self._tokens and self.holds("tokens") and self.holds("samples"):
                tok, smp = self.cols["tokens"].view()[n_before:], self.cols["samples"].view()[n_before:]
                if np.any((tok != smp) & np.isfinite(tok) & np.isfinite(smp)):
                    self._tokens = True
        for c in CUMULATIVE_COLUMNS:
            if c in self.cols:
                self._extend_cumulative(c, n_before)
        self._extend_inlier_ema()
        self.version += 1
        return len(self) - n_before

    def _new_ema(self) -> Ema:
        return Ema(self.smoothing)

    def set_smoothing(self, weight: float) -> bool:
        """The weight of every smoothed column (app/model/smoothing.py): they are computed again
        with it (a million steps: tens of milliseconds). True if it changed."""
        w = clamp_weight(weight)
        if w == self.smoothing:
            return False
        self.smoothing = w
        self._inlier_ema = InlierEma(self._new_ema)
        if INLIER_EMA in self.cols:
            self.cols[INLIER_EMA].clear()
        self._smooth_again()
        return True

    def _smooth_again(self) -> None:
        """Every smoothed column from its first row (a new weight; steps cut off)."""
        for dst in self._emas:
            self._emas[dst] = self._new_ema()
            self.cols[dst].set_tail(0, self._emas[dst].run(self.view(SMOOTHED[dst])))
        if INLIER_EMA in self.cols:
            self._inlier_ema.reset()
            self._extend_inlier_ema()
        for name in (*self._emas, INLIER_EMA):
            pyramid = self._pyramids.get(name)
            if pyramid is not None:
                pyramid.reset()
        self.version += 1

    def _extend_inlier_ema(self) -> None:
        """Keep `loss_ema_inliers` up to the loss column, once it is asked for."""
        arr = self.cols.get(INLIER_EMA)
        if arr is not None and self._inlier_ema.rebuild(arr, self.cols["loss"].view()):
            pyramid = self._pyramids.get(INLIER_EMA)
            if pyramid is not None:
                pyramid.reset()  # its earlier values changed

    def _extend_cumulative(self, name: str, start: int) -> None:
        """Bring a cumulative column up to the other columns from row `start` on."""
        arr = self.cols[name]
        if start == 0:
            self._wall0 = None if name == "wall" else self._wall0
        if name == "wall":  # never going back; a row without a time holds the last one (0 before any)
            t = self.view("time")[start:]
            before = float(arr.view()[start - 1]) if start > 0 and len(arr) >= start else 0.0
            if self._wall0 is None:
                finite = t[np.isfinite(t)]
                if not len(finite):
                    arr.set_tail(start, np.full(len(t), before))
                    return
                self._wall0 = float(finite[0])
            rel = np.fmax.accumulate(np.concatenate(([before], t - self._wall0)))[1:]
            arr.set_tail(start, np.where(np.isfinite(rel), rel, before))
            return
        per_step = self.view("samples" if name == "samples_seen" else "tokens")[start:]
        before = float(arr.view()[start - 1]) if start > 0 and len(arr) >= start else 0.0
        arr.set_tail(start, before + np.cumsum(np.nan_to_num(per_step, nan=0.0)))

    def truncate_after(self, step: int) -> None:
        """Drop steps after `step` (a resumed run supersedes them)."""
        steps = self.view("step")
        keep = int(np.searchsorted(steps, step, side="right"))
        for arr in self.cols.values():
            arr.set_tail(keep, [])
        if keep == 0:
            self._wall0 = None
        cx = self.clipped_x.view()
        ck = int(np.searchsorted(cx, step, side="right"))
        self.clipped_x.set_tail(ck, [])
        self.clipped_y.set_tail(ck, [])
        self.nonfinite_steps = [s for s in self.nonfinite_steps if s <= step]
        self._smooth_again()
        for p in self._pyramids.values():
            p.reset()
        self.version += 1

    def clear(self) -> None:
        self._gpu = self._tokens = False
        self._wall0 = None
        for c in self._lazy:
            self.cols[c] = GrowableArray(16, COLUMN_DTYPES[c])
        self._lazy = {}
        for arr in list(self.cols.values()) + [self.clipped_x, self.clipped_y]:
            arr.clear()
        self.nonfinite_steps = []
        for ema in self._emas.values():
            ema.reset()
        self._inlier_ema.reset()
        for p in self._pyramids.values():
            p.reset()
        self.version += 1

    # -- reading -------------------------------------------------------------------------
    def has_gpu_memory(self) -> bool:
        return self._gpu

    def counts_tokens(self) -> bool:
        """True when the task's loss counts tokens (count differs from samples)."""
        return self._tokens

    def rows(self, columns: Optional[Iterable[str]] = None, chunk: int = 4096) -> Iterable[list[float]]:
        """Row by row as Python floats; a float32 fraction as the shortest decimal that is it
        (0.1, not 0.10000000149011612), a whole number (bytes, counts) as itself."""
        names = list(columns or (*STEP_COLUMNS, "loss_ema"))
        arrays = [self.view(c) for c in names]
        for i0 in range(0, len(self), chunk):
            yield from (list(r) for r in zip(*[_as_floats(a[i0:i0 + chunk]) for a in arrays]))
