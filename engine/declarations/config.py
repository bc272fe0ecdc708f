"""Run configuration: one frozen dataclass, validated in one place.

Torch-free on purpose: the app imports this at start-up, before torch loads.
"""
from __future__ import annotations

import math
import re
from dataclasses import InitVar, asdict, dataclass, field, fields, replace
from typing import Any, Optional

from . import limits

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "sgd")
LR_SCALINGS = ("none", "linear", "sqrt")
NONFINITE_MODES = ("skip", "stop", "rollback")
LR_SCHEDULES = ("constant", "linear", "cosine")
MEMORY_SNAPSHOTS = ("off", "on-oom")
STRATEGIES = ("ddp", "fsdp")  # under torchrun: DistributedDataParallel, or FSDP2 sharding (engine/distributed)
FSDP_REDUCES = ("last", "every")  # fsdp: reduce-scatter the gradients at the window's last micro-batch, or at each
DEFAULT_TASK = "mlp"
# The fields that take one of a fixed set of words, and the words (the flags' choices, the app's lists).
CHOICES: dict[str, tuple[str, ...]] = {
    "optimizer": OPTIMIZERS, "precision": PRECISIONS, "lr_scaling": LR_SCALINGS, "nonfinite": NONFINITE_MODES,
    "lr_schedule": LR_SCHEDULES, "memory_snapshot": MEMORY_SNAPSHOTS, "strategy": STRATEGIES,
    "fsdp_reduce": FSDP_REDUCES,
}
# Linear warmup is one of two fields: a number of samples or a fraction of the run's samples.
WARMUP_FIELDS = ("warmup_samples", "warmup_fraction")


class ConfigError(ValueError):
    """A value the user gave is out of range; the message is one line for `error: ...`."""


@dataclass(frozen=True)
class TrainConfig:
    task: str = DEFAULT_TASK
    micro_batch: int = 16
    accum: int = 4
    lr: float = 1e-3
    clip: float = 1.0  # 0 = off
    epochs: int = 3
    max_steps: Optional[int] = None  # optimizer steps
    optimizer: str = "adamw"
    precision: str = "fp32"
    device: str = "auto"
    seed: int = 0
    run_dir: Optional[str] = None
    resume: Optional[str] = None
    nonfinite: str = "skip"
    lr_scaling: str = "none"
    token_budget: Optional[int] = None
    find_micro_batch: bool = False
    effective_batch: Optional[int] = None
    memory_margin: float = 0.0
    oom_recovery: bool = True
    vram_limit: Optional[int] = None  # bytes
    vram_low_fraction: float = 0.10
    lr_schedule: str = "constant"  # constant | linear | cosine, over samples seen (engine/declarations/schedule.py)
    warmup_samples: int = 0  # linear warmup over this many samples (or warmup_fraction; not both)
    warmup_fraction: float = 0.0  # linear warmup over this fraction of the run's planned samples
    min_lr_ratio: float = 0.1  # linear and cosine end at this x the peak
    workers: Optional[int] = None  # DataLoader workers; None = auto (engine/window/feeder.py)
    micro_tokens: Optional[int] = None  # under --token-budget: a micro-batch's counted items at most
    task_args: dict = field(default_factory=dict)  # --task-arg KEY=VALUE: build_task(seed, **task_args)
    checkpointing: bool = False  # activation checkpointing (a live setting: set_checkpointing)
    memory_snapshot: str = "off"  # off | on-oom: allocator history, dumped at every out-of-memory error
    fork: Optional[str] = None  # DIR[@last|@epoch-N|@step-S]: a new run from that checkpoint
    fork_changes: tuple = ()  # the fields the user set for the fork (else: those that differ from the parent's)
    checkpoint_every: Optional[int] = None  # optimizer steps between step checkpoints (step-S.pt)
    keep_checkpoints: int = 3  # step checkpoints kept (epoch checkpoints are all kept)
    spike_factor: Optional[float] = None  # a window loss above F x the loss EMA is a spike (rollback)
    rollback_lr_factor: float = 0.5  # a rollback multiplies the lr peak by this
    reference_batch: Optional[int] = None  # the effective batch --lr was tuned for (with --lr-scaling)
    strategy: str = "ddp"  # under torchrun: ddp (a replica per rank) | fsdp (parameters, gradients, state sharded)
    fsdp_reduce: str = "last"  # fsdp: last (one reduce-scatter a window) | every (one per micro-batch)
    cpu_offload: bool = False  # fsdp: the shards and the optimizer step on the CPU (CPUOffloadPolicy)
    # The old single warmup field (< 1 a fraction, >= 1 samples): TrainConfig(warmup=W) still works and
    # sets warmup_fraction or warmup_samples. An argument only, never stored: read those two fields.
    warmup: InitVar[Optional[float]] = None

    def __post_init__(self, warmup: Optional[float]) -> None:
        if warmup is None:
            return
        if self.warmup_samples or self.warmup_fraction:
            raise ConfigError("warmup and warmup_samples / warmup_fraction: give one")
        for name, value in split_warmup(warmup, "warmup").items():
            object.__setattr__(self, name, value)

    def validate(self) -> "TrainConfig":
        """Every field against its declared range (engine/declarations/limits.py) or choices
        (CHOICES), the same the commands and the app's fields use; a field whose default is None
        may be None. One-line ConfigError for the first that is out."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
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
        if self.fork is not None and self.resume is not None:
            raise ConfigError("--fork and --resume: give one (a fork starts a new run folder, a resume continues one)")
        if self.micro_tokens is not None and self.token_budget is None:
            raise ConfigError("--micro-tokens needs --token-budget N (it bounds the micro-batches of a token-budget window)")
        if self.find_micro_batch and self.effective_batch is None:
            raise ConfigError("--find-micro-batch needs --effective-batch N")
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fork_changes"] = list(self.fork_changes)
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


def split_warmup(warmup: Any, who: str = "--warmup") -> dict[str, Any]:
    """The old single warmup value as the two fields: below 1 a fraction of the run, 1 or more
    a number of samples (rounded to a whole sample)."""
    high = limits.RANGES["warmup_samples"].high
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
    """A value of TrainConfig field `name` against what it may hold: its range (limits.RANGES),
    its choices (CHOICES) or, for a switch, true or false. ConfigError with one line if not."""
    said = who or "--" + name.replace("_", "-")
    if name in limits.RANGES:
        return limits.check(name, value, who, ConfigError)
    if name in CHOICES:
        _choice(said, value, CHOICES[name])
    elif isinstance(_DEFAULTS.get(name), bool) and not isinstance(value, bool):
        raise ConfigError(f"{said} must be on or off (true or false), got {limits.quote(value)}")
    return value


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(TrainConfig)}

MAX_TASK_ARGS = 64  # options of one task; more is not a configuration
MAX_TASK_ARG_CHARS = 1024  # one value as JSON text: options, not data


def check_task_args(args: Any) -> dict:
    """Task arguments are keyword arguments of build_task: identifiers, JSON-able values."""
    import json
    if not isinstance(args, dict):
        raise ConfigError(f"--task-arg: task arguments must be KEY=VALUE pairs, got {limits.quote(args)}")
    if len(args) > MAX_TASK_ARGS:
        raise ConfigError(f"--task-arg: at most {MAX_TASK_ARGS} task arguments, got {len(args)}")
    for k, v in args.items():
        if not (isinstance(k, str) and k.isidentifier() and k != "seed"):
            raise ConfigError(f"--task-arg: {limits.quote(k)} is not a keyword name (letters, digits, _; not seed)")
        try:
            text = json.dumps(v)
        except (TypeError, ValueError):
            raise ConfigError(f"--task-arg {k}: the value must be plain data (JSON), got {limits.quote(v)}") from None
        if len(text) > MAX_TASK_ARG_CHARS:
            raise ConfigError(f"--task-arg {k}: the value is {len(text)} characters (at most {MAX_TASK_ARG_CHARS})")
    return args


def parse_task_arg(text: str) -> tuple[str, Any]:
    """'KEY=VALUE' -> (KEY, VALUE), VALUE as a JSON literal where it parses, else the string."""
    import json
    key, sep, raw = str(text).partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--task-arg must be KEY=VALUE, got {limits.quote(text)}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    check_task_args({key: value})
    return key, value


def _choice(who: str, value: str, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{who} must be one of {', '.join(choices)}, got {limits.quote(value)}")


def check_lr(lr: Any, who: str = "--lr") -> float:
    return limits.check("lr", lr, who, ConfigError)


def check_clip(clip: Any, who: str = "--clip") -> float:
    return limits.check("clip", clip, who, ConfigError)


def check_range(name: str, value: Any, who: Optional[str] = None) -> Any:
    """Any TrainConfig field against its range in engine/declarations/limits.py (ConfigError if out)."""
    return limits.check(name, value, who, ConfigError)


def check_device_name(device: str) -> str:
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|cuda(:\d{1,4})?", device):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got {limits.quote(device)}")
    return device


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
          "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4}


def parse_size(text: str) -> int:
    """'24GiB' -> bytes. Accepts B, K/M/G/T (powers of 1000) and Ki/Mi/Gi/Ti (powers of 1024).

    Exact arithmetic (no float): a 400-digit number is a (huge) int, never an overflow; the
    range a run can use is checked by validate() (engine/declarations/limits.py)."""
    text = str(text)
    m = _SIZE.match(text) if len(text) <= 200 else None
    if not m:
        raise ConfigError(f"cannot read a memory size from {limits.quote(text)} (try 24GiB)")
    unit = (m.group(2) or "").upper().rstrip("B")
    whole, _, frac = m.group(1).partition(".")
    value = (int(whole) * 10**len(frac) + int(frac or 0)) * _UNITS[unit] // 10**len(frac)
    if value < 1:
        raise ConfigError(f"memory size must be positive, got {limits.quote(text)}")
    return value


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
