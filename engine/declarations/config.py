"""Run configuration: one frozen dataclass whose fields declare every setting, validated in one place.

Each field a user sets is declared with `setting(...)` (engine/declarations/_declare.py): its
name, type and default, and in the same call its flag, help line, option group, the app's
label, whether it is live and recorded every step, and its range or its words. Adding a
setting is adding a field here; settings.py, cli.py, commands.py, events.StepMetrics and the
app read it from here (tests/engine/test_declarations.py checks every surface has it).

Why the ranges are what they are (the upper bounds are where a number stops meaning a
training run and starts meaning a typo, an overflow, or an attack on the process; all fit
SQLite's 64-bit INTEGER and a float64 exactly):

- micro-batch 1..2**20: samples in one forward/backward. A million samples of even 1 KiB
  each is a GiB of input before activations; nothing trainable holds more at once.
- accum 1..2**20: micro-batches per optimizer step; with the micro-batch bound the window
  is at most 2**40 samples, more than any data set has.
- epochs 1..10**6 and max-steps 1..10**12: a million passes over the data, or a trillion
  optimizer steps (31 years at one per millisecond), are already beyond any real run.
- lr 0..1e4 (finite): SGD on some losses uses lr 20 or 100; above 1e4 the first step moves
  every weight by four orders of magnitude more than the gradient: a typo (1e-4 -> 1e4
  is allowed, 1e39 overflows float32 at once and is not).
- clip 0..1e6 (0 = off): a gradient-norm threshold above a million clips nothing a finite
  fp16/bf16 run can produce that is still worth training.
- vram-limit 1 MiB..1 PiB: below a MiB no CUDA context fits; above a PiB is no card.
- token-budget, micro-tokens, effective-batch, reference-batch 1..2**40: the window bound.
- seed 0..2**63-1: what torch.manual_seed and SQLite's INTEGER both hold.
- memory-margin [0, 1): a fraction of the card kept free.
- warmup-samples 0..2**40 (the window bound) or warmup-fraction 0..1 (at most the whole run).
- checkpoint-every 1..10**9 steps, keep-checkpoints and keep-epoch-checkpoints 1..10**4 (each
  is a full copy; `all` keeps every epoch checkpoint).
- spike-factor 1.01..1e6: F <= 1 would call every step a spike.
- workers 0..64: past 64 a workstation spends more on IPC than it gains.

Torch-free on purpose: the app imports this at start-up, before torch loads.
"""
from __future__ import annotations

import math
import re
import typing
from dataclasses import InitVar, asdict, dataclass, fields, replace
from typing import Any, Optional

from . import limits
from ._declare import (
    BATCH,
    BOUNDS,
    CHECKPOINTS,
    GPUS,
    MEMORY,
    NONFINITE,
    OPTIMIZER,
    OUTPUT,
    PRECISION,
    SETTING,
    TASK,
    bounded,
    default_of,
    setting,
)

# (ConfigError and the parsers are read from here too: re-exported, `name as name`.)
from ._reading import MAX_TASK_ARG_CHARS as MAX_TASK_ARG_CHARS
from ._reading import MAX_TASK_ARGS as MAX_TASK_ARGS
from ._reading import ConfigError as ConfigError
from ._reading import check_task_args as check_task_args
from ._reading import parse_size as parse_size
from ._reading import parse_task_arg as parse_task_arg
from ._reading import read_kept as read_kept
from ._reading import read_task_arg as read_task_arg
from ._reading import read_workers as read_workers

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "sgd")
LR_SCALINGS = ("none", "linear", "sqrt")
NONFINITE_MODES = ("skip", "stop", "rollback")
LR_SCHEDULES = ("constant", "linear", "cosine")
MEMORY_SNAPSHOTS = ("off", "on-oom")
STRATEGIES = ("ddp", "fsdp")  # under torchrun: DistributedDataParallel, or FSDP2 sharding (engine/distributed)
FSDP_REDUCES = ("last", "every")  # fsdp: reduce-scatter the gradients at the window's last micro-batch, or at each
DEFAULT_TASK = "mlp"
# Linear warmup is one of two fields: a number of samples or a fraction of the run's samples.
WARMUP_FIELDS = ("warmup_samples", "warmup_fraction")


@dataclass(frozen=True)
class TrainConfig:
    # Task and data
    task: str = setting(
        DEFAULT_TASK, TASK, "built-in name (mlp, charlm, cnn-bn), path/to/file.py or module:attr",
        label="Task", metavar="NAME|FILE|MODULE:ATTR")
    task_args: dict[str, Any] = setting(
        {}, TASK, "passed to build_task(seed, KEY=VALUE, ...); VALUE is read as JSON where it parses "
        "(repeatable)",
        label="Task args", flag="--task-arg", read=read_task_arg, metavar="KEY=VALUE", repeat=True)
    epochs: int = setting(
        3, TASK, "passes over the training data", label="Epochs", live=True, metavar="E", low=1,
        high=limits.MAX_EPOCHS)
    max_steps: Optional[int] = setting(
        None, TASK, "stop after N optimizer steps",
        label="Max steps", live=True, short="max steps", metavar="N", none_means="no limit", low=1, high=limits.MAX_STEPS)
    seed: int = setting(
        0, TASK, "seeds the model, the sample order and the data workers",
        metavar="S", low=0, high=limits.WHOLE_INT)
    workers: Optional[int] = setting(
        None, TASK, "DataLoader worker processes (auto: 0 for data in memory, up to 4 for slow loading)",
        label="Workers", read=read_workers, metavar="N|auto", none_means="auto", low=0, high=64)

    # Batch and accumulation
    micro_batch: int = setting(
        16, BATCH, "samples per forward/backward",
        label="Micro-batch", live=True, per_step=True, short="micro-batch", metavar="B", low=1, high=2**20)
    accum: int = setting(
        4, BATCH, "micro-batches per optimizer step (one accumulation window)",
        label="Accumulation", live=True, per_step=True, metavar="K", low=1, high=2**20)
    token_budget: Optional[int] = setting(
        None, BATCH, "close a window once it holds N counted items (tokens)",
        label="Token budget", metavar="N", none_means="off", low=1, high=2**40)
    micro_tokens: Optional[int] = setting(
        None, BATCH, "under --token-budget: close a micro-batch before it would exceed N counted items",
        label="Micro-tokens", metavar="N", none_means="off", low=1, high=2**40)
    find_micro_batch: bool = setting(
        False, BATCH, "before training, probe the largest micro-batch that fits in memory and set accumulation to "
        "keep --effective-batch",
        label="Find micro-batch", switch=True)
    effective_batch: Optional[int] = setting(
        None, BATCH, "samples per optimizer step that --find-micro-batch keeps (micro-batch x accumulation)",
        metavar="N", low=1, high=2**40)
    memory_margin: float = setting(
        0.0, BATCH, "with --find-micro-batch: the fraction of the card's memory left free",
        metavar="F", low=0.0, high=1.0, high_open=True)

    # Optimizer and schedule
    lr: float = setting(
        1e-3, OPTIMIZER, "learning rate (the schedule's peak)",
        label="Learning rate", live=True, per_step=True, metavar="LR", low=0.0, high=1e4)
    clip: float = setting(
        1.0, OPTIMIZER, "clip the total gradient norm at C, 0 = off",
        label="Clip norm", live=True, per_step=True, metavar="C", low=0.0, high=1e6, note="0 = off")
    lr_scaling: str = setting(
        "none", OPTIMIZER, "how lr follows the effective batch when micro-batch or accumulation changes without a new "
        "lr",
        label="lr scaling", live=True, short="lr scaling", choices=LR_SCALINGS)
    optimizer: str = setting("adamw", OPTIMIZER, "the optimizer, unless the task brings its own", choices=OPTIMIZERS)
    reference_batch: Optional[int] = setting(
        None, OPTIMIZER, "the effective batch --lr was tuned for: with --lr-scaling the lr is scaled to the run's",
        metavar="B", low=1, high=2**40)
    lr_schedule: str = setting(
        "constant", OPTIMIZER, "lr over samples seen: constant, or linear or cosine decay to --min-lr-ratio x lr",
        label="Schedule", choices=LR_SCHEDULES)
    warmup_samples: int = setting(
        0, OPTIMIZER, "linear warmup from 0 to the peak over the first N samples",
        label="Warmup samples", metavar="N", low=0, high=2**40)
    warmup_fraction: float = setting(
        0.0, OPTIMIZER, "linear warmup over the first F of the run's samples (0.05 = 5%)",
        label="Warmup fraction", metavar="F", low=0.0, high=1.0)
    min_lr_ratio: float = setting(
        0.1, OPTIMIZER, "where linear and cosine decay end, as a fraction of the peak",
        label="Min lr ratio", metavar="R", low=0.0, high=1.0)

    # Precision and device
    precision: str = setting(
        "fp32", PRECISION, "autocast precision (fp16 with a GradScaler)",
        label="Precision", choices=PRECISIONS)
    device: str = setting(
        "auto", PRECISION, "auto, cpu, cuda or cuda:N (auto picks CUDA when present)",
        label="Device", metavar="DEVICE")

    # Memory
    checkpointing: bool = setting(
        False, MEMORY, "activation checkpointing: recompute activations in the backward pass (the task's switch or a "
        "Hugging Face model's own)",
        label="Activation checkpointing", live=True, flag="--activation-checkpointing", old_flags=("--checkpointing",),
        metavar="on|off")
    oom_recovery: bool = setting(
        True, MEMORY, "on an out-of-memory error, halve the micro-batch, double accumulation and redo the window",
        metavar="on|off")
    vram_limit: Optional[int] = setting(
        None, MEMORY, "simulate a smaller card, e.g. 24GiB",
        read=parse_size, metavar="SIZE", none_means="the whole card", low=2**20, high=2**50, unit="bytes")
    memory_snapshot: str = setting(
        "off", MEMORY, "on-oom: record allocator history and write RUN_DIR/memory/oom-step-S.pickle at every "
        "out-of-memory error (open it at pytorch.org/memory_viz)",
        choices=MEMORY_SNAPSHOTS)

    # Several GPUs (torchrun)
    strategy: str = setting(
        "ddp", GPUS, "under torchrun: ddp (a replica per rank, PyTorch's DistributedDataParallel) or fsdp "
        "(parameters, gradients and optimizer state sharded over the ranks, FSDP2)",
        label="Strategy", choices=STRATEGIES)
    fsdp_reduce: str = setting(
        "last", GPUS, "fsdp: reduce-scatter the gradients once a window, in its last micro-batch (parameters and "
        "gradients stay whole during the window), or in every micro-batch (less memory, more traffic)",
        label="FSDP gradient reduction", choices=FSDP_REDUCES)
    cpu_offload: bool = setting(
        False, GPUS, "fsdp on CUDA: keep the parameter shards and the optimizer step on the CPU",
        label="CPU offload", metavar="on|off")

    # Checkpoints and forks
    resume: Optional[str] = setting(
        None, CHECKPOINTS, "continue the run in DIR from its last checkpoint",
        metavar="DIR")
    fork: Optional[str] = setting(
        None, CHECKPOINTS, "a new run from DIR's checkpoint (last, epoch-N or step-S; default last) with any setting "
        "flag given here changed",
        metavar="DIR[@CHECKPOINT]")
    checkpoint_every: Optional[int] = setting(
        None, CHECKPOINTS, "also write checkpoints/step-S.pt every N optimizer steps",
        metavar="N", none_means="off", low=1, high=10**9)
    keep_checkpoints: int = setting(
        3, CHECKPOINTS, "step checkpoints kept (the newest K, and any a fork or a rollback names)",
        metavar="K", low=1, high=10**4)
    # None (`all`) keeps every epoch checkpoint, as runs did before this setting: a run saved
    # without it resumes so (engine/run_config.py).
    keep_epoch_checkpoints: Optional[int] = setting(
        3, CHECKPOINTS, "epoch checkpoints kept: the newest N, besides the best by validation loss and any a "
        "fork or a rollback names (all: every one)",
        label="Epoch checkpoints kept", read=read_kept, metavar="N|all", none_means="all", low=1, high=10**4)

    # Non-finite steps
    nonfinite: str = setting(
        "skip", NONFINITE, "a non-finite window: skip it, stop, or roll back to the newest good checkpoint when skips "
        "repeat",
        choices=NONFINITE_MODES)
    spike_factor: Optional[float] = setting(
        None, NONFINITE, "with --nonfinite rollback: a window loss above F x the loss EMA rolls back too",
        metavar="F", none_means="off", low=1.01, high=1e6)
    rollback_lr_factor: float = setting(
        0.5, NONFINITE, "a rollback multiplies the lr peak by F",
        metavar="F", low=1e-6, high=1.0)

    # Output
    run_dir: Optional[str] = setting(
        None, OUTPUT, "folder for run.db and checkpoints",
        metavar="DIR", none_means="a new folder under $HEADROOM_RUNS")
    notify: tuple[str, ...] = setting(
        (), OUTPUT, "send a message when the run ends, rolls back or first runs out of memory, to an Apprise URL "
        "(ntfy://, slack://, discord://, mailto://, json://, ...; repeatable; without it $HEADROOM_NOTIFY, URLs "
        "separated by spaces; the extra headroom[notify])",
        label="Notify", metavar="URL", repeat=True)

    # Not flags: set in code or kept in a saved config
    # the free fraction of the card below which VRAM is called low (an alert)
    vram_low_fraction: float = bounded(0.10, low=0.0, high=1.0, high_open=True)
    # the fields the user set for the fork (else: those that differ from the parent's)
    fork_changes: tuple[Any, ...] = ()

    # The old single warmup field (< 1 a fraction, >= 1 samples): TrainConfig(warmup=W) still works and
    # sets warmup_fraction or warmup_samples. An argument only, never stored: read those two fields.
    warmup: InitVar[Optional[float]] = None

    def __post_init__(self, warmup: Optional[float]) -> None:
        if isinstance(self.notify, (list, str)):  # the flag's list, a saved config's, or one string of URLs
            urls = self.notify.split() if isinstance(self.notify, str) else self.notify
            object.__setattr__(self, "notify", tuple(urls))
        if warmup is None:
            return
        if self.warmup_samples or self.warmup_fraction:
            raise ConfigError("warmup and warmup_samples / warmup_fraction: give one")
        for name, value in split_warmup(warmup, "warmup").items():
            object.__setattr__(self, name, value)

    def validate(self) -> "TrainConfig":
        """Every field against its declared range (RANGES) or choices (CHOICES), the same the
        commands and the app's fields use; a field whose default is None may be None. One-line
        ConfigError for the first that is out."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and _may_be_none(f):
                continue
            check_value(f.name, value)
        if self.strategy != "fsdp" and (self.fsdp_reduce != "last" or self.cpu_offload):
            raise ConfigError(f"--{'cpu-offload' if self.cpu_offload else 'fsdp-reduce'} needs --strategy fsdp")
        if self.strategy == "fsdp" and self.precision == "fp16":
            raise ConfigError("--strategy fsdp takes --precision fp32 or bf16 (fp16's GradScaler does not unscale "
                              "sharded gradients)")
        if self.strategy == "fsdp" and (self.nonfinite == "rollback" or self.spike_factor is not None):
            raise ConfigError("--nonfinite rollback and --spike-factor do not work with --strategy fsdp yet "
                              "(use --nonfinite skip or stop)")
        check_device_name(self.device)
        if self.warmup_samples and self.warmup_fraction:
            raise ConfigError("--warmup-samples and --warmup-fraction: give one (a number of samples or a "
                              "fraction of the run)")
        check_task_args(self.task_args)
        check_one_origin(self.resume, self.fork)
        if self.micro_tokens is not None and self.token_budget is None:
            raise ConfigError("--micro-tokens needs --token-budget N (it bounds the micro-batches of a token-budget window)")
        if self.find_micro_batch and self.effective_batch is None:
            raise ConfigError("--find-micro-batch needs --effective-batch N")
        return self

    def to_dict(self) -> dict[str, Any]:
        """The config as saved (run.db, checkpoints, run_started): never the --notify URLs, which
        hold tokens and passwords; a resumed run is given them again (the flag or HEADROOM_NOTIFY)."""
        d = asdict(self)
        d["fork_changes"] = list(self.fork_changes)
        d["notify"] = []
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """From a saved or merged config; keys of older versions are read (upgrade_keys), unknown
        keys are ignored."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in upgrade_keys(d).items() if k in names}
        if "fork_changes" in kw:
            kw["fork_changes"] = tuple(kw["fork_changes"] or ())
        return cls(**kw)

    def with_(self, **changes: Any) -> "TrainConfig":
        return replace(self, **changes)


# The fields' annotations as types (they are strings here). Field by field: Python 3.10's
# get_type_hints refuses the class's InitVar, which fields() leaves out.
_HINTS = {f.name: eval(f.type, globals()) if isinstance(f.type, str) else f.type  # noqa: S307 - our own annotations
          for f in fields(TrainConfig)}


def check_one_origin(resume: Any, fork: Any) -> None:
    """--resume and --fork together are refused before either folder is read (the fault is the
    pair of flags, never a run's saved config)."""
    if fork is not None and resume is not None:
        raise ConfigError("--fork and --resume: give one (a fork starts a new run folder, a resume continues one)")


def value_type(name: str) -> type:
    """A TrainConfig field's type, Optional[...] unwrapped."""
    hint = _HINTS[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else typing.get_origin(hint) or hint


# What each field may hold, from its declaration: a number's range, a word's choices.
RANGES: dict[str, limits.Range] = {
    f.name: limits.Range(f.name, value_type(f.name), b.low, b.high, b.high_open, b.unit, b.note)
    for f in fields(TrainConfig) if (b := f.metadata.get(BOUNDS)) is not None}
CHOICES: dict[str, tuple[str, ...]] = {
    f.name: f.metadata[SETTING].choices for f in fields(TrainConfig)
    if SETTING in f.metadata and f.metadata[SETTING].choices}
_DEFAULTS: dict[str, Any] = {f.name: default_of(f) for f in fields(TrainConfig)}
_FIELDS_BY_NAME = {f.name: f for f in fields(TrainConfig)}


def _may_be_none(f: Any) -> bool:
    """A field that may hold None: its default is None, or its setting says what None means
    (keep_epoch_checkpoints: None is `all`, the default a number)."""
    declared = f.metadata.get(SETTING)
    return f.default is None or bool(declared is not None and declared.none_means)


def split_warmup(warmup: Any, who: str = "--warmup") -> dict[str, Any]:
    """The old single warmup value as the two fields: below 1 a fraction of the run, 1 or more
    a number of samples (rounded to a whole sample)."""
    high = RANGES["warmup_samples"].high
    if isinstance(warmup, bool) or not isinstance(warmup, (int, float)) or not math.isfinite(warmup) \
            or not 0 <= warmup <= high:
        raise ConfigError(f"{who} must be a number from 0 to 2**40 (below 1: a fraction of the run's samples, "
                          f"1 or more: samples), got {limits.quote(warmup)}")
    if warmup < 1:
        return {"warmup_samples": 0, "warmup_fraction": float(warmup)}
    return {"warmup_samples": int(round(warmup)), "warmup_fraction": 0.0}


def upgrade_keys(d: dict[str, Any]) -> dict[str, Any]:
    """A config dict with the keys of older versions read as today's: `warmup` becomes
    warmup_samples or warmup_fraction (unless the dict already has one of those, which then
    wins). A value the old key cannot hold is left to validate() to refuse."""
    if "warmup" not in d:
        return d
    out = {k: v for k, v in d.items() if k != "warmup"}
    if not any(k in out for k in WARMUP_FIELDS):
        try:
            out.update(split_warmup(d["warmup"], "warmup"))
        except ConfigError:
            out["warmup_fraction"] = d["warmup"]  # validate() says what is wrong with it
    return out


def overlay(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`changes` over `base` (a saved config under the flags given, a parent's under a fork's
    edits), both read as today's keys. A warmup among the changes replaces the base's however
    it was given (samples or a fraction), so the two never add up to both."""
    base, changes = dict(upgrade_keys(base)), upgrade_keys(changes)
    if any(k in changes for k in WARMUP_FIELDS):
        for key in WARMUP_FIELDS:
            base.pop(key, None)
    return {**base, **changes}


def check_value(name: str, value: Any, who: Optional[str] = None) -> Any:
    """A value of TrainConfig field `name` against what it may hold: its range (RANGES), its
    choices (CHOICES) or, for a switch, true or false. ConfigError with one line if not."""
    said = who or "--" + name.replace("_", "-")
    if value is None and name in _FIELDS_BY_NAME and _may_be_none(_FIELDS_BY_NAME[name]):
        return None  # max steps None: no limit (a live setting's value, as validate() takes it)
    if name in RANGES:
        return RANGES[name].check(value, who, ConfigError)
    if name in CHOICES:
        _choice(said, value, CHOICES[name])
    elif isinstance(_DEFAULTS.get(name), bool) and not isinstance(value, bool):
        raise ConfigError(f"{said} must be on or off (true or false), got {limits.quote(value)}")
    return value


def _choice(who: str, value: str, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{who} must be one of {', '.join(choices)}, got {limits.quote(value)}")


def check_lr(lr: Any, who: str = "--lr") -> float:
    checked: float = RANGES["lr"].check(lr, who, ConfigError)
    return checked


def check_clip(clip: Any, who: str = "--clip") -> float:
    checked: float = RANGES["clip"].check(clip, who, ConfigError)
    return checked


def check_range(name: str, value: Any, who: Optional[str] = None) -> Any:
    """Any TrainConfig field against its declared range (ConfigError if out)."""
    return RANGES[name].check(value, who, ConfigError)


def check_device_name(device: str) -> str:
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d{1,4})?", device):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got {limits.quote(device)}")
    return device


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
