"""Read-only views of a trainer for tests, the CLI and the app: where the run is and what it
trains, without reaching into its parts."""
from __future__ import annotations

from typing import Optional

import torch

from engine.tasks.task import Task

from .progress import Progress
from .setup import RunParts


class TrainerViews:
    progress: Progress
    parts: RunParts  # built with the trainer: every view can be read before, during and after run()

    @property
    def step(self) -> int:
        return self.progress.step

    @property
    def epoch(self) -> int:
        return self.progress.epoch

    @property
    def nonfinite_steps(self) -> int:
        return self.progress.nonfinite_steps

    @property
    def deferred(self) -> bool:
        """True when steps are reported one step late (the sync-free step, step.py)."""
        return self.parts.window.stepper.depth > 0

    @property
    def run_dir(self) -> str:
        return self.parts.run_dir

    @property
    def model(self) -> torch.nn.Module:
        return self.parts.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.parts.optimizer

    @property
    def scaler(self) -> Optional[torch.amp.GradScaler]:
        return self.parts.scaler

    @property
    def device(self) -> torch.device:
        return self.parts.device

    @property
    def task(self) -> Task:
        return self.parts.task
