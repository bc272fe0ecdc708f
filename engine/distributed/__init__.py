"""torchrun support: who am I, and the few collectives the step needs.

Under torchrun (WORLD_SIZE > 1) every rank starts from rank 0's model (`share_rank0_model`)
and the run's strategy shares the windows' work (strategy.py: DistributedDataParallel or
FSDP2, ddp.py and fsdp.py); this module reads the environment, starts the process group
(NCCL on GPUs, gloo on CPU) and offers small helpers. Right after the group starts every rank
checks that the others run the same job (agree.py); a refusal there, or a failure, leaves the
group as leaving.py says.
"""
from __future__ import annotations

import datetime
import hashlib
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from engine.declarations.config import ConfigError

from .agree import agree_on_run as agree_on_run
from .leaving import failed_peer as failed_peer
from .leaving import leave_refused as leave_refused
from .leaving import tell_rank0 as tell_rank0


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    launched: bool = False  # started by torchrun (even with one process: the gradient sum and NCCL then run too)

    @property
    def enabled(self) -> bool:
        return self.world > 1 or self.launched

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env() -> DistContext:
    """torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and TORCHELASTIC_RUN_ID; a plain process has none."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ or "MASTER_ADDR" not in os.environ:
        return DistContext()
    return DistContext(rank=int(os.environ["RANK"]), world=int(os.environ["WORLD_SIZE"]),
                       local_rank=int(os.environ.get("LOCAL_RANK", "0")), launched=True)


def init(ctx: DistContext, device: torch.device, timeout_s: float = 120.0) -> None:
    if not ctx.enabled or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(seconds=timeout_s)}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)


def all_reduce_sum(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    if ctx.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def any_rank(flag: bool, ctx: DistContext, device: torch.device) -> bool:
    """True on every rank if `flag` is true on any rank (a one-number all-reduce)."""
    if not ctx.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def broadcast_object(obj: Any, ctx: DistContext) -> Any:
    if not ctx.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def share_rank0_model(model: torch.nn.Module, ctx: DistContext, device: torch.device) -> None:
    """What DistributedDataParallel's constructor does, once for every strategy (FSDP2 shards
    each rank's own values, so they must be rank 0's first): check that every rank built the
    same parameters and buffers (one line if not, not DDP's multi-line shape dump), then give
    every rank rank 0's values."""
    if not ctx.enabled:
        return
    named = list(model.named_parameters()) + list(model.named_buffers())
    layout = repr([(n, tuple(t.shape), str(t.dtype)) for n, t in named])
    h = int.from_bytes(hashlib.sha256(layout.encode()).digest()[:7], "big")
    t = torch.tensor([h, -h], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # [max h, -min h]: equal on every rank, h iff all agree
    if int(t[0]) != h or -int(t[1]) != h:  # every rank sees the difference
        raise ConfigError(f"under torchrun every rank must build the same model: rank {ctx.rank}'s parameters "
                          "and buffers (names, shapes, dtypes) differ from another rank's")
    with torch.no_grad():
        for _, x in named:
            in_place(broadcast_from_rank0, x)


def broadcast_from_rank0(t: torch.Tensor) -> None:
    dist.broadcast(t, src=0)


def in_place(collective: Callable[[torch.Tensor], Any], t: torch.Tensor) -> None:
    """Run `collective` on `t` in place; a tensor of an unusual layout goes through a
    contiguous copy (the collectives take contiguous tensors only)."""
    if t.is_contiguous():
        collective(t)
        return
    flat = t.contiguous()
    collective(flat)
    t.copy_(flat)


def shutdown(ctx: DistContext, clean: bool = True) -> None:
    """After a clean finish every rank meets at a barrier, so no rank tears the group down
    while another (rank 0 writing its last checkpoint) still needs it, then the group is
    destroyed: its threads end here, not at the interpreter's exit (where a gloo thread that
    frees a tensor needs the GIL of an interpreter being torn down, and the process aborts).

    After a failure the group is left as it is: a peer may be inside a collective waiting for
    this rank, and a graceful teardown races with it (seen once in CI: one rank failed and
    tore its group down, the other waited in its recv until the 120 s gloo timeout). The
    process's exit closes the connections at once, which ends the peers' waits with an error
    (as every failure test under torchrun shows, in seconds)."""
    if not (clean and ctx.enabled and dist.is_initialized()):
        return
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        pass
