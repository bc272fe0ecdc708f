"""What the window knows about one run: metrics, epochs, setting markers, alerts, state.

Plain Python (no Qt). Fed in order by a source (live events or run.db rows); each
`ingest` returns a Delta saying what changed so the window updates only that.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from engine.events import Event, StepMetrics

from .metrics import MetricsBuffer

# Event kinds that become an entry in the alerts panel (one entry per occurrence).
ALERT_KINDS = ("nonfinite", "clip_saturation", "vram_low", "batchnorm_small_batch", "lr_hint",
               "oom_recovered", "command_refused", "scaler_skip", "run_failed", "micro_batch_found",
               "run_damaged")
SETTING_NAMES = {"micro_batch": "micro-batch", "accum": "accum", "lr": "lr", "clip": "clip",
                 "lr_scaling": "lr scaling"}


@dataclass
class Note:
    """A non-step event, from the engine in this process or from run.db."""
    kind: str
    step: int
    epoch: int
    message: str
    data: dict = field(default_factory=dict)
    time: float = 0.0

    @classmethod
    def from_event(cls, event: Event, when: Optional[float] = None) -> "Note":
        d = event.to_dict()
        data = {k: v for k, v in d.items() if k not in ("step", "epoch", "kind")}
        return cls(event.kind, event.step, event.epoch, event.message(), data,
                   when if when is not None else time.time())

    @classmethod
    def from_row(cls, row: dict) -> "Note":
        return cls(row["kind"], int(row["step"] or 0), int(row["epoch"] or 0), row.get("message") or "",
                   row.get("data") or {}, float(row.get("time") or 0.0))


@dataclass
class Marker:
    step: float  # drawn between this step and the next
    label: str
    changes: tuple = ()


@dataclass
class Delta:
    steps: int = 0
    notes: list[Note] = field(default_factory=list)
    alerts: list[Note] = field(default_factory=list)
    markers: bool = False
    epochs: bool = False
    state: bool = False
    info: bool = False

    def __bool__(self) -> bool:
        return bool(self.steps or self.notes or self.markers or self.epochs or self.state or self.info)


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def marker_label(changes: Sequence[Sequence[Any]]) -> str:
    return ", ".join(f"{SETTING_NAMES.get(n, n)} {fmt_value(o)}\u2192{fmt_value(v)}" for n, o, v in changes)


class RunModel:
    def __init__(self) -> None:
        self.metrics = MetricsBuffer()
        self.epochs: list[tuple[int, int, float, Optional[float]]] = []  # epoch, step, train, val
        self.markers: list[Marker] = []
        self.notes: list[Note] = []
        self.info: dict[str, Any] = {}  # from run_started: run_dir, task, device, device_name, ...
        self.state = "idle"  # idle starting training pausing paused stopping finished failed interrupted
        self.finish_reason: Optional[str] = None
        self.epoch = 0  # the epoch being trained (from the last step)
        self.step = 0
        self.started_at: Optional[float] = None  # wall clock of run_started
        self.ended_at: Optional[float] = None
        self.samples_per_epoch: Optional[int] = None  # known once an epoch has ended
        self._samples_this_epoch = 0
        self._epoch_of_count = 0

    # -- feeding -------------------------------------------------------------------------
    def ingest(self, items: Sequence[Any], step_get: Callable[[Any, str], Any] = getattr) -> Delta:
        """Items in order: steps (StepMetrics or run.db metric rows) and Notes (or Events)."""
        delta = Delta()
        run: list[Any] = []
        for item in items:
            if isinstance(item, (StepMetrics, dict)):
                run.append(item)
                continue
            if run:
                self._steps(run, step_get, delta)
                run = []
            note = item if isinstance(item, Note) else Note.from_event(item)
            self._note(note, delta)
        if run:
            self._steps(run, step_get, delta)
        return delta

    def _steps(self, records: list[Any], get: Callable[[Any, str], Any], delta: Delta) -> None:
        n = self.metrics.extend_records(records, get)
        delta.steps += n
        last = records[-1]
        self.step = int(get(last, "step"))
        for r in records:  # samples per epoch: the data set size, for the ETA
            e = int(get(r, "epoch"))
            if e != self._epoch_of_count:
                self._epoch_of_count, self._samples_this_epoch = e, 0
            self._samples_this_epoch += int(get(r, "samples") or 0)
        epoch = int(get(last, "epoch"))
        if epoch != self.epoch:
            self.epoch = epoch
            delta.state = True
        if self.state in ("idle", "starting", "paused"):
            self.state = "training"
            delta.state = True

    def _note(self, note: Note, delta: Delta) -> None:
        self.notes.append(note)
        delta.notes.append(note)
        kind, d = note.kind, note.data
        if kind in ALERT_KINDS:
            delta.alerts.append(note)
        if kind == "run_started":
            self.info = dict(d)
            self.started_at = note.time or time.time()
            self.ended_at = None
            self.state, self.finish_reason = "training", None
            delta.info = delta.state = True
        elif kind == "settings_applied":
            changes = tuple(tuple(c) for c in d.get("changes") or ())
            if changes:
                self.markers.append(Marker(note.step + 0.5, marker_label(changes), changes))
                delta.markers = True
        elif kind == "oom_recovered":
            changes = (("micro_batch", d.get("old_micro_batch"), d.get("new_micro_batch")),
                       ("accum", d.get("old_accum"), d.get("new_accum")))
            self.markers.append(Marker(note.step + 0.5, "OOM: " + marker_label(changes), changes))
            delta.markers = True
        elif kind == "epoch_end":
            val = d.get("val_loss")
            self.epochs.append((note.epoch, note.step, float(d.get("train_loss", math.nan)),
                                None if val is None else float(val)))
            if self._epoch_of_count == note.epoch and self._samples_this_epoch:
                self.samples_per_epoch = self._samples_this_epoch
            delta.epochs = True
        elif kind == "paused":
            self.state = "paused"
            delta.state = True
        elif kind == "resumed":
            self.state = "training"
            delta.state = True
        elif kind == "run_finished":
            self.state, self.finish_reason = "finished", d.get("reason")
            self.ended_at = note.time or time.time()
            delta.state = True
        elif kind == "run_failed":
            self.state, self.finish_reason = "failed", d.get("error")
            self.ended_at = note.time or time.time()
            delta.state = True

    # -- reading -------------------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        c = self.info.get("config")
        return c if isinstance(c, dict) else {}

    @property
    def is_live(self) -> bool:
        return self.state in ("starting", "training", "pausing", "paused", "stopping")

    def elapsed(self, now: Optional[float] = None) -> Optional[float]:
        if self.started_at is None:
            return None
        end = self.ended_at if self.ended_at is not None else (now or time.time())
        return max(0.0, end - self.started_at)

    def eta(self) -> Optional[float]:
        """Seconds left, from the recent sample rate and the data set size (known after epoch 1)."""
        if not self.is_live or self.state == "paused":
            return None
        m = self.metrics
        n = len(m)
        if n < 2:
            return None
        k = min(n, 50)
        samples = m.view("samples")[-k:]
        secs = m.view("step_time")[-k:]
        if not secs.sum() > 0:
            return None
        rate = samples.sum() / secs.sum()  # samples per second
        step_secs = secs.mean()
        candidates = []
        epochs = int(self.config.get("epochs") or 0)
        if self.samples_per_epoch and epochs:
            left_epochs = epochs - self.epoch
            left = left_epochs * self.samples_per_epoch + max(0, self.samples_per_epoch - self._samples_this_epoch)
            candidates.append(left / rate if rate > 0 else math.inf)
        max_steps = self.config.get("max_steps")
        if max_steps:
            candidates.append(max(0, int(max_steps) - self.step) * step_secs)
        return min(candidates) if candidates else None

    def alerts(self) -> list[Note]:
        return [n for n in self.notes if n.kind in ALERT_KINDS]
