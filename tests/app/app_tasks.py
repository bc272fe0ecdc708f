"""Task files the app tests write to tmp_path: small, fast, and each with one behaviour."""
from __future__ import annotations

from pathlib import Path

TINY = '''
import torch
import torch.nn.functional as F
from engine import Task

N = {n}
BAD_CALLS = {bad_calls}
RAISE_AT = {raise_at}
calls = {{"n": 0}}


class Data(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def loss(model, batch):
    x, y = batch
    out = F.cross_entropy(model(x), y, reduction="sum")
    if not model.training:  # the engine's pre-flight check and validation (eval mode): not counted
        return out, len(y)
    calls["n"] += 1  # training micro-batches only: two per step here
    if RAISE_AT and calls["n"] == RAISE_AT:
        raise RuntimeError("boom in the task's loss")
    if calls["n"] in BAD_CALLS:
        out = out * float("nan")
    return out, len(y)


def build_task(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return Task(model=model, train_data=Data(N, 1), val_data=Data(128, 2), loss=loss, name="tiny")
'''


def tiny_task(folder: Path, name: str = "tiny.py", n: int = 1024, bad_calls: tuple = (), raise_at: int = 0) -> str:
    path = folder / name
    path.write_text(TINY.format(n=n, bad_calls=set(bad_calls) or "set()", raise_at=raise_at))
    return str(path)


def broken_task(folder: Path) -> str:
    path = folder / "broken.py"
    path.write_text("import torch\n\ndef build_task(seed)\n    return None\n")  # a syntax error on line 3
    return str(path)


SLOW = """
import time
import torch
from engine import Task


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return torch.ones(4) * (i % 7), torch.tensor(i % 2)


def loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y, reduction="sum"), len(y)


def build_task(seed):
    open({mark!r}, "w").close()  # loading now: tests wait for this file, not a fixed time
    time.sleep({seconds})  # a task that takes a while to load: the window closes meanwhile
    return Task(model=torch.nn.Linear(4, 2), train_data=Data(), loss=loss, name="slow")
"""


def slow_task(folder: Path, seconds: float = 4.0) -> str:
    """A task file whose build_task takes `seconds`; it creates loading_mark(folder) first."""
    path = folder / "slow.py"
    path.write_text(SLOW.format(seconds=seconds, mark=str(loading_mark(folder))))
    return str(path)


def loading_mark(folder: Path) -> Path:
    """The file slow_task's build_task creates when it starts loading."""
    return folder / "slow.loading"
