"""The task interface (what a user's task file returns) and how tasks are loaded."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from .config import ConfigError

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
    name: str = "task"


class TaskError(ConfigError):
    """A task could not be loaded or is malformed. Message names the task and the problem."""


BUILTINS = ("mlp", "charlm", "cnn-bn")


def _builtin_module(name: str):
    from . import tasks
    return tasks.BUILTIN_MODULES[name]


def resolve_builder(spec: str) -> tuple[Callable[[int], Any], str]:
    """Find the build_task function for a task spec: a built-in name, a .py path or module:attr."""
    if spec in BUILTINS:
        return _builtin_module(spec).build_task, spec
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        return _builder_from_file(spec), spec
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        mod = _import(mod_name, spec)
        fn = getattr(mod, attr, None)
        if not callable(fn):
            raise TaskError(f"task {spec}: module {mod_name} has no callable {attr!r}")
        return fn, spec
    raise TaskError(f"unknown task {spec!r}: use one of {', '.join(BUILTINS)}, a path/to/file.py or module:attr")


def _import(mod_name: str, spec: str):
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        raise TaskError(f"task {spec}: cannot import {mod_name!r} ({e})") from None
    except SyntaxError as e:
        raise TaskError(f"task {spec}: syntax error in {e.filename} line {e.lineno}: {e.msg}") from None
    except Exception as e:  # the module's own code failed while importing
        raise TaskError(f"task {spec}: importing {mod_name} failed: {type(e).__name__}: {e}") from None


def _builder_from_file(path: str) -> Callable[[int], Any]:
    if not os.path.isfile(path):
        raise TaskError(f"task file {path}: no such file")
    mod_name = "headroom_task_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise TaskError(f"task file {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(mod_name, None)
        raise TaskError(f"task file {path}: syntax error at line {e.lineno}: {e.msg}") from None
    except BaseException as e:  # noqa: BLE001 - user code, report anything (SystemExit too)
        sys.modules.pop(mod_name, None)
        raise TaskError(f"task file {path}: importing it failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, "build_task", None)
    if not callable(fn):
        raise TaskError(f"task file {path}: defines no build_task(seed) function")
    return fn


def load_task(spec: str, seed: int = 0) -> Task:
    """Build and check a task. Raises TaskError with a one-line message."""
    builder, name = resolve_builder(spec)
    torch.manual_seed(seed)  # a task that draws random numbers without seeding is still reproducible
    try:
        task = builder(seed)
    except TaskError:
        raise
    except BaseException as e:  # noqa: BLE001
        raise TaskError(f"task {name}: build_task({seed}) failed: {type(e).__name__}: {e}") from None
    if not isinstance(task, Task):
        raise TaskError(f"task {name}: build_task must return engine.Task, got {type(task).__name__}")
    if task.name == "task":
        task.name = name
    check_task(task)
    return task


def check_task(task: Task) -> None:
    name = task.name
    if not isinstance(task.model, torch.nn.Module):
        raise TaskError(f"task {name}: model must be a torch.nn.Module, got {type(task.model).__name__}")
    if not any(p.requires_grad for p in task.model.parameters()):
        raise TaskError(f"task {name}: the model has no trainable parameters")
    for label, data in (("train_data", task.train_data), ("val_data", task.val_data)):
        if data is None and label == "val_data":
            continue
        if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            raise TaskError(f"task {name}: {label} must be a map-style dataset (__len__ and __getitem__)")
        if label == "train_data" and len(data) == 0:
            raise TaskError(f"task {name}: train_data is empty")
    if not callable(task.loss):
        raise TaskError(f"task {name}: loss must be callable as loss(model, batch)")


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
