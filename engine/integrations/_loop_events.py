"""What the integrations share below their writer: their error and the events only they emit
(frozen dataclasses of plain numbers, kinds the app shows as notes). Torch-free."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from engine.declarations.config import ConfigError
from engine.declarations.events import Event, Paused


class IntegrationError(ConfigError):
    """A bad argument to an integration (one line, like the engine's ConfigError)."""


# -- events only the integrations emit (frozen, plain numbers; kinds the app shows as notes) ----------

@dataclass(frozen=True)
class PausedAtStep(Paused):
    """The engine pauses at epoch ends; a foreign loop between optimizer steps."""

    def message(self) -> str:
        return f"paused after step {self.step}"


@dataclass(frozen=True)
class LossWeighting(Event):
    """The framework's window loss (what it backpropagated: a mean of micro-batch means)
    against the window's token-weighted loss (sum of loss sums / total count), which is
    what the `metrics` row's `loss` holds. Emitted at the first step they differ by more
    than 0.1%, and at each epoch end with that epoch's largest gap."""
    framework_loss: float
    weighted_loss: float
    gap: float  # (framework - weighted) / weighted
    steps: int  # steps of the epoch whose gap was over 0.1% (1 for the first note)
    kind: ClassVar[str] = "loss_weighting"

    def message(self) -> str:
        gap = (f"framework loss {self.framework_loss:.4g} vs token-weighted {self.weighted_loss:.4g} "
               f"({self.gap:+.1%})")
        if self.steps <= 1:
            return (f"{gap} at step {self.step}: the framework averages micro-batch means, so its gradient "
                    "weights tokens unequally (README: 'Already have a training script?')")
        return f"epoch {self.epoch}: {self.steps} steps with the two losses apart by over 0.1%; largest, step {self.step}: {gap}"


@dataclass(frozen=True)
class StepSkipped(Event):
    """The framework itself skipped work: micro-batches whose training_step returned None."""
    micro_batches: int
    reason: str
    kind: ClassVar[str] = "step_skipped"

    def message(self) -> str:
        return f"{self.micro_batches} micro-batch(es) skipped at step {self.step}: {self.reason}"
