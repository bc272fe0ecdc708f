"""A small classifier task whose faults are switched on by environment variables.

  HEADROOM_FAULT_DATA_AT=I       the data set raises on sample index I (after the first batch check)
  HEADROOM_FAULT_COLLATE_AFTER=N the collate function raises on its N-th training call
  HEADROOM_FAULT_SLOW=SEC        sleep SEC per loss call
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from engine import Task


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int, fail_at: int | None) -> None:
        g = torch.Generator().manual_seed(5)
        self.x = torch.randn(n, 12, generator=g)
        self.y = (self.x[:, 0] + self.x[:, 1] > 0).long()
        self.fail_at = fail_at
        self.armed = False

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        if self.armed and self.fail_at is not None and i == self.fail_at:
            raise ValueError(f"sample {i} is corrupt")
        return self.x[i], self.y[i]


def build_task(seed: int) -> Task:
    fail_at = os.environ.get("HEADROOM_FAULT_DATA_AT")
    data = Data(256, int(fail_at) if fail_at else None)
    collate_after = int(os.environ.get("HEADROOM_FAULT_COLLATE_AFTER", "0"))
    slow = float(os.environ.get("HEADROOM_FAULT_SLOW", "0"))
    calls = {"collate": 0}

    def collate(samples):
        calls["collate"] += 1
        data.armed = True  # the engine's first-batch check has passed
        if collate_after and calls["collate"] > collate_after:
            raise RuntimeError("collate: the tokenizer crashed")
        return torch.utils.data.default_collate(samples)

    def loss(model, batch):
        if slow:
            time.sleep(slow)
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="sum"), len(y)

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(12, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 2))
    return Task(model=model, train_data=data, loss=loss, collate=collate, name="faulty")
