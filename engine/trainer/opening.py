"""Opening a run folder for writing, and where the run continues from.

Rank 0 opens run.db (the folder's lock is already held, setup.py), expires the commands
an earlier engine never read, keeps apart (never deletes) the rows a resume supersedes,
and records the run's config, device and, for a fork, its parent.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

import torch

from engine.checkpoints import files as ckpt
from engine.declarations.commands import Command
from engine.declarations.config import TrainConfig
from engine.declarations.events import EpochEnd, Event, RunStarted, SettingsApplied, StoreProblem
from engine.declarations.settings import LENGTH_NAMES, LiveSettings
from engine.distributed.devices import device_name
from engine.store import RunStore

from . import run_state
from .progress import Progress
from .setup import RunParts


def open_store(parts: RunParts, on_problem: Callable[[str], None]) -> RunStore:
    os.makedirs(os.path.join(parts.run_dir, ckpt.CKPT_DIR), exist_ok=True)
    store = RunStore(parts.run_dir, on_problem=on_problem)
    # Commands an earlier engine never read are not this engine's to apply (a stale stop).
    store.expire_pending_commands()
    return store


def run_started(parts: RunParts, config: TrainConfig, step: int, epoch: int) -> RunStarted:
    """The run's first event: its folder, task, device and whole config (run.db keeps it)."""
    return RunStarted(step, epoch, run_dir=os.path.abspath(parts.run_dir), task=parts.task.name,
                      device=str(parts.device), device_name=device_name(parts.device),
                      torch_version=torch.__version__, world_size=parts.ctx.world,
                      resumed=parts.resume_state is not None, config=config.to_dict(),
                      forked_from=config.fork or "")


def continue_from(parts: RunParts, state: dict[str, Any]) -> tuple[Progress, LiveSettings, list[Command]]:
    progress, settings, asked = run_state.restore(parts, state)
    if progress.window and "epoch_offset" not in state:  # a checkpoint from before epoch_offset existed
        done = parts.policy.windows(progress.epoch, settings, parts.ctx.world)[:progress.window]
        progress.epoch_offset = sum(len(w) for w in done)
    return progress, settings, asked


def resumed_changes(parts: RunParts, state: dict[str, Any], step: int, epoch: int) -> list[SettingsApplied]:
    """A resume whose --task-arg changed the task (the task is built at the start, so the change
    holds from the first step): a settings change in run.db, as a changed setting is. (A fork
    records what it changed in its parent record.)"""
    if parts.origin.parent is not None or not parts.config.resume:
        return []
    saved = (state.get("config") or {}).get("task_args")
    now = dict(parts.config.task_args)
    if not isinstance(saved, dict) or saved == now:
        return []
    return [SettingsApplied(step, epoch, changes=(("task_args", saved, now),), at="start", from_step=step + 1)]


def changed_length(config: TrainConfig, settings: LiveSettings, step: int, epoch: int) -> Optional[SettingsApplied]:
    """A continued run whose length is not its config's (a change made while it trained, kept by
    its checkpoint): said as a settings change from the start, so what reads run.db (the
    window's progress bar and ETA, headroom-ctl status) counts to that length."""
    changes = tuple((name, getattr(config, name), getattr(settings, name)) for name in LENGTH_NAMES
                    if getattr(config, name) != getattr(settings, name))
    return SettingsApplied(step, epoch, changes=changes, at="start", from_step=step + 1) if changes else None


def record_start(store: RunStore, parts: RunParts, step: int) -> None:
    cfg, ctx = parts.config, parts.ctx
    if cfg.resume:  # rows past the checkpoint are kept apart (discarded_metrics), never deleted
        store.discard_after(step, f"resumed from the checkpoint at step {step}")
    parent = parts.origin.parent
    store.set_info(config=cfg.to_dict(), task=parts.task.name, device=str(parts.device),
                   device_name=device_name(parts.device), world_size=ctx.world, torch_version=torch.__version__,
                   strategy=parts.window.strategy.name,
                   status="running", pid=os.getpid(),
                   backend=(torch.distributed.get_backend() if ctx.enabled else "none"), precision=cfg.precision,
                   started=time.time(), **({"parent": parent} if parent is not None else {}))
    store.commit()


def epoch_row(done: EpochEnd) -> dict[str, Any]:
    """An epoch's row as its checkpoint keeps it (Progress.ended_epoch)."""
    return dict(epoch=done.epoch, step=done.step, train_loss=done.train_loss, val_loss=done.val_loss,
                seconds=done.seconds)


def restore_epoch_row(store: RunStore, parts: RunParts, progress: Progress) -> list[Event]:
    """The epoch row a crash lost: the checkpoint a resume continues from was written at that
    epoch's end (or later) and holds the row; run.db, which takes it just after, may not. The
    events that put it back (the row itself and a note saying why), or none if run.db has it
    (or the run is a fork: its parent's epochs are the parent's)."""
    row: Optional[dict[str, Any]] = progress.ended_epoch
    if not parts.config.resume or not row or store.has_epoch(int(row["epoch"])):
        return []
    done = EpochEnd(int(row["step"]), int(row["epoch"]), train_loss=row.get("train_loss"),  # type: ignore[arg-type]  # as saved: a row without it is written so (NULL)
                    val_loss=row.get("val_loss"), seconds=row.get("seconds") or 0.0)
    note = StoreProblem(progress.step, progress.epoch,
                        problem=f"epoch {done.epoch}'s row was not in run.db (the run stopped between the "
                                "epoch's checkpoint and its row): written back from the checkpoint")
    return [note, done]
