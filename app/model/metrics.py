"""The metrics buffer: one growable numpy array per column, doubling when full.

The GUI timer appends a batch of steps at a time; plots read `view(name)`, a
zero-copy slice of the filled part. Appending never touches what is already there,
so a slice handed to a plot stays valid (a regrowth leaves the old array to the plot
until its next update).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from .decimate import PeakPyramid
from .growable import GrowableArray

# Columns kept per optimizer step. None (no GPU, say) is stored as NaN.
STEP_COLUMNS = (
    "step", "epoch", "loss", "grad_norm", "lr", "accum", "clip", "micro_batch", "samples", "tokens",
    "clipped", "nonfinite", "throughput", "step_time", "mem_allocated", "mem_reserved", "mem_peak",
    "mem_used", "mem_total", "time",
)
EMA_BETA = 0.9


def _num(v: Any) -> float:
    if v is None:
        return math.nan
    return float(v)


class Ema:
    """Debiased exponential moving average, fed in batches; non-finite values hold the last one."""

    def __init__(self, beta: float = EMA_BETA) -> None:
        self.beta = beta
        self.reset()

    def reset(self) -> None:
        self.value, self.n = 0.0, 0

    def run(self, values: np.ndarray) -> np.ndarray:
        out = np.empty(len(values))
        ema, n, beta = self.value, self.n, self.beta
        for i, v in enumerate(values.tolist()):
            if math.isfinite(v):
                ema = beta * ema + (1 - beta) * v
                n += 1
            out[i] = ema / (1 - beta ** n) if n else math.nan
        self.value, self.n = ema, n
        return out


class MetricsBuffer:
    """All per-step metrics of one run, plus the loss EMA, as growable columns.

    Also keeps derived series that plots need as points: clipped steps (x, grad norm)
    and non-finite steps. Each plotted series has a peak (min/max) pyramid so a
    million-point curve is drawn from a few thousand points.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self.cols: dict[str, GrowableArray] = {c: GrowableArray(capacity) for c in STEP_COLUMNS}
        self.cols["loss_ema"] = GrowableArray(capacity)
        self.cols["clip_line"] = GrowableArray(capacity)  # clip norm, NaN where clipping is off
        self.cols["throughput_ema"] = GrowableArray(capacity)
        self.clipped_x = GrowableArray(64)
        self.clipped_y = GrowableArray(64)
        self.nonfinite_steps: list[int] = []
        self._loss_ema = Ema()
        self._tput_ema = Ema()
        self._pyramids: dict[str, PeakPyramid] = {}
        self._gpu = False  # some step has GPU memory figures
        self._tokens = False  # some step counted items other than samples
        self.version = 0  # bumps on every change; plots compare it

    def __len__(self) -> int:
        return len(self.cols["step"])

    def view(self, name: str) -> np.ndarray:
        return self.cols[name].view()

    def last_step(self) -> int:
        s = self.view("step")
        return int(s[-1]) if len(s) else 0

    def pyramid(self, name: str) -> PeakPyramid:
        """The min/max pyramid of a column (or of 'clipped_y'), brought up to date."""
        p = self._pyramids.get(name)
        if p is None:
            arr = self.clipped_y if name == "clipped_y" else self.cols[name]
            p = self._pyramids[name] = PeakPyramid(arr)
        p.update()
        return p

    # -- appending -----------------------------------------------------------------------
    def extend_records(self, records: Sequence[Any], get: Callable[[Any, str], Any]) -> int:
        """Append steps from StepMetrics objects (get=getattr) or run.db rows (get=dict.get).

        A step at or before the last one kept (a resumed run rewinding) truncates first.
        Returns the number of steps appended.
        """
        if not records:
            return 0
        first = int(get(records[0], "step"))
        steps = self.view("step")
        if len(steps) and first <= steps[-1]:
            self.truncate_after(first - 1)
        columns = {c: np.fromiter((_num(get(r, c)) for r in records), dtype=np.float64, count=len(records))
                   for c in STEP_COLUMNS if c != "time"}
        if isinstance(records[0], dict):
            columns["time"] = np.array([_num(r.get("time")) for r in records], dtype=np.float64)
        else:  # a live event: stamped when the GUI drains it (run.db has the engine's own time)
            columns["time"] = np.full(len(records), time.time())
        return self.extend_columns(columns)

    def extend_columns(self, columns: dict[str, np.ndarray]) -> int:
        """Append steps given as one array per column (steps after the last one kept)."""
        n = len(columns["step"])
        if n == 0:
            return 0
        n_before = len(self)
        for c in STEP_COLUMNS:
            values = columns.get(c)
            self.cols[c].extend(np.full(n, np.nan) if values is None else np.asarray(values, dtype=np.float64))
        loss = self.cols["loss"].view()[n_before:]
        self.cols["loss_ema"].extend(self._loss_ema.run(loss))
        self.cols["throughput_ema"].extend(self._tput_ema.run(self.cols["throughput"].view()[n_before:]))
        clip = self.cols["clip"].view()[n_before:]
        self.cols["clip_line"].extend(np.where(clip > 0, clip, np.nan))
        steps = self.cols["step"].view()[n_before:]
        clipped = self.cols["clipped"].view()[n_before:] > 0
        if clipped.any():
            self.clipped_x.extend(steps[clipped])
            self.clipped_y.extend(self.cols["grad_norm"].view()[n_before:][clipped])
        bad = self.cols["nonfinite"].view()[n_before:] > 0
        if bad.any():
            self.nonfinite_steps.extend(int(s) for s in steps[bad])
        if not self._gpu and np.isfinite(self.cols["mem_total"].view()[n_before:]).any():
            self._gpu = True
        if not self._tokens and np.any(self.cols["tokens"].view()[n_before:] != self.cols["samples"].view()[n_before:]):
            self._tokens = True
        self.version += 1
        return len(self) - n_before

    def truncate_after(self, step: int) -> None:
        """Drop steps after `step` (a resumed run supersedes them)."""
        steps = self.view("step")
        keep = int(np.searchsorted(steps, step, side="right"))
        for arr in self.cols.values():
            arr.set_tail(keep, [])
        cx = self.clipped_x.view()
        ck = int(np.searchsorted(cx, step, side="right"))
        self.clipped_x.set_tail(ck, [])
        self.clipped_y.set_tail(ck, [])
        self.nonfinite_steps = [s for s in self.nonfinite_steps if s <= step]
        for ema, src, dst in ((self._loss_ema, "loss", "loss_ema"), (self._tput_ema, "throughput", "throughput_ema")):
            ema.reset()
            self.cols[dst].set_tail(0, [])
            self.cols[dst].extend(ema.run(self.view(src).copy()))
        for p in self._pyramids.values():
            p.reset()
        self.version += 1

    def clear(self) -> None:
        self._gpu = self._tokens = False
        for arr in list(self.cols.values()) + [self.clipped_x, self.clipped_y]:
            arr.clear()
        self.nonfinite_steps = []
        self._loss_ema.reset()
        self._tput_ema.reset()
        for p in self._pyramids.values():
            p.reset()
        self.version += 1

    # -- reading -------------------------------------------------------------------------
    def has_gpu_memory(self) -> bool:
        return self._gpu

    def counts_tokens(self) -> bool:
        """True when the task's loss counts tokens (count differs from samples)."""
        return self._tokens

    def rows(self, columns: Optional[Iterable[str]] = None) -> Iterable[list[float]]:
        names = list(columns or (*STEP_COLUMNS, "loss_ema"))
        arrays = [self.view(c) for c in names]
        for i in range(len(self)):
            yield [a[i] for a in arrays]
