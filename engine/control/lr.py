"""The lr each window trains with: the schedule's factor at the samples seen times the peak
(the lr setting), or what the task's own torch scheduler set. Written into the optimizer
only when it moves; the plan ahead of the run is published as an `lr_planned` event."""
from __future__ import annotations

from typing import Optional

import torch

from engine.declarations.events import LrPlanned
from engine.declarations.schedule import LrSchedule
from engine.declarations.settings import LiveSettings


class LrControl:
    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LrSchedule, task_scheduler: object) -> None:
        self.optimizer, self.schedule, self.task_scheduler = optimizer, schedule, task_scheduler
        self._in_use: Optional[float] = None  # the lr last written into the optimizer

    def for_window(self, settings: LiveSettings, samples_seen: int) -> LiveSettings:
        """The settings this window trains with (the lr the step uses, as its row will say)."""
        if self.task_scheduler is not None:  # the task's own scheduler set the lr: report what it set
            lr = float(self.optimizer.param_groups[0]["lr"])
        else:
            lr = settings.lr * self.schedule.factor(samples_seen)
            if lr != self._in_use:
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self._in_use = lr
        return settings if lr == settings.lr else settings.with_(lr=lr)

    def invalidate(self) -> None:
        """The peak (or the optimizer's state) changed: the next window writes its lr again."""
        self._in_use = None

    def plan(self, step: int, epoch: int, peak: float, samples_seen: int) -> LrPlanned:
        s = self.schedule
        return LrPlanned(step, epoch, schedule=s.kind, peak=peak, warmup_samples=s.warmup, total_samples=s.total,
                         min_lr_ratio=s.min_ratio, samples_now=samples_seen, curve=s.curve(peak))
