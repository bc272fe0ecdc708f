"""`--strategy ddp`: PyTorch's DistributedDataParallel around the task's loss call.

Every micro-batch but the window's last runs under `no_sync()`: its backward only
accumulates into the local gradients, with no collective, so an out-of-memory error there is
this rank's alone to redo. The last micro-batch's backward all-reduces the accumulated
gradients in DDP's buckets as they become ready, overlapping the backward;
`gradient_as_bucket_view=True` makes the gradients views into those buckets (no second copy).

The buckets are summed, not averaged (a communication hook of one SUM all-reduce): the
window's exact normalisation divides once by the global count, so the result equals one
process's on the same window to fp32 rounding.

Buffers are not broadcast before each forward (`forward_sync_buffers=False`): they go from rank 0
once a window, after its gradients (strategy.Replicated.after_window), so every rank holds the
same statistics at every step boundary, where checkpoints and validation read them.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, ContextManager, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from engine import distributed

from .strategy import LossCall, Replicated


def sum_hook(_state, bucket):
    """DDP's default hook divides each bucket by the world size; this one only sums. (No
    annotations: DDP checks them against dist.GradBucket, and this module's are strings.)"""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def no_forward_buffer_sync() -> dict:
    """DDP's switch for "no buffer broadcast before each forward": `forward_sync_buffers` where
    this torch has it (2.13 deprecates `broadcast_buffers` with a warning on every rank),
    `broadcast_buffers` before."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


class Ddp(Replicated):
    name = "ddp"
    collective = "all-reduce the gradients in its backward"
    grads_in_buckets = True

    def __init__(self, model: torch.nn.Module, ctx: distributed.DistContext, device: torch.device,
                 find_unused: bool = False) -> None:
        super().__init__(model, ctx, device)
        # rank 0's values are on every rank already (strategy.build): no second broadcast
        self.net: Optional[DistributedDataParallel] = DistributedDataParallel(
            LossCall(model), device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True, init_sync=False, find_unused_parameters=find_unused,
            **no_forward_buffer_sync())
        self.net.register_comm_hook(None, sum_hook)

    def begin_window(self, n_micro: int) -> int:
        return max(1, n_micro)  # every rank runs the last backward: its all-reduce needs every rank

    def forward(self, loss: Callable[[torch.nn.Module, Any], Any], batch: Any) -> Any:
        assert self.net is not None, "the DDP wrapper was released"
        return self.net(loss, batch)

    def micro_batch(self, last: bool) -> ContextManager:
        if last or self.net is None:
            return contextlib.nullcontext()
        return self.net.no_sync()

    def collectives_in(self, last: bool) -> bool:
        return last  # the last backward all-reduces the buckets

    def release(self) -> None:
        self.net = None
