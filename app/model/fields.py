"""The run settings a user can change while a run goes, and how each maps to an engine command.

Derived from the engine's one declaration (engine/declarations/settings.py LIVE_SETTINGS), so the form, the
session, the pending-changes model and the engine agree on names, order, command kinds and
the command field that carries the value. Qt-free, torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from engine.declarations.commands import Command
from engine.declarations.settings import LIVE_SETTINGS


@dataclass(frozen=True)
class LiveField:
    name: str  # the TrainConfig field, also the key in every dict of live values
    label: str  # how the alerts, markers and hints name it
    command: type[Command]
    arg: str  # the command's field that carries the value
    cast: Callable[[Any], Any]

    def make(self, value: Any, at: str = "epoch") -> Command:
        """The command that sets this field, applied at the next "epoch" or "step" boundary
        (raises ConfigError for a value out of range)."""
        return self.command(**{self.arg: self.cast(value)}, at=at)


# The settings the Controls form edits, in the engine's order (micro-batch and accumulation
# before lr, so lr scaling sees the new batch). Activation checkpointing is switched from the
# memory view's "what fits" table, which sends its commands itself.
FORM_SETTINGS = ("micro_batch", "accum", "lr", "clip", "lr_scaling")
FIELDS: tuple[LiveField, ...] = tuple(LiveField(s.name, s.short, s.command, s.payload, s.type)
                                      for s in LIVE_SETTINGS if s.name in FORM_SETTINGS)
LIVE_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS)
BY_NAME: dict[str, LiveField] = {f.name: f for f in FIELDS}
BY_COMMAND: dict[str, LiveField] = {f.command.kind: f for f in FIELDS}
SETTING_LABELS: dict[str, str] = {f.name: f.label for f in FIELDS}


def make_command(name: str, value: Any, at: str = "epoch") -> Command:
    return BY_NAME[name].make(value, at)


def field_of_command(kind: str) -> Optional[LiveField]:
    """The live field a command kind sets (None for pause, stop, a run.db row's error...)."""
    return BY_COMMAND.get(kind)


def same(a: Any, b: Any) -> bool:
    """Equal values of a setting: floats compared with a relative tolerance (the form rounds)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
