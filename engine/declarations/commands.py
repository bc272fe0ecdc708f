"""Commands into a running engine: frozen dataclasses, validated on creation.

They reach the trainer through a queue.Queue (same process) or through run.db's
`commands` table (another process). Nothing is ever eval'd or unpickled: a row
is a kind name from a fixed table plus JSON fields checked by the dataclass.
Torch-free.
"""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar

from . import limits
from .config import LR_SCALINGS, ConfigError, check_clip, check_lr, check_range


@dataclass(frozen=True)
class Command:
    kind: ClassVar[str] = "command"
    at_epoch_boundary: ClassVar[bool] = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))


APPLY_AT = ("epoch", "step")


@dataclass(frozen=True)
class SettingCommand(Command):
    """A change of a live setting. `at`: "epoch" (the next epoch boundary, the default) or
    "step" (the next optimizer-step boundary); either way no window is split between two
    settings. Through run.db it is a payload field: {"steps": 4, "at": "step"}."""
    at: str = field(default="epoch", kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.at, str) or self.at not in APPLY_AT:
            raise ConfigError(f"{self.kind} at must be one of {', '.join(APPLY_AT)}, got {limits.quote(self.at)}")
        self.check()

    def check(self) -> None:
        """The value's own range (each setting)."""


@dataclass(frozen=True)
class SetAccum(SettingCommand):
    steps: int
    kind: ClassVar[str] = "set_accum"

    def check(self) -> None:
        check_range("accum", self.steps, "set_accum steps")


@dataclass(frozen=True)
class SetMicroBatch(SettingCommand):
    size: int
    kind: ClassVar[str] = "set_micro_batch"

    def check(self) -> None:
        check_range("micro_batch", self.size, "set_micro_batch size")


@dataclass(frozen=True)
class SetClip(SettingCommand):
    norm: float
    kind: ClassVar[str] = "set_clip"

    def check(self) -> None:
        check_clip(self.norm, "set_clip norm")


@dataclass(frozen=True)
class SetLr(SettingCommand):
    lr: float
    kind: ClassVar[str] = "set_lr"

    def check(self) -> None:
        check_lr(self.lr, "set_lr lr")


@dataclass(frozen=True)
class SetLrScaling(SettingCommand):
    rule: str
    kind: ClassVar[str] = "set_lr_scaling"

    def check(self) -> None:
        if not isinstance(self.rule, str) or self.rule not in LR_SCALINGS:
            raise ConfigError(f"set_lr_scaling rule must be one of {', '.join(LR_SCALINGS)}, "
                              f"got {limits.quote(self.rule)}")


@dataclass(frozen=True)
class SetCheckpointing(SettingCommand):
    """Activation checkpointing on or off (the task's switch, or a Hugging Face model's own)."""
    on: bool
    kind: ClassVar[str] = "set_checkpointing"

    def check(self) -> None:
        if not isinstance(self.on, bool):
            raise ConfigError(f"set_checkpointing on must be true or false, got {limits.quote(self.on)}")


@dataclass(frozen=True)
class SetPrecision(SettingCommand):
    """Not a live setting: autocast, the GradScaler and the memory model change with it, so
    the engine refuses it with this reason (the levers table still names the cell)."""
    precision: str
    kind: ClassVar[str] = "set_precision"
    refusal: ClassVar[str] = ("precision changes when the run restarts: stop it, then continue with "
                              "--resume DIR --precision P")

    def check(self) -> None:
        from .config import PRECISIONS
        if not isinstance(self.precision, str) or self.precision not in PRECISIONS:
            raise ConfigError(f"set_precision precision must be one of {', '.join(PRECISIONS)}, "
                              f"got {limits.quote(self.precision)}")


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
    c.kind: c for c in (SetAccum, SetMicroBatch, SetClip, SetLr, SetLrScaling, SetCheckpointing, SetPrecision,
                        Pause, Resume, Stop)
}


def command_from_json(kind: Any, payload: Any) -> Command:
    """Rebuild a command from a `commands` row: input from another program, so it is
    checked before it is parsed. The payload is bounded in size (limits.MAX_COMMAND_BYTES)
    and in nesting (limits.MAX_COMMAND_DEPTH, counted without recursion, so no payload can
    raise RecursionError), its fields must be exactly the command's, and the values go
    through the same ranges as the flags. Raises ConfigError (one line, quoting at most a
    short prefix of what was given) for anything else; never another exception."""
    if isinstance(kind, (bytes, bytearray)):
        kind = bytes(kind).decode("utf-8", "replace")
    cls = COMMANDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigError(f"unknown command {limits.quote(kind)}")
    if payload is None:
        payload = "{}"
    if isinstance(payload, (bytes, bytearray)):
        if len(payload) > limits.MAX_COMMAND_BYTES:
            raise ConfigError(f"command {kind}: payload is {len(payload)} bytes "
                              f"(at most {limits.MAX_COMMAND_BYTES})")
        try:
            payload = bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"command {kind}: payload is not UTF-8 text") from None
    if not isinstance(payload, str):
        raise ConfigError(f"command {kind}: payload must be a JSON object, got {limits.quote(payload)}")
    # len() in characters first: a huge string is refused without encoding it.
    size = len(payload) if len(payload) > limits.MAX_COMMAND_BYTES else len(payload.encode("utf-8", "replace"))
    if size > limits.MAX_COMMAND_BYTES:
        raise ConfigError(f"command {kind}: payload is {size} bytes (at most {limits.MAX_COMMAND_BYTES})")
    if limits.json_depth_exceeds(payload):
        raise ConfigError(f"command {kind}: payload nests deeper than {limits.MAX_COMMAND_DEPTH} levels")
    try:
        data = json.loads(payload or "{}")
    except (ValueError, RecursionError) as e:  # RecursionError: cannot happen after the depth check
        raise ConfigError(f"command {kind}: payload is not JSON ({limits.one_line(e, 80)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"command {kind}: payload must be a JSON object, got {limits.quote(data)}")
    names = [f.name for f in fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ConfigError(f"command {kind}: unknown field {limits.quote(unknown[0])} "
                          f"(fields: {', '.join(names) or 'none'})")
    missing = [f.name for f in fields(cls)
               if f.name not in data and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ConfigError(f"command {kind}: missing field {missing[0]}")
    try:
        return cls(**data)
    except ConfigError:
        raise
    except Exception as e:  # a check that did not expect this type
        raise ConfigError(f"command {kind}: {limits.one_line(e, 120)}") from None
