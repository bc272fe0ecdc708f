"""What a step's numbers say about it: clipped, non-finite. One rule for the engine's steps
(engine.trainer.report) and for the rows a plain loop or a framework writes (engine.integrations)."""
from __future__ import annotations

import math
from typing import NamedTuple, Optional


class StepFlags(NamedTuple):
    clipped: bool  # clipping scaled the gradients: a clip in force, a finite norm above it
    nonfinite: bool  # the loss or the norm is not finite, and no fp16 scaler skipped the step for it


def step_flags(loss: float, grad_norm: Optional[float], clip: float, scaler_skipped: bool = False) -> StepFlags:
    """The flags of an optimizer step from its loss, its gradient norm before clipping (None if
    not measured), the clip norm in force (0 = off) and whether the fp16 scaler skipped it (an
    overflow is the scaler's business: not a non-finite step)."""
    norm_ok = grad_norm is None or math.isfinite(grad_norm)
    return StepFlags(clipped=clip > 0 and grad_norm is not None and norm_ok and grad_norm > clip,
                     nonfinite=not scaler_skipped and not (norm_ok and math.isfinite(loss)))
