"""A tiny classifier (small checkpoints, fast steps) with faults switched on by task arguments.

  bad=[N, ...]          the N-th training forward's loss is NaN (one forward a window at --accum 1)
  delete_at=N, folder=D the N-th training forward deletes D/run.db, -wal and -shm (a user, a cleaner)
  extra_state=true      the model's get_extra_state() returns plain data
  note=true             the model's get_extra_state() returns an object of this file's own class
  odd_optimizer=true    the optimizer keeps an object of this file's own class in its state once it stepped
  val_low_at=N          the validation loss is |F - N| + 1, F the training forwards so far: lowest at the
                        epoch that ends after N forwards (retention keeps the best epoch checkpoint)
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from engine import Task


class Note:
    def __init__(self, text: str) -> None:
        self.text = text


class Net(torch.nn.Sequential):
    def __init__(self) -> None:
        super().__init__(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


class WithExtraState(Net):
    """A model with extra state in its state_dict: plain data, or (note=True) an object."""

    def __init__(self, note: bool) -> None:
        super().__init__()
        self.note = note

    def get_extra_state(self):
        return Note("a note") if self.note else {"note": "plain data", "seen": [1, 2]}

    def set_extra_state(self, state) -> None:
        pass


class OddAdamW(torch.optim.AdamW):
    def step(self, closure=None):
        out = super().step(closure)
        for p in self.param_groups[0]["params"][:1]:
            self.state[p]["note"] = Note("kept by the optimizer")
        return out


def build_task(seed, bad=(), delete_at=0, folder="", note=False, extra_state=False, odd_optimizer=False, n=256,
               val_low_at=0):
    bad = set(bad)
    calls = {"n": 0}

    def loss(model, batch):
        x, y = batch
        out = F.cross_entropy(model(x), y, reduction="sum")
        if val_low_at and not model.training:  # (through the model: the start-up probe wants a gradient)
            return out * 0 + float(abs(calls["n"] - val_low_at) + 1) * len(y), len(y)
        if model.training:
            calls["n"] += 1
            if calls["n"] in bad:
                out = out * float("nan")
            if calls["n"] == delete_at:
                for name in ("run.db", "run.db-wal", "run.db-shm"):
                    try:
                        os.unlink(os.path.join(folder, name))
                    except FileNotFoundError:
                        pass
            if delete_at and calls["n"] > delete_at:
                time.sleep(0.05)  # the run goes on a few seconds after the deletion, as a real one does
        return out, len(y)

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = WithExtraState(note) if note or extra_state else Net()
    return Task(model=model, train_data=torch.utils.data.TensorDataset(x, y), loss=loss,
                val_data=torch.utils.data.TensorDataset(x[:32], y[:32]),
                optimizer=(lambda params, lr: OddAdamW(params, lr=lr)) if odd_optimizer else None)
