"""The run loop: set-up (`setup.build` -> `RunParts`), opening the run folder, the epochs and
windows (`trainer.Trainer`), validation, reporting each step, checkpoints of the run's state,
the rollback autopilot, the micro-batch finder and the watchers that raise alerts.

The interface is `Trainer`, `RunResult` and `TrainingError` (loaded on first use: they import torch).
"""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("Trainer", "RunResult", "TrainingError"):
        from engine.trainer import trainer
        return getattr(trainer, name)
    raise AttributeError(f"module 'engine.trainer' has no attribute {name!r}")
