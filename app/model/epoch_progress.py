"""How far the current epoch is, in accumulation windows, and when it (and the run) will end.

The engine plans an epoch as len(train_data) samples. The app does not load the task, so it
reads that size off the engine's `lr_planned` event: the schedule spans epochs x the data
set, or, with --max-steps, the smaller of that and max steps x the starting effective batch
(engine/loop/setup.py planned_samples). Where the max-steps term is the smaller, the data set size
is known only once an epoch has ended (RunModel.samples_per_epoch). Windows left = samples
left / the samples of the latest window (accumulation can change mid-epoch), never past
--max-steps. Seconds per window come from the last steps' wall time, so the ETA is there from
the second step on, not only after epoch 1. Qt-free; O(1) per update (the running sums of
app/model/x_axis.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .runmodel import RunModel
from .stored import whole
from .x_axis import columns, fmt_clock

RATE_STEPS = 50  # seconds per window over the last 50 steps


@dataclass(frozen=True)
class EpochProgress:
    epoch: int
    done: int  # windows trained in this epoch
    planned: Optional[int]  # windows this epoch will have (done + left); None when the plan is unknown
    eta: Optional[float]  # seconds to the end of this epoch (or of the run, if --max-steps ends it first)
    run_eta: Optional[float]  # seconds to the end of the run
    step: int = 0
    max_steps: Optional[int] = None
    by_steps: bool = False  # the epoch's size is unknown: the bar counts the run's steps to --max-steps

    @property
    def fraction(self) -> float:
        if self.by_steps and self.max_steps:
            return min(1.0, self.step / self.max_steps)
        return min(1.0, self.done / self.planned) if self.planned else 0.0

    def text(self, eta_shown: bool = True) -> str:
        """'epoch 2: 37% · ETA 1:24'."""
        if self.by_steps:
            head = f"epoch {self.epoch} \u00b7 step {self.step:,} of {self.max_steps:,}: {self.fraction:.0%}"
        elif self.planned:
            head = f"epoch {self.epoch}: {self.fraction:.0%}"
        else:
            head = f"epoch {self.epoch}: {self.done:,} steps"
        if eta_shown and self.eta is not None:
            head += f" \u00b7 ETA {fmt_eta(self.eta)}"
        return head


def fmt_duration(s: Optional[float]) -> str:
    """Seconds as m:ss or h:mm:ss; '--' when unknown."""
    return "--" if s is None else fmt_clock(s)


def fmt_eta(s: Optional[float]) -> str:
    """Like fmt_duration, but time still to go never reads 0:00 ('<0:01')."""
    return "<0:01" if s is not None and 0 < s < 0.5 else fmt_duration(s)


class ProgressTracker:
    """Reads the model's lr_planned notes as they come (a cursor, never the whole list again)."""

    def __init__(self) -> None:
        self._model: Optional[RunModel] = None
        self._notes = 0
        self.planned_total: Optional[float] = None  # samples the engine plans for the whole run

    def _read(self, model: RunModel) -> None:
        if model is not self._model or len(model.notes) < self._notes:
            self._model, self._notes, self.planned_total = model, 0, None
        for note in model.notes[self._notes:]:
            if note.kind == "lr_planned" and note.data.get("total_samples"):
                self.planned_total = float(note.data["total_samples"])
        self._notes = len(model.notes)

    def epoch_samples(self, model: RunModel) -> Optional[float]:
        """Samples in one epoch (len(train_data) x the ranks' share), if it can be told yet."""
        self._read(model)
        if model.samples_per_epoch:
            return float(model.samples_per_epoch)
        cfg = model.config
        epochs = whole(cfg.get("epochs"))
        if self.planned_total is None or epochs <= 0:
            return None
        max_steps = cfg.get("max_steps")
        if max_steps:
            world = whole(model.info.get("world_size") or 1, 1)
            by_steps = whole(max_steps) * whole(cfg.get("micro_batch")) * whole(cfg.get("accum")) * world
            if self.planned_total >= by_steps:
                return None  # max steps x the batch was the smaller: the data set size is not in the plan
        return self.planned_total / epochs

    def progress(self, model: RunModel) -> Optional[EpochProgress]:
        buf = model.metrics
        n = len(buf)
        if n == 0:
            return None
        cols = columns(buf)
        seen = cols.values("samples")
        epoch_col = buf.view("epoch")
        epoch = int(epoch_col[-1])
        first = int(np.searchsorted(epoch_col, epoch, side="left"))
        done = n - first
        done_samples = float(seen[-1] - (seen[first - 1] if first > 0 else 0.0))
        window = float(buf.view("samples")[-1]) or 1.0
        cfg = model.config
        max_steps = whole(cfg.get("max_steps")) or None
        steps_left = max(0, max_steps - model.step) if max_steps else None
        per_epoch = self.epoch_samples(model)
        secs = seconds_per_window(model)
        if per_epoch is None:
            eta = steps_left * secs if (steps_left is not None and secs is not None) else None
            return EpochProgress(epoch, done, None, eta, eta, model.step, max_steps, by_steps=max_steps is not None)
        left = math.ceil(max(0.0, per_epoch - done_samples) / window)
        if steps_left is not None:
            left = min(left, steps_left)
        eta = left * secs if secs is not None else None
        run_eta = None
        epochs = whole(cfg.get("epochs"))
        if secs is not None and epochs:
            run_left = left + max(0, epochs - epoch) * math.ceil(per_epoch / window)
            if steps_left is not None:
                run_left = min(run_left, steps_left)
            run_eta = run_left * secs
        return EpochProgress(epoch, done, done + left, eta, run_eta, model.step, max_steps)


def seconds_per_window(model: RunModel) -> Optional[float]:
    """Wall seconds per optimizer step over the last steps: the median time between two rows
    (a pause, or a validation pass, between two of them is one gap among fifty, not a tenth of
    the pace: the ETA jumped from 4:23 to 14:06 after a pause); their step_time until rows are
    apart in time."""
    buf = model.metrics
    n = len(buf)
    if n == 0:
        return None
    k = min(RATE_STEPS, n)
    t = columns(buf).values("time")
    if k >= 3 and t[-1] > t[-k]:
        gaps = np.diff(t[-k:])
        gaps = gaps[np.isfinite(gaps) & (gaps > 0)]
        if len(gaps):
            return float(np.median(gaps))
    st = buf.view("step_time")[-k:]
    st = st[np.isfinite(st)]
    return float(st.mean()) if len(st) and st.mean() > 0 else None
