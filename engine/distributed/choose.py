"""The run's strategy, from --strategy (strategy.py says what a strategy is)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from engine import distributed

from .ddp import Ddp
from .fsdp import Fsdp
from .strategy import Local


def build(name: str, model: torch.nn.Module, ctx: distributed.DistContext, device: torch.device, *,
          blocks: Optional[Callable[[torch.nn.Module], Any]] = None, precision: str = "fp32",
          fsdp_reduce: str = "last", cpu_offload: bool = False, unused: frozenset = frozenset()) -> Local:
    """The run's strategy: Local in one process; under torchrun (after the process group
    started) the model is made rank 0's on every rank, then wrapped."""
    if not ctx.enabled:
        return Local(model, ctx)
    distributed.share_rank0_model(model, ctx, device)
    if name == "fsdp":
        return Fsdp(model, ctx, device, blocks=blocks, precision=precision, reduce=fsdp_reduce,
                    cpu_offload=cpu_offload)
    return Ddp(model, ctx, device, find_unused=bool(unused))
