"""What a run ended as, and the errors a run can end with after it started."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


class TrainingError(RuntimeError):
    """The run failed after it started; the message is for the user."""


class NonFiniteStop(TrainingError):
    pass


class OutOfMemoryStop(TrainingError):
    pass


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
