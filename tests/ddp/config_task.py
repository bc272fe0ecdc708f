"""A task whose loss reads `model.config`, as a Hugging Face loss does, and calls a method of the
model that runs its forward (not through `model(...)`): under torchrun both must work unchanged
(the loss sees the user's model, not a wrapper, and its whole call runs inside the wrapper's
forward, so DDP and FSDP see the computation)."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from engine import Task
from tests.ddp.varlen_task import IGNORE, VOCAB, TinyLM, collate, make_samples


class ConfiguredLM(TinyLM):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(vocab_size=VOCAB)

    def next_token_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)  # no __call__: no hook of this module runs


def loss(model, batch):
    x, y = batch
    logits = model.next_token_logits(x)
    time.sleep(float(os.environ.get("HEADROOM_TEST_SLOW", "0")))
    flat = logits.reshape(-1, model.config.vocab_size)  # the attribute DDP itself does not have
    count = (y != IGNORE).sum()
    return F.cross_entropy(flat, y.reshape(-1), ignore_index=IGNORE, reduction="sum"), count


def build_task(seed: int) -> Task:
    torch.manual_seed(seed)
    return Task(model=ConfiguredLM(), train_data=make_samples(64), loss=loss, collate=collate, name="config-lm")
