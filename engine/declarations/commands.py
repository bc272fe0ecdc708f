"""Commands into a running engine: frozen dataclasses, validated on creation.

They reach the trainer through a queue.Queue (same process) or through run.db's
`commands` table (another process). Nothing is ever eval'd or unpickled: a row
is a kind name from a fixed table plus JSON fields checked by the dataclass.
Torch-free.
"""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields, make_dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from . import limits
from .config import ConfigError, check_value
from .settings import BY_NAME as SETTINGS_BY_NAME
from .settings import LIVE_SETTINGS, Setting

SENDER_CHARS = 40  # the longest name of who sent a command


@dataclass(frozen=True)
class Command:
    """`sent_by`: who sent it when not the window or a person at headroom-ctl ("agent": an MCP
    client through headroom-ctl mcp); the row, the command_received event and the answers keep it."""
    sent_by: str = field(default="", kw_only=True)
    kind: ClassVar[str] = "command"
    at_epoch_boundary: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not isinstance(self.sent_by, str) or len(self.sent_by) > SENDER_CHARS:
            raise ConfigError(f"{self.kind} sent_by must be text of at most {SENDER_CHARS} characters, "
                              f"got {limits.quote(self.sent_by)}")

    def to_json(self) -> str:
        data = asdict(self)
        if not self.sent_by:  # a row an older engine still reads
            del data["sent_by"]
        return json.dumps(data)


APPLY_AT = ("epoch", "step")


@dataclass(frozen=True)
class SettingCommand(Command):
    """A change of a live setting. `at`: "epoch" (the next epoch boundary, the default) or
    "step" (the next optimizer-step boundary); either way no window is split between two
    settings. Its one other field is named like the setting (SetAccum(accum=4)); through
    run.db it is a payload field: {"accum": 4, "at": "step"}."""
    at: str = field(default="epoch", kw_only=True)
    setting: ClassVar[str] = ""  # the live setting it changes ("" for a command that is refused)

    if TYPE_CHECKING:  # each set_<name> class is made from its declaration (below): its one field, then `at`
        def __init__(self, *value: Any, at: str = "epoch", **field_value: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...  # that field (cmd.lr, cmd.accum, ...)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.at, str) or self.at not in APPLY_AT:
            raise ConfigError(f"{self.kind} at must be one of {', '.join(APPLY_AT)}, got {limits.quote(self.at)}")
        self.check()

    @property
    def value(self) -> Any:
        return getattr(self, self.setting)

    def check(self) -> None:
        """The value against the setting's range or choices (engine/declarations/config.check_value)."""
        check_value(self.setting, self.value, f"{self.kind} {self.setting}")


# The setting commands' fields as older versions named them (SetAccum(steps=...) read as optimizer
# steps): command_from_json reads rows that use them, and each command still answers to its
# old name as a read-only attribute (cmd.steps is cmd.accum), for loops written against it.
OLD_FIELDS: dict[str, dict[str, str]] = {
    "set_accum": {"steps": "accum"}, "set_micro_batch": {"size": "micro_batch"}, "set_clip": {"norm": "clip"},
    "set_lr_scaling": {"rule": "lr_scaling"}, "set_checkpointing": {"on": "checkpointing"},
}


def _old_name(new: str) -> property:
    return property(lambda self: getattr(self, new), doc=f"The old name of `{new}`.")


def _setting_command(s: Setting) -> type[SettingCommand]:
    """set_<name>: a SettingCommand whose one field is the setting, typed as its TrainConfig field."""
    class_name = "Set" + "".join(part.capitalize() for part in s.name.split("_"))
    kind = f"set_{s.name}"
    namespace: dict[str, Any] = {"kind": kind, "setting": s.name,
                                 "__doc__": f"Set {s.label or s.words} ({s.option}) while the run trains."}
    namespace.update({old: _old_name(new) for old, new in OLD_FIELDS.get(kind, {}).items()})
    cls = make_dataclass(class_name, [(s.name, s.type)], bases=(SettingCommand,), frozen=True, namespace=namespace)
    cls.__module__ = __name__
    return cls


# One command per live setting (engine/declarations/settings.py LIVE_SETTINGS), by setting name.
SETTING_COMMANDS: dict[str, type[SettingCommand]] = {s.name: _setting_command(s) for s in LIVE_SETTINGS}
SetMicroBatch = SETTING_COMMANDS["micro_batch"]
SetAccum = SETTING_COMMANDS["accum"]
SetLr = SETTING_COMMANDS["lr"]
SetClip = SETTING_COMMANDS["clip"]
SetLrScaling = SETTING_COMMANDS["lr_scaling"]
SetCheckpointing = SETTING_COMMANDS["checkpointing"]  # activation checkpointing on or off


@dataclass(frozen=True)
class SetPrecision(SettingCommand):
    """Not a live setting: autocast, the GradScaler and the memory model change with it, so
    the engine refuses it with this reason (the levers table still names the cell)."""
    precision: str
    kind: ClassVar[str] = "set_precision"
    refusal: ClassVar[str] = ("precision changes when the run restarts: stop it, then continue with "
                              "--resume DIR --precision P")

    def check(self) -> None:
        check_value("precision", self.precision, "set_precision precision")


@dataclass(frozen=True)
class Pause(Command):
    kind: ClassVar[str] = "pause"


@dataclass(frozen=True)
class Unpause(Command):
    """Go on after a pause. (Not --resume DIR, which continues a stopped run from its folder.)"""
    kind: ClassVar[str] = "unpause"


Resume = Unpause  # the old name (kind "resume" rows are read as unpause too)


@dataclass(frozen=True)
class Stop(Command):
    kind: ClassVar[str] = "stop"
    at_epoch_boundary: ClassVar[bool] = False


_ALL_COMMANDS: tuple[type[Command], ...] = (*SETTING_COMMANDS.values(), SetPrecision, Pause, Unpause, Stop)
COMMANDS: dict[str, type[Command]] = {c.kind: c for c in _ALL_COMMANDS}
# Command kinds older versions wrote, and what they are called now (command_from_json reads them).
OLD_KINDS: dict[str, str] = {"resume": "unpause"}


def command_for(name: str, value: Any, at: str = "epoch") -> SettingCommand:
    """The command that sets live setting `name` to `value` (ConfigError if out of range)."""
    return SETTING_COMMANDS[name](value, at=at)


def setting_change(command: Command) -> Optional[tuple[Setting, Any]]:
    """(setting, new value) if `command` changes a live setting, else None."""
    if not isinstance(command, SettingCommand) or not command.setting:
        return None
    return SETTINGS_BY_NAME[command.setting], command.value


def setting_of(kind: Any) -> Optional[Setting]:
    """The live setting a command kind changes (an older kind too); None for pause, stop, an
    unknown kind..."""
    cls = COMMANDS.get(OLD_KINDS.get(kind, kind)) if isinstance(kind, str) else None
    name = getattr(cls, "setting", "")
    return SETTINGS_BY_NAME[name] if name else None


def payload_value(kind: str, payload: dict[str, Any]) -> Any:
    """The value a setting command's payload carries (a command_received event's, say), under
    today's field name or an older one; None if it carries none."""
    cls = COMMANDS.get(OLD_KINDS.get(kind, kind))
    name = getattr(cls, "setting", "")
    if not name:
        return None
    if name in payload:
        return payload[name]
    return next((payload[old] for old in OLD_FIELDS.get(OLD_KINDS.get(kind, kind), {}) if old in payload), None)


def command_from_json(kind: Any, payload: Any) -> Command:
    """Rebuild a command from a `commands` row: input from another program, so it is
    checked before it is parsed. The payload is bounded in size (limits.MAX_COMMAND_BYTES)
    and in nesting (limits.MAX_COMMAND_DEPTH, counted without recursion, so no payload can
    raise RecursionError), its fields must be exactly the command's, and the values go
    through the same ranges as the flags. Raises ConfigError (one line, quoting at most a
    short prefix of what was given) for anything else; never another exception."""
    if isinstance(kind, (bytes, bytearray)):
        kind = bytes(kind).decode("utf-8", "replace")
    cls = COMMANDS.get(OLD_KINDS.get(kind, kind)) if isinstance(kind, str) else None
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
    for old, new in OLD_FIELDS.get(cls.kind, {}).items():  # a row an older version wrote
        if old in data and new not in data:
            data[new] = data.pop(old)
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
