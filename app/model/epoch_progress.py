"""How far the current epoch is, in accumulation windows, and when it (and the run) will end.

The engine counts an epoch as len(train_data) samples. The app does not load the task, so it
reads that size off the engine's `lr_planned` event: the schedule spans epochs x the data
set, or, with --max-steps, the smaller of that and max steps x the starting effective batch
(engine/trainer/setup.py total_samples); a run whose epochs or max steps changed while it trains
counts to the engine's last settings_applied of them and its re-planned lr_planned total (the
config's length otherwise). Where the max-steps term is the smaller, the data set size
is known only once an epoch has ended (RunModel.samples_per_epoch). Windows left = samples
left / the samples of the latest window (accumulation can change mid-epoch), never past
--max-steps. Seconds per window are the median pace of the last steps (seconds_per_window), so
the ETA is there from the first steps on, not only after epoch 1, and holds still: no ETA
before MIN_PACED steps past a segment's warm-up (the first steps of a run, or of a run
continued with --resume, pay for allocation and compilation: early ETAs swung from 0:48 to
7:35:13). The elapsed time counts every segment of a continued run (app/model/run_time.py),
never from 0 again at a resume. Qt-free; O(1) per update (the running sums of
app/model/x_axis.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from engine.declarations.settings import LENGTH_NAMES

from .metrics import MetricsBuffer
from .run_time import MARK_KINDS, STARTED, Mark, RunTime, run_time
from .runmodel import RunModel
from .stored import changes, number, whole
from .x_axis import columns, fmt_clock

RATE_STEPS = 50  # seconds per window: the median pace of the last 50 steps
WARMUP_STEPS = 2  # a segment's first steps (allocation, autotuning, compilation) are not its pace
MIN_PACED = 5  # no ETA before this many steps past the warm-up: a guess from one or two steps swings


@dataclass(frozen=True)
class EpochProgress:
    epoch: int
    done: int  # windows trained in this epoch
    total: Optional[int]  # windows this epoch will have (done + left); None when not known
    eta: Optional[float]  # seconds to the end of this epoch (or of the run, if --max-steps ends it first)
    run_eta: Optional[float]  # seconds to the end of the run
    step: int = 0
    max_steps: Optional[int] = None
    by_steps: bool = False  # the epoch's size is unknown: the bar counts the run's steps to --max-steps

    @property
    def fraction(self) -> float:
        if self.by_steps and self.max_steps:
            return min(1.0, self.step / self.max_steps)
        return min(1.0, self.done / self.total) if self.total else 0.0

    def text(self, eta_shown: bool = True) -> str:
        """'epoch 2: 37% · ETA 1:24'."""
        if self.by_steps:
            head = f"epoch {self.epoch} \u00b7 step {self.step:,} of {self.max_steps:,}: {self.fraction:.0%}"
        elif self.total:
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
        self.total_samples: Optional[float] = None  # the whole run's samples, as the engine counts them
        self.length: dict[str, Any] = {}  # epochs and max steps as the engine last changed them (settings_applied)
        self._marks: list[Mark] = []  # the run's segments' starts and ends (run_started, run_finished...)
        self.time = RunTime()

    def _read(self, model: RunModel) -> None:
        if model is not self._model or len(model.notes) < self._notes:
            self._model, self._notes, self.total_samples, self.length = model, 0, None, {}
            self._marks, self.time = [], RunTime()
        marks = len(self._marks)
        for note in model.notes[self._notes:]:
            if note.kind == "lr_planned" and number(note.data.get("total_samples"), None):
                self.total_samples = number(note.data.get("total_samples"), None)
            elif note.kind == "settings_applied":  # a run whose length changed while it trains
                self.length.update({name: new for name, _old, new in changes(note.data.get("changes"))
                                    if name in LENGTH_NAMES})
            elif note.kind in MARK_KINDS:
                self._marks.append(self._mark(note.kind, note.time, model.metrics))
        self._notes = len(model.notes)
        if len(self._marks) != marks:
            self.time = run_time(self._marks)

    def _mark(self, kind: str, when: float, buf: MetricsBuffer) -> Mark:
        """A segment's start or end; a start after a segment that said no end (its process died)
        carries the time of the last row before it, where that segment ended."""
        died = kind == STARTED and bool(self._marks) and self._marks[-1].kind == STARTED
        return Mark(kind, when, last_row_before(buf, when) if died else None)

    def elapsed(self, model: RunModel, live: bool, now: Optional[float] = None) -> Optional[float]:
        """Seconds trained, every segment of a continued run together; the one going counts to
        now while the run is live, else to its last row (a run whose process died)."""
        self._read(model)
        if live:
            until: Optional[float] = now or time.time()
        else:
            until = last_row_before(model.metrics, None)
        return self.time.seconds(until)

    def planned(self, model: RunModel, name: str) -> Any:
        """The run's epochs or max steps now: the config's, or the engine's last change of it."""
        self._read(model)
        return self.length[name] if name in self.length else model.config.get(name)

    def epoch_samples(self, model: RunModel) -> Optional[float]:
        """Samples in one epoch (len(train_data) x the ranks' share), if it can be told yet."""
        self._read(model)
        if model.samples_per_epoch:
            return float(model.samples_per_epoch)
        cfg = model.config
        epochs = whole(self.planned(model, "epochs"))
        if self.total_samples is None or epochs <= 0:
            return None
        max_steps = self.planned(model, "max_steps")
        if max_steps:
            world = whole(model.info.get("world_size") or 1, 1)
            by_steps = whole(max_steps) * whole(cfg.get("micro_batch")) * whole(cfg.get("accum")) * world
            if self.total_samples >= by_steps:
                return None  # max steps x the batch was the smaller: the data set size is not in the total
        return self.total_samples / epochs

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
        max_steps = whole(self.planned(model, "max_steps")) or None
        steps_left = max(0, max_steps - model.step) if max_steps else None
        per_epoch = self.epoch_samples(model)
        secs = seconds_per_window(model, self.time.last_started)
        if per_epoch is None:
            eta = steps_left * secs if (steps_left is not None and secs is not None) else None
            return EpochProgress(epoch, done, None, eta, eta, model.step, max_steps, by_steps=max_steps is not None)
        left = math.ceil(max(0.0, per_epoch - done_samples) / window)
        if steps_left is not None:
            left = min(left, steps_left)
        eta = left * secs if secs is not None else None
        run_eta = None
        epochs = whole(self.planned(model, "epochs"))
        if secs is not None and epochs:
            run_left = left + max(0, epochs - epoch) * math.ceil(per_epoch / window)
            if steps_left is not None:
                run_left = min(run_left, steps_left)
            run_eta = run_left * secs
        return EpochProgress(epoch, done, done + left, eta, run_eta, model.step, max_steps)


def last_row_before(buf: MetricsBuffer, t: Optional[float]) -> Optional[float]:
    """The time of the newest row before `t` (None: of all), or None."""
    times = buf.view("time")
    if t is not None:
        times = times[times < t]
    times = times[np.isfinite(times)]
    return float(times.max()) if len(times) else None


def seconds_per_window(model: RunModel, segment_start: Optional[float] = None) -> Optional[float]:
    """Wall seconds per optimizer step: the median pace of the last RATE_STEPS steps of the run's
    current segment (the one that started at `segment_start`; None: at the first row), past its
    first WARMUP_STEPS; None until MIN_PACED steps can say.

    A step's pace is the wall time since the row before. Rows that reach run.db together (a run
    followed from its folder) share one time: the time since the batch before is shared among
    them (the gaps alone said 0 s, or the commit interval, a step: early ETAs swung from 0:48 to
    7:35:13). The step's own step_time is the least it took. The median leaves a pause, a
    validation pass or a checkpoint between two steps as one gap among fifty."""
    buf = model.metrics
    n = len(buf)
    k = min(n, RATE_STEPS + WARMUP_STEPS + 1)
    if k < MIN_PACED + 1:
        return None
    t = buf.view("time")[-k:]
    # A long run opened from its folder leaves step_time on disk until asked for: not read for this.
    step_time = buf.view("step_time")[-k:] if buf.holds("step_time") else np.full(k, np.nan)
    before = np.flatnonzero(t < segment_start) if segment_start is not None else np.array([], dtype=np.int64)
    if len(before):
        first: Optional[int] = int(before[-1]) + 1  # the segment's first row, in the tail
    else:
        first = 0 if n == k else None  # the whole run is in the tail; else the segment began before it
    lo = first + WARMUP_STEPS if first is not None else 1
    if lo >= k:
        return None
    pace = np.fmax(batch_gaps(t[lo - 1:]), step_time[lo:])  # fmax: where one is NaN, the other
    pace = pace[np.isfinite(pace) & (pace > 0)][-RATE_STEPS:]
    return float(np.median(pace)) if len(pace) >= MIN_PACED else None


def batch_gaps(t: np.ndarray) -> np.ndarray:
    """Each row's share of the time since the row before (t[0] is that row for t[1]): rows that
    share one time (written together) share the time since the rows before them; NaN for rows
    that share the first row's time (what came before it is not in `t`)."""
    starts = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])  # where the time changes (a NaN: a batch of its own)
    sizes = np.diff(np.r_[starts, len(t)])
    per_row = np.r_[np.nan, np.diff(t[starts])] / sizes
    return np.repeat(per_row, sizes)[1:]
