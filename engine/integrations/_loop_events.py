"""What the integrations share below their writer: their error and the events only they emit
(frozen dataclasses of plain numbers, kinds the app shows as notes). Torch-free."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

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
    """An optimizer step the framework made differently from the exact one (the whole window
    as one batch). Emitted at the first such step, and at the end of every epoch that had any
    (`epoch_summary`, with that epoch's largest error and how many steps had one).

    The size is the update's: `grad_error` = |update - exact| / |exact| of the gradients before
    clipping, `grad_scale` = <update, exact> / |exact|^2 (4.0: four times too large), measured
    as `measured` says: "gradients" (the two gradients compared), "scale" (every micro-batch
    weighted by one common factor: the update is that factor times the exact one), "weights"
    (micro-batches weighted unequally, `weights` = the lowest and highest weight relative to
    the exact one; gradients not compared at that step), "" (a plain loop that gave only its
    framework's loss: the two loss values compared). The loss values are beside it:
    `framework_loss` as the framework reports it, `weighted_loss` the window's true
    token-weighted loss (the `metrics` row's `loss`), `gap` = (framework - weighted) / weighted."""
    framework_loss: Optional[float]
    weighted_loss: float
    gap: Optional[float]  # (framework - weighted) / weighted
    steps: int  # steps of the epoch off the exact update (1 for the first note)
    grad_error: Optional[float] = None
    grad_scale: Optional[float] = None
    measured: str = ""
    weights: tuple = ()  # (lowest, highest) micro-batch weight relative to the exact one
    cause: str = ""
    fix: str = ""
    epoch_summary: bool = False
    kind: ClassVar[str] = "loss_weighting"

    def size(self) -> str:
        """The error, in words."""
        how = {"gradients": "gradients compared", "scale": "every micro-batch weighted alike"}.get(self.measured, "")
        err, scale = self.grad_error, self.grad_scale
        if err is not None and scale is not None and how:
            if abs(err - abs(scale - 1.0)) <= 1e-3 * max(1.0, err):  # the update is the exact one, scaled
                return f"the update is {scale:.4g}x the exact one ({scale - 1:+.1%}; {how})"
            return f"the update is off the exact one by {err:.1%} ({how}; {scale:.4g}x along it)"
        if self.weights:
            lo, hi = self.weights[0], self.weights[-1]
            return f"micro-batches weighted {lo:.3g}x to {hi:.3g}x their share of the window's count"
        if self.gap is not None:
            return f"the loss is off the token-weighted one by {self.gap:+.1%}"
        return "the update is off the exact one"

    def message(self) -> str:
        loss = f"loss {self.weighted_loss:.4g} token-weighted"
        if self.framework_loss is not None:
            loss += f", {self.framework_loss:.4g} as the framework reports it"
        why = f" Cause: {self.cause}." if self.cause else (
            " The framework averages micro-batch means, so its gradient weights tokens unequally." if not self.measured
            else "")
        fix = f" Fix: {self.fix}." if self.fix else " (README: 'Already have a training script?')"
        if self.epoch_summary:
            return (f"epoch {self.epoch}: {self.steps} step(s) off the exact update; largest at step {self.step}: "
                    f"{self.size()} ({loss}).{why}{fix}")
        return f"step {self.step}: {self.size()} ({loss}).{why}{fix}"


@dataclass(frozen=True)
class StepSkipped(Event):
    """The framework itself skipped work: micro-batches whose training_step returned None."""
    micro_batches: int
    reason: str
    kind: ClassVar[str] = "step_skipped"

    def message(self) -> str:
        return f"{self.micro_batches} micro-batch(es) skipped at step {self.step}: {self.reason}"
