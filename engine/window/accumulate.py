"""One accumulation window, top to bottom: forward and backward every micro-batch,
normalise exactly, norm, clip, then hand over to the step variant (step.py).

Each micro-batch backpropagates loss_sum / (samples in the whole window), a host
number every rank knows; after the last one (under torchrun, once the gradients are
summed over ranks: grad_sync.py) the gradients are multiplied once by
samples / count, so they equal the gradient of
    (sum of the window's loss_sums) / (the window's total count)
for any mix of lengths and a short last window. Nothing but the gradients and two
device scalars survives from one micro-batch to the next.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Optional

import torch

from engine import distributed as D
from . import grads as G
from engine.distributed.grad_sync import GradSync
from .oom import is_oom
from engine.declarations.outcome import StepNotRedoable
from .step import InFlight
from engine.tasks.task import check_loss_output


class StopRequested(Exception):
    """A stop arrived between two micro-batches: the partial window is dropped."""


@dataclass
class WindowContext:
    """What training a window needs, fixed for the whole run (built by setup.py)."""
    net: torch.nn.Module  # the model (under torchrun each rank's copy; grad_sync.py sums the gradients)
    loss: Callable[[torch.nn.Module, Any], Any]
    task_name: str
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scaler: Optional[torch.amp.GradScaler]
    autocast: Callable[[], ContextManager]
    device: torch.device
    ctx: D.DistContext
    stepper: Any  # step.SyncStep | step.DeferredStep
    loss_checked: bool = False
    commands_waiting: Callable[[], bool] = lambda: False  # rank 0: commands for the next step boundary
    grad_sync: Optional[GradSync] = None  # under torchrun: the gradient sum over ranks
    _totals: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None

    _seed: Optional[tuple[tuple[float, torch.dtype, torch.device], torch.Tensor]] = None

    def seed(self, value: float, like: torch.Tensor) -> torch.Tensor:
        """The backward's starting gradient, 1 / window samples, as a 0-dim tensor like the loss,
        kept while value, dtype and device stay (compared on the host: reading the tensor
        back would be a GPU sync per micro-batch)."""
        key = (value, like.dtype, like.device)
        if self._seed is None or self._seed[0] != key:
            self._seed = (key, torch.full((), value, dtype=like.dtype, device=like.device))
        return self._seed[1]

    def totals(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One small float64 buffer for the window's loss sum and count, zeroed for each window
        (and its two views), instead of a new tensor and two views every step. It holds two
        numbers, never a graph: nothing of a micro-batch outlives its backward."""
        if self._totals is None:
            t = torch.zeros(2, device=self.device, dtype=torch.float64)
            self._totals = (t, t[0], t[1])
        else:
            self._totals[0].zero_()
        return self._totals


def train_window(w: WindowContext, batches: Iterable[Any], window_samples: int, clip: float,
                 micro_batch: int, stop_requested: Callable[[], bool]) -> InFlight:
    dev, torchrun = w.device, w.ctx.enabled
    host_scale = 1.0 / window_samples  # keeps gradients O(1) before the exact division (fp16-friendly)
    totals, loss_acc, count_acc = w.totals()  # the window's loss sum and count, zeroed
    # Hot path: add_ into views of totals (one op, not the three of `totals[i] += x`), and
    # int counts added on the host, exactly, flushed before any tensor count and after the loop.
    host_count = host_total = 0
    tensor_count = False
    for batch in batches:
        if not torchrun and stop_requested():
            raise StopRequested()
        # Under torchrun every micro-batch is local, the last one too: no collective is in
        # flight during any backward, so an out-of-memory error anywhere in the window is
        # this rank's alone to redo (grad_sync.py). The gradients are summed once, below.
        with w.autocast():
            out = w.loss(w.net, batch)
        if not w.loss_checked:
            check_loss_output(w.task_name, out)
            w.loss_checked = True
        loss_sum, count = out
        if w.scaler is not None:
            w.scaler.scale(loss_sum * host_scale).backward()
        else:  # d(loss_sum x s) = s x d(loss_sum): s as the backward's seed, no extra op
            loss_sum.backward(gradient=w.seed(host_scale, loss_sum))
        loss_acc.add_(loss_sum.detach())
        if isinstance(count, int):
            host_count += count
            host_total += count
        else:
            tensor_count = True
            if host_count:
                count_acc.add_(host_count)
                host_count = 0
            count_acc.add_(count)
        del batch, out, loss_sum  # this micro-batch's graph and activations go now
    if host_count:
        count_acc.add_(host_count)

    agree = None
    if torchrun:
        assert w.grad_sync is not None
        flags = [1.0 if stop_requested() else 0.0, -float(micro_batch), 1.0 if w.commands_waiting() else 0.0]
        flags_t = torch.tensor(flags, device=dev, dtype=torch.float64)
        w.grad_sync.prepare()  # allocates what the sum needs: nothing allocates between collectives
        # Every rank is here with its whole window done. Two tiny all-reduces, read with the
        # step's numbers: the window's loss sum and count over all ranks, and (max) whether
        # any rank was asked to stop, the smallest micro-batch any rank fell back to after an
        # out-of-memory error, and whether rank 0 holds commands for the next step boundary
        # (so every rank joins their broadcast). Then the gradients, summed.
        D.all_reduce_sum(totals, w.ctx)
        agree = D.all_reduce_max(flags_t, w.ctx)
        w.grad_sync.reduce()
        # From here on the other ranks step and move on: an out-of-memory error on this rank
        # cannot be redone here alone (see _step), so it stops the run.
    return _step(w, totals, agree, window_samples, clip, tensor_count, host_total)


def _step(w: WindowContext, totals: torch.Tensor, agree: Optional[torch.Tensor], window_samples: int,
          clip: float, tensor_count: bool, host_total: int) -> InFlight:
    """The window's gradients to the update: exact normalisation, norm, clip, step."""
    try:
        return _normalise_and_step(w, totals, agree, window_samples, clip, tensor_count, host_total)
    except BaseException as e:
        if not (w.ctx.enabled and is_oom(e)):
            raise
        detail = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise StepNotRedoable(
            f"out of memory on rank {w.ctx.rank} in the optimizer step, after the gradients were summed over "
            f"all {w.ctx.world} ranks: under torchrun that window cannot be redone by one rank alone, so the run "
            f"stops (the last checkpoint is kept; continue with --resume) ({detail})") from None


def _normalise_and_step(w: WindowContext, totals: torch.Tensor, agree: Optional[torch.Tensor], window_samples: int,
                        clip: float, tensor_count: bool, host_total: int) -> InFlight:
    torchrun, dev = w.ctx.enabled, w.device
    if w.scaler is not None:
        w.scaler.unscale_(w.optimizer)  # once per window, before the norm and the clip
    grads = [p.grad for p in w.params if p.grad is not None]
    # Every rank scaled by 1/window_samples (the window's samples over all ranks) and the sum
    # over ranks added them up: multiply by window_samples / the window's global count, one
    # fused multiply per dtype. When every count was a host int (one process), the factor is
    # a host number, and exactly 1 (count == samples, a classifier) needs no multiply at all.
    if torchrun or tensor_count:
        G.scale_(grads, window_samples / totals[1])
    elif host_total != window_samples:
        G.scale_by_(grads, window_samples / host_total if host_total else float("inf"))
    # Per-parameter norms (to name non-finite parameters without another sync) and the
    # total norm before clipping, as clip_grad_norm_ computes it. The step variant clips:
    # with the norm on the host (SyncStep) a window under the clip norm costs no pass at all.
    per_param = G.per_param_norms(grads, dev)
    norm = torch.linalg.vector_norm(per_param)
    return w.stepper.finish(totals, agree, norm, per_param, clip, grads)
