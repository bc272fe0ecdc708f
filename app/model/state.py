"""Where a run stands, as one enum. A str-valued enum: `RunState.PAUSED == "paused"`, so
logs, tests and the status texts read the same words as before there was an enum.

The vocabulary lives down here with the data so that every layer can name a state; the
transitions are the session's alone (app/session/session.py). Qt-free.
"""
from __future__ import annotations

from enum import Enum


class RunState(str, Enum):
    IDLE = "idle"  # no run, or one whose process ended before it trained a step
    STARTING = "starting"  # torch and the task loading, or a torchrun launch without its run.db yet
    TRAINING = "training"
    PAUSING = "pausing"  # Pause sent; the engine pauses at the next epoch boundary
    PAUSED = "paused"  # the engine said it is waiting at a boundary
    STOPPING = "stopping"  # Stop sent; the engine stops at the next micro-batch
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # run.db says running but no process writes it (killed, crashed)

    @property
    def is_live(self) -> bool:
        """A run is going: commands reach it, and no other run can start."""
        return self in LIVE

    @property
    def is_over(self) -> bool:
        return self in OVER


LIVE = frozenset({RunState.STARTING, RunState.TRAINING, RunState.PAUSING, RunState.PAUSED, RunState.STOPPING})
OVER = frozenset({RunState.FINISHED, RunState.FAILED, RunState.INTERRUPTED})
