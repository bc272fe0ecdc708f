"""Gradient arithmetic of the step: the exact normalisation, norms, clipping.

Grouped by dtype, one foreach call per group, so a step costs a handful of kernel
launches whatever the number of parameters.
"""
from __future__ import annotations

import math
import struct

import torch


def by_dtype(tensors: list[torch.Tensor]) -> dict[torch.dtype, list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return groups


def dtype_order(tensors: list[torch.Tensor]) -> list[int]:
    """Indices of `tensors` grouped by dtype (first-seen order), as per_param_norms lists them."""
    groups: dict[torch.dtype, list[int]] = {}
    for k, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(k)
    return [k for ks in groups.values() for k in ks]


def scale_(grads: list[torch.Tensor], factor: torch.Tensor) -> None:
    """grads *= factor, one fused multiply per dtype (factor stays on the device: no sync)."""
    for dtype, group in by_dtype(grads).items():
        torch._foreach_mul_(group, factor.to(group[0].device, dtype))  # (fsdp --cpu-offload: grads on the CPU)


def scale_by_(grads: list[torch.Tensor], factor: float) -> None:
    """grads *= a host number, one fused multiply per dtype."""
    for group in by_dtype(grads).values():
        torch._foreach_mul_(group, factor)


def per_param_norms(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The 2-norm of every gradient, in dtype_order, as one tensor."""
    if not grads:
        return torch.zeros(1, device=device)
    groups = by_dtype(grads)
    if len(groups) == 1:  # the common case: one dtype, no cat
        return torch.stack(torch._foreach_norm(grads))
    wide = torch.float64 if torch.float64 in groups else torch.float32
    return torch.cat([torch.stack(torch._foreach_norm(group)).to(wide) for group in groups.values()])


def clip_(grads: list[torch.Tensor], max_norm: float, total_norm: torch.Tensor) -> None:
    """Clip to max_norm given the total norm already computed, on the device (no sync), as
    clip_grads_with_norm_ does. A NaN norm would smear NaN over every gradient; such a
    window is skipped anyway, so clip with 0 instead."""
    coef = torch.clamp(max_norm / (torch.nan_to_num(total_norm, nan=0.0) + 1e-6), max=1.0)
    for group in by_dtype(grads).values():
        torch._foreach_mul_(group, coef.to(group[0].device))  # the coefficient in the norm's dtype, as torch clips


def clip_by_host_norm_(grads: list[torch.Tensor], max_norm: float, total_norm: torch.Tensor,
                       host_norm: float) -> None:
    """clip_ with the norm also on the host (the synchronous step, whose norm is finite): the
    float32 coefficient is computed on the host exactly as clip_ computes it on the device, so
    the gradients end bit-identical, and under the clip norm they are not touched at all."""
    if total_norm.dtype != torch.float32:
        clip_(grads, max_norm, total_norm)
        return
    _clip_by_f32_coef(grads, max_norm, host_norm)


def clip_params_by_host_norm_(params: list[torch.Tensor], max_norm: float, total_norm: torch.Tensor,
                              host_norm: float) -> None:
    """torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm), bit for bit, when
    the norm is also on the host (the integrations read it anyway): for a finite float32 norm
    the coefficient is host arithmetic, as in clip_by_host_norm_; anything else (a NaN or inf
    norm, another dtype) goes to torch's own function."""
    if total_norm.dtype == torch.float32 and math.isfinite(host_norm) and math.isfinite(max_norm):
        _clip_by_f32_coef([p.grad for p in params if p.grad is not None], max_norm, host_norm)
        return
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm)


def _clip_by_f32_coef(grads: list[torch.Tensor], max_norm: float, norm: float) -> None:
    coef = _f32_clip_coef(max_norm, norm)
    if coef < 1.0:
        scale_by_(grads, coef)


_F32 = struct.Struct("f")


def _f32(x: float) -> float:
    """x rounded to float32 (the host's float64 arithmetic of two float32 values, rounded
    once, is float32's correctly rounded +, *, /)."""
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _f32_clip_coef(max_norm: float, norm: float) -> float:
    """clamp(max_norm / (norm + 1e-6), max=1) in float32 as torch evaluates it: a scalar over
    a tensor is the tensor's reciprocal times the scalar."""
    reciprocal = _f32(1.0 / _f32(norm + _f32(1e-6)))
    return min(1.0, _f32(reciprocal * _f32(max_norm)))
