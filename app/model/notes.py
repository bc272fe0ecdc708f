"""A non-step event as the app keeps it, whether it came live from the engine or from run.db."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from engine.events import Event

# Event kinds that become an entry in the alerts panel (one entry per occurrence).
ALERT_KINDS = ("nonfinite", "clip_saturation", "vram_low", "batchnorm_small_batch", "lr_hint",
               "oom_recovered", "command_refused", "scaler_skip", "run_failed", "micro_batch_found",
               "run_damaged")


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

    @property
    def is_alert(self) -> bool:
        return self.kind in ALERT_KINDS
