"""Devices: which one a run uses, what it is called, and moving a batch onto it."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Callable

import torch

from engine import distributed
from engine.declarations.config import ConfigError


def resolve_device(name: str, ctx: distributed.DistContext = distributed.DistContext()) -> torch.device:
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
    """Move every tensor in `batch` to `device`, whatever holds it: tensors, lists, tuples,
    NamedTuples, Mappings (a transformers BatchEncoding too), dataclasses, and objects with
    their own `.to(device)`. Containers keep their type; anything else is left as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a NamedTuple: fields by position
        return type(batch)(*(to_device(b, device) for b in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        moved = {k: to_device(v, device) for k, v in batch.items()}
        if type(batch) is dict:
            return moved
        try:
            return type(batch)(moved)  # OrderedDict and friends keep their type
        except TypeError:
            return moved
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: to_device(getattr(batch, f.name), device)
                                             for f in dataclasses.fields(batch) if f.init})
    move = getattr(batch, "to", None)
    if isinstance(batch, Mapping) and callable(move):
        return move(device)  # BatchEncoding and friends move themselves
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    to = getattr(batch, "to", None)
    if callable(to) and not isinstance(batch, (str, bytes, type)):
        try:
            return to(device)
        except TypeError:
            return batch
    return batch


def default_optimizer(name: str, device: torch.device) -> Callable[[Any, float], torch.optim.Optimizer]:
    if name == "sgd":
        return lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9)
    fused = device.type == "cuda" or os.environ.get("HEADROOM_STEP_MODE") == "deferred"
    return lambda params, lr: torch.optim.AdamW(params, lr=lr, fused=fused or None)
