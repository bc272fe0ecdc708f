"""Helpers for the engine's tests: small tasks built in-test and a trainer harness.

The token task is a tiny per-token language model on variable-length random
"token" sequences. Its loss returns (loss_sum, count) with count = number of
target tokens, so micro-batches of the same size hold different counts: the
case where normalising by the window's true count matters. Every builder seeds
its own model, so two builds with the same seed are identical; the Trainer
trains `task.model` in place, so build a fresh task for every run.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.declarations.config import TrainConfig
from engine.tasks.task import Task
from testkit import ROOT  # noqa: F401 - re-exported: engine tests import it from here

VOCAB = 11
DIM = 6
IGNORE = -100


# -- data -------------------------------------------------------------------------------
class TokenData(torch.utils.data.Dataset):
    """Sample i is (i, token sequence): the index travels with the sample, so tests can see order."""

    def __init__(self, seqs: list[torch.Tensor]) -> None:
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int):
        return i, self.seqs[i]


def make_seqs(n: int, lengths: str = "variable", seed: int = 0, equal_len: int = 12,
              lo: int = 2, hi: int = 40) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + seed)
    if lengths == "equal":
        lens = [equal_len] * n
    elif lengths == "variable":
        lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    else:
        raise ValueError(lengths)
    return [torch.randint(0, VOCAB, (L,), generator=g) for L in lens]


def token_collate(samples: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.tensor([i for i, _ in samples], dtype=torch.long)
    T = max(len(s) for _, s in samples) - 1
    x = torch.zeros(len(samples), T, dtype=torch.long)
    y = torch.full((len(samples), T), IGNORE, dtype=torch.long)
    for r, (_, s) in enumerate(samples):
        n = len(s) - 1
        x[r, :n] = s[:-1]
        y[r, :n] = s[1:]
    return ids, x, y


def sample_length(sample) -> int:
    return len(sample[1]) - 1  # target tokens the loss counts


# -- model and loss -----------------------------------------------------------------------------
class TokenModel(nn.Module):
    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.hidden = nn.Linear(DIM, DIM)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(torch.tanh(self.hidden(self.emb(x)))))


def token_loss_sum(model: nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor]:
    _, x, y = batch
    logits = model(x)
    loss_sum = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=IGNORE, reduction="sum")
    return loss_sum, (y != IGNORE).sum()


def sgd(params, lr):  # plain SGD: the update is exactly -lr * (clipped) gradient
    return torch.optim.SGD(params, lr=lr, momentum=0.0)


def adamw(params, lr):  # has per-parameter state, for the NaN-skip and resume tests
    return torch.optim.AdamW(params, lr=lr)


class RecordingSGD(torch.optim.SGD):
    """SGD without momentum that keeps, for every step, the gradients it was given (after
    the engine's normalisation and clipping) and the lr it used."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr, momentum=0.0)
        self.grads: list[list[torch.Tensor]] = []
        self.lrs: list[float] = []

    @torch.no_grad()
    def step(self, closure=None):
        self.grads.append([p.grad.detach().clone() for g in self.param_groups for p in g["params"]])
        self.lrs.append(self.param_groups[0]["lr"])
        return super().step(closure)


class Recorder:
    """Collate wrapper that records which sample ids the engine fed, micro-batch by micro-batch;
    `cut()` (called by the sink on each step event) closes the current window."""

    def __init__(self) -> None:
        self.micro: list[list[int]] = []
        self.windows: list[list[int]] = []
        self.window_micro: list[list[list[int]]] = []
        self._current: list[list[int]] = []

    def collate(self, samples: list):
        ids = [i for i, _ in samples]
        self.micro.append(ids)
        self._current.append(ids)
        return token_collate(samples)

    def reset(self) -> None:
        """Forget what was collated before training (the engine's pre-flight check of the loss)."""
        self.__init__()

    def cut(self) -> None:
        self.window_micro.append(self._current)
        self.windows.append([i for mb in self._current for i in mb])
        self._current = []


def make_task(n: int = 24, lengths: str = "variable", dtype: torch.dtype = torch.float64, seed: int = 0,
              optimizer: Optional[Callable] = sgd, dropout: float = 0.0, val: bool = False,
              loss: Optional[Callable] = None, recorder: Optional[Recorder] = None,
              seqs: Optional[list[torch.Tensor]] = None, model: Optional[nn.Module] = None) -> Task:
    seqs = seqs if seqs is not None else make_seqs(n, lengths, seed)
    if model is None:
        torch.manual_seed(seed)
        model = TokenModel(dropout)
    model = model.to(dtype)
    return Task(model=model, train_data=TokenData(seqs),
                val_data=TokenData(make_seqs(8, lengths, seed + 7)) if val else None,
                loss=loss or token_loss_sum, collate=recorder.collate if recorder else token_collate,
                optimizer=optimizer, sample_length=sample_length, name="tokens")


# -- running the trainer ------------------------------------------------------------------------
@dataclass
class Run:
    result: Any
    trainer: Any
    events: list = field(default_factory=list)
    run_dir: str = ""

    def of(self, kind: str) -> list:
        return [e for e in self.events if e.kind == kind]

    @property
    def steps(self) -> list:
        return self.of("step")


def run_trainer(task: Task, run_dir, on_event: Optional[Callable[[Any, Any], None]] = None,
                recorder: Optional[Recorder] = None, db_interval: float = 1.0, **cfg: Any) -> Run:
    """Train `task` on CPU with clip off and one epoch unless told otherwise. `db_interval`:
    seconds between the engine's reads of run.db's commands (0: at every step)."""
    from engine.trainer.trainer import Trainer
    settings = dict(device="cpu", clip=0.0, epochs=1, lr=0.1, micro_batch=2, accum=3)
    settings.update(cfg)
    if "resume" not in settings:
        settings["run_dir"] = str(run_dir)
        # Not auto: it times the data set's loading and picks workers on a loaded machine, and a
        # Recorder sees only the collate calls made in this process.
        settings.setdefault("workers", 0)
    config = TrainConfig(task="tokens", **settings)
    box: dict[str, Any] = {}
    events: list = []

    def sink(e):
        events.append(e)
        if recorder is not None and e.kind == "run_started":
            recorder.reset()
        if recorder is not None and e.kind == "step":
            recorder.cut()
        if on_event is not None:
            on_event(e, box["trainer"])

    trainer = Trainer(config, task=task, sink=sink, db_interval=db_interval)
    box["trainer"] = trainer
    result = trainer.run()
    return Run(result, trainer, events, str(settings.get("resume") or run_dir))


def params_of(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def snapshot(trainer) -> tuple[dict, dict]:
    return copy.deepcopy(trainer.model.state_dict()), copy.deepcopy(trainer.optimizer.state_dict())


def assert_same_tree(a: Any, b: Any, path: str = "") -> None:
    """Bit-identical: tensors by torch.equal (dtype too), everything else by ==."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), f"tensor differs at {path}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"keys differ at {path}: {set(a) ^ set(b)}"
        for k in a:
            assert_same_tree(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm())


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1).double() for t in tensors])
