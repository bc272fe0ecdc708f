"""The seed's classifier: 784-128-10 MLP on synthetic digits."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.tasks.task import Task

from .synthetic_digits import DigitsDataset


def loss(model: torch.nn.Module, batch):
    x, y = batch
    # Summed, not averaged: the engine divides by the window's total count.
    return F.cross_entropy(model(x), y, reduction="sum"), len(y)


def build_task(seed: int) -> Task:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    return Task(model=model, train_data=DigitsDataset(4096, 1, flat=True),
                val_data=DigitsDataset(1024, 2, flat=True), loss=loss, name="mlp")
