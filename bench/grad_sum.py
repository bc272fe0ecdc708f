"""The engine's former gradient sum (issue 12, the engine's grad_sync module until issue 20),
kept here so the benchmarks can hold --strategy ddp against it side by side.

No wrapper: every micro-batch's backward is local, the last one too, and the window's
gradients are summed over ranks once every rank has finished its share, in buckets of at
most BUCKET_BYTES per dtype (allocated before the first collective), with the buffers
broadcast from rank 0. No collective is ever in flight in a micro-batch, so an
out-of-memory error anywhere is the rank's alone; the price: the all-reduce does not
overlap the last backward. bench/RESULTS.md has the measurement that retired it
(bench/torchrun_strategies.py): it did not win a case by more than the noise.

As a launcher, the engine's CLI with this sum in place of --strategy's:

    torchrun --nproc-per-node 2 bench/grad_sum.py --task charlm ...   (the engine's flags)
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402 - after the sys.path set-up above
import torch.distributed as dist  # noqa: E402 - after the sys.path set-up above

from engine import distributed  # noqa: E402 - after the sys.path set-up above
from engine.distributed.strategy import Replicated  # noqa: E402 - after the sys.path set-up above

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
                distributed.in_place(dist.all_reduce, g)  # a large gradient is its own bucket
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
            distributed.in_place(distributed.broadcast_from_rank0, b)
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
    """The strategy: no wrapper; every micro-batch local, the last one too, and the
    gradients summed after the window (GradSync), so no collective is ever in flight in a
    micro-batch: an out-of-memory error anywhere in the window is this rank's alone."""
    name = "sum"
    collective = "sum the gradients after the window"

    def __init__(self, model: torch.nn.Module, ctx: distributed.DistContext, device: torch.device) -> None:
        super().__init__(model, ctx, device)
        self.sync = GradSync([p for p in model.parameters() if p.requires_grad], self.buffers)

    def end_micro_batches(self) -> None:
        self.sync.prepare()

    def after_window(self) -> None:
        self.sync.reduce()  # the buffers from rank 0 too


def main() -> int:
    import engine.trainer.setup as setup
    setup.build_strategy = lambda name, model, ctx, device, **kw: (  # type: ignore[assignment]  # the benchmark swaps in the old gradient sum
        (distributed.share_rank0_model(model, ctx, device), GradSum(model, ctx, device))[1] if ctx.enabled
        else _local(model, ctx))
    from engine.cli import main as engine_main
    return engine_main(sys.argv[1:])


def _local(model: torch.nn.Module, ctx: distributed.DistContext) -> Any:
    from engine.distributed.strategy import Local
    return Local(model, ctx)


if __name__ == "__main__":
    sys.exit(main())
