"""A task that diverges on purpose, for the run-tree, rollback and fork tests (engine and app).

Two micro-batches a window; the training loss is NaN for steps bad_from..bad_until-1 (or from
bad_from on, with always_bad), and 50x at spike_at. dropout > 0 puts a Dropout layer in the
model, so a fork reproduces its parent only if the RNG state travels with the checkpoint.
"""
import torch
import torch.nn.functional as F

from engine import Task


def build_task(seed, bad_from=0, bad_until=0, spike_at=0, always_bad=False, dropout=0.1):
    state = {"calls": 0}

    def loss(model, batch):
        x, y = batch
        out = F.cross_entropy(model(x), y, reduction="sum")
        if model.training:
            state["calls"] += 1
            step = (state["calls"] + 1) // 2  # two micro-batches a window
            if always_bad and step >= bad_from or bad_from <= step < bad_until:
                out = out * float("nan")
            if spike_at and step == spike_at:
                out = out * 50.0
        return out, len(y)

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 6, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    middle = [torch.nn.Dropout(dropout)] if dropout else []
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), *middle, torch.nn.Linear(16, 2))
    return Task(model=model, train_data=torch.utils.data.TensorDataset(x, y), loss=loss)
