"""Run configuration: one frozen dataclass, validated in one place.

Torch-free on purpose: the app imports this at start-up, before torch loads.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Optional

PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "sgd")
LR_SCALINGS = ("none", "linear", "sqrt")
NONFINITE_MODES = ("skip", "stop")
DEFAULT_TASK = "mlp"


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

    def validate(self) -> "TrainConfig":
        _int_at_least("micro-batch", self.micro_batch, 1)
        _int_at_least("accum", self.accum, 1)
        _int_at_least("epochs", self.epochs, 1)
        if self.max_steps is not None:
            _int_at_least("max-steps", self.max_steps, 1)
        if self.token_budget is not None:
            _int_at_least("token-budget", self.token_budget, 1)
        if self.effective_batch is not None:
            _int_at_least("effective-batch", self.effective_batch, 1)
        check_lr(self.lr)
        check_clip(self.clip)
        if not (isinstance(self.memory_margin, (int, float)) and 0.0 <= self.memory_margin < 1.0):
            raise ConfigError(f"--memory-margin must be in [0, 1), got {self.memory_margin}")
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("lr-scaling", self.lr_scaling, LR_SCALINGS)
        _choice("nonfinite", self.nonfinite, NONFINITE_MODES)
        check_device_name(self.device)
        if self.find_micro_batch and self.effective_batch is None:
            raise ConfigError("--find-micro-batch needs --effective-batch N")
        if self.vram_limit is not None and self.vram_limit <= 0:
            raise ConfigError("--vram-limit must be positive")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63:
            raise ConfigError(f"--seed must be a non-negative integer, got {self.seed!r}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def with_(self, **changes: Any) -> "TrainConfig":
        return replace(self, **changes)


def _int_at_least(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"--{name} must be an integer >= {low}, got {value!r}")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"--{name} must be one of {', '.join(choices)}, got {value!r}")


def check_lr(lr: Any) -> float:
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr < 0:
        raise ConfigError(f"--lr must be a finite number >= 0, got {lr!r}")
    return float(lr)


def check_clip(clip: Any) -> float:
    if not isinstance(clip, (int, float)) or isinstance(clip, bool) or not math.isfinite(clip) or clip < 0:
        raise ConfigError(f"--clip must be a finite number >= 0 (0 = off), got {clip!r}")
    return float(clip)


def check_device_name(device: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(device)):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    return device


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
          "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4}


def parse_size(text: str) -> int:
    """'24GiB' -> bytes. Accepts B, K/M/G/T (powers of 1000) and Ki/Mi/Gi/Ti (powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise ConfigError(f"cannot read a memory size from {text!r} (try 24GiB)")
    unit = (m.group(2) or "").upper().rstrip("B")
    value = float(m.group(1)) * _UNITS[unit]
    if value < 1:
        raise ConfigError(f"memory size must be positive, got {text!r}")
    return int(value)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
