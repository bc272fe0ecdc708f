"""A non-step event as the app keeps it, whether it came live from the engine or from run.db."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

from engine.declarations.events import Event

from .stored import number, whole

# Event kinds that become an entry in the alerts panel (one entry per kind: NoteGroups). run_damaged,
# run_ended and framework_checkpoints are the app's own notes about a run folder; window_error its
# note of an exception no slot of the window caught (app/core/logs.py).
ALERT_KINDS = ("nonfinite", "clip_saturation", "vram_low", "batchnorm_small_batch", "lr_hint",
               "oom_recovered", "command_refused", "scaler_skip", "run_failed", "micro_batch_found",
               "run_damaged", "rolled_back", "memory_snapshot", "run_ended", "loss_weighting", "step_skipped",
               "store_problem", "framework_checkpoints", "window_error", "notify_failed")
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
                   str(row.get("message") or ""), data if isinstance(data, dict) else {}, number(row.get("time")) or 0.0)

    @property
    def is_alert(self) -> bool:
        return self.kind in ALERT_KINDS


# A group keeps the latest message of each of its first few wordings (a message with its numbers
# taken out): a run folder's different problems stay readable, 218 "non-finite at step N" are one.
MAX_WORDINGS = 8
_NUMBER = re.compile(r"[-+]?\d+(?:[.,:]\d+)*(?:e[-+]?\d+)?", re.IGNORECASE)


def wording(message: str) -> str:
    """A message with its numbers taken out: what two occurrences of one alert have in common."""
    return _NUMBER.sub("#", message)


@dataclass
class NoteGroup:
    """Every occurrence of one alert kind so far: how many, the first and the latest, and the
    latest message of each wording (capped at MAX_WORDINGS; `more_wordings` counts the rest)."""
    first: Note
    last: Note
    count: int = 1
    messages: dict[str, str] = field(default_factory=dict)  # wording -> its latest message, first seen first
    more_wordings: int = 0

    @classmethod
    def of(cls, note: Note) -> "NoteGroup":
        return cls(note, note, 1, {wording(note.message): note.message})

    @property
    def kind(self) -> str:
        return self.first.kind

    def add(self, note: Note) -> None:
        self.last = note
        self.count += 1
        key = wording(note.message)
        if key in self.messages or len(self.messages) < MAX_WORDINGS:
            self.messages[key] = note.message
        else:
            self.more_wordings += 1

    def details(self) -> str:
        """Each wording's latest message, one a line (the latest occurrence's last)."""
        latest = wording(self.last.message)
        lines = [m for k, m in self.messages.items() if k != latest] + [self.last.message]
        if self.more_wordings:
            lines.append(f"(and {self.more_wordings} more worded otherwise)")
        return "\n".join(lines)


class NoteGroups:
    """Alerts grouped by kind, in the order each kind first came; Qt-free."""

    def __init__(self) -> None:
        self.by_kind: dict[str, NoteGroup] = {}

    def add(self, notes: Iterable[Note]) -> tuple[list[NoteGroup], list[NoteGroup]]:
        """The groups that are new and those that grew (each once, whatever the notes' number)."""
        new: dict[str, NoteGroup] = {}
        grown: dict[str, NoteGroup] = {}
        for n in notes:
            g = self.by_kind.get(n.kind)
            if g is None:
                new[n.kind] = self.by_kind[n.kind] = NoteGroup.of(n)
                continue
            g.add(n)
            if n.kind not in new:
                grown[n.kind] = g
        return list(new.values()), list(grown.values())

    def __len__(self) -> int:
        return len(self.by_kind)

    def __iter__(self) -> Iterator[NoteGroup]:
        return iter(self.by_kind.values())

    def clear(self) -> None:
        self.by_kind.clear()
