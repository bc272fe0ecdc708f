"""What a run ended as, and the errors a run can end with after it started."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


def first_line(e: BaseException, limit: Optional[int] = None) -> str:
    """An error's first line for a one-line message (its class name when it says nothing)."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__


class TrainingError(RuntimeError):
    """The run failed after it started; the message is for the user."""


class NonFiniteStop(TrainingError):
    pass


class OutOfMemoryStop(TrainingError):
    pass


class CheckpointFailed(TrainingError):
    """A checkpoint could not be written (a full disk: the message says which checkpoint was
    kept and what the next one needs), or what was written cannot be loaded back. The run
    stops without a second try."""


class StepNotRedoable(OutOfMemoryStop):
    """Under torchrun, out of memory after the window's gradients were summed over ranks (in
    the optimizer step): the other ranks have moved on, so this rank cannot redo the window
    alone. The run stops; this rank's weights may be half-stepped, so its state is not saved
    (the last checkpoint is kept)."""


@dataclass
class RunResult:
    run_dir: str
    steps: int
    epochs_done: int
    reason: str
    final_loss: Optional[float]
    nonfinite_steps: int = 0
    scaler_skips: int = 0
    losses: list[float] = field(default_factory=list)
    message: str = ""  # why a run that did not complete stopped, for the user
    store_lost: str = ""  # what run.db did not take ("" = every row reached disk): the exit code is not 0
