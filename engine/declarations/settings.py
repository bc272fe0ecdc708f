"""The live settings, declared once: what the user may change while a run trains.

Each setting has one declaration here: its name (the `LiveSettings` field, the
checkpoint key, the `TrainConfig` field and the name in `settings_applied`), the
command that changes it and that command's payload field, its type, the label the
app shows and the command-line flag. Everything else (the command table, the
checkpoint's `settings`, resume's "flags given again", the app's fields) is derived
from `LIVE_SETTINGS`. Torch-free: the app imports this at start-up.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional

from .commands import Command, SetAccum, SetCheckpointing, SetClip, SetLr, SetLrScaling, SetMicroBatch


@dataclass(frozen=True)
class LiveSetting:
    name: str  # LiveSettings field, TrainConfig field, checkpoint key
    command: type[Command]  # the command that changes it
    payload: str  # that command's one field
    type: type
    label: str  # what the app's form calls it
    flag: str  # the command-line flag
    short: str = ""  # how alerts, plot markers and hints name it ("accum 4->8")

    def command_for(self, value: Any) -> Command:
        return self.command(**{self.payload: value})


# Order matters: micro-batch and accumulation come before lr, so lr scaling sees the new batch.
LIVE_SETTINGS: tuple[LiveSetting, ...] = (
    LiveSetting("micro_batch", SetMicroBatch, "size", int, "Micro-batch", "--micro-batch", "micro-batch"),
    LiveSetting("accum", SetAccum, "steps", int, "Accumulation", "--accum", "accum"),
    LiveSetting("lr", SetLr, "lr", float, "Learning rate", "--lr", "lr"),
    LiveSetting("clip", SetClip, "norm", float, "Clip norm", "--clip", "clip"),
    LiveSetting("lr_scaling", SetLrScaling, "rule", str, "lr scaling", "--lr-scaling", "lr scaling"),
    LiveSetting("checkpointing", SetCheckpointing, "on", bool, "Activation checkpointing", "--checkpointing",
                "checkpointing"),
)

BY_NAME: dict[str, LiveSetting] = {s.name: s for s in LIVE_SETTINGS}
BY_COMMAND: dict[str, LiveSetting] = {s.command.kind: s for s in LIVE_SETTINGS}


@dataclass(frozen=True)
class LiveSettings:
    """The values of the live settings. Frozen: a change makes a new object, so the
    settings a window was trained with can never change under it."""
    micro_batch: int
    accum: int
    lr: float
    clip: float
    lr_scaling: str
    checkpointing: bool = False

    @property
    def window_samples(self) -> int:  # per rank, for fixed windows
        return self.micro_batch * self.accum

    def with_(self, **changes: Any) -> "LiveSettings":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_config(cls, config: Any) -> "LiveSettings":
        return cls(**{s.name: getattr(config, s.name) for s in LIVE_SETTINGS})

    def updated(self, saved: Optional[dict[str, Any]]) -> "LiveSettings":
        """These settings with the values a checkpoint saved (unknown keys ignored)."""
        known = {f.name for f in fields(self)}
        return replace(self, **{k: v for k, v in (saved or {}).items() if k in known})


def setting_change(command: Command) -> Optional[tuple[LiveSetting, Any]]:
    """(setting, new value) if `command` changes a live setting, else None."""
    setting = BY_COMMAND.get(command.kind)
    if setting is None:
        return None
    return setting, getattr(command, setting.payload)


def scaled_to_reference(settings: LiveSettings, config: Any, world: int, emit: Any, step: int) -> LiveSettings:
    """--reference-batch B with --lr-scaling linear|sqrt: the given lr was tuned for an
    effective batch of B; scale it to this run's (micro-batch x accum x world, after the
    finder chose them). Says so with a settings_applied event."""
    import math
    from .events import SettingsApplied
    ref = getattr(config, "reference_batch", None)
    if not ref or settings.lr_scaling == "none":
        return settings
    ratio = settings.window_samples * world / ref
    lr = settings.lr * (ratio if settings.lr_scaling == "linear" else math.sqrt(ratio))
    if lr == settings.lr:
        return settings
    emit(SettingsApplied(step, 1, changes=(("lr", settings.lr, lr),), at="start", from_step=step + 1))
    return settings.with_(lr=lr)
