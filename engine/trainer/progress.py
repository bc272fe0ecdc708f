"""Where a run is: one dataclass, written into every checkpoint and read back on resume.

Step, epoch, window in epoch, the epoch's running train-loss sums and the skip
counters live here and nowhere else, so save and resume cannot disagree on which
fields make up "where the run is". The RNG state is captured at save time and
restored at load time through the same two functions.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Optional

import torch


@dataclass
class Progress:
    step: int = 0  # optimizer steps done
    epoch: int = 1  # the epoch being trained (1-based)
    window: int = 0  # windows of this epoch already trained
    epoch_offset: int = 0  # samples of this epoch already trained (where the rest of its windows start)
    epoch_loss: float = 0.0  # this epoch's sum of loss x count so far
    epoch_count: float = 0.0  # and of count
    nonfinite_steps: int = 0
    scaler_skips: int = 0
    samples: int = 0  # samples seen by optimizer steps so far (all ranks): the lr schedule's clock
    # The lr schedule as re-planned when the run's length changed while it trained (its total
    # samples, and where and at which factor of the peak the new decay starts); 0: as planned at
    # the start. Saved so that a resume goes on with the same curve (LrControl.resumed).
    plan_total: float = 0.0
    plan_from: float = 0.0
    plan_factor: float = 1.0
    # The last finished epoch's row (epoch, step, train_loss, val_loss, seconds), saved with the
    # checkpoint written at its end: a crash between that checkpoint and run.db's epochs row
    # loses nothing, a resume writes the row from here (opening.py).
    ended_epoch: Optional[dict[str, Any]] = None

    def start_epoch(self) -> None:
        """A new epoch from its first window: its train loss starts from zero."""
        self.epoch_loss = self.epoch_count = 0.0

    def add_loss(self, loss: float, count: float) -> None:
        self.epoch_loss += loss * count
        self.epoch_count += count

    @property
    def epoch_train_loss(self) -> float:
        return self.epoch_loss / self.epoch_count if self.epoch_count else float("nan")

    def end_epoch(self, row: Optional[dict[str, Any]] = None) -> None:
        """The epoch is done; `row` is its epochs row (saved with the next checkpoint)."""
        self.ended_epoch = dict(row) if row is not None else None
        self.epoch += 1
        self.window = self.epoch_offset = 0

    # -- checkpoints -------------------------------------------------------------------------
    def to_checkpoint(self, device: torch.device) -> dict[str, Any]:
        """The checkpoint keys for this state (flat, as DESIGN.md names step and epoch), RNG included."""
        state: dict[str, Any] = asdict(self)
        state["rng"] = {"torch": torch.get_rng_state(),
                        **({"cuda": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {})}
        return state

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any], device: torch.device) -> "Progress":
        """Read back what to_checkpoint wrote (older checkpoints: `epoch_sums`), and restore the RNG."""
        known = {f.name for f in fields(cls)}
        p = cls(**{k: state[k] for k in known if k in state})
        if "epoch_sums" in state and "epoch_loss" not in state:
            p.epoch_loss, p.epoch_count = (float(x) for x in state["epoch_sums"])
        p.step, p.epoch, p.window, p.epoch_offset = int(p.step), int(p.epoch), int(p.window), int(p.epoch_offset)
        rng = state.get("rng") or {}  # checked by engine/checkpoints/contents.py: a None is no state
        if rng.get("torch") is not None:
            torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], device)
        return p
