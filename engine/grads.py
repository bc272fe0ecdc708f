"""Gradient arithmetic of the step: the exact normalisation, norms, clipping.

Grouped by dtype, one foreach call per group, so a step costs a handful of kernel
launches whatever the number of parameters.
"""
from __future__ import annotations

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
        torch._foreach_mul_(group, factor.to(dtype))


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


def clip_(params: list[torch.nn.Parameter], max_norm: float, total_norm: torch.Tensor) -> None:
    """Clip to max_norm given the total norm already computed. A NaN norm would smear NaN
    over every gradient; such a window is skipped anyway, so clip with 0 instead."""
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, torch.nan_to_num(total_norm, nan=0.0), foreach=True)
