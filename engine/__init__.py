"""Headroom's training engine: exact gradient accumulation, no Qt.

Light modules (config, events, commands, store) import without torch so the app
starts fast; Task and Trainer load torch on first use.
"""
from __future__ import annotations

from typing import Any

from .declarations.commands import (
    Pause,
    Resume,
    SetAccum,
    SetCheckpointing,
    SetClip,
    SetLr,
    SetLrScaling,
    SetMicroBatch,
    Stop,
    Unpause,
)
from .declarations.config import ConfigError, TrainConfig
from .declarations.events import EventBuffer

__version__ = "0.1.0"

_LAZY = {
    "Task": "tasks.task", "TaskError": "tasks.task", "load_task": "tasks.loader",
    "Trainer": "trainer.trainer", "TrainingError": "declarations.outcome", "RunResult": "declarations.outcome",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = ["ConfigError", "TrainConfig", "EventBuffer", "Task", "TaskError", "load_task", "Trainer",
           "TrainingError", "RunResult", "Pause", "Unpause", "Resume", "SetAccum", "SetCheckpointing", "SetClip",
           "SetLr", "SetLrScaling", "SetMicroBatch", "Stop", "__version__"]
