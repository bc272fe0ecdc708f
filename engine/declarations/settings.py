"""Every run setting, declared once: what the user sets with a flag, in the app's form, or
(for the live ones) with a command while the run trains.

A `Setting` says what only it can say: the flag, the help line, the --help option group, the
app's label, whether it is live and whether every metrics row records it. Each other fact
has one home and is read from there, never written again:

- the default and the type: the `TrainConfig` field of the same name (engine/declarations/config.py);
- the range: `limits.RANGES[name]`; the words it may take: `config.CHOICES[name]`;
- the metrics column of a per-step setting: the `StepMetrics` field of the same name (events.py).

From these come the command-line flags (engine/cli.py: name, reader, default in the help
line, option group, old spellings), the app's form fields and labels, the live settings
(`LiveSettings`, built here from the live declarations) and their commands (`set_<name>`,
whose one field is named like the setting: engine/declarations/commands.py). Adding a
setting is one entry in SETTINGS next to its TrainConfig field and range; tests/engine/
test_declarations.py checks that every surface has it. Torch-free: the app imports this at
start-up.
"""
from __future__ import annotations

import math
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, make_dataclass, replace
from typing import Any, Callable, Optional

from . import limits
from .config import CHOICES, ConfigError, TrainConfig, check_value, parse_size, parse_task_arg
from .events import SettingsApplied


# -- reading a flag's text -----------------------------------------------------------------------
def read_text(text: str) -> str:
    return str(text)


def read_int(text: str) -> int:
    """A whole number. The range is validate()'s; this only reads it, quoting at most a prefix."""
    try:
        if len(text) > 100:  # no run needs a 100-digit number; int() of 5000 digits raises
            raise ValueError
        return int(text)
    except ValueError:
        raise ConfigError(f"not an integer: {limits.quote(text)}") from None


def read_float(text: str) -> float:
    try:
        v = float(text) if len(text) <= 100 else math.nan
    except ValueError:
        raise ConfigError(f"not a number: {limits.quote(text)}") from None
    if not math.isfinite(v):
        raise ConfigError(f"not a finite number: {limits.quote(text)}")
    return v


def read_on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise ConfigError(f"expected on or off, got {limits.quote(text)}")
    return text == "on"


def read_workers(text: str) -> Optional[int]:
    return None if str(text).strip().lower() == "auto" else read_int(text)


def read_task_arg(text: str) -> tuple[str, Any]:
    try:
        return parse_task_arg(text)
    except ConfigError as e:  # the flag is named by whoever reads it
        raise ConfigError(str(e).removeprefix("--task-arg: ").removeprefix("--task-arg ")) from None


_READERS: dict[type, Callable[[str], Any]] = {int: read_int, float: read_float, bool: read_on_off, str: read_text}
_HINTS = typing.get_type_hints(TrainConfig)
_FIELDS = {f.name: f for f in fields(TrainConfig)}


def _value_type(name: str) -> type:
    """The TrainConfig field's type, Optional[...] unwrapped."""
    hint = _HINTS[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else typing.get_origin(hint) or hint


# -- the declaration ---------------------------------------------------------------------------
GROUPS = ("Task and data", "Batch and accumulation", "Optimizer and schedule", "Precision and device", "Memory",
          "Several GPUs (torchrun)", "Checkpoints and forks", "Non-finite steps", "Output")
# The settings of this group are chosen in the app's "Run on N GPUs" dialog, not in its form.
LAUNCH_GROUP = "Several GPUs (torchrun)"


@dataclass(frozen=True)
class Setting:
    name: str  # the TrainConfig field (and LiveSettings field, checkpoint key, metrics column, command field)
    group: str  # its option group in --help (GROUPS)
    help: str  # one line for --help and the app's tooltip; "(default X)" is added from TrainConfig
    label: str = ""  # the app's label (its form; LAUNCH_GROUP: its Run on N GPUs dialog); "" = a flag only
    live: bool = False  # changes while a run trains: a LiveSettings field and a set_<name> command
    per_step: bool = False  # every metrics row records the value its step used (a StepMetrics field)
    short: str = ""  # how alerts, plot markers and hints name it ("accum 4->8"); "" = the name, spaced
    flag: str = ""  # "" = --name-with-dashes
    old_flags: tuple[str, ...] = ()  # earlier spellings of the flag, still read (listed as such in --help)
    read: Optional[Callable[[str], Any]] = None  # the flag's text -> the value; None = by the field's type
    metavar: Optional[str] = None
    none_means: str = ""  # what the default None does, for --help ("auto", "off")
    switch: bool = False  # a flag without a value (it turns the setting on)
    repeat: bool = False  # given once per value; the values are collected

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def type(self) -> type:
        return _value_type(self.name)

    @property
    def default(self) -> Any:
        f = _FIELDS[self.name]
        return f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]

    @property
    def choices(self) -> tuple[str, ...]:
        return CHOICES.get(self.name, ())

    @property
    def range(self) -> Optional[limits.Range]:
        return limits.RANGES.get(self.name)

    @property
    def reader(self) -> Callable[[str], Any]:
        return self.read or _READERS.get(self.type, read_text)

    @property
    def words(self) -> str:
        """How a sentence names it."""
        return self.short or self.name.replace("_", " ")

    def default_text(self) -> str:
        """The default as the flag would be written ("" when there is nothing to say)."""
        v = self.default
        if self.switch or v in ({}, ()):
            return ""
        if v is None:
            return self.none_means
        if isinstance(v, bool):
            return "on" if v else "off"
        return f"{v:g}" if isinstance(v, float) else str(v)

    def help_text(self) -> str:
        shown = self.default_text()
        return f"{self.help} (default {shown})" if shown else self.help

    def check(self, value: Any, who: Optional[str] = None) -> Any:
        """The value if this setting may hold it, else ConfigError (one line)."""
        return check_value(self.name, value, who or self.option)


SETTINGS: tuple[Setting, ...] = (
    # Task and data
    Setting("task", "Task and data", "built-in name (mlp, charlm, cnn-bn), path/to/file.py or module:attr",
            label="Task", metavar="NAME|FILE|MODULE:ATTR"),
    Setting("task_args", "Task and data", "passed to build_task(seed, KEY=VALUE, ...); VALUE is read as JSON where "
            "it parses (repeatable)", label="Task args", flag="--task-arg", read=read_task_arg, metavar="KEY=VALUE",
            repeat=True),
    Setting("epochs", "Task and data", "passes over the training data", label="Epochs", metavar="E"),
    Setting("max_steps", "Task and data", "stop after N optimizer steps", metavar="N", none_means="no limit"),
    Setting("seed", "Task and data", "seeds the model, the sample order and the data workers", metavar="S"),
    Setting("workers", "Task and data", "DataLoader worker processes (auto: 0 for data in memory, up to 4 for slow "
            "loading)", label="Workers", read=read_workers, metavar="N|auto", none_means="auto"),
    # Batch and accumulation (live ones first: the order a batch of changes is applied in)
    Setting("micro_batch", "Batch and accumulation", "samples per forward/backward", label="Micro-batch", live=True,
            per_step=True, short="micro-batch", metavar="B"),
    Setting("accum", "Batch and accumulation", "micro-batches per optimizer step (one accumulation window)",
            label="Accumulation", live=True, per_step=True, metavar="K"),
    Setting("token_budget", "Batch and accumulation", "close a window once it holds N counted items (tokens)",
            label="Token budget", metavar="N", none_means="off"),
    Setting("micro_tokens", "Batch and accumulation", "under --token-budget: close a micro-batch before it would "
            "exceed N counted items", label="Micro-tokens", metavar="N", none_means="off"),
    Setting("find_micro_batch", "Batch and accumulation", "before training, probe the largest micro-batch that fits "
            "in memory and set accumulation to keep --effective-batch", label="Find micro-batch", switch=True),
    Setting("effective_batch", "Batch and accumulation", "samples per optimizer step that --find-micro-batch keeps "
            "(micro-batch x accumulation)", metavar="N"),
    Setting("memory_margin", "Batch and accumulation", "with --find-micro-batch: the fraction of the card's memory "
            "left free", metavar="F"),
    # Optimizer and schedule
    Setting("lr", "Optimizer and schedule", "learning rate (the schedule's peak)", label="Learning rate", live=True,
            per_step=True, metavar="LR"),
    Setting("clip", "Optimizer and schedule", "clip the total gradient norm at C, 0 = off", label="Clip norm",
            live=True, per_step=True, metavar="C"),
    Setting("lr_scaling", "Optimizer and schedule", "how lr follows the effective batch when micro-batch or "
            "accumulation changes without a new lr", label="lr scaling", live=True, short="lr scaling"),
    Setting("optimizer", "Optimizer and schedule", "the optimizer, unless the task brings its own"),
    Setting("reference_batch", "Optimizer and schedule", "the effective batch --lr was tuned for: with --lr-scaling "
            "the lr is scaled to the run's", metavar="B"),
    Setting("lr_schedule", "Optimizer and schedule", "lr over samples seen: constant, or linear or cosine decay to "
            "--min-lr-ratio x lr", label="Schedule"),
    Setting("warmup_samples", "Optimizer and schedule", "linear warmup from 0 to the peak over the first N samples",
            label="Warmup samples", metavar="N"),
    Setting("warmup_fraction", "Optimizer and schedule", "linear warmup over the first F of the run's samples "
            "(0.05 = 5%)", label="Warmup fraction", metavar="F"),
    Setting("min_lr_ratio", "Optimizer and schedule", "where linear and cosine decay end, as a fraction of the peak",
            label="Min lr ratio", metavar="R"),
    # Precision and device
    Setting("precision", "Precision and device", "autocast precision (fp16 with a GradScaler)", label="Precision"),
    Setting("device", "Precision and device", "auto, cpu, cuda or cuda:N (auto picks CUDA when present)",
            label="Device", metavar="DEVICE"),
    # Memory
    Setting("checkpointing", "Memory", "activation checkpointing: recompute activations in the backward pass (the "
            "task's switch or a Hugging Face model's own)", label="Activation checkpointing", live=True,
            flag="--activation-checkpointing", old_flags=("--checkpointing",), metavar="on|off"),
    Setting("oom_recovery", "Memory", "on an out-of-memory error, halve the micro-batch, double accumulation and "
            "redo the window", metavar="on|off"),
    Setting("vram_limit", "Memory", "simulate a smaller card, e.g. 24GiB", read=parse_size, metavar="SIZE",
            none_means="the whole card"),
    Setting("memory_snapshot", "Memory", "on-oom: record allocator history and write RUN_DIR/memory/oom-step-S.pickle "
            "at every out-of-memory error (open it at pytorch.org/memory_viz)"),
    # Several GPUs (torchrun)
    Setting("strategy", "Several GPUs (torchrun)", "under torchrun: ddp (a replica per rank, PyTorch's "
            "DistributedDataParallel) or fsdp (parameters, gradients and optimizer state sharded over the ranks, "
            "FSDP2)", label="Strategy"),
    Setting("fsdp_reduce", "Several GPUs (torchrun)", "fsdp: reduce-scatter the gradients once a window, in its "
            "last micro-batch (parameters and gradients stay whole during the window), or in every micro-batch "
            "(less memory, more traffic)", label="FSDP gradient reduction"),
    Setting("cpu_offload", "Several GPUs (torchrun)", "fsdp on CUDA: keep the parameter shards and the optimizer "
            "step on the CPU", label="CPU offload", metavar="on|off"),
    # Checkpoints and forks
    Setting("resume", "Checkpoints and forks", "continue the run in DIR from its last checkpoint", metavar="DIR"),
    Setting("fork", "Checkpoints and forks", "a new run from DIR's checkpoint (last, epoch-N or step-S; default last) "
            "with any setting flag given here changed", metavar="DIR[@CHECKPOINT]"),
    Setting("checkpoint_every", "Checkpoints and forks", "also write checkpoints/step-S.pt every N optimizer steps",
            metavar="N", none_means="off"),
    Setting("keep_checkpoints", "Checkpoints and forks", "step checkpoints kept (epoch checkpoints are all kept)",
            metavar="K"),
    # Non-finite steps
    Setting("nonfinite", "Non-finite steps", "a non-finite window: skip it, stop, or roll back to the newest good "
            "checkpoint when skips repeat"),
    Setting("spike_factor", "Non-finite steps", "with --nonfinite rollback: a window loss above F x the loss EMA "
            "rolls back too", metavar="F", none_means="off"),
    Setting("rollback_lr_factor", "Non-finite steps", "a rollback multiplies the lr peak by F", metavar="F"),
    # Output
    Setting("run_dir", "Output", "folder for run.db and checkpoints", metavar="DIR",
            none_means="a new folder under $HEADROOM_RUNS"),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
# The live settings, in the order a batch of changes is applied (micro-batch and accumulation
# before lr, so lr scaling sees the new batch).
LIVE_SETTINGS: tuple[Setting, ...] = tuple(s for s in SETTINGS if s.live)
LIVE_NAMES: tuple[str, ...] = tuple(s.name for s in LIVE_SETTINGS)
# The flag's old spellings: --warmup W is one of two settings by its value (config.split_warmup).
OLD_WARMUP_FLAG = "--warmup"


# -- the live settings' values ----------------------------------------------------------------
class _LiveSettingsMethods:
    """What LiveSettings does; its fields are the live declarations (below)."""
    micro_batch: int
    accum: int

    @property
    def window_samples(self) -> int:  # per rank, for fixed windows
        return self.micro_batch * self.accum

    def with_(self, **changes: Any) -> Any:
        return replace(self, **changes)  # type: ignore[type-var]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_config(cls, config: Any) -> Any:
        return cls(**{name: getattr(config, name) for name in LIVE_NAMES})

    def updated(self, saved: Optional[dict[str, Any]]) -> Any:
        """These settings with the values a checkpoint saved (unknown keys ignored)."""
        known = {f.name for f in fields(self)}  # type: ignore[arg-type]
        return replace(self, **{k: v for k, v in (saved or {}).items() if k in known})  # type: ignore[type-var]


# Frozen: a change makes a new object, so the settings a window was trained with can never
# change under it. Fields: the live settings in order, typed and defaulted as TrainConfig's.
LiveSettings = make_dataclass(
    "LiveSettings", [(s.name, s.type, field(default=s.default)) for s in LIVE_SETTINGS],
    bases=(_LiveSettingsMethods,), frozen=True,
    namespace={"__doc__": "The values of the live settings (engine/declarations/settings.py LIVE_SETTINGS)."})
LiveSettings.__module__ = __name__


# -- the lr scaling rule ------------------------------------------------------------------------
def scale_lr(lr: float, rule: str, ratio: float) -> float:
    """The lr for an effective batch `ratio` times the one `lr` was set for: linear (x ratio),
    sqrt (x sqrt(ratio)) or none (unchanged). The one place the rule is written: a batch
    change mid-run (engine/control/rules.py) and --reference-batch at the start both use it."""
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    return lr


def scaled_to_reference(settings: Any, config: Any, world: int, emit: Any, step: int) -> Any:
    """--reference-batch B with --lr-scaling linear|sqrt: the given lr was tuned for an
    effective batch of B; scale it to this run's (micro-batch x accum x world, after the
    finder chose them). Says so with a settings_applied event."""
    ref = getattr(config, "reference_batch", None)
    if not ref or settings.lr_scaling == "none":
        return settings
    lr = scale_lr(settings.lr, settings.lr_scaling, settings.window_samples * world / ref)
    if lr == settings.lr:
        return settings
    emit(SettingsApplied(step, 1, changes=(("lr", settings.lr, lr),), at="start", from_step=step + 1))
    return settings.with_(lr=lr)
