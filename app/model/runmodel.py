"""What the app knows about one run's data: metrics, epochs, setting markers, notes, info.

Plain Python (no Qt). Fed in order by a source (live events or run.db rows); each
`ingest` returns a Delta saying what changed, so the views update only that. Where the
run stands (training, paused, finished...) is the session's business (app/session/):
it runs the one state machine and writes its state here too, for code that holds only
the model; nothing here changes it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from engine.declarations.events import StepMetrics
from engine.declarations.settings import LIVE_SETTINGS

from .discarded import KEPT, DiscardedSteps
from .ending import Ending, ending
from .fields import fmt_value, words
from .metrics import MetricsBuffer, StepColumns
from .notes import Note
from .scalars import Scalars
from .state import RunState
from .stored import changes as stored_changes
from .stored import measured, whole

PER_STEP_LIVE = tuple(s for s in LIVE_SETTINGS if s.per_step)  # every metrics row records these


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
    epoch: bool = False  # the epoch being trained changed
    info: bool = False

    def __bool__(self) -> bool:
        return bool(self.steps or self.notes or self.markers or self.epochs or self.epoch or self.info)

    def absorb(self, later: "Delta") -> None:
        """Add what a later ingest changed to this delta."""
        self.steps += later.steps
        self.notes += later.notes
        self.alerts += later.alerts
        self.markers |= later.markers
        self.epochs |= later.epochs
        self.epoch |= later.epoch
        self.info |= later.info


@dataclass(frozen=True)
class Rollback:
    """The run went back to `to_step` (a rolled_back event): the steps after it were thrown away."""
    to_step: int
    from_step: int
    reason: str
    new_lr: float
    windows_skipped: int

    @property
    def label(self) -> str:
        return f"rolled back to step {self.to_step} ({self.reason}), lr {fmt_value(self.new_lr)}"


def marker_label(changes: Sequence[Sequence[Any]]) -> str:
    return ", ".join(f"{words(n)} {fmt_value(o)}\u2192{fmt_value(v)}" for n, o, v in changes)


class RunModel:
    def __init__(self) -> None:
        self.metrics = MetricsBuffer()
        self.epochs: list[tuple[int, int, float, Optional[float]]] = []  # epoch, step, train, val
        self.markers: list[Marker] = []
        self.rollbacks: list[Rollback] = []  # rolled_back events, in order
        self.discarded = DiscardedSteps()  # steps thrown away (rollbacks, resumes): drawn greyed
        self.memory_levers: Optional[Note] = None  # the latest "what fits" table (memory_levers)
        self.notes: list[Note] = []
        # What a framework logged, when a follow pushes it (a run on another machine): the
        # Scalars plot shows these instead of reading a run.db here. None: none pushed.
        self.pushed_scalars: Optional[Scalars] = None
        self.info: dict[str, Any] = {}  # from run_started: run_dir, task, device, device_name, ...
        self.state = RunState.IDLE  # written by the session (its state machine), read by anyone
        self.finish_reason: Optional[str] = None  # from run_finished (reason) or run_failed (error)
        self.epoch = 0  # the epoch being trained (from the last step)
        self.step = 0
        self.started_at: Optional[float] = None  # wall clock of run_started
        self.ended_at: Optional[float] = None
        self.samples_per_epoch: Optional[int] = None  # known once an epoch has ended
        self._samples_this_epoch = 0
        self._epoch_of_count = 0
        self._on_note: dict[str, Callable[[Note, Delta], None]] = {
            "run_started": self._run_started, "settings_applied": self._settings_applied,
            "oom_recovered": self._oom_recovered, "epoch_end": self._epoch_end,
            "run_finished": self._run_ended, "run_failed": self._run_ended,
            "rolled_back": self._rolled_back, "memory_levers": self._memory_levers,
        }

    # -- feeding -------------------------------------------------------------------------
    def ingest(self, items: Sequence[Any], step_get: Callable[[Any, str], Any] = getattr) -> Delta:
        """Items in order: steps (StepMetrics or run.db metric rows) and Notes (or Events)."""
        delta = Delta()
        pieces = [i for i in items if isinstance(i, StepColumns)]
        if pieces:  # a run folder's read: room for all of it at once, no doubling on the way
            self.metrics.reserve(sum(len(p) for p in pieces))
        run: list[Any] = []
        for item in items:
            if isinstance(item, (StepMetrics, dict)):
                run.append(item)
                continue
            if run:
                self._steps(run, step_get, delta)
                run = []
            if isinstance(item, StepColumns):
                if len(item):
                    self._keep_superseded(float(item.steps()[0]), delta)
                self._after_steps(self.metrics.extend_columns(item), delta)
                continue
            self._note(item if isinstance(item, Note) else Note.from_event(item), delta)
        if run:
            self._steps(run, step_get, delta)
        return delta

    def _steps(self, records: list[Any], get: Callable[[Any, str], Any], delta: Delta) -> None:
        self._keep_superseded(measured(get(records[0], "step")), delta)
        self._after_steps(self.metrics.extend_records(records, get), delta)

    def _keep_superseded(self, first: float, delta: Delta) -> None:
        """New steps from `first` on replace the ones held from there (the run went back: a
        rollback, a resume): those move to `discarded` first, never dropped silently."""
        m = self.metrics
        if not len(m) or not math.isfinite(first) or first > m.last_step():
            return
        i = int(np.searchsorted(m.view("step"), first, side="left"))
        back = self.rollbacks[-1] if self.rollbacks and self.rollbacks[-1].to_step == int(first) - 1 else None
        reason = (f"rolled back from step {back.from_step} to step {back.to_step} ({back.reason})" if back
                  else f"superseded: the run went back to step {int(first) - 1}")
        self.discarded.add_columns({k: m.view(k)[i:] for k in KEPT if m.holds(k)}, reason)
        delta.markers = True

    def _after_steps(self, n: int, delta: Delta) -> None:
        """The last n steps of the buffer are new: the step, the epoch, samples per epoch."""
        delta.steps += n
        if n <= 0:
            return
        m = self.metrics
        epochs, samples = m.view("epoch")[-n:], m.view("samples")[-n:]
        self.step = int(m.view("step")[-1])
        # Samples per epoch (the data set size, for the ETA): the samples of the last epoch's steps so far.
        last = float(epochs[-1])
        others = np.flatnonzero(epochs != last) if math.isfinite(last) else np.arange(n)
        start = int(others[-1]) + 1 if len(others) else 0
        e = int(last) if math.isfinite(last) else -1
        counted = float(np.nansum(samples[start:]))
        if start == 0 and e == self._epoch_of_count:
            self._samples_this_epoch += int(counted)
        else:
            self._epoch_of_count, self._samples_this_epoch = e, int(counted)
        if e >= 0 and e != self.epoch:
            self.epoch = e
            delta.epoch = True

    def _note(self, note: Note, delta: Delta) -> None:
        self.notes.append(note)
        delta.notes.append(note)
        if note.is_alert:
            delta.alerts.append(note)
        handler = self._on_note.get(note.kind)
        if handler is not None:
            handler(note, delta)

    def _run_started(self, note: Note, delta: Delta) -> None:
        self.info = dict(note.data)
        self.started_at = note.time or time.time()
        self.ended_at = None
        self.finish_reason = None
        delta.info = True

    def _settings_applied(self, note: Note, delta: Delta) -> None:
        changes = stored_changes(note.data.get("changes"))  # its (name, old, new) triples only
        if changes:
            self.markers.append(Marker(note.step + 0.5, marker_label(changes), changes))
            delta.markers = True

    def _oom_recovered(self, note: Note, delta: Delta) -> None:
        d = note.data
        changes = (("micro_batch", d.get("old_micro_batch"), d.get("new_micro_batch")),
                   ("accum", d.get("old_accum"), d.get("new_accum")))
        self.markers.append(Marker(note.step + 0.5, "OOM: " + marker_label(changes), changes))
        delta.markers = True

    def _rolled_back(self, note: Note, delta: Delta) -> None:
        d = note.data  # a damaged row: what the note itself says
        self.rollbacks.append(Rollback(whole(d.get("to_step"), note.step), whole(d.get("from_step"), note.step),
                                       str(d.get("reason") or "?"), measured(d.get("new_lr")),
                                       whole(d.get("windows_skipped"), 0)))
        delta.markers = True

    def _memory_levers(self, note: Note, delta: Delta) -> None:
        self.memory_levers = note

    def add_discarded(self, rows: Sequence[dict[str, Any]]) -> Delta:
        """A run folder's discarded_metrics rows (read when it is opened)."""
        self.discarded.add_rows(rows)
        return Delta(markers=bool(rows))

    def _epoch_end(self, note: Note, delta: Delta) -> None:
        val = note.data.get("val_loss")
        self.epochs.append((note.epoch, note.step, measured(note.data.get("train_loss")),
                            None if val is None else measured(val)))
        if self._epoch_of_count == note.epoch and self._samples_this_epoch:
            self.samples_per_epoch = self._samples_this_epoch
        delta.epochs = True

    def _run_ended(self, note: Note, delta: Delta) -> None:
        self.finish_reason = note.data.get("reason" if note.kind == "run_finished" else "error")
        self.ended_at = note.time or time.time()
        delta.info = True
        if note.kind == "run_finished":  # why it ended, in the alerts (run_failed is one itself)
            end = self.ending("finished")
            said = Note("run_ended", note.step, note.epoch, end.why or end.word, {"key": end.key, "word": end.word},
                        note.time)
            self.notes.append(said)
            delta.alerts.append(said)

    def ending(self, status: Optional[str] = None) -> Ending:
        """How the run ended (status: finished, failed, interrupted; default: from its state)."""
        st = status or {RunState.FAILED: "failed", RunState.INTERRUPTED: "interrupted"}.get(self.state, "finished")
        return ending(st, self.finish_reason, self.step, self.config.get("nonfinite"), self.rollbacks,
                      error=str(self.finish_reason or "") if st == "failed" else "")

    # -- reading -------------------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        c = self.info.get("config")
        return c if isinstance(c, dict) else {}

    def elapsed(self, now: Optional[float] = None) -> Optional[float]:
        if self.started_at is None:
            return None
        end = self.ended_at if self.ended_at is not None else (now or time.time())
        return max(0.0, end - self.started_at)

    def eta(self) -> Optional[float]:
        """Seconds left at the recent sample rate, from the data set size (known after epoch 1)
        and max_steps. Whether a run is going at all is the caller's to know."""
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
        epochs = whole(self.config.get("epochs"))
        if self.samples_per_epoch and epochs:
            left_epochs = epochs - self.epoch
            left = left_epochs * self.samples_per_epoch + max(0, self.samples_per_epoch - self._samples_this_epoch)
            candidates.append(left / rate if rate > 0 else math.inf)
        max_steps = whole(self.config.get("max_steps"))
        if max_steps:
            candidates.append(max(0, max_steps - self.step) * step_secs)
        return min(candidates) if candidates else None

    def alerts(self) -> list[Note]:
        return [n for n in self.notes if n.is_alert]

    def step_values(self, index: int) -> dict[str, Any]:
        """The live settings a step was trained with (lr, clip, micro-batch, accum), by its index;
        None for one its row does not hold."""
        buf = self.metrics

        def value(name: str, cast: Callable[[float], Any]) -> Any:
            v = buf.value_at(name, index)
            return cast(v) if math.isfinite(v) else None  # a damaged row: not known

        return {s.name: value(s.name, s.type) for s in PER_STEP_LIVE}
