"""The builtin mlp task (its model, data and name), each training micro-batch paced by a short
sleep: the live runs the headroom-ctl tests steer train until stopped, and at full speed each
kept a core busy for the whole module (~10-16 s of CPU a module on CI's loaded 2 cores) where the
tests only need a step every few milliseconds. build_task(seed, pace=seconds)."""
from __future__ import annotations

import time
from typing import Any

from engine.tasks.builtin import mlp
from engine.tasks.task import Task

PACE = 0.02  # seconds a training micro-batch sleeps: two a step (accum 2), ~25 steps a second at most


def build_task(seed: int, pace: float = PACE) -> Task:
    task = mlp.build_task(seed)
    measured = task.loss

    def loss(model: Any, batch: Any) -> Any:
        if model.training:  # not the engine's check of the task, nor validation
            time.sleep(pace)
        return measured(model, batch)

    task.loss = loss
    return task
