"""How a TrainConfig field declares itself a setting: `setting(...)` is the one place.

    accum: int = setting(4, BATCH, "micro-batches per optimizer step (one accumulation window)",
                         label="Accumulation", live=True, per_step=True, metavar="K", low=1, high=2**20)

The field's name, type and default are the dataclass's; everything else a setting is
known by rides in the field's metadata (`Declared`): the flag and its help line, the
--help option group, the app's label, whether it is live (a command and a LiveSettings
field) and per-step (a metrics column), its range or its words. From that one entry come
the command-line flag (engine/cli.py), the app's field and label, the validation of flags,
fields, commands and checkpoints (config.RANGES, config.CHOICES), the live settings and
their commands (settings.py, commands.py) and the metrics column (events.StepMetrics).
This is Hugging Face's HfArgumentParser idiom (`field(metadata={"help": ...})`), carried
through to the app and the store.

Torch-free: the app imports this at start-up.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, Optional, Union

Number = Union[int, float]

# The --help option groups, in order (and the sections of the app's form).
TASK, BATCH, OPTIMIZER = "Task and data", "Batch and accumulation", "Optimizer and schedule"
PRECISION, MEMORY, GPUS = "Precision and device", "Memory", "Several GPUs (torchrun)"
CHECKPOINTS, NONFINITE, OUTPUT = "Checkpoints and forks", "Non-finite steps", "Output"
GROUPS = (TASK, BATCH, OPTIMIZER, PRECISION, MEMORY, GPUS, CHECKPOINTS, NONFINITE, OUTPUT)
# The settings of this group are chosen in the app's "Run on N GPUs" dialog, not in its form.
LAUNCH_GROUP = GPUS

SETTING, BOUNDS = "headroom_setting", "headroom_bounds"  # the metadata keys


@dataclass(frozen=True)
class Bounds:
    """What a number may hold: [low, high] (or [low, high)). limits.Range with the field's
    name and type added (config.RANGES)."""
    low: Number
    high: Number
    high_open: bool = False
    unit: str = ""  # "bytes": bounds are shown as sizes
    note: str = ""  # said after the flag in a refusal ("0 = off")


@dataclass(frozen=True)
class Declared:
    """What a setting says beyond its field's name, type and default."""
    group: str  # its option group in --help (GROUPS)
    help: str  # one line for --help and the app's tooltip; "(default X)" is added from the field
    label: str = ""  # the app's label (its form; LAUNCH_GROUP: its Run on N GPUs dialog); "" = a flag only
    live: bool = False  # changes while a run trains: a LiveSettings field and a set_<name> command
    per_step: bool = False  # every metrics row records the value its step used (a StepMetrics column)
    short: str = ""  # how alerts, plot markers and hints name it ("accum 4->8"); "" = the name, spaced
    flag: str = ""  # "" = --name-with-dashes
    old_flags: tuple[str, ...] = ()  # earlier spellings of the flag, still read (listed as such in --help)
    read: Optional[Callable[[str], Any]] = None  # the flag's text -> the value; None = by the field's type
    metavar: Optional[str] = None
    none_means: str = ""  # what the default None does, for --help ("auto", "off")
    switch: bool = False  # a flag without a value (it turns the setting on)
    repeat: bool = False  # given once per value; the values are collected
    choices: tuple[str, ...] = ()  # the words it may take (the flag's choices, the app's list)


def setting(default: Any, group: str, help: str, *, low: Optional[Number] = None, high: Optional[Number] = None,
            high_open: bool = False, unit: str = "", note: str = "", **declared: Any) -> Any:
    """A TrainConfig field that is a setting (see the module doc). `low`/`high` bound a number;
    the other keywords are `Declared`'s. A dict default is a fresh dict per config."""
    if declared.get("per_step") and not declared.get("live"):  # its column is filled from the live settings
        raise TypeError("setting(per_step=True) needs live=True: a metrics column records a live setting")
    meta: dict[str, Any] = {SETTING: Declared(group, help, **declared)}
    if low is not None or high is not None:
        meta[BOUNDS] = Bounds(low, high, high_open, unit, note)  # type: ignore[arg-type]  # one bound may be None: no limit on that side
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


def bounded(default: Any, *, low: Number, high: Number, high_open: bool = False, unit: str = "",
            note: str = "") -> Any:
    """A TrainConfig field with a range that is not a flag (set in code or a saved config)."""
    return field(default=default, metadata={BOUNDS: Bounds(low, high, high_open, unit, note)})


def default_of(f: Any) -> Any:
    """A dataclass field's default (a fresh one from its factory)."""
    return f.default_factory() if f.default is MISSING else f.default
