"""How a run ended, in words: completed, stopped, reached its step limit, gave up (non-finite
steps the rollbacks could not get past), stopped at a non-finite step, failed, interrupted;
with one line saying why. The status bar, the alerts and the run history all say it the
same way. Qt-free.

The engine's run_finished event carries the reason's key (completed, max_steps, stopped,
nonfinite); what a "nonfinite" ending means is told by the run's --nonfinite mode and the
rollbacks it logged: under rollback it gave up after rolling back to the same checkpoint
again and again without getting past the trouble.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence


@dataclass(frozen=True)
class Ending:
    key: str  # completed | max_steps | stopped | gave_up | nonfinite | failed | interrupted | running
    word: str  # for the status bar and the history's Status column
    why: str  # one line: the reason

    @property
    def text(self) -> str:
        return f"{self.word}: {self.why}" if self.why else self.word


def gave_up_text(rollbacks: Sequence[Any]) -> str:
    """'gave up after 3 rollbacks in a row to step 6 without getting past it (nonfinite at step 7)'."""
    last = rollbacks[-1]
    to = getattr(last, "to_step", None)
    in_a_row = 0
    for r in reversed(rollbacks):
        if getattr(r, "to_step", None) != to:
            break
        in_a_row += 1
    what = getattr(last, "reason", "") or "trouble"
    at = getattr(last, "from_step", None)
    where = f" ({what} at step {at})" if at is not None else f" ({what})"
    times = f"{in_a_row} rollbacks in a row" if in_a_row > 1 else "a rollback"
    return f"gave up after {times} to step {to} without getting past it{where}"


def ending(status: str, reason: Optional[str], step: int, nonfinite_mode: Optional[str] = None,
           rollbacks: Sequence[Any] = (), error: str = "") -> Ending:
    """status: the run's (finished, failed, interrupted, running); reason: run_finished's key."""
    if status == "failed":
        return Ending("failed", "Failed", error or str(reason or ""))
    if status == "interrupted":
        return Ending("interrupted", "Interrupted", f"its process ended at step {step:,} without finishing")
    if status == "running":
        return Ending("running", "Running", "")
    if reason == "completed":
        return Ending("completed", "Completed", f"every epoch trained ({step:,} steps)")
    if reason == "max_steps":
        return Ending("max_steps", "Reached max steps", f"stopped at its step limit, step {step:,}")
    if reason == "stopped":
        return Ending("stopped", "Stopped", f"stopped by hand at step {step:,}, with a checkpoint: it can be continued")
    if reason == "nonfinite":
        if rollbacks and nonfinite_mode != "stop":
            return Ending("gave_up", "Gave up", gave_up_text(rollbacks))
        return Ending("nonfinite", "Stopped: non-finite", f"a non-finite loss or gradient at step {step:,} "
                                                          "(--nonfinite stop): the last good weights are saved")
    return Ending(str(reason or status or "unknown"), str(reason or status or "Ended").capitalize(), "")
