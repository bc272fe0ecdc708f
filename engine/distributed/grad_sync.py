"""Under torchrun: the window's gradients summed over ranks, once, after every rank finished
its micro-batches.

Every micro-batch's backward is local, the last one too (the model is not wrapped in
DistributedDataParallel, whose reducer would all-reduce buckets during the last backward),
so no collective is ever in flight while a backward runs. An out-of-memory error anywhere in
a window is then this rank's alone: it redoes the window with a smaller micro-batch while
the others wait at the window's first collective, and every rank takes the same decision
afterwards (accumulate.py). Without the wrapper there is no second, bucketed copy of every
gradient either: the sum needs its buckets of at most BUCKET_BYTES per dtype, no more.

The price: the gradient all-reduce does not overlap the last backward. With k micro-batches
a window it is paid once per k backwards, as DDP under accumulation pays it anyway.

Nothing here allocates once the window's collectives begin: the bucket buffers are made in
`prepare()`, which runs before the first one, so an out-of-memory error cannot strike one
rank between two collectives.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from engine import distributed as D
from .strategy import Replicated

BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb


class GradSync:
    """Sums the gradients of `params` over ranks in place, in buckets of at most BUCKET_BYTES
    per dtype, and broadcasts `buffers` (BatchNorm statistics) from rank 0, as DDP does before
    each synchronised forward."""

    def __init__(self, params: list[torch.nn.Parameter], buffers: list[torch.Tensor],
                 bucket_bytes: int = BUCKET_BYTES) -> None:
        self.params, self.buffers, self.bucket_bytes = params, buffers, bucket_bytes
        self._buckets: Optional[dict[tuple[torch.dtype, torch.device], torch.Tensor]] = None
        self.reductions = 0  # windows whose gradients were summed (tests count them)

    def prepare(self) -> None:
        """Before the window's first collective, every allocation the sum needs: a zero gradient
        for a parameter this window did not reach (the same tensors on every rank, in the same
        order), and the bucket buffers, made once."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self._buckets is None:
            sizes: dict[tuple[torch.dtype, torch.device], int] = {}
            for p in self.params:
                key = (p.grad.dtype, p.grad.device)
                if p.grad.numel() * p.grad.element_size() < self.bucket_bytes:  # bigger ones go alone, in place
                    sizes[key] = sizes.get(key, 0) + p.grad.numel()
            self._buckets = {k: torch.empty(min(n, self.bucket_bytes // k[0].itemsize), dtype=k[0], device=k[1])
                             for k, n in sizes.items()}

    def reduce(self) -> None:
        """Sum every gradient over all ranks (after prepare, on every rank in the same order)."""
        assert self._buckets is not None, "prepare() first"
        pending: dict[tuple[torch.dtype, torch.device], tuple[list[torch.Tensor], list[int]]] = {}
        for p in self.params:
            g = p.grad
            assert g is not None
            key = (g.dtype, g.device)
            buf = self._buckets.get(key)
            if buf is None or g.numel() > buf.numel() or not g.is_contiguous():
                D.in_place(dist.all_reduce, g)  # a large gradient is its own bucket
                continue
            group, filled = pending.setdefault(key, ([], [0]))
            if filled[0] + g.numel() > buf.numel():
                self._flush(buf, group)
                group.clear()
                filled[0] = 0
            group.append(g)
            filled[0] += g.numel()
        for key, (group, _) in pending.items():
            self._flush(self._buckets[key], group)
        for b in self.buffers:
            D.in_place(D.broadcast_from_rank0, b)
        self.reductions += 1

    @staticmethod
    def _flush(buf: torch.Tensor, grads: list[torch.Tensor]) -> None:
        if not grads:
            return
        views, offset = [], 0
        for g in grads:
            views.append(buf[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        torch._foreach_copy_(views, grads)
        dist.all_reduce(buf[:offset])
        torch._foreach_copy_(grads, views)



class GradSum(Replicated):
    """`--strategy sum`: no wrapper; every micro-batch local, the last one too, and the
    gradients summed after the window (GradSync), so no collective is ever in flight in a
    micro-batch: an out-of-memory error anywhere in the window is this rank's alone."""
    name = "sum"
    collective = "sum the gradients after the window"

    def __init__(self, model: torch.nn.Module, ctx: D.DistContext, device: torch.device) -> None:
        super().__init__(model, ctx, device)
        self.sync = GradSync([p for p in model.parameters() if p.requires_grad], self.buffers)

    def end_micro_batches(self) -> None:
        self.sync.prepare()

    def after_window(self) -> None:
        self.sync.reduce()  # the buffers from rank 0 too
