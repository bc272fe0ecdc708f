"""The task interface: what a user's task file returns, and the checks of what it returned.

Loading a task from a name, a file or a module is engine/tasks/loader.py."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch

from engine.declarations.config import ConfigError

LossFn = Callable[[torch.nn.Module, Any], "tuple[torch.Tensor, int | torch.Tensor]"]


@dataclass
class Task:
    """What `build_task(seed)` returns.

    loss(model, batch) returns (loss_sum, count): the loss summed over the batch's
    counted items (samples or tokens) and how many there were. The engine divides
    by the window's total count, so windows of different token counts are exact.
    """
    model: torch.nn.Module
    train_data: Any  # map-style Dataset: __len__ and __getitem__
    loss: LossFn
    collate: Optional[Callable[[list], Any]] = None
    val_data: Any = None
    optimizer: Optional[Callable[[Any, float], torch.optim.Optimizer]] = None
    sample_length: Optional[Callable[[Any], int]] = None
    # fn(optimizer) -> torch.optim.lr_scheduler.LRScheduler: the task's own schedule, stepped
    # once per optimizer step (then --lr-schedule stays constant; set_lr scales its base lrs).
    scheduler: Optional[Callable[[torch.optim.Optimizer], Any]] = None
    # fn(model, on): switch activation checkpointing (engine/memory/activation_checkpointing.py finds Hugging
    # Face models' own switch by itself).
    checkpointing: Optional[Callable[[torch.nn.Module, bool], None]] = None
    name: str = "task"
    # fn(model) -> the modules --strategy fsdp shards one by one (e.g. the transformer layers); without it,
    # a Hugging Face model's _no_split_modules classes, else each top-level child that holds parameters.
    blocks: Optional[Callable[[torch.nn.Module], Any]] = None


class TaskError(ConfigError):
    """A task could not be loaded or is malformed. Message names the task and the problem."""


def check_task(task: Task) -> None:
    name = task.name
    if not isinstance(task.model, torch.nn.Module):
        raise TaskError(f"task {name}: model must be a torch.nn.Module, got {type(task.model).__name__}")
    if not any(p.requires_grad for p in task.model.parameters()):
        raise TaskError(f"task {name}: the model has no trainable parameters")
    if any(p.is_meta for p in task.model.parameters()):
        raise TaskError(f"task {name}: the model has parameters on the meta device (no data to train): "
                        "materialise them first, e.g. model.to_empty(device=...) and load the weights")
    for label, data in (("train_data", task.train_data), ("val_data", task.val_data)):
        if data is None and label == "val_data":
            continue
        if isinstance(data, torch.utils.data.IterableDataset):
            raise TaskError(f"task {name}: {label} is an IterableDataset; Headroom needs a map-style dataset "
                            "(__len__ and __getitem__ by index), so every window is exact and a run resumes "
                            "at the sample it stopped")
        if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            raise TaskError(f"task {name}: {label} must be a map-style dataset (__len__ and __getitem__)")
        n = dataset_len(name, label, data)
        if label == "train_data" and n == 0:
            raise TaskError(f"task {name}: train_data is empty")
    if not callable(task.loss):
        raise TaskError(f"task {name}: loss must be callable as loss(model, batch)")
    if task.blocks is not None and not callable(task.blocks):
        raise TaskError(f"task {name}: blocks must be callable as blocks(model) -> the modules to shard")


def check_last_samples(task: Task) -> None:
    """Read the last sample of each set once: a __len__ larger than what __getitem__ holds is
    bad input now, not a failure at step 0 (train) or after a whole epoch (validation, and
    again at every resume)."""
    for label, data in (("train_data", task.train_data), ("val_data", task.val_data)):
        if data is None:
            continue
        n = dataset_len(task.name, label, data)
        if n <= 0:
            continue
        try:
            with torch.random.fork_rng(devices=[]):  # a check: the run's random stream stays as it was
                data[n - 1]
        except Exception as e:  # IndexError, KeyError, a file that is not there, ...
            raise TaskError(f"task {task.name}: {label} says it holds {n} samples (len) but reading the last, "
                            f"{label}[{n - 1}], failed: {type(e).__name__}: {e}") from None


def dataset_len(name: str, label: str, data: Any) -> int:
    """len(data), or a TaskError if __len__ fails or is not a non-negative integer."""
    try:
        n = len(data)
    except Exception as e:  # __len__ raised, or returned -1, 2.5, ...
        raise TaskError(f"task {name}: len({label}) failed: {type(e).__name__}: {e}") from None
    return n


def check_loss_output(name: str, out: Any) -> tuple[torch.Tensor, Any]:
    """Validate what a task's loss returned on the first micro-batch."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise TaskError(f"task {name}: loss must return (loss_sum, count), got {type(out).__name__}")
    loss_sum, count = out
    if not (isinstance(loss_sum, torch.Tensor) and loss_sum.dim() == 0):
        shape = tuple(loss_sum.shape) if isinstance(loss_sum, torch.Tensor) else type(loss_sum).__name__
        raise TaskError(f"task {name}: loss_sum must be a scalar tensor, got {shape}")
    if not (isinstance(count, (int, torch.Tensor)) and not isinstance(count, bool)):
        raise TaskError(f"task {name}: count must be an int or a tensor, got {type(count).__name__}")
    if isinstance(count, torch.Tensor) and count.numel() != 1:
        raise TaskError(f"task {name}: count must be a single number, got shape {tuple(count.shape)}")
    return loss_sum, count


def default_collate(samples: list) -> Any:
    return torch.utils.data.default_collate(samples)


def _inner_schedulers(sched: Any) -> Iterator[Any]:
    """A scheduler and those it steps itself (SequentialLR, ChainedScheduler, a wrapper's
    `scheduler`), each once."""
    seen: set[int] = set()
    todo = [sched]
    while todo:
        s = todo.pop()
        if s is None or id(s) in seen:
            continue
        seen.add(id(s))
        yield s
        inner = getattr(s, "_schedulers", None)
        todo += list(inner) if isinstance(inner, (list, tuple)) else []
        wrapped = getattr(s, "scheduler", None)
        if wrapped is not None and callable(getattr(wrapped, "step", None)):
            todo.append(wrapped)


def check_scheduler(name: str, sched: Any) -> None:
    """The engine steps a task's scheduler once per optimizer step, as `step()`, with no
    argument (engine.steering.lr.LrControl). A scheduler (or one inside it) whose step() needs
    one, ReduceLROnPlateau's step(metrics) first of all, would pass set-up and fail at step 1
    with a run folder written: refused here, before anything is written."""
    for s in _inner_schedulers(sched):
        step = getattr(s, "step", None)
        if not callable(step):
            raise TaskError(f"task {name}: scheduler(optimizer) must return a torch lr scheduler, "
                            f"got {type(s).__name__}")
        try:
            sig = inspect.signature(step)
        except (TypeError, ValueError):  # a step() whose signature Python cannot tell: trusted as a scheduler's
            continue
        try:
            sig.bind()
        except TypeError:
            need = ", ".join(p.name for p in sig.parameters.values()
                             if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                                    p.KEYWORD_ONLY))
            raise TaskError(
                f"task {name}: its scheduler {type(s).__name__} steps on a value (step({need})), but the engine "
                "steps a task's scheduler once per optimizer step with no argument; use a schedule that "
                "steps by itself (--lr-schedule, or a torch scheduler such as LambdaLR, OneCycleLR, "
                "CosineAnnealingLR)") from None
