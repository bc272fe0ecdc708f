"""A small CNN with BatchNorm on synthetic digits.

BatchNorm normalises with the statistics of the micro-batch it sees, not of the
accumulation window: the engine warns when the micro-batch is small.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.tasks.task import Task

from .synthetic_digits import DigitsDataset


def loss(model: nn.Module, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="sum"), len(y)


def build_task(seed: int) -> Task:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 10),
    )
    return Task(model=model, train_data=DigitsDataset(2048, 1, flat=False),
                val_data=DigitsDataset(512, 2, flat=False), loss=loss, name="cnn-bn")
