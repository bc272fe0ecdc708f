"""The two memory levers that are not yet commands: activation checkpointing and precision.

Frozen dataclasses like engine.commands, validated on creation, torch-free. They are
not registered yet: to travel through run.db's `commands` table they must be added to
engine.commands.COMMANDS (kinds "set_checkpointing" and "set_precision").

How the trainer applies them (at the boundary the command asks for, never inside a window):

- SetCheckpointing(on): switch = engine.checkpointing.find_switch(task, model) (found once,
  at setup); None -> refuse with engine.checkpointing.why_no_switch(task, model); else
  switch(on). Memory fits are kept per (precision, checkpointing) state, so the next
  window's peak goes to the new state's MemoryModel.
- SetPrecision(precision): rebuild the autocast context (and a GradScaler for fp16, drop
  it otherwise); parameters and optimizer state keep their dtype (autocast only).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .commands import Command
from .config import PRECISIONS, ConfigError


@dataclass(frozen=True)
class SetCheckpointing(Command):
    on: bool
    kind: ClassVar[str] = "set_checkpointing"

    def __post_init__(self) -> None:
        if not isinstance(self.on, bool):
            raise ConfigError(f"checkpointing must be true or false, got {self.on!r}")


@dataclass(frozen=True)
class SetPrecision(Command):
    precision: str
    kind: ClassVar[str] = "set_precision"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")


MEM_COMMANDS: dict[str, type[Command]] = {c.kind: c for c in (SetCheckpointing, SetPrecision)}
