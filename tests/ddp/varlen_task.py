"""A small float32 language-model-like task with variable-length samples, for DDP tests.

Behaviour switches come from environment variables so the same file serves every case:
  HEADROOM_TEST_NAN_AT=R:S   rank R returns a NaN loss on its share of window S (1-based)
  HEADROOM_TEST_OOM_AT=R:C   rank R raises out-of-memory on its C-th loss call if the micro-batch > 1
  HEADROOM_TEST_BACKWARD_OOM_AT=R:C   the same, raised in the backward of that call's loss
  HEADROOM_TEST_STEP_OOM_AT=R:S   rank R's optimizer raises out-of-memory in its S-th step
  HEADROOM_TEST_RAISE_AT=R:C rank R's task raises ValueError on its C-th loss call (the task's own bug)
  HEADROOM_TEST_SLOW=SEC     sleep SEC in every loss call (to give a test time to act)
  HEADROOM_TEST_BATCH_NORM=1 the model has a BatchNorm (buffers each rank updates from its own data)
  HEADROOM_TEST_RANK_INIT=1  each rank initialises its model from its own seed (seed + rank)
  HEADROOM_TEST_RANK_WIDTH=1 rank 1 builds a wider model than rank 0 (not the same model)
  HEADROOM_TEST_PIDS=DIR     write DIR/rank-R.pid
  HEADROOM_TEST_BAD_BLOCKS=1 the task's blocks(model) returns the model itself (fsdp refuses it while it shards)
  HEADROOM_TEST_SAMPLES=N    the data set holds N samples (default 64)
  HEADROOM_TEST_MOMENTUM=1   SGD with momentum 0.9 (optimizer state a checkpoint must carry)
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from engine import Task

VOCAB, IGNORE = 32, -100


class TinyLM(torch.nn.Module):
    def __init__(self, batch_norm: bool = False, width: int = 16) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, width)
        self.mix = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, VOCAB)
        self.norm = torch.nn.BatchNorm1d(width) if batch_norm else None  # buffers: running statistics

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        if self.norm is not None:
            h = self.norm(h.transpose(1, 2)).transpose(1, 2)
        h = h + torch.tanh(self.mix(torch.cumsum(h, dim=1) / torch.arange(1, x.shape[1] + 1).view(1, -1, 1)))
        return self.head(h)


def make_samples(n: int = 64) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(3, 40, (n,), generator=g)
    return [torch.randint(0, VOCAB, (int(k),), generator=g) for k in lengths]


def collate(samples):
    T = max(len(s) for s in samples) - 1
    x = torch.zeros(len(samples), T, dtype=torch.long)
    y = torch.full((len(samples), T), IGNORE, dtype=torch.long)
    for i, s in enumerate(samples):
        x[i, :len(s) - 1] = s[:-1]
        y[i, :len(s) - 1] = s[1:]
    return x, y


def build_task(seed: int) -> Task:
    rank = int(os.environ.get("RANK", "0"))
    pids = os.environ.get("HEADROOM_TEST_PIDS")
    if pids:
        with open(os.path.join(pids, f"rank-{rank}.pid"), "w") as f:
            f.write(str(os.getpid()))
    nan_at = os.environ.get("HEADROOM_TEST_NAN_AT")
    oom_at = os.environ.get("HEADROOM_TEST_OOM_AT")
    backward_oom_at = os.environ.get("HEADROOM_TEST_BACKWARD_OOM_AT")
    slow = float(os.environ.get("HEADROOM_TEST_SLOW", "0"))
    raise_at = os.environ.get("HEADROOM_TEST_RAISE_AT")
    calls = {"n": 0}

    def loss(model, batch):
        x, y = batch
        calls["n"] += model.training  # the engine's up-front check runs in eval mode: not counted
        if slow:
            time.sleep(slow)
        if oom_at:
            r, c = map(int, oom_at.split(":"))
            if r == rank and calls["n"] == c and len(x) > 1:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (injected)")
        if raise_at and tuple(map(int, raise_at.split(":"))) == (rank, calls["n"]):
            raise ValueError(f"sample shard of rank {rank} is corrupt (injected)")
        logits = model(x)
        s = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=IGNORE, reduction="sum")
        if backward_oom_at:
            r, c = map(int, backward_oom_at.split(":"))
            if r == rank and calls["n"] == c and len(x) > 1:
                s = _OomInBackward.apply(s)
        if nan_at and model.training:  # "R:S" or "R:S1,R:S2"
            for spec in nan_at.split(","):
                r, step = map(int, spec.split(":"))
                if r == rank and _window[0] == step:
                    s = s * float("nan")
        return s, (y != IGNORE).sum()

    step_oom_at = os.environ.get("HEADROOM_TEST_STEP_OOM_AT")

    class SGD(torch.optim.SGD):
        steps = 0

        def step(self, closure=None):  # type: ignore[override]  # torch's Optimizer.step is overloaded on the closure
            SGD.steps += 1
            if step_oom_at:
                r, s = map(int, step_oom_at.split(":"))
                if r == rank and SGD.steps == s:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB (injected in step)")
            return super().step(closure)

    torch.manual_seed(seed + (rank if os.environ.get("HEADROOM_TEST_RANK_INIT") == "1" else 0))
    width = 24 if os.environ.get("HEADROOM_TEST_RANK_WIDTH") == "1" and rank == 1 else 16
    model = TinyLM(os.environ.get("HEADROOM_TEST_BATCH_NORM") == "1", width)
    return Task(model=model, train_data=make_samples(int(os.environ.get("HEADROOM_TEST_SAMPLES", "64"))), loss=loss, collate=collate,
                optimizer=lambda p, lr: SGD(p, lr=lr, momentum=0.9 if os.environ.get("HEADROOM_TEST_MOMENTUM") else 0),
                sample_length=lambda s: len(s) - 1, name="varlen",
                blocks=(lambda m: [m]) if os.environ.get("HEADROOM_TEST_BAD_BLOCKS") == "1" else None)


class _OomInBackward(torch.autograd.Function):
    """Identity forward; its backward runs out of memory (as a real backward would, half-way
    through: the gradients of the layers after it are already computed)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected in backward)")


_window = [0]  # set by the worker: the window (optimizer step, 1-based) being trained
