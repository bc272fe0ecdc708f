"""`--strategy fsdp`: FSDP2 (`torch.distributed.fsdp.fully_shard`) on each block, then the root.

Each rank holds 1/world of every parameter, of its gradient and of the optimizer state
(DTensors sharded on dim 0); a block's parameters are all-gathered whole just before they
are used and its gradients reduce-scattered after its backward. The root is a `LossCall`
around the user's model, so whatever the loss calls runs inside the root's forward.

Blocks: the task's `blocks(model)`, else a Hugging Face model's `_no_split_modules` classes,
else each top-level child holding parameters (a ModuleList's or ModuleDict's children in its
place: those have no forward); a candidate that shares a parameter with a
module outside it (tied weights) is left to the root.

Gradient reduction (`--fsdp-reduce`):
- `last` (default): at the window's start every block is gathered whole once and stays whole
  through the window; every micro-batch but the last accumulates whole gradients locally,
  with no collective at all (`set_requires_gradient_sync(False)`), so an out-of-memory error
  there is this rank's alone to redo; the last micro-batch's backward reduce-scatters and
  reshards. Memory during the window: whole parameters and gradients, as DDP; at rest
  (optimizer step, checkpoints): shards.
- `every`: blocks are gathered for each forward and backward and resharded after, and every
  micro-batch's backward reduce-scatters: the least memory, collectives in every micro-batch.

Reductions are sums (divide factor 1, SUM only): the window's exact normalisation divides once
by the global count. `--precision bf16` gathers parameters in bfloat16 and reduces in float32
(MixedPrecisionPolicy); `--cpu-offload` keeps the shards on the CPU (CPUOffloadPolicy).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Iterator, Optional, cast

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from engine import distributed
from engine.declarations.config import ConfigError

from .strategy import LossCall, Replicated


def find_blocks(model: torch.nn.Module, blocks: Optional[Callable[[torch.nn.Module], Any]] = None
                ) -> list[torch.nn.Module]:
    """The modules to shard one by one, innermost first (fully_shard's order)."""
    if blocks is not None:
        try:
            found = list(blocks(model))
        except Exception as e:
            raise ConfigError(f"the task's blocks(model) failed: {type(e).__name__}: {e}") from None
        inside = {id(m) for m in model.modules()}
        for m in found:
            if not isinstance(m, torch.nn.Module) or id(m) not in inside or m is model:
                raise ConfigError("the task's blocks(model) must return submodules of the model (not the model "
                                  f"itself), got {type(m).__name__}")
    elif getattr(model, "_no_split_modules", None):
        no_split: Any = model._no_split_modules  # Hugging Face's list of block class names
        names = set(no_split)
        found = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    else:
        found = [c for c in _unpacked(model.children()) if any(True for _ in c.parameters())]
    depth = {id(m): len(name.split(".")) for name, m in model.named_modules() if name}
    unique = list({id(m): m for m in found}.values())
    kept = [m for m in unique if not _shares_parameters(model, m)]
    return sorted(kept, key=lambda m: -depth.get(id(m), 0))


def _unpacked(modules: Any) -> list[torch.nn.Module]:
    """ModuleList and ModuleDict have no forward of their own (fully_shard needs one): their
    children instead."""
    out: list[torch.nn.Module] = []
    for m in modules:
        out += _unpacked(m.children()) if isinstance(m, (torch.nn.ModuleList, torch.nn.ModuleDict)) else [m]
    return out


def _shares_parameters(model: torch.nn.Module, block: torch.nn.Module) -> bool:
    """Whether a parameter of `block` is also held by a module outside it (tied weights)."""
    inside = {id(m) for m in block.modules()}
    mine = {id(p) for p in block.parameters()}
    for m in model.modules():
        if id(m) in inside:
            continue
        if any(id(p) in mine for p in m.parameters(recurse=False)):
            return True
    return False


class Fsdp(Replicated):
    name = "fsdp"
    sharded = True

    def __init__(self, model: torch.nn.Module, ctx: distributed.DistContext, device: torch.device, *,
                 blocks: Optional[Callable[[torch.nn.Module], Any]] = None, precision: str = "fp32",
                 reduce: str = "last", cpu_offload: bool = False) -> None:
        super().__init__(model, ctx, device)
        if cpu_offload and device.type != "cuda":
            raise ConfigError("--cpu-offload needs a CUDA device (it keeps the shards in CPU memory while the "
                              "GPU computes)")
        self.reduce, self.offloaded = reduce, cpu_offload
        self.collective = ("reduce-scatter the gradients in its backward" if reduce == "last"
                           else "gather parameters and reduce-scatter gradients in every micro-batch")
        mesh = init_device_mesh(device.type, (ctx.world,))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16"
              else MixedPrecisionPolicy())
        offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
        self.blocks = find_blocks(model, blocks)
        for b in self.blocks:
            fully_shard(b, mesh=mesh, mp_policy=mp, offload_policy=offload)
        self.root: Any = fully_shard(LossCall(model), mesh=mesh, mp_policy=mp, offload_policy=offload)
        root = cast(torch.nn.Module, self.root)  # fully_shard returns the module, its class swapped in place
        self.modules: list[Any] = [m for m in root.modules() if isinstance(m, FSDPModule)]
        for m in self.modules:
            m.set_gradient_divide_factor(1.0)  # sums: the exact normalisation divides once, by the global count
            m.set_force_sum_reduction_for_comms(True)
            if reduce == "last":
                m.set_reshard_after_forward(False, recurse=False)  # whole through the window
        self.root._get_fsdp_state()._lazy_init()  # the root is known before the first forward

    # -- the window ---------------------------------------------------------------------------
    def forward(self, loss: Callable[[torch.nn.Module, Any], Any], batch: Any) -> Any:
        return self.root(loss, batch)

    def begin_window(self, n_micro: int) -> int:
        if self.reduce != "last":  # every micro-batch gathers and reduces: the same number on every rank
            most = torch.tensor([max(1, n_micro)], dtype=torch.int64, device=self.device)
            dist.all_reduce(most, op=dist.ReduceOp.MAX)
            return int(most.item())
        self.root.set_requires_gradient_sync(False)
        self.root.set_reshard_after_backward(False)
        for m in self.modules:  # the window's only all-gathers (a no-op when already whole)
            m.unshard()
        return max(1, n_micro)  # every rank runs the last backward: its reduce-scatters need every rank

    @contextlib.contextmanager
    def _last_reduces(self, last: bool) -> Iterator[None]:
        if last and self.reduce == "last":
            self.root.set_requires_gradient_sync(True)
            self.root.set_reshard_after_backward(True)
        yield

    def micro_batch(self, last: bool) -> ContextManager:
        return self._last_reduces(last)

    def collectives_in(self, last: bool) -> bool:
        return last or self.reduce == "every"

    def forget_window(self) -> None:
        """What FSDP's own reset_iter_state does after a failed forward or backward, except
        the reshard: the parameters stay whole, so redoing the window needs no all-gather
        (which would pair with another rank's reduce-scatter). Only called where no
        collective was in flight (collectives_in was False)."""
        state = self.root._get_fsdp_state()
        from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState
        for s in state._state_ctx.all_states:
            s._modules_to_run_forward.clear()
            s._training_state = TrainingState.IDLE
            for group in s._fsdp_param_groups:
                group._training_state = TrainingState.IDLE
                group._post_forward_indices.clear()
                group._partial_reduce_output = None
                for fp in group.fsdp_params:
                    fp.unsharded_accumulated_grad = None
                    whole = getattr(fp, "_unsharded_param", None)
                    if whole is not None:
                        whole.grad = None
        state._comm_ctx.post_forward_order.clear()
        state._state_ctx.iter_forward_root = None
        state._state_ctx.post_backward_final_callback_queued = False

    # -- the step -----------------------------------------------------------------------------
    def local_grads(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        return [g.to_local() if isinstance(g, DTensor) else g for g in grads]

    def global_norms(self, per_param: torch.Tensor) -> torch.Tensor:
        """sqrt(sum over ranks of each shard's squared norm): one all-reduce of a number per
        parameter, in float64."""
        sq = per_param.to(self.device, torch.float64).square()
        dist.all_reduce(sq)
        return sq.sqrt().to(per_param.dtype)

    # -- validation -----------------------------------------------------------------------------
    def eval_forward(self, loss: Callable[[torch.nn.Module, Any], Any], batch: Any) -> Any:
        return self.root(loss, batch)

    @contextlib.contextmanager
    def _whole(self) -> Iterator[None]:
        for m in self.modules:  # the same all-gathers on every rank, whatever its number of batches
            m.unshard()
            m.set_reshard_after_forward(False, recurse=False)
        try:
            yield
        finally:
            for m in self.modules:
                m.reshard()  # local: frees the gathered parameters
                if self.reduce == "every" and m is not self.root:
                    m.set_reshard_after_forward(True, recurse=False)

    def whole_model(self) -> ContextManager:
        return self._whole()

    def release(self) -> None:
        pass
