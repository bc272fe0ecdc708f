"""One optimizer step as a training loop reports it: the record `HeadroomRun` writes as a metrics row.

A plain loop gives `HeadroomRun.log_step` what it knows (tensors or floats, defaults left
out): `loop_step` checks it and fills the defaults. The framework adapters build a
`StepRecord` of plain values themselves (several steps after one host sync) and pass it to
`HeadroomRun.record_step`. Either way the record is passed once, to `StepRows.write`
(engine.integrations._loop_rows). Torch-free: a tensor is read through its `item()`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from engine.declarations.step_flags import step_flags

from ._loop_events import IntegrationError

STEPPED = "not skipped (the optimizer stepped)"  # what a non-finite step's event says was done


@dataclass(slots=True)  # not frozen: built once a step, and frozen init costs a setattr a field
class StepRecord:
    """A step's values, plain Python numbers. `clipped` and `nonfinite` left None are derived
    from the loss, norm and clip (engine.declarations.step_flags)."""
    step: int
    epoch: int
    loss: float  # the window's loss, token-weighted
    grad_norm: Optional[float]  # total norm before clipping; None if not measured
    lr: Optional[float]
    accum: int  # micro-batches in the window
    clip: float  # the clip norm in force (0 = off)
    micro_batch: Optional[int]
    samples: Optional[int]  # samples in the window, all processes
    tokens: Optional[int]  # the loss's count, all processes
    step_time: float  # seconds
    scaler_skipped: bool = False
    clipped: Optional[bool] = None
    nonfinite: Optional[bool] = None
    framework_loss: Optional[float] = None  # the window's loss as the framework reports it, if it differs
    bad_params: tuple[str, ...] = ()  # named by a non-finite step's event
    nonfinite_action: str = STEPPED

    def __post_init__(self) -> None:
        if self.clipped is None or self.nonfinite is None:
            flags = step_flags(self.loss, self.grad_norm, self.clip, self.scaler_skipped)
            if self.clipped is None:
                self.clipped = flags.clipped
            if self.nonfinite is None:
                self.nonfinite = flags.nonfinite


def number(v: Any, what: str, allow_none: bool = True) -> Optional[float]:
    """A float from a float, int or 0-d tensor (read to the host here)."""
    if type(v) is float:  # the per-step fast path
        return v
    if v is None:
        if allow_none:
            return None
        raise IntegrationError(f"log_step: {what} is required")
    if isinstance(v, bool):
        raise IntegrationError(f"log_step: {what} must be a number, got {v!r}")
    if isinstance(v, (int, float)):
        return float(v)
    item = getattr(v, "item", None)
    if callable(item) and getattr(v, "numel", lambda: 1)() == 1:
        return float(item())
    raise IntegrationError(f"log_step: {what} must be a number or a one-element tensor, got {type(v).__name__}")


INDEX_MAX = 2 ** 62  # a step or epoch beyond this is no index: run.db's INTEGER holds 2**63 - 1


def logged_index(v: Any) -> Optional[int]:
    """A step or epoch number a framework logged (Lightning's "epoch" is whatever the module
    logged under that name), as an int, or None when it is none: NaN, inf, a string, a tensor of
    many values, a bool, a number run.db cannot hold. Never raises: a logged value is data, and
    the caller keeps its own index instead."""
    if isinstance(v, bool):
        return None
    try:
        item = getattr(v, "item", None)
        if callable(item) and not isinstance(v, (int, float)):
            if getattr(v, "numel", lambda: 1)() != 1:
                return None
            v = item()
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return None
        i = int(v)  # NaN: ValueError, inf: OverflowError
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None
    return i if -INDEX_MAX <= i <= INDEX_MAX else None


def integer(v: Any, what: str, minimum: int = 0) -> Optional[int]:
    if type(v) is int and v >= minimum:  # the per-step fast path
        return v
    if v is None:
        return None
    if not isinstance(v, bool):
        item = getattr(v, "item", None)
        if callable(item) and not isinstance(v, int):
            v = item()
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, int) and v >= minimum:
            return int(v)
    raise IntegrationError(f"{what} must be an integer >= {minimum}, got {v!r}")


def loop_step(loss: Any, *, grad_norm: Any, lr: Any, accum: Any, micro_batch: Any, samples: Any, tokens: Any,
              clip: Any, clipped: Optional[bool], step_time: Optional[float], nonfinite: Optional[bool],
              scaler_skipped: bool, epoch: Any, step: Any, framework_loss: Optional[float],
              bad_params: tuple[str, ...], nonfinite_action: str, last_step: int, this_epoch: int,
              world_size: int, elapsed: float) -> StepRecord:
    """HeadroomRun.log_step's arguments, checked, with their defaults: the step after `last_step`,
    in `this_epoch`; samples and micro-batch from each other (x `world_size` processes); tokens =
    samples; step_time = `elapsed`, the seconds since the previous step."""
    loss_f = loss if type(loss) is float else number(loss, "loss", allow_none=False)
    assert loss_f is not None  # (allow_none=False: a float or it raised)
    norm = grad_norm if grad_norm is None or type(grad_norm) is float else number(grad_norm, "grad_norm")
    lr_f = lr if lr is None or type(lr) is float else number(lr, "lr")
    clip_f = clip if type(clip) is float else (number(clip, "clip") or 0.0)
    accum_i = accum if type(accum) is int and accum >= 1 else integer(accum, "accum", 1)
    if accum_i is None:
        raise IntegrationError("log_step: accum must be an integer >= 1, got None")
    samples_i = samples if samples is None or type(samples) is int else integer(samples, "samples")
    micro_i = micro_batch if micro_batch is None or type(micro_batch) is int else integer(micro_batch, "micro_batch", 1)
    if micro_i is None and samples_i is not None:
        micro_i = max(1, samples_i // max(1, accum_i * world_size))
    if samples_i is None and micro_i is not None:
        samples_i = micro_i * accum_i * world_size
    tokens_i = tokens if tokens is None or type(tokens) is int else integer(tokens, "tokens")
    if tokens_i is None:
        tokens_i = samples_i
    if step_time is None:
        step_time = elapsed
    elif not isinstance(step_time, (int, float)) or isinstance(step_time, bool) or step_time < 0:
        raise IntegrationError(f"log_step: step_time must be seconds >= 0, got {step_time!r}")
    step_i = last_step + 1 if step is None else integer(step, "step", 1)
    epoch_i = this_epoch if epoch is None else integer(epoch, "epoch", 1)
    assert step_i is not None and epoch_i is not None  # (from numbers: an int or it raised)
    return StepRecord(step=step_i, epoch=epoch_i, loss=loss_f, grad_norm=norm, lr=lr_f, accum=accum_i, clip=clip_f,
                      micro_batch=micro_i, samples=samples_i, tokens=tokens_i, step_time=float(step_time),
                      scaler_skipped=bool(scaler_skipped), clipped=None if clipped is None else bool(clipped),
                      nonfinite=None if nonfinite is None else bool(nonfinite), framework_loss=framework_loss,
                      bad_params=bad_params, nonfinite_action=nonfinite_action)
