"""Writing a run's checkpoints, and saying what a failed write leaves.

The trainer saves through `Checkpointer.save` (run_state.py writes the files). Around that:

- the autopilot learns of every save on every rank, and rotation keeps what it may still
  roll back to (autopilot.needed);
- epoch checkpoints past --keep-epoch-checkpoints go once the new one is written; the
  best by validation loss stays (each epoch's loss kept here, the earlier ones read from
  run.db once, so a resumed run still knows its best), and so does every checkpoint a fork
  beside this run continues from (checkpoints/forks.py), step checkpoints included;
- the first checkpoint a run writes is read back through the loader --resume uses
  (weights_only=True, values in range): a run finds out at once, not after it ends, that it
  writes checkpoints it would refuse (setup.check_checkpointable checked the same before
  training, on what the task puts in one; this adds what only training does);
- a write that fails names the cause: a full disk (or the file-size limit) says so, with the
  checkpoint kept and how much space the next one needs.
"""
from __future__ import annotations

import errno
import os
import resource
from typing import TYPE_CHECKING, Optional

import torch

from engine.checkpoints import files as ckpt
from engine.checkpoints.forks import ForkFinder
from engine.declarations.config import format_bytes
from engine.declarations.outcome import CheckpointFailed
from engine.declarations.settings import LiveSettings
from engine.store import RunReader, StoreError

from . import run_state
from .progress import Progress
from .setup import RunParts

if TYPE_CHECKING:
    from .autopilot import Autopilot


class Checkpointer:
    def __init__(self, parts: RunParts) -> None:
        self.parts = parts
        self.autopilot: Optional["Autopilot"] = None  # set when the run rolls back by itself
        origin = parts.origin
        # The newest checkpoint of this run folder on disk, (step, path): a resume starts at one.
        self.kept: Optional[tuple[int, str]] = None
        if origin.state is not None and origin.parent is None and origin.path:
            self.kept = (int(origin.state["step"]), origin.path)
        self.read_back = False
        # Each epoch's validation loss (the best epoch checkpoint is kept): None until the
        # first epoch end on the main rank reads the earlier epochs' from run.db.
        self.val_losses: Optional[dict[int, Optional[float]]] = None
        self.forks = ForkFinder(parts.run_dir)  # the checkpoints forks beside this run continue from

    def save(self, progress: Progress, settings: LiveSettings, epoch_done: Optional[int] = None,
             step_checkpoint: bool = False) -> Optional[str]:
        """Write the checkpoint (every rank calls this); last.pt's path where this rank wrote,
        None where it has nothing to write. CheckpointFailed if it could not be written or
        read back."""
        parts = self.parts
        numbered = run_state.numbered_path(parts, progress.step, epoch_done, step_checkpoint)
        keep_too: set[str] = set()
        if self.autopilot is not None:  # every rank: each must know the same rollback targets
            self.autopilot.saved(progress.step, numbered or ckpt.last_path(parts.run_dir), numbered is not None)
            keep_too = self.autopilot.needed(progress.step)
        sharded = parts.window.strategy.sharded  # every rank writes its shards
        if not (parts.ctx.is_main or sharded):
            return None
        losses = None
        if parts.ctx.is_main and (step_checkpoint or epoch_done is not None):  # a save that prunes
            keep_too |= self.forks.named()
            losses = self.epoch_losses(progress) if epoch_done is not None else None
        try:
            path = run_state.save(parts, progress, settings, epoch_done, step_checkpoint, keep_too, losses)
        except OSError as e:
            raise CheckpointFailed(self.not_written(e, progress.step, numbered)) from None
        if not self.read_back and parts.ctx.is_main and not sharded:
            self.read_back = True
            try:
                try:
                    ckpt.load(path, mmap=True)
                except ckpt.CheckpointRefused:
                    raise
                except ckpt.CheckpointError:  # mmap is not possible everywhere (a path that is not UTF-8)
                    ckpt.load(path)
            except ckpt.CheckpointError as e:
                raise CheckpointFailed(f"this run writes checkpoints it could not load back: {e}; "
                                       "--resume, --fork and a rollback would refuse every one") from None
        self.kept = (progress.step, numbered or path)
        return path

    def epoch_losses(self, progress: Progress) -> dict[int, Optional[float]]:
        """Every epoch's validation loss this run knows, the one just ended included (its row
        is in the checkpoint before run.db has it). The earlier ones come from run.db, read
        once: a resumed run's best epoch is not forgotten."""
        if self.val_losses is None:
            self.val_losses = earlier_val_losses(self.parts.run_dir)
        row = progress.ended_epoch
        if row is not None:
            self.val_losses[int(row["epoch"])] = row.get("val_loss")
        return self.val_losses

    def save_rolled_back(self, progress: Progress, settings: LiveSettings) -> str:
        """After a rollback: the restored state as last.pt, before training goes on, so a
        crash and --resume continue from the rollback (with its lr), not from what it
        discarded. Written even at step 0 (a rollback to the run's start)."""
        assert self.autopilot is not None
        last = ckpt.last_path(self.parts.run_dir)
        self.autopilot.saved(progress.step, last, False)
        if not self.parts.ctx.is_main:  # rollbacks are refused for sharded runs: rank 0 writes
            return last
        try:
            path = run_state.save(self.parts, progress, settings)
        except OSError as e:
            raise CheckpointFailed(self.not_written(e, progress.step, None)) from None
        self.kept = (progress.step, path)
        return path

    def not_written(self, e: OSError, step: int, numbered: Optional[str]) -> str:
        """One line: what could not be written and why, what is kept, what the next one needs."""
        last = ckpt.last_path(self.parts.run_dir)
        target = numbered or last
        if numbered is not None and os.path.exists(numbered):  # it was written; last.pt was not
            self.kept, target = (step, numbered), last
        kept = (f"the newest checkpoint kept is {os.path.basename(self.kept[1])} (step {self.kept[0]})"
                if self.kept is not None else "no checkpoint of this run is kept (none was written before)")
        what = f"could not write checkpoint {os.path.basename(target)} at step {step}"
        if e.errno not in ckpt.DISK_FULL:
            return f"{what}: {e.strerror or e}; {kept}"
        folder = os.path.dirname(last)
        files = 2 if numbered is not None else 1  # a numbered file and last.pt (each written beside the old one)
        need = f"the next checkpoint needs about {format_bytes(files * self.checkpoint_bytes())} free"
        if e.errno == errno.EFBIG:
            limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
            shown = format_bytes(limit) if limit != resource.RLIM_INFINITY else "a limit of the file system"
            return f"file too large: {what} (files here may hold at most {shown}: ulimit -f); {kept}; {need}"
        try:
            st = os.statvfs(folder)
            free = f" ({format_bytes(st.f_bavail * st.f_frsize)} free in {folder})"
        except OSError:
            free = ""
        return f"disk full: {what}; {kept}; {need}{free}"

    def checkpoint_bytes(self) -> int:
        """About how much one checkpoint of this run takes: the kept file's size, else the
        bytes of the tensors a checkpoint holds."""
        if self.kept is not None:
            try:
                path = self.kept[1]
                if os.path.isdir(path):  # a sharded checkpoint: its files
                    return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
                return os.path.getsize(path)
            except OSError:
                pass
        parts = self.parts
        tensors = list(parts.model.state_dict().values())
        for per_param in parts.optimizer.state_dict().get("state", {}).values():
            tensors += list(per_param.values()) if isinstance(per_param, dict) else []
        return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)) + 64 * 1024


def earlier_val_losses(run_dir: str) -> dict[int, Optional[float]]:
    """Epoch -> validation loss from the run's run.db (empty if it cannot be read: then the
    best is chosen among the epochs this process ends)."""
    try:
        reader = RunReader(run_dir)
    except StoreError:
        return {}
    try:
        return {int(r["epoch"]): r["val_loss"] for r in reader.epochs()}
    except (StoreError, TypeError, ValueError):
        return {}
    finally:
        reader.close()
