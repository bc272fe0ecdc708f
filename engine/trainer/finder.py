"""The micro-batch finder (the seed's recipe): the largest micro-batch that trains.

Probe a real forward + backward + optimizer step of the task at growing sizes;
on out-of-memory, bisect. On a GPU the first two probes also fit a memory model
(engine.memory.what_fits.forecast) whose prediction is probed next, so the search usually
ends in a handful of probes. Model, optimizer, scaler and RNG state are restored
afterwards: probing leaves no trace in training. Then accumulation is set to
ceil(effective batch / (micro-batch x world size)).
"""
from __future__ import annotations

import copy
import math
from typing import Optional

import torch

from engine.accumulation.oom import free_memory, is_oom
from engine.declarations.events import MicroBatchFound
from engine.distributed import all_reduce_max
from engine.memory.what_fits.forecast import MemoryModel

from .progress import Progress
from .setup import RunParts


class NothingFits(RuntimeError):
    """Even micro-batch 1 ran out of memory."""

MAX_PROBES = 8


class Prober:
    """Runs one training step on real samples at micro-batch `b` and reports whether it fit.

    When the effective batch needs accumulation at this size, the probe runs two
    micro-batches before its optimizer step, as training will: the second backward
    runs with the first one's gradients already allocated, which is the step's real
    peak. The unwrapped model is used, so a probe under torchrun needs no collective.
    """

    def __init__(self, parts: RunParts, effective_per_rank: int) -> None:
        self.t = parts
        self.effective = effective_per_rank
        self.probes = 0
        self.model = MemoryModel()
        self.results: dict[int, bool] = {}

    def __call__(self, b: int) -> bool:
        if b in self.results:
            return self.results[b]
        t = self.t
        self.probes += 1
        dev = t.device
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        ok = True
        try:
            n = len(t.task.train_data)
            for k in range(2 if self.effective > b else 1):
                batch = t.fetch([(k * b + i) % n for i in range(b)])
                with t.autocast():
                    loss_sum, count = t.task.loss(t.model, batch)
                (loss_sum / count).backward()
                del batch, loss_sum, count
            t.optimizer.step()
        except BaseException as e:
            if not is_oom(e):
                raise
            ok = False
        t.optimizer.zero_grad(set_to_none=True)
        free_memory(dev)
        if ok and dev.type == "cuda":
            self.model.add(b, torch.cuda.max_memory_allocated(dev))
        self.results[b] = ok
        return ok


def _capacity(parts: RunParts) -> Optional[float]:
    dev = parts.device
    if dev.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(dev).total_memory
    free, _ = torch.cuda.mem_get_info(dev)
    cap = parts.config.vram_limit
    # What this process may still allocate: the cap, or what is free plus what we hold.
    return float(min(cap, total) if cap else free + torch.cuda.memory_allocated(dev))


def search(prober: Prober, upper: int, capacity: Optional[float], margin: float) -> int:
    """Largest b in [1, upper] for which prober(b) is True (0 if even 1 fails)."""
    if not prober(1):
        return 0
    lo, hi = 1, None  # lo fits; hi (if known) does not
    if upper >= 2 and capacity is not None and prober(2):
        lo = 2
        guess = prober.model.largest_fitting(capacity, margin)
        if guess is not None and margin > 0:
            upper = max(1, min(upper, guess))  # the margin caps the search itself
            lo = min(lo, upper)
        if guess is not None:
            guess = max(lo + 1, min(upper, guess))
            if guess > lo and prober(guess):
                lo = guess
                step_up = min(upper, max(lo + 1, int(lo * 1.1)))
                if step_up > lo:
                    if prober(step_up):
                        lo = step_up
                    else:
                        hi = step_up
            elif guess > lo:
                hi = guess
    # Doubling until something fails (or the upper bound), then bisection.
    while hi is None and lo < upper and prober.probes < MAX_PROBES:
        nxt = min(upper, lo * 2)
        if prober(nxt):
            lo = nxt
        else:
            hi = nxt
    while hi is not None and hi - lo > max(1, lo // 20) and prober.probes < MAX_PROBES:
        mid = (lo + hi) // 2
        if prober(mid):
            lo = mid
        else:
            hi = mid
    return lo


def find_micro_batch(parts: RunParts, progress: Progress, memory_model: MemoryModel) -> MicroBatchFound:
    """Probe, restore everything, and say what was found (micro-batch and the accumulation
    that keeps --effective-batch) at the run's `progress`. The measured peaks are added to
    `memory_model`."""
    t = parts
    cfg = t.config
    assert cfg.effective_batch is not None
    world = t.ctx.world
    upper = min(math.ceil(cfg.effective_batch / world), len(t.task.train_data))
    # Snapshot everything a probe step touches, on the CPU.
    model_state = copy.deepcopy({k: v.detach().cpu() for k, v in t.model.state_dict().items()})
    opt_state = copy.deepcopy(t.optimizer.state_dict())
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(t.device) if t.device.type == "cuda" else None
    t.modes.train_mode(t.model)
    prober = Prober(t, upper)
    try:
        best = search(prober, upper, _capacity(t), cfg.memory_margin)
        if t.ctx.enabled:  # every rank trains with the smallest size that fits on all of them
            agreed = torch.tensor([-float(best)], device=t.device)
            best = int(-all_reduce_max(agreed, t.ctx).item())
    finally:
        t.model.load_state_dict(model_state)
        t.optimizer.load_state_dict(opt_state)
        t.optimizer.zero_grad(set_to_none=True)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, t.device)
        t.modes.train_mode(t.model)
        free_memory(t.device)
        if t.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(t.device)
    if best < 1:
        raise NothingFits("out of memory even at micro-batch 1: the model does not fit on this device")
    memory_model.points.update(prober.model.points)
    return MicroBatchFound(progress.step, progress.epoch, micro_batch=best,
                           accum=math.ceil(cfg.effective_batch / (best * world)), probes=prober.probes,
                           peak_bytes=int(prober.model.points.get(best, 0)))
