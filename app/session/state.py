"""Where a run stands, as one enum, and the one rule for what the user may do in each state.

A str-valued enum: `RunState.PAUSED == "paused"`, so logs, tests and the status texts read
the same words as before there was an enum. Qt-free.
"""
from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Allowed:
    """What the Run actions (toolbar, menu and Controls panel alike) may do now."""
    start: bool
    pause: bool
    resume: bool
    stop: bool
    apply: bool
    launch: bool  # Run on N GPUs


def allowed(state: RunState, busy: bool, edits_ready: bool, gpus: int, min_gpus: int) -> Allowed:
    """The one rule. `busy`: a run of this window's own is going or still winding down (its
    engine thread not yet ended); `edits_ready`: the form holds valid live changes to send."""
    return Allowed(start=not busy,
                   pause=state is RunState.TRAINING,
                   resume=state in (RunState.PAUSING, RunState.PAUSED),
                   stop=state.is_live and state is not RunState.STOPPING,
                   apply=state.is_live and state is not RunState.STOPPING and edits_ready,
                   launch=not busy and gpus >= min_gpus)
