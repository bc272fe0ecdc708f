"""Commands into a running engine: frozen dataclasses, validated on creation.

They reach the trainer through a queue.Queue (same process) or through run.db's
`commands` table (another process). Nothing is ever eval'd or unpickled: a row
is a kind name from a fixed table plus JSON fields checked by the dataclass.
Torch-free.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from .config import LR_SCALINGS, ConfigError, check_clip, check_lr


@dataclass(frozen=True)
class Command:
    kind: ClassVar[str] = "command"
    at_epoch_boundary: ClassVar[bool] = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass(frozen=True)
class SetAccum(Command):
    steps: int
    kind: ClassVar[str] = "set_accum"

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 1:
            raise ConfigError(f"accumulation steps must be an integer >= 1, got {self.steps!r}")


@dataclass(frozen=True)
class SetMicroBatch(Command):
    size: int
    kind: ClassVar[str] = "set_micro_batch"

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ConfigError(f"micro-batch must be an integer >= 1, got {self.size!r}")


@dataclass(frozen=True)
class SetClip(Command):
    norm: float
    kind: ClassVar[str] = "set_clip"

    def __post_init__(self) -> None:
        check_clip(self.norm)


@dataclass(frozen=True)
class SetLr(Command):
    lr: float
    kind: ClassVar[str] = "set_lr"

    def __post_init__(self) -> None:
        check_lr(self.lr)


@dataclass(frozen=True)
class SetLrScaling(Command):
    rule: str
    kind: ClassVar[str] = "set_lr_scaling"

    def __post_init__(self) -> None:
        if self.rule not in LR_SCALINGS:
            raise ConfigError(f"lr scaling must be one of {', '.join(LR_SCALINGS)}, got {self.rule!r}")


@dataclass(frozen=True)
class Pause(Command):
    kind: ClassVar[str] = "pause"


@dataclass(frozen=True)
class Resume(Command):
    kind: ClassVar[str] = "resume"


@dataclass(frozen=True)
class Stop(Command):
    kind: ClassVar[str] = "stop"
    at_epoch_boundary: ClassVar[bool] = False


COMMANDS: dict[str, type[Command]] = {
    c.kind: c for c in (SetAccum, SetMicroBatch, SetClip, SetLr, SetLrScaling, Pause, Resume, Stop)
}


def command_from_json(kind: str, payload: str) -> Command:
    """Rebuild a command from a `commands` row. Raises ConfigError for anything unexpected."""
    cls = COMMANDS.get(kind)
    if cls is None:
        raise ConfigError(f"unknown command {kind!r}")
    try:
        fields = json.loads(payload or "{}")
    except (TypeError, ValueError) as e:
        raise ConfigError(f"command {kind}: payload is not JSON ({e})") from None
    if not isinstance(fields, dict):
        raise ConfigError(f"command {kind}: payload must be an object")
    try:
        return cls(**fields)
    except TypeError as e:
        raise ConfigError(f"command {kind}: {e}") from None
