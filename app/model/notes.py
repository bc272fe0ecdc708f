"""A non-step event as the app keeps it, whether it came live from the engine or from run.db."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from engine.declarations.events import Event

from .stored import number, whole

# Event kinds that become an entry in the alerts panel (one entry per occurrence). run_damaged,
# run_ended and framework_checkpoints are the app's own notes about a run folder.
ALERT_KINDS = ("nonfinite", "clip_saturation", "vram_low", "batchnorm_small_batch", "lr_hint",
               "oom_recovered", "command_refused", "scaler_skip", "run_failed", "micro_batch_found",
               "run_damaged", "rolled_back", "memory_snapshot", "run_ended", "loss_weighting", "step_skipped",
               "store_problem", "framework_checkpoints")
# Every other kind the engine or an integration writes, and where the app shows it instead
# (tests/app/test_alert_kinds.py fails for a kind in neither list).
NOT_SHOWN = {
    "step": "the plots (one metrics row per optimizer step)",
    "epoch_end": "the plots' validation points and the epoch progress",
    "run_started": "the run's header and settings",
    "run_finished": "a run_ended alert (the app's note of how the run ended)",
    "settings_applied": "markers on the plots and the controls' values",
    "command_received": "the controls' pending changes",
    "lr_planned": "the planned lr curve",
    "memory_forecast": "the controls' memory forecast",
    "memory_levers": "the Memory tab's what-fits table",
    "paused": "the status bar",
    "unpaused": "the status bar",
    "checkpoint": "Run history's checkpoints",
}


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
        """A run.db events row. Rows are input from disk: a damaged one (text where a number
        belongs, data that is not an object) gives 0 / {} for what it lacks, never an error."""
        data = row.get("data")
        return cls(str(row.get("kind") or ""), whole(row.get("step")), whole(row.get("epoch")),
                   str(row.get("message") or ""), data if isinstance(data, dict) else {}, number(row.get("time")))

    @property
    def is_alert(self) -> bool:
        return self.kind in ALERT_KINDS
