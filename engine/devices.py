"""Devices: which one a run uses, what it is called, and moving a batch onto it."""
from __future__ import annotations

import os
from typing import Any, Callable

import torch

from . import distributed as D
from .config import ConfigError


def resolve_device(name: str, ctx: D.DistContext = D.DistContext()) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine (use --device cpu)")
    dev = torch.device(name)
    index = dev.index if dev.index is not None else (ctx.local_rank if ctx.enabled else 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) present")
    return torch.device("cuda", index)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform
    return platform.processor() or platform.machine() or "CPU"


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def default_optimizer(name: str, device: torch.device) -> Callable[[Any, float], torch.optim.Optimizer]:
    if name == "sgd":
        return lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9)
    fused = device.type == "cuda" or os.environ.get("HEADROOM_STEP_MODE") == "deferred"
    return lambda params, lr: torch.optim.AdamW(params, lr=lr, fused=fused or None)
