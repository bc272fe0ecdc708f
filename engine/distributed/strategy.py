"""How the ranks of a torchrun job share a window: one interface, one class per strategy.

- `Local`: one process (no torchrun): the model itself, nothing to share.
- `Ddp` (ddp.py, `--strategy ddp`, the default): PyTorch's DistributedDataParallel; every
  rank holds a replica, every micro-batch but the last runs under `no_sync()`, and the last
  one's backward sums the gradients in DDP's buckets, overlapping the backward.
- `Fsdp` (fsdp.py, `--strategy fsdp`): FSDP2's `fully_shard` on each block and then the
  root; parameters, gradients and optimizer state are sharded over the ranks.

Either wrapper sees the task's whole loss call as its forward (`LossCall`, the pattern
Lightning uses for training_step): the loss gets the user's model itself, so `model.config`
and the model's own methods work unchanged, and everything the loss runs happens inside the
wrapper's forward, where DDP and FSDP expect it. Gradients are summed over ranks, never
averaged: the window's exact normalisation (accumulate.py) divides once by the global count.

The window (engine/accumulation/accumulate.py) asks a strategy, per micro-batch, for the context it
runs in and whether collectives are in flight in it: an out-of-memory error where none are
is this rank's alone to redo (`forget_window`, then the window again with half the
micro-batch); one where they are cannot be redone apart and stops every rank.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch

from engine import distributed


class LossCall(torch.nn.Module):
    """The module a wrapper wraps: its forward is the task's loss on the user's model."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, loss: Callable[[torch.nn.Module, Any], Any], batch: Any) -> Any:
        return loss(self.model, batch)


class Local:
    """One process, or the base every strategy refines: the model as the task built it."""
    name = "none"
    sharded = False  # the parameters are shards (DTensors): checkpoints with DCP, norms all-reduced
    collective = ""  # what the ranks do together in a micro-batch with collectives in flight (error lines)
    grads_in_buckets = False  # ddp: the gradients are views into the reducer's buckets (zeroed in place, kept)
    offloaded = False  # fsdp --cpu-offload: shards, gradients and the optimizer step on the CPU

    def __init__(self, model: torch.nn.Module, ctx: distributed.DistContext) -> None:
        self.model, self.ctx = model, ctx

    def forward(self, loss: Callable[[torch.nn.Module, Any], Any], batch: Any) -> Any:
        return loss(self.model, batch)

    def begin_window(self, n_micro: int) -> int:
        """Before the window's first micro-batch, which holds `n_micro` (fsdp: the parameters
        gathered whole): how many micro-batches this rank must run. More than it holds where
        every rank must take part in each reduction (an empty share of a short window; fsdp
        --fsdp-reduce every with shares of different lengths): the extra ones are stand-ins,
        trained with weight 0."""
        return n_micro

    def micro_batch(self, last: bool) -> ContextManager:
        """The context a micro-batch's forward and backward run in (ddp: no_sync but the last)."""
        return contextlib.nullcontext()

    def collectives_in(self, last: bool) -> bool:
        """Whether collectives are in flight in that micro-batch (an out-of-memory error there
        cannot be redone by one rank alone)."""
        return False

    def end_micro_batches(self) -> None:
        """After the window's micro-batches, before its first collective: allocate what the
        window's remaining collectives need (nothing may allocate between two of them)."""

    def forget_window(self) -> None:
        """After an out-of-memory error with no collective in flight: what the wrapper kept of
        the window (the optimizer's gradients are zeroed by the trainer)."""

    def after_window(self) -> None:
        """After the window's gradients are summed: buffers (BatchNorm statistics) from rank 0."""

    def local_grads(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """The tensors this rank holds of `grads` (fsdp: the local shards of DTensors)."""
        return grads

    def global_norms(self, per_param: torch.Tensor) -> torch.Tensor:
        """Per-parameter gradient norms over all ranks, from this rank's (fsdp: its shards')."""
        return per_param

    def eval_forward(self, loss: Callable[[torch.nn.Module, Any], Any], batch: Any) -> Any:
        return loss(self.model, batch)

    def whole_model(self) -> ContextManager:
        """The context of a validation pass (fsdp: parameters gathered once, kept whole, so
        ranks with different numbers of validation batches run no collective in it)."""
        return contextlib.nullcontext()

    def release(self) -> None:
        """Before the process group goes: drop what holds it beside the world (DDP's reducer),
        so the group's last reference is the world's, whose destructor lets the GIL go."""


class Replicated(Local):
    """What every torchrun strategy of replicas shares: rank 0's model on every rank at the
    start, and its buffers on every rank after each window."""

    def __init__(self, model: torch.nn.Module, ctx: distributed.DistContext, device: torch.device) -> None:
        super().__init__(model, ctx)
        self.device = device
        self.buffers = list(model.buffers())

    def after_window(self) -> None:
        for b in self.buffers:
            distributed.in_place(distributed.broadcast_from_rank0, b)
