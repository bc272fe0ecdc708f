"""The lr each window trains with, and the one place that writes it into the optimizer.

`LrControl` owns the optimizer's learning rate for the engine: each window's lr is the
schedule's factor at the samples seen times the peak (the lr setting), or what the task's
own torch scheduler set; a new peak (set_lr, a rollback) rescales the task's scheduler so
its curve keeps its shape. The planned lr ahead of the run is published as an `lr_planned` event.

`rescale` is the scheduler arithmetic the engine and the integrations (set_lr for a plain
loop, the Hugging Face and Lightning callbacks) share: every param group's lr and the keys
schedulers build it from, and the base_lrs / max_lrs of the scheduler and of those nested in
it, multiplied by one factor.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Iterator, Optional

from engine.declarations.events import LrPlanned
from engine.declarations.schedule import LrSchedule
from engine.declarations.settings import LiveSettings

if TYPE_CHECKING:  # torch-free at import: the plain-loop integration loads this before torch
    import torch

GROUP_LR_KEYS = ("initial_lr", "max_lr", "min_lr")  # what schedulers compute a group's lr from


class LrControl:
    """The engine's lr: written into the optimizer here and nowhere else (set-up builds the
    optimizer at the configured lr; checkpoints load its state)."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LrSchedule, task_scheduler: Any) -> None:
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

    def stepped(self) -> None:
        """After each optimizer step, skipped windows included: the task's scheduler counts
        windows (the engine's own schedule counts samples, read by the next window)."""
        if self.task_scheduler is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()" after a skip
                self.task_scheduler.step()

    def new_peak(self, old: float, new: float) -> None:
        """The lr setting moved from `old` to `new`: the task's scheduler (if any) goes on at
        the new level with its shape kept; the schedule's lr is written by the next window."""
        self._in_use = None
        if self.task_scheduler is not None and new != old:
            rescale(self.optimizer, new / old if old else None, new, self.task_scheduler)

    def reloaded(self) -> None:
        """The optimizer's state was loaded (a rollback): the next window writes its lr again."""
        self._in_use = None

    def new_length(self, total_samples: float, samples_seen: int) -> None:
        """The run's length changed to `total_samples`: the schedule is re-planned from where
        the run is (LrSchedule.replanned); the next window writes its lr."""
        self.schedule = self.schedule.replanned(samples_seen, total_samples)
        self._in_use = None

    def resumed(self, total: float, from_samples: float, from_factor: float) -> None:
        """A checkpoint's re-planned schedule (Progress.plan_*, checked by the checkpoint's
        ranges): the run goes on with the curve it had. total 0: the plan made at the start."""
        if total > 0:
            s = self.schedule
            self.schedule = LrSchedule(s.kind, s.warmup, total, s.min_ratio, from_samples, from_factor, s)
            self._in_use = None

    def planned(self, step: int, epoch: int, peak: float, samples_seen: int, replanned: bool = False) -> LrPlanned:
        s = self.schedule
        return LrPlanned(step, epoch, schedule=s.kind, peak=peak, warmup_samples=s.warmup, total_samples=s.total,
                         min_lr_ratio=s.min_ratio, samples_now=samples_seen, curve=s.curve(peak), replanned=replanned)


def rescale(optimizer: Any, factor: Optional[float], lr: float, scheduler: Any = None) -> None:
    """Multiply every param group's lr (and initial_lr, max_lr, min_lr) and the base_lrs /
    max_lrs of `scheduler` and of the schedulers inside it by `factor`, so the schedule goes
    on from the new level with its shape (a warmup keeps warming up, a decay keeps
    decaying, OneCycleLR keeps its cycle). factor None (nothing to scale from: the lr was
    0) sets the lrs, initial_lr and the schedulers' base lrs to `lr` outright. Floors such
    as CosineAnnealingLR's eta_min are left as they are. The schedulers' last lr
    (get_last_lr()) follows. Call it between optimizer steps."""
    for g in optimizer.param_groups:
        g["lr"] = g["lr"] * factor if factor is not None else float(lr)
        for k in GROUP_LR_KEYS if factor is not None else GROUP_LR_KEYS[:1]:
            v = g.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                g[k] = v * factor if factor is not None else float(lr)
    for s in schedulers(scheduler):
        for attr in ("base_lrs", "max_lrs"):
            v = getattr(s, attr, None)
            if isinstance(v, list) and v and all(isinstance(e, (int, float)) for e in v):
                setattr(s, attr, [e * factor if factor is not None else float(lr) for e in v])
        if hasattr(s, "_last_lr") and getattr(s, "optimizer", None) is not None:
            s._last_lr = [g["lr"] for g in s.optimizer.param_groups]  # what get_last_lr() reports


def schedulers(s: Any) -> Iterator[Any]:
    """A scheduler and those inside it (SequentialLR, ChainedScheduler, accelerate's wrapper,
    a list of them)."""
    seen: set[int] = set()
    stack = [s]
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
            continue
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        inner = getattr(x, "_schedulers", None)
        if isinstance(inner, (list, tuple)):
            stack.extend(inner)
        wrapped = getattr(x, "scheduler", None)
        if wrapped is not None and wrapped is not x and hasattr(wrapped, "step"):
            stack.append(wrapped)


def base_lrs(s: Any) -> list[float]:
    """The first base_lrs found in `s` or the schedulers inside it ([] if none)."""
    for x in schedulers(s):
        b = getattr(x, "base_lrs", None)
        if isinstance(b, (list, tuple)) and b:
            return [float(v) for v in b]
    return []
