"""What a checkpoint says about where a run is and how it trains is input.

--resume, --fork and a rollback read it back, so its values pass the same declarations every
flag and command passes (engine/declarations): the live settings against their ranges and
choices (config.RANGES, config.CHOICES, through config.check_value), where a run is against
limits.PROGRESS_RANGES, and the numbers the optimizer and scaler go on with must be finite. A
value out of range is a damaged or edited file: files.load refuses it (naming the file and the
field), and nothing trains from it or writes over it.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

from engine.declarations import limits
from engine.declarations.config import ConfigError, check_value
from engine.declarations.settings import LIVE_NAMES


def problem(state: dict[str, Any]) -> Optional[str]:
    """Why `state` (a loaded checkpoint, or a sharded checkpoint's meta) holds what no run can
    continue from, in one line naming the field; None if every value is in range."""
    try:
        _check(state)
    except ConfigError as e:
        return str(e)
    return None


def _check(state: dict[str, Any]) -> None:
    for name, r in limits.PROGRESS_RANGES.items():
        if name in state:
            r.check(state[name], name, ConfigError)
    if "epoch_sums" in state:  # the older spelling of epoch_loss and epoch_count
        sums = state["epoch_sums"]
        if not (isinstance(sums, (list, tuple)) and len(sums) == 2):
            raise ConfigError(f"epoch_sums must be two numbers, got {limits.quote(sums)}")
        limits.PROGRESS_RANGES["epoch_loss"].check(sums[0], "epoch_sums[0]", ConfigError)
        limits.PROGRESS_RANGES["epoch_count"].check(sums[1], "epoch_sums[1]", ConfigError)
    settings = _mapping(state, "settings")
    for name in LIVE_NAMES:
        if name in settings:
            check_value(name, settings[name], f"settings.{name}")
    _mapping(state, "config")  # compared with the flags given, never trained with: a mapping is enough
    _ended_epoch(state.get("ended_epoch"))
    scaler = _mapping(state, "scaler")
    for key, value in scaler.items():
        _finite(value, f"scaler.{key}")
    if "scale" in scaler and not scaler["scale"] > 0:
        raise ConfigError(f"scaler.scale must be above 0, got {limits.quote(scaler['scale'])}")
    if "model" in state and not isinstance(state["model"], dict):
        raise ConfigError(f"model must be a state_dict (a mapping), got {type(state['model']).__name__}")
    optimizer = state.get("optimizer")
    if isinstance(optimizer, dict):
        groups = optimizer.get("param_groups", [])
        if not isinstance(groups, (list, tuple)) or not all(isinstance(g, dict) for g in groups):
            raise ConfigError(f"optimizer.param_groups must be a list of mappings, got {limits.quote(groups)}")
        for i, group in enumerate(groups):
            for key, value in group.items():
                if key != "params":
                    _finite(value, f"optimizer.param_groups[{i}].{limits.quote(key)}")
    _rng(state.get("rng"))


def _mapping(state: dict[str, Any], key: str) -> dict[str, Any]:
    value = state.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a mapping, got {limits.quote(value)}")
    return value


def _finite(value: Any, who: str) -> None:
    """A number (or a tuple of numbers, as Adam's betas) must be finite; other values are the
    optimizer's own (flags, names, None) and pass."""
    values = value if isinstance(value, (list, tuple)) else (value,)
    for v in values:
        if isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point():
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{who} must be a finite number, got {limits.quote(value)}")


def _ended_epoch(row: Any) -> None:
    """The last finished epoch's row (engine/trainer/progress.py), which run.db gets back from the
    checkpoint if a crash lost it."""
    if row is None:
        return
    if not isinstance(row, dict):
        raise ConfigError(f"ended_epoch must be a mapping, got {limits.quote(row)}")
    limits.PROGRESS_RANGES["epoch"].check(row.get("epoch"), "ended_epoch.epoch", ConfigError)
    limits.PROGRESS_RANGES["step"].check(row.get("step"), "ended_epoch.step", ConfigError)
    for key in ("train_loss", "val_loss", "seconds"):  # a loss may be NaN: what the epoch gave
        v = row.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ConfigError(f"ended_epoch.{key} must be a number, got {limits.quote(v)}")


def _rng(rng: Any) -> None:
    if rng is None:
        return
    if not isinstance(rng, dict):
        raise ConfigError(f"rng must be a mapping, got {limits.quote(rng)}")
    want = torch.get_rng_state()
    for key in ("torch", "cuda"):
        t = rng.get(key)
        if t is None:
            continue
        ok = isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1
        if ok and key == "torch":
            try:  # a state torch would refuse when the run restores it: tried on a generator of its own
                torch.Generator().set_state(t)
            except (RuntimeError, TypeError, ValueError):
                ok = False
        if not ok:
            raise ConfigError(f"rng.{key} must be a generator state (a 1-d uint8 tensor"
                              f"{f' of {want.numel()} bytes' if key == 'torch' else ''}), got {limits.quote(t)}")
