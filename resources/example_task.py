"""An example Headroom task: copy this file, change the model and the data, keep the shape.

Run it with the window:      python -m app --task resources/example_task.py --autostart
or without one:              python -m engine --task resources/example_task.py --epochs 2

A task file defines build_task(seed) returning engine.Task. What matters for exact
gradient accumulation is the loss: return the loss SUMMED over the items it counts
(samples, or tokens as here) and HOW MANY there were. Headroom divides by the whole
accumulation window's count, so windows whose micro-batches hold different numbers of
tokens are weighted correctly. Do not return a mean.

The task here: sequences of 8 to 64 random symbols; at each position, predict
(this symbol + the previous one) mod VOCAB. Sequences have different lengths, so
micro-batches hold different token counts: the case where summing matters.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine import Task

VOCAB = 16
PAD = -100  # target value the loss ignores (padding)


class Sequences(torch.utils.data.Dataset):
    """A map-style dataset (__len__ and __getitem__): what train_data and val_data must be."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(8, 65, (n,), generator=g)
        self.samples = [torch.randint(0, VOCAB, (int(k),), generator=g) for k in lengths]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.samples[i]


def collate(samples: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad a micro-batch to its longest sequence; padded targets are PAD and do not count."""
    longest = max(len(s) for s in samples)
    x = torch.zeros(len(samples), longest, dtype=torch.long)
    y = torch.full((len(samples), longest), PAD, dtype=torch.long)
    for i, s in enumerate(samples):
        x[i, : len(s)] = s
        y[i, : len(s)] = (s + torch.roll(s, 1)) % VOCAB
        y[i, 0] = PAD  # the first symbol has no previous one
    return x, y


class Model(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.conv = nn.Conv1d(dim, dim, kernel_size=2)  # sees this symbol and the previous one
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x).transpose(1, 2)  # (batch, dim, time)
        h = F.pad(h, (1, 0))  # causal: position t sees t-1 and t
        h = torch.relu(self.conv(h)).transpose(1, 2)
        return self.head(h)  # (batch, time, VOCAB)


def loss(model: nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss summed over counted tokens, number of counted tokens)."""
    x, y = batch
    logits = model(x)
    loss_sum = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=PAD, reduction="sum")
    return loss_sum, (y != PAD).sum()


def sample_length(sample: torch.Tensor) -> int:
    """Tokens a sample contributes to the count: lets --token-budget close windows by tokens."""
    return len(sample) - 1


def build_task(seed: int) -> Task:
    torch.manual_seed(seed)  # the model's initial weights follow the run's --seed
    return Task(
        model=Model(),
        train_data=Sequences(2048, seed=1),
        val_data=Sequences(256, seed=2),
        loss=loss,
        collate=collate,
        # optimizer=lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9),  # default: AdamW
        sample_length=sample_length,
        name="example",
    )
