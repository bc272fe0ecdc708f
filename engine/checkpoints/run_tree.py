"""Where a run's state comes from: nothing (a new run), its own newest good checkpoint (a
resume), or another run's checkpoint (a fork). Checked before anything is written.

A fork is a new run folder that continues another run's checkpoint exactly (weights,
optimizer, scaler, schedule position, progress, RNG, settings) with the settings given on
its command line changed from its first step. Its run table records the parent:
{"run_dir", "checkpoint", "step", "changed"}; its steps continue the parent's step
counter and samples seen, so the two line up on any axis.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from engine.declarations.checkpoint_names import split_fork
from engine.declarations.config import ConfigError, TrainConfig

from . import files as ckpt

# Config keys that say where a run is, not how it trains: never "changed" by a fork.
NOT_SETTINGS = ("run_dir", "resume", "fork", "fork_changes", "find_micro_batch", "effective_batch",
                "memory_margin")


@dataclass
class Origin:
    state: Optional[dict[str, Any]] = None  # the checkpoint to continue from (None: from the start)
    path: Optional[str] = None
    skipped: list[str] = field(default_factory=list)  # newer checkpoints passed over, and why
    parent: Optional[dict[str, Any]] = None  # a fork's parent record


def checkpoint_for(run_dir: str, which: str, notes: Optional[list[str]] = None) -> str:
    """The checkpoint `which` of the run: its file, or its sharded folder; if both are there (a
    crash between writing one and removing the other), the newer by the step inside, with a
    line in `notes` saying so."""
    if which == "last":
        path = ckpt.last_path(run_dir)
    else:
        kind, _, n = which.partition("-")
        path = ckpt.epoch_path(run_dir, int(n)) if kind == "epoch" else ckpt.step_path(run_dir, int(n))
    if os.path.isfile(path) and os.path.isdir(path[:-3]):
        return ckpt.newest_first([path, path[:-3]], notes if notes is not None else [])[0]
    return ckpt.existing(path)


def mismatch(state: dict[str, Any], model: torch.nn.Module) -> Optional[str]:
    """Why `state` cannot continue this task's model, or None. Keys and shapes of every
    tensor, and the optimizer state a continuation needs. A sharded checkpoint is checked
    against its metadata (nothing loaded)."""
    if state.get("sharded"):
        return _sharded_mismatch(state["sharded"], model)
    saved, own = state.get("model") or {}, model.state_dict()
    missing = [k for k in own if k not in saved]
    extra = [k for k in saved if k not in own]
    if missing or extra:
        which = f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}, which the task's model has not"
        return f"its weights are not this task's model ({which}; {len(missing)} missing, {len(extra)} extra)"
    for k, v in own.items():
        if isinstance(v, torch.Tensor) and not isinstance(saved[k], torch.Tensor):
            return f"its weights are not this task's model ({k} is a {type(saved[k]).__name__}, not a tensor)"
        if isinstance(v, torch.Tensor) and tuple(saved[k].shape) != tuple(v.shape):
            return f"its weights are not this task's model ({k}: {tuple(saved[k].shape)} vs {tuple(v.shape)})"
    if not isinstance(state.get("optimizer"), dict) or "state" not in state["optimizer"]:
        return "it holds no optimizer state"
    return None


def _sharded_mismatch(folder: str, model: torch.nn.Module) -> Optional[str]:
    from .sharded import has_optimizer_state, tensor_shapes
    saved, own = tensor_shapes(folder), model.state_dict()
    missing = [k for k, v in own.items() if isinstance(v, torch.Tensor) and k not in saved]
    extra = [k for k in saved if k not in own]
    if missing or extra:
        which = f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}, which the task's model has not"
        return f"its weights are not this task's model ({which}; {len(missing)} missing, {len(extra)} extra)"
    for k, v in own.items():
        if isinstance(v, torch.Tensor) and saved[k] != tuple(v.shape):
            return f"its weights are not this task's model ({k}: {saved[k]} vs {tuple(v.shape)})"
    if not has_optimizer_state(folder):
        return "it holds no optimizer state"
    return None


def resume_origin(run_dir: str, model: torch.nn.Module) -> Origin:
    """The newest checkpoint of the run that loads and fits the task. No checkpoint at all:
    the run starts again from step 0 (its rows are kept apart, never deleted). Checkpoints
    that exist but none fits, or one that holds values no run can hold: bad input, the run
    untouched. A `checkpoints` that is not a folder is bad input too (nothing could be written)."""
    folder = os.path.join(run_dir, ckpt.CKPT_DIR)
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise ConfigError(f"--resume {run_dir}: {folder} is not a folder (the run's checkpoints go there; "
                          "move it away to resume)")
    path, state, skipped = ckpt.load_newest(run_dir, lambda s: mismatch(s, model))
    if state is None and ckpt.candidates(run_dir):
        raise ConfigError(f"--resume {run_dir}: no checkpoint fits: {skipped[0] if skipped else 'none loads'}")
    return Origin(state=state, path=path, skipped=skipped)


def fork_origin(spec: str, config: TrainConfig, model: torch.nn.Module) -> Origin:
    parent_dir, which = split_fork(spec)
    notes: list[str] = []
    path = checkpoint_for(parent_dir, which, notes)
    if not os.path.exists(path):
        have = ", ".join(ckpt.name_of(p) for p in ckpt.candidates(parent_dir)) or "none"
        raise ConfigError(f"--fork {spec}: no checkpoint {which} in {parent_dir} (it has: {have})")
    state = ckpt.load(path)
    why = mismatch(state, model)
    if why:
        raise ConfigError(f"--fork {spec}: checkpoint {which} does not fit the task: {why}")
    parent_config = state.get("config") or {}
    mine = config.to_dict()
    if config.fork_changes:  # the flags given, against what the parent had at the checkpoint
        at_checkpoint = {**parent_config, **(state.get("settings") or {})}
        changed = {k: mine[k] for k in config.fork_changes
                   if k in mine and k not in NOT_SETTINGS and at_checkpoint.get(k, mine[k]) != mine[k]}
    else:  # a fork built in code: what differs from the parent's config
        changed = {k: v for k, v in mine.items()
                   if k not in NOT_SETTINGS and k in parent_config and parent_config[k] != v}
    parent = dict(run_dir=os.path.abspath(parent_dir), checkpoint=which, step=int(state["step"]), changed=changed)
    return Origin(state=state, path=path, parent=parent, skipped=notes)
