"""A small classifier task whose data set blocks, or whose loss raises a many-line error, on demand.

  HEADROOM_FAULT_BLOCK_AFTER=N  the data set's N-th training __getitem__ blocks (an hour's
                                sleep: a network read that never returns); it first creates
                                the file named by HEADROOM_FAULT_BLOCK_MARK
  HEADROOM_FAULT_RAISE_AFTER=N  the loss raises on its N-th call, with a message of many lines
"""
from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from engine import Task


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(5)
        self.x = torch.randn(n, 12, generator=g)
        self.y = (self.x[:, 0] > 0).long()
        self.block_after = int(os.environ.get("HEADROOM_FAULT_BLOCK_AFTER", "0"))
        self.calls = 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        self.calls += 1
        if self.block_after and self.calls > self.block_after:
            mark = os.environ.get("HEADROOM_FAULT_BLOCK_MARK")
            if mark:
                open(mark, "w").close()
            time.sleep(3600)
        return self.x[i], self.y[i]


def build_task(seed: int) -> Task:
    raise_after = int(os.environ.get("HEADROOM_FAULT_RAISE_AFTER", "0"))
    calls = {"loss": 0}

    def loss(model, batch):
        calls["loss"] += 1
        if raise_after and calls["loss"] > raise_after:
            raise RuntimeError("the loss failed\n  at line one\n\n  at line two\n" + "detail " * 2000)
        x, y = batch
        return F.cross_entropy(model(x), y, reduction="sum"), len(y)

    torch.manual_seed(seed)
    return Task(model=torch.nn.Linear(12, 2), train_data=Data(256), loss=loss, name="blocking")
