"""Loading a task: a built-in name, a path/to/file.py or module:attr, then build_task(seed)."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from typing import Any, Callable, Optional

import torch

from engine.declarations.paths import BUILTIN_TASKS
from engine.tasks import builtin

from .task import Task, TaskError, check_task

# Task files loaded in this process, by the private module name each was loaded under: a spawned
# DataLoader worker loads them again by path before it unpickles the data set (engine/accumulation/workers.py).
TASK_FILES: dict[str, str] = {}


def resolve_builder(spec: str) -> tuple[Callable[[int], Any], str]:
    """Find the build_task function for a task spec: a built-in name, a .py path or module:attr."""
    if spec in BUILTIN_TASKS:
        return builtin.BUILTIN_MODULES[spec].build_task, spec
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        return _builder_from_file(spec), spec
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        mod = _import(mod_name, spec)
        fn = getattr(mod, attr, None)
        if not callable(fn):
            raise TaskError(f"task {spec}: module {mod_name} has no callable {attr!r}")
        return fn, spec
    raise TaskError(f"unknown task {spec!r}: use one of {', '.join(BUILTIN_TASKS)}, a path/to/file.py or module:attr")


def where(e: BaseException, task_file: str) -> str:
    """' (at PATH:LINE in FUNC)': the last frame of e's traceback in the task's own file, where
    its author looks first; '' if none of it ran there."""
    if not task_file:
        return ""
    target = os.path.abspath(task_file)
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if os.path.abspath(frame.filename) == target:
            return f" (at {frame.filename}:{frame.lineno} in {frame.name})"
    return ""


def _check_accepts(builder: Callable[..., Any], name: str, args: dict[str, Any]) -> None:
    """--task-arg names the builder cannot take are bad input, said before it runs."""
    if not args:
        return
    try:
        sig = inspect.signature(builder)
    except (TypeError, ValueError):
        return  # a builtin or C callable: let the call say
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    takes = {p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                   inspect.Parameter.KEYWORD_ONLY)}
    unknown = sorted(set(args) - takes)
    if unknown:
        wanted = ", ".join(sorted(takes - {next(iter(sig.parameters), "")})) or "none"
        raise TaskError(f"task {name}: build_task takes no argument {unknown[0]!r} (--task-arg; it takes: {wanted})")


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
    module = import_task_file(path)
    fn = getattr(module, "build_task", None)
    if not callable(fn):
        raise TaskError(f"task file {path}: defines no build_task(seed) function")
    return fn


def task_module_name(path: str) -> str:
    """The private name a task file is loaded under (never a clash with an installed module)."""
    return "headroom_task_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")


def import_task_file(path: str, mod_name: Optional[str] = None) -> Any:
    """Load a task file as a module (its folder first on the import path) and register it in
    sys.modules and TASK_FILES. TaskError if it is missing or its import fails."""
    if not os.path.isfile(path):
        raise TaskError(f"task file {path}: no such file")
    # As `python path/to/task.py` would: the file's folder is on the import path, so the task
    # can import the helpers next to it whatever the current folder is.
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    mod_name = mod_name or task_module_name(path)
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
        raise TaskError(f"task file {path}: importing it failed: {type(e).__name__}: {e}{where(e, path)}") from None
    TASK_FILES[mod_name] = os.path.abspath(path)
    return module


def load_task(spec: str, seed: int = 0, task_args: Optional[dict[str, Any]] = None) -> Task:
    """Build and check a task: build_task(seed, **task_args). Raises TaskError with a one-line message."""
    builder, name = resolve_builder(spec)
    args = dict(task_args or {})
    _check_accepts(builder, name, args)
    torch.manual_seed(seed)  # a task that draws random numbers without seeding is still reproducible
    try:
        task = builder(seed, **args)
    except TaskError:
        raise
    except KeyboardInterrupt:
        raise  # Ctrl-C while the task builds is an interruption, not bad input
    except BaseException as e:  # noqa: BLE001 - user code: report anything (SystemExit too)
        shown = ", ".join([str(seed)] + [f"{k}={v!r}" for k, v in args.items()])
        code = getattr(builder, "__code__", None)
        raise TaskError(f"task {name}: build_task({shown}) failed: {type(e).__name__}: {e}"
                        f"{where(e, code.co_filename if code is not None else '')}") from None
    if not isinstance(task, Task):
        raise TaskError(f"task {name}: build_task must return engine.Task, got {type(task).__name__}")
    if task.name == "task":
        task.name = name
    check_task(task)
    return task
