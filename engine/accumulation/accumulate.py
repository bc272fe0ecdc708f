"""One accumulation window, top to bottom: forward and backward every micro-batch,
normalise exactly, norm, clip, then hand over to the step variant (step.py).

Each micro-batch backpropagates loss_sum / (samples in the whole window), a host
number every rank knows; after the last one (under torchrun its backward summed the
gradients over ranks: engine/distributed/ddp.py, fsdp.py) the gradients are multiplied
once by samples / count, so they equal the gradient of
    (sum of the window's loss_sums) / (the window's total count, over all ranks)
for any mix of lengths and a short last window. Nothing but the gradients and two
device scalars survives from one micro-batch to the next.

Under torchrun an out-of-memory error in a micro-batch with no collective in flight (the
strategy says which) is this rank's alone: the trainer redoes the window with half the
micro-batch while the others wait in their last backward. One with collectives in flight
cannot be redone apart: this rank stops at once (StepNotRedoable) and the others, whose
collective lost its peer, stop too.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable, Optional

import torch

from engine import distributed
from engine.declarations.outcome import StepNotRedoable, first_line
from engine.distributed.strategy import Local
from engine.tasks.task import check_loss_output

from .grads import per_param_norms, scale_, scale_by_
from .oom import is_oom
from .step import MEM_N, InFlight


class StopRequested(Exception):
    """A stop arrived between two micro-batches: the partial window is dropped."""


@dataclass
class WindowContext:
    """What training a window needs, fixed for the whole run (built by setup.py)."""
    net: torch.nn.Module  # the user's model (under torchrun each rank's replica or shards)
    loss: Callable[[torch.nn.Module, Any], Any]
    task_name: str
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scaler: Optional[torch.amp.GradScaler]
    autocast: Callable[[], ContextManager]
    device: torch.device
    ctx: distributed.DistContext
    stepper: Any  # step.SyncStep | step.DeferredStep
    loss_checked: bool = False
    commands_waiting: Callable[[], bool] = lambda: False  # rank 0: commands for the next step boundary
    strategy: Local = field(default_factory=lambda: Local(torch.nn.Module(), distributed.DistContext()))
    # A micro-batch trained with weight 0 where the strategy needs more than the rank's share
    # holds (under DDP and FSDP every rank must run the window's last backward: its reduction).
    stand_in: Optional[Callable[[], Any]] = None
    probe: Any = None  # memory.telemetry.MemoryProbe: under torchrun on CUDA each rank's memory joins the agreement
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


def train_window(w: WindowContext, batches: Iterable[Any], global_samples: int, clip: float,
                 micro_batch: int, stop_requested: Callable[[], bool], n_micro: Optional[int] = None) -> InFlight:
    """`n_micro`: how many micro-batches `batches` holds (under torchrun the last one is
    special: its backward reduces the gradients over ranks)."""
    dev, torchrun, strategy = w.device, w.ctx.enabled, w.strategy
    host_scale = 1.0 / global_samples  # keeps gradients O(1) before the exact division (fp16-friendly)
    totals, loss_acc, count_acc = w.totals()  # the window's loss sum and count, zeroed
    # Hot path: add_ into views of totals (one op, not the three of `totals[i] += x`), and
    # int counts added on the host, exactly, flushed before any tensor count and after the loop.
    host_count = host_total = 0
    tensor_count = False
    n_real = n_micro
    if n_micro is not None:  # how many micro-batches this rank runs: stand-ins (weight 0) beyond its own
        n_micro = _guarded(w, lambda: strategy.begin_window(n_real or 0), True, 0, None, micro_batch)
        if n_micro > (n_real or 0):
            assert w.stand_in is not None
            batches = itertools.chain(batches, (w.stand_in() for _ in range(n_micro - (n_real or 0))))
    for k, batch in enumerate(batches):
        if not torchrun and stop_requested():
            raise StopRequested()
        last = n_micro is not None and k == n_micro - 1
        try:
            with strategy.micro_batch(last):
                with w.autocast():
                    out = strategy.forward(w.loss, batch)
                if not w.loss_checked:
                    check_loss_output(w.task_name, out)
                    w.loss_checked = True
                loss_sum, count = out
                if n_real is not None and k >= n_real:  # a stand-in: its gradient and count are zero
                    loss_sum, count = loss_sum * 0.0, 0
                if w.scaler is not None:
                    w.scaler.scale(loss_sum * host_scale).backward()
                else:  # d(loss_sum x s) = s x d(loss_sum): s as the backward's seed, no extra op
                    loss_sum.backward(gradient=w.seed(host_scale, loss_sum))
        except BaseException as e:
            _out_of_memory(w, e, strategy.collectives_in(last), k, n_micro, micro_batch)
            raise
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
        flags = [1.0 if stop_requested() else 0.0, -float(micro_batch), 1.0 if w.commands_waiting() else 0.0]
        flags += _memory_slots(w)
        flags_t = torch.tensor(flags, device=dev, dtype=torch.float64)
        strategy.end_micro_batches()  # allocates what the gradient sum needs, before any collective
        # Every rank is here with its whole window done. Two tiny all-reduces, read with the
        # step's numbers: the window's loss sum and count over all ranks, and (max) whether
        # any rank was asked to stop, the smallest micro-batch any rank fell back to after an
        # out-of-memory error, and whether rank 0 holds commands for the next step boundary
        # (so every rank joins their broadcast); on CUDA each rank's memory in its own slot, so
        # the metrics row can show the tightest rank's. Then buffers from rank 0.
        distributed.all_reduce_sum(totals, w.ctx)
        agree = distributed.all_reduce_max(flags_t, w.ctx)
        strategy.after_window()
        # From here on the other ranks step and move on: an out-of-memory error on this rank
        # cannot be redone here alone (see _step), so it stops the run.
    return _step(w, totals, agree, global_samples, clip, tensor_count, host_total)


def _memory_slots(w: WindowContext) -> list[float]:
    """This rank's GPU memory in its slot of world x MEM_N numbers, zeros elsewhere (nothing on CPU)."""
    probe = w.probe
    if probe is None or not probe.available:
        return []
    m = probe.sample()
    mine = [float(v or 0) for v in (m.allocated, m.reserved, m.peak, m.used, m.total)]
    slots = [0.0] * (MEM_N * w.ctx.world)
    slots[MEM_N * w.ctx.rank:MEM_N * (w.ctx.rank + 1)] = mine
    return slots


def _guarded(w: WindowContext, fn: Callable[[], Any], collectives: bool, k: int, n_micro: Optional[int],
             micro_batch: int) -> Any:
    try:
        return fn()
    except BaseException as e:
        _out_of_memory(w, e, collectives, k, n_micro, micro_batch)
        raise


def _out_of_memory(w: WindowContext, e: BaseException, collectives: bool, k: int, n_micro: Optional[int],
                   micro_batch: int) -> None:
    """Under torchrun, an out-of-memory error: with no collective in flight the strategy
    forgets the window (the trainer redoes it with half the micro-batch); with collectives
    in flight the ranks cannot redo it apart: StepNotRedoable, which stops the run."""
    if not (w.ctx.enabled and is_oom(e)):
        return
    if not collectives:
        w.strategy.forget_window()
        return
    detail = first_line(e, 160)
    which = f"micro-batch {k + 1} of {n_micro}" if n_micro else "the window's start"
    smaller = max(1, micro_batch // 2)
    advice = (f"try --micro-batch {smaller} (continue with --resume)" if smaller < micro_batch
              else "even micro-batch 1 does not fit: try --strategy fsdp or more ranks")
    raise StepNotRedoable(
        f"out of memory on rank {w.ctx.rank} in {which} at micro-batch size {micro_batch}, where the ranks "
        f"{w.strategy.collective} (--strategy {w.strategy.name}): the ranks cannot redo it apart, so every rank "
        f"stops (rows committed, the last checkpoint kept); {advice} ({detail})") from None


def _step(w: WindowContext, totals: torch.Tensor, agree: Optional[torch.Tensor], global_samples: int,
          clip: float, tensor_count: bool, host_total: int) -> InFlight:
    """The window's gradients to the update: exact normalisation, norm, clip, step."""
    try:
        return _normalise_and_step(w, totals, agree, global_samples, clip, tensor_count, host_total)
    except BaseException as e:
        if not (w.ctx.enabled and is_oom(e)):
            raise
        detail = first_line(e, 200)
        raise StepNotRedoable(
            f"out of memory on rank {w.ctx.rank} in the optimizer step, after the gradients were summed over "
            f"all {w.ctx.world} ranks: under torchrun that window cannot be redone by one rank alone, so the run "
            f"stops (the last checkpoint is kept; continue with --resume) ({detail})") from None


def _normalise_and_step(w: WindowContext, totals: torch.Tensor, agree: Optional[torch.Tensor], global_samples: int,
                        clip: float, tensor_count: bool, host_total: int) -> InFlight:
    torchrun, dev = w.ctx.enabled, w.device
    if w.scaler is not None:
        w.scaler.unscale_(w.optimizer)  # once per window, before the norm and the clip
    grads = w.strategy.local_grads([p.grad for p in w.params if p.grad is not None])
    # Every rank scaled by 1/global_samples (the window's samples over all ranks; LiveSettings.
    # window_samples is one rank's) and the strategy's reduction summed them over ranks: multiply
    # by global_samples / the window's global count, one fused multiply per dtype. When every
    # count was a host int (one process), the factor is a host number, and exactly 1 (count ==
    # samples, a classifier) needs no multiply at all.
    if torchrun or tensor_count:
        scale_(grads, global_samples / totals[1])
    elif host_total != global_samples:
        scale_by_(grads, global_samples / host_total if host_total else float("inf"))
    # Per-parameter norms (to name non-finite parameters without another sync) and the
    # total norm before clipping, as clip_grad_norm_ computes it. The step variant clips:
    # with the norm on the host (SyncStep) a window under the clip norm costs no pass at all.
    per_param = w.strategy.global_norms(per_param_norms(grads, dev))  # fsdp: over the shards of all ranks
    norm = torch.linalg.vector_norm(per_param)
    return w.stepper.finish(totals, agree, norm, per_param, clip, grads)
