"""A task whose every 97th training micro-batch has a NaN loss (issue 28's reproduction: 218 alert
rows in 19 s): with --nonfinite skip the run goes on, and run.db gets a nonfinite event every
97 micro-batches. `--task-arg every=N` changes the period."""
import torch
import torch.nn.functional as F

from engine import Task


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def build_task(seed: int, every: int = 97) -> Task:
    calls = {"n": 0}

    def loss(model, batch):
        x, y = batch
        out = F.cross_entropy(model(x), y, reduction="sum")
        if model.training:  # the pre-flight check and validation run in eval mode: not counted
            calls["n"] += 1
            if calls["n"] % int(every) == 0:
                out = out * float("nan")
        return out, len(y)

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return Task(model=model, train_data=Data(2048, 1), loss=loss, name="every-97th")
