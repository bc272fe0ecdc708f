"""The one rule for what the user may do in each run state (the toolbar, the menus and the
Controls panel all follow it). Qt-free."""
from __future__ import annotations

from dataclasses import dataclass

from app.model.state import RunState


@dataclass(frozen=True)
class Allowed:
    """What the Run actions (toolbar, menu and Controls panel alike) may do now."""
    start: bool
    pause: bool
    resume: bool
    stop: bool
    apply: bool
    launch: bool  # Run on N GPUs
    cont: bool = False  # Continue run: the run shown, from its last checkpoint


def allowed(state: RunState, busy: bool, edits_ready: bool, gpus: int, min_gpus: int,
            checkpoint: bool = False) -> Allowed:
    """The one rule. `busy`: a run of this window's own is going or still winding down (its
    engine thread not yet ended); `edits_ready`: the form holds valid live changes to send;
    `checkpoint`: the run shown has one to continue from."""
    return Allowed(start=not busy,
                   pause=state is RunState.TRAINING,
                   resume=state in (RunState.PAUSING, RunState.PAUSED),
                   stop=state.is_live and state is not RunState.STOPPING,
                   apply=state.is_live and state is not RunState.STOPPING and edits_ready,
                   launch=not busy and gpus >= min_gpus,
                   cont=not busy and not state.is_live and checkpoint)
