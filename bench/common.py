"""Shared pieces of the benchmarks: the bare seed loop, the anchors' GPT, timing helpers.

The bare loop is what a careful user writes without Headroom: the same model, the
same sample order (engine.accumulation.sampling.epoch_windows), the same collate, micro-batch,
accumulation and optimizer, clip_grad_norm_, and no host reads at all. Benchmarks
hold the engine against it side by side in one process.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.accumulation import sampling
from engine.distributed.devices import to_device
from engine.tasks.builtin.charlm import GPT
from engine.tasks.task import Task, default_collate

# -- the bare seed loop -------------------------------------------------------------------


class BareLoop:
    """The bare seed loop, one optimizer step per call, over the engine's windows of epoch 1.

    Each micro-batch backpropagates loss_sum / window samples (a host constant: the
    cheapest exact form for equal counts); after the window: clip_grad_norm_, step,
    zero_grad. No host reads.
    """

    def __init__(self, task: Task, device: torch.device, micro: int, accum: int, clip: float,
                 optimizer: torch.optim.Optimizer, precision: str = "fp32", seed: int = 0) -> None:
        self.task, self.device, self.micro, self.clip, self.optimizer = task, device, micro, clip, optimizer
        self.data = task.train_data
        self.collate = task.collate or default_collate
        amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.autocast = ((lambda: torch.autocast(device.type, dtype=amp_dtype)) if amp_dtype
                         else contextlib.nullcontext)
        self.params = [p for p in task.model.parameters() if p.requires_grad]
        self.windows = sampling.epoch_windows(len(self.data), seed, 1, micro * accum)
        self.k = 0
        task.model.train()

    def step(self) -> None:
        if self.k >= len(self.windows):
            raise ValueError(f"the bare loop runs one epoch ({len(self.windows)} windows)")
        window = self.windows[self.k]
        self.k += 1
        model, data, n = self.task.model, self.data, len(window)
        for idx in sampling.micro_batches(window, self.micro):
            batch = to_device(self.collate([data[j] for j in idx]), self.device)
            with self.autocast():
                loss_sum, _count = self.task.loss(model, batch)
            (loss_sum / n).backward()
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def bare_loop(task: Task, device: torch.device, micro: int, accum: int, clip: float, steps: int,
              optimizer: torch.optim.Optimizer, precision: str = "fp32", seed: int = 0,
              on_step: Optional[Callable[[int], None]] = None) -> None:
    """`steps` optimizer steps of BareLoop; `on_step(k)` after the k-th (1-based), where
    the engine emits its StepMetrics, so both loops are timed at the same point."""
    loop = BareLoop(task, device, micro, accum, clip, optimizer, precision, seed)
    for k in range(1, steps + 1):
        loop.step()
        if on_step is not None:
            on_step(k)


def engine_default_optimizer(params, device: torch.device, lr: float) -> torch.optim.Optimizer:
    """The engine's default (--optimizer adamw): AdamW, fused on CUDA."""
    from engine.distributed.devices import default_optimizer as _default_optimizer
    return _default_optimizer("adamw", device)(params, lr)


# -- timing -------------------------------------------------------------------------------


class StepClock:
    """Per-step wall-clock intervals, taken at the same point in both loops."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def mark(self, *_: Any) -> None:
        self.marks.append(time.perf_counter())

    def intervals(self, skip: int) -> list[float]:
        d = [b - a for a, b in zip(self.marks, self.marks[1:])]
        return d[skip:]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


@contextlib.contextmanager
def temp_run_dir(prefix: str = "headroom-bench-"):
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield os.path.join(d, "run")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def emit_json(path: Optional[str], row: dict[str, Any]) -> None:
    line = json.dumps(row, default=repr)
    print(line, flush=True)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


# -- the anchors' GPT (../shared/anchors/gpu_accum_anchor.py), as an engine Task ---------------

GPT_CFG = dict(vocab=32000, d=768, L=12, h=12, T=1024)
GPT_SMALL_CFG = dict(vocab=512, d=64, L=2, h=2, T=64)
# The anchors' GPT is engine.tasks.builtin.charlm.GPT (the charlm task's module) at this size.


class RandomTokens(torch.utils.data.Dataset):
    """n rows of T+1 random tokens, fixed seed; a sample is one row."""

    def __init__(self, n: int, vocab: int, T: int, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.rows = torch.randint(0, vocab, (n, T + 1), generator=g)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.rows[i]


def gpt_loss(model: nn.Module, batch: torch.Tensor):
    x, y = batch[:, :-1], batch[:, 1:]
    logits = model(x)
    loss_sum = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
    return loss_sum, y.numel()  # every token counts: a host int, no sync


def make_gpt(cfg: dict, device: torch.device, seed: int = 0) -> GPT:
    """Built directly on the device; the same seed gives the same weights every time."""
    torch.manual_seed(seed)
    with torch.device(device):
        return GPT(**cfg)


def gpt_task(cfg: dict, device: torch.device, n_samples: int, seed: int = 0,
             loss: Optional[Callable] = None) -> Task:
    return Task(model=make_gpt(cfg, device, seed), train_data=RandomTokens(n_samples, cfg["vocab"], cfg["T"]),
                loss=loss or gpt_loss, name="gpt135m" if cfg["d"] >= 768 else "gpt-small")
