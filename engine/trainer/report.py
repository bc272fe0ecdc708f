"""From a finished step's numbers to what the user sees: the metrics row, whether the
window was skipped and why, which parameters went non-finite. (A failure's message: failure.py.)"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from engine.accumulation.grads import dtype_order
from engine.accumulation.step import InFlight, WindowNumbers
from engine.declarations.events import Event, NonFinite, ScalerSkip, StepMetrics
from engine.declarations.settings import LiveSettings
from engine.declarations.step_flags import step_flags
from engine.memory.breakdown import MemoryBreakdown, activations
from engine.memory.telemetry import MemorySample


@dataclass(frozen=True)
class Launched:
    """What the loop knew about a step when it launched it (its numbers may come later)."""
    step: int
    epoch: int
    samples: int  # in the window, all ranks
    accum: int  # micro-batches this rank ran (the metrics row's accum)
    settings: LiveSettings
    started: float
    mem: Any  # telemetry.MemorySample taken right after the launch
    flight: InFlight
    breakdown: Optional[MemoryBreakdown] = None  # params/grads/optimizer bytes at the window's end
    device: Optional[torch.device] = None


def skip_kind(nums: WindowNumbers, scaler: Optional[torch.amp.GradScaler]) -> str:
    """'' for a good window; 'scaler' for an fp16 overflow (the GradScaler's business, not a
    NaN in the model); 'nonfinite' for a non-finite loss or gradient."""
    if nums.finite:
        return ""
    if scaler is not None and math.isfinite(nums.loss) and nums.count > 0:
        return "scaler"
    return "nonfinite"


def skip_events(launched: Launched, nums: WindowNumbers, skip: str, parts: Any, mode: str) -> list[Event]:
    """What a skipped window says: an fp16 overflow (the scaler's new scale), or a non-finite
    loss or gradient with the parameters it came from."""
    if skip == "scaler":
        return [ScalerSkip(launched.step, launched.epoch, scale=float(parts.scaler.get_scale()))]
    if skip == "nonfinite":
        return [NonFinite(launched.step, launched.epoch, params=nonfinite_params(parts.named_params, nums),
                          loss_finite=math.isfinite(nums.loss), action="stopped" if mode == "stop" else "skipped")]
    return []


def step_metrics(launched: Launched, nums: WindowNumbers, skip: str) -> StepMetrics:
    s, mem = launched.settings, launched.mem
    if nums.memory:  # torchrun on CUDA: the tightest rank's, gathered in the step's all-reduce
        mem = MemorySample(*nums.memory)
    step_time = time.perf_counter() - launched.started
    # a non-finite window is skipped, never clipped: the flag needs the whole window finite
    return StepMetrics(
        launched.step, launched.epoch, loss=nums.loss, grad_norm=nums.norm,
        clipped=nums.finite and step_flags(nums.loss, nums.norm, s.clip).clipped, lr=s.lr, accum=launched.accum,
        clip=s.clip, micro_batch=s.micro_batch, samples=launched.samples, tokens=int(nums.count), step_time=step_time,
        throughput=nums.count / step_time if step_time > 0 else 0.0, nonfinite=skip == "nonfinite",
        scaler_skipped=skip == "scaler", mem_allocated=mem.allocated, mem_reserved=mem.reserved,
        mem_peak=mem.peak, mem_used=mem.used, mem_total=mem.total,
        **_breakdown_columns(launched.breakdown, mem.peak, launched.device),
        **{name: getattr(s, name) for name in StepMetrics.setting_columns})  # any other per-step setting


def _breakdown_columns(b: Optional[MemoryBreakdown], peak: Optional[int],
                       device: Optional[torch.device]) -> dict[str, Optional[int]]:
    if b is None:
        return {}
    return dict(mem_params=b.params, mem_grads=b.grads, mem_optimizer=b.optimizer,
                mem_activations=activations(peak, b, device) if peak else None)


def nonfinite_params(named: list[tuple[str, torch.nn.Parameter]], nums: WindowNumbers) -> tuple[str, ...]:
    """Names of the parameters whose gradient norm was not finite, in the order the
    per-parameter norms were taken (grads.dtype_order of the gradients held)."""
    held = [(n, q) for n, q in named if q.grad is not None]
    if len(held) != len(nums.per_param):  # gradients were dropped since: name all parameters
        held = named
    ordered = [held[k] for k in dtype_order([q for _, q in held])]
    return tuple(n for (n, _), v in zip(ordered, nums.per_param) if not math.isfinite(v))
