"""A run's full state in a checkpoint, and back: weights, optimizer, scaler, progress,
live settings and the config the run was started with."""
from __future__ import annotations

from typing import Any, Collection, Mapping, Optional

import torch

from engine.checkpoints import files as ckpt
from engine.checkpoints import retention, sharded
from engine.declarations.commands import Command, command_for
from engine.declarations.settings import LENGTH_NAMES, LIVE_SETTINGS, LiveSettings

from .progress import Progress
from .setup import RunParts


def checkpoint_state(parts: RunParts, progress: Progress, settings: LiveSettings,
                     weights: bool = True) -> dict[str, Any]:
    """weights=False: all but model and optimizer (a sharded checkpoint's meta.pt)."""
    return {
        **({"model": parts.model.state_dict(), "optimizer": parts.optimizer.state_dict()} if weights else {}),
        "world_size": parts.ctx.world,  # a resume on another number of ranks keeps the effective batch
        "scaler": parts.scaler.state_dict() if parts.scaler is not None else {},
        "scheduler": parts.scheduler.state_dict() if parts.scheduler is not None else {},
        **progress.to_checkpoint(parts.device),
        "settings": settings.to_dict(),
        "config": parts.config.to_dict(),
    }


def numbered_path(parts: RunParts, step: int, epoch_done: Optional[int], step_checkpoint: bool) -> Optional[str]:
    """The epoch-N.pt or step-S.pt file a save writes besides last.pt (None: last.pt alone)."""
    if epoch_done is not None:
        return ckpt.epoch_path(parts.run_dir, epoch_done)
    if step_checkpoint:
        return ckpt.step_path(parts.run_dir, step)
    return None


def save(parts: RunParts, progress: Progress, settings: LiveSettings, epoch_done: Optional[int] = None,
         step_checkpoint: bool = False, keep_too: Collection[str] = (),
         val_losses: Optional[Mapping[int, Optional[float]]] = None) -> str:
    """Write last.pt, and epoch-N.pt at an epoch's end or step-S.pt (--checkpoint-every),
    atomically. Returns last.pt's path. A sharded run (every rank calls this) writes folders
    instead (checkpoints/sharded.py).

    Step files rotate before the new one is written: all but the newest --keep-checkpoints - 1
    go first, so the disk holds K step checkpoints and last.pt at rest, and one more while a
    file is being written (K + 1, +1 temporary), never K + 3. Epoch files are pruned after the
    new one is written (--keep-epoch-checkpoints, checkpoints/retention.py; `val_losses`: each
    epoch's validation loss, for the best). last.pt is never removed, so a write that fails
    still leaves a good checkpoint; `keep_too` (what a rollback may still pick, autopilot.py,
    and what a fork continues from, checkpoints/forks.py) is never removed either."""
    numbered = numbered_path(parts, progress.step, epoch_done, step_checkpoint)
    last = ckpt.last_path(parts.run_dir)
    if step_checkpoint and parts.ctx.is_main:
        prune_step_checkpoints(parts.run_dir, parts.config.keep_checkpoints - 1, keep_too, coming=numbered)
    if parts.window.strategy.sharded:
        meta = checkpoint_state(parts, progress, settings, weights=False)
        folders = [p[:-3] for p in ([numbered] if numbered else []) + [last]]
        sharded.save(folders, parts.model, parts.optimizer, meta, progress.step, parts.ctx.is_main)
    else:
        state = checkpoint_state(parts, progress, settings)
        if numbered is not None:
            ckpt.save_checkpoint(state, numbered)
        ckpt.save_checkpoint(state, last)
    if epoch_done is not None and parts.ctx.is_main:  # after the write: a failed one removes nothing
        paths = ckpt.candidates(parts.run_dir)
        retention.remove(retention.epochs_to_remove(paths, val_losses or {}, parts.config.keep_epoch_checkpoints,
                                                    keep_too))
    return ckpt.existing(last)


def prune_step_checkpoints(run_dir: str, keep: int, keep_too: Collection[str] = (),
                           coming: Optional[str] = None) -> list[str]:
    """Remove all but the newest `keep` step-S checkpoints (epoch checkpoints and last.pt are
    all kept, and so is every one named in `keep_too`). `coming`: the step file about to be
    written, not counted (it replaces any file of its name)."""
    spared = {ckpt.name_of(p) for p in keep_too}
    steps = [p for p in ckpt.candidates(run_dir) if ckpt.name_of(p).startswith("step-")
             and (coming is None or ckpt.name_of(p) != ckpt.name_of(coming))]
    steps.sort(key=lambda p: int(ckpt.name_of(p)[5:]))
    removed = [p for p in (steps[:-keep] if keep > 0 else steps) if ckpt.name_of(p) not in spared]
    retention.remove(removed)  # a sharded checkpoint is a folder
    return removed


def weights_state(parts: RunParts) -> dict[str, Any]:
    """CPU copies of what a rollback to the run's start restores."""
    import copy
    return {"model": {k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                      for k, v in parts.model.state_dict().items()},  # a model's extra state is any plain data
            "optimizer": copy.deepcopy(parts.optimizer.state_dict()),
            "scaler": parts.scaler.state_dict() if parts.scaler is not None else {},
            "scheduler": parts.scheduler.state_dict() if parts.scheduler is not None else {}}


def load_weights(parts: RunParts, state: dict[str, Any]) -> None:
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    if parts.scaler is not None and state.get("scaler"):
        parts.scaler.load_state_dict(state["scaler"])
    if parts.scheduler is not None and state.get("scheduler"):
        parts.scheduler.load_state_dict(state["scheduler"])


def restore(parts: RunParts, state: dict[str, Any]) -> tuple[Progress, LiveSettings, list[Command]]:
    """Where the run was and its settings (weights, optimizer, scaler and scheduler were
    loaded by setup), and the commands for flags given again with --resume that differ
    from the run's saved config (the user's new settings, applied at the next boundary).
    A fork applies its changed settings from its first step instead."""
    progress = Progress.from_checkpoint(state, parts.device)
    settings = LiveSettings.from_config(parts.config).updated(state.get("settings"))
    asked = parts.config
    parent = parts.origin.parent
    commands: list[Command]
    if parent is not None:
        # A fork is a new run: its length is its own config's (the parent's as it is now, with the
        # flags given), not what the checkpoint's run had planned when it was written.
        changes = {s.name: getattr(asked, s.name) for s in LIVE_SETTINGS
                   if s.name in parent["changed"] or s.name in LENGTH_NAMES}
        settings, commands = settings.with_(**changes), []
    else:
        saved = state.get("config") or {}
        # The run's length: the checkpoint's (a change made while it trained holds), unless
        # --epochs is given anew; max steps only as given now (the limit that stopped the run
        # is not one for its continuation, engine/run_config.py). From the first step.
        settings = settings.with_(max_steps=asked.max_steps, **(
            {"epochs": asked.epochs} if saved.get("epochs", asked.epochs) != asked.epochs else {}))
        commands = [command_for(s.name, getattr(asked, s.name)) for s in LIVE_SETTINGS
                    if s.name in saved and saved[s.name] != getattr(asked, s.name) and s.name not in LENGTH_NAMES
                    and getattr(settings, s.name) != getattr(asked, s.name)]
    return progress, settings, commands  # the lr: the first window writes it (LrControl), from these settings

