"""Roll back a diverging run by itself (--nonfinite rollback, --spike-factor F).

The autopilot watches each reported step. Trouble is either non-finite windows that
repeat (more than MAX_SKIPS skips within the last RECENT steps) or a spike (a window loss
above F x the running average of the good losses, once SPIKE_WARMUP good steps have been
seen). On trouble it names the newest good checkpoint: one written before the trouble
began (a numbered epoch-N/step-S file, last.pt while nothing newer was saved, or the
state the run started from, kept in memory). The run loop restores it, multiplies the lr
peak by --rollback-lr-factor, skips the windows that diverged (the data moves on), keeps
their rows in run.db marked as discarded, writes the rolled-back state as last.pt (a crash
and --resume go on from the rollback, not from what it discarded), and goes on. Rotation
never removes a checkpoint a rollback may still pick (`needed`); one that no longer loads
(a user removed or damaged it) is passed over, with a note, for the next older one. After MAX_IN_A_ROW rollbacks with
no RECENT good steps between them it gives up: the run stops with a checkpoint and says why.

Pure bookkeeping on host numbers, identical on every rank (they all see the same
all-reduced loss and norm), so every rank decides the same.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

MAX_SKIPS = 1  # more than this many non-finite windows ...
RECENT = 20  # ... within this many steps is a divergence, not a glitch
SPIKE_WARMUP = 10  # good steps before spikes are judged
EMA_BETA = 0.9
MAX_IN_A_ROW = 3  # rollbacks without RECENT good steps between them, then stop


@dataclass(frozen=True)
class Target:
    step: int  # the step the restored state was saved at
    path: Optional[str]  # the checkpoint file, or None for the run's starting state (in memory)


@dataclass(frozen=True)
class Trouble:
    reason: str  # "nonfinite" or "spike"
    first_step: int  # the first step of the trouble: the target must be older
    at_step: int  # the step that triggered the rollback


class Autopilot:
    def __init__(self, rollback_on_nonfinite: bool, spike_factor: Optional[float], start_step: int,
                 start_state: Optional[dict[str, Any]]) -> None:
        self.on_nonfinite, self.spike_factor = rollback_on_nonfinite, spike_factor
        self.start = Target(start_step, None)
        self.start_state = start_state  # model/optimizer/scaler/scheduler as the run began (CPU copies)
        self.saves: list[tuple[int, str, bool]] = []  # (step, path, immutable) of every checkpoint written
        self.skips: deque[int] = deque()
        self.ema: Optional[float] = None
        self.good = 0  # good steps seen (for the spike warm-up)
        self.since_rollback = RECENT  # good steps since the last rollback
        self.in_a_row = 0
        self.pending: Optional[Trouble] = None

    @property
    def enabled(self) -> bool:
        return self.on_nonfinite or self.spike_factor is not None

    def saved(self, step: int, path: str, immutable: bool) -> None:
        self.saves.append((step, path, immutable))

    def observe(self, step: int, loss: float, nonfinite: bool) -> None:
        """One reported step (a scaler skip is neither good nor trouble)."""
        if not self.enabled or self.pending is not None:
            return
        if nonfinite:
            self.skips.append(step)
            while self.skips and self.skips[0] <= step - RECENT:
                self.skips.popleft()
            if self.on_nonfinite and len(self.skips) > MAX_SKIPS:
                self.pending = Trouble("nonfinite", self.skips[0], step)
            return
        if not math.isfinite(loss):
            return
        if (self.spike_factor is not None and self.ema is not None and self.good >= SPIKE_WARMUP
                and loss > self.spike_factor * self.ema):
            self.pending = Trouble("spike", step, step)
            return
        self.ema = loss if self.ema is None else EMA_BETA * self.ema + (1 - EMA_BETA) * loss
        self.good += 1
        self.since_rollback += 1
        if self.since_rollback >= RECENT:
            self.in_a_row = 0

    def target(self, trouble: Trouble) -> Target:
        """The newest state saved before the trouble began."""
        return self._newest_before(trouble.first_step)

    def needed(self, now: int) -> set[str]:
        """The checkpoint files a rollback may still pick, at step `now`: the target of every
        trouble that can still begin (at the pending trouble, at a non-finite step recent
        enough to start one, or at any later step). Rotation keeps these."""
        firsts = {s for s in self.skips if s > now - RECENT} | {math.inf}
        if self.pending is not None:
            firsts.add(self.pending.first_step)
        return {t.path for t in (self._newest_before(f) for f in firsts) if t.path is not None}

    def forget(self, path: str) -> None:
        """A checkpoint that no longer loads: never a target again."""
        self.saves = [s for s in self.saves if s[1] != path]

    def restored(self, target: Target) -> None:
        """After a rollback to `target`: the states saved after it were on the discarded path."""
        self.saves = [s for s in self.saves if s[0] <= target.step]

    def _newest_before(self, first_step: float) -> Target:
        newest_last: Optional[tuple[int, str]] = None
        best = self.start
        for i, (step, path, immutable) in enumerate(self.saves):
            if step >= first_step:
                continue
            if not immutable:  # last.pt: good only if nothing was saved over it since
                if i == len(self.saves) - 1 or all(s[1] != path for s in self.saves[i + 1:]):
                    newest_last = (step, path)
                continue
            if step >= best.step:
                best = Target(step, path)
        if newest_last is not None and newest_last[0] > best.step:
            best = Target(*newest_last)
        return best

    def rolled_back(self) -> bool:
        """Bookkeeping after a rollback; False when it is one too many in a row (give up)."""
        self.pending = None
        self.skips.clear()
        self.in_a_row = self.in_a_row + 1 if self.since_rollback < RECENT else 1
        self.since_rollback = 0
        return self.in_a_row <= MAX_IN_A_ROW


def roll_back(parts: Any, progress: Any, settings: Any, trouble: Trouble,
              autopilot: Autopilot) -> tuple[Any, Any, Any, list[str]]:
    """Restore the newest good state saved before `trouble`: its weights, optimizer, scaler and
    scheduler; keep the data position (the diverged windows are skipped: their samples are not
    trained again); go back to its step counter; lower the lr peak. A target file that no
    longer loads is passed over for the next older one (the state the run started from is
    always there). Returns the new progress, settings, event, and a note per file passed over."""
    from engine.checkpoints import files as ckpt
    from engine.declarations.events import RolledBack

    from . import run_state
    notes = []
    while True:
        target = autopilot.target(trouble)
        if target.path is None:
            state = autopilot.start_state
            break
        try:
            state = ckpt.load(target.path)
            break
        except ckpt.CheckpointError as e:  # removed or damaged since it was written
            notes.append(f"rollback passed over {target.path}: {e}")
            autopilot.forget(target.path)
    assert state is not None
    run_state.load_weights(parts, state)
    autopilot.restored(target)
    from_step = progress.step
    progress.step = target.step  # the rows after it are moved to discarded_metrics by the caller
    new = settings.with_(lr=settings.lr * parts.config.rollback_lr_factor)
    event = RolledBack(target.step, progress.epoch, from_step=trouble.at_step, to_step=target.step,
                       reason=trouble.reason, new_lr=new.lr, windows_skipped=from_step - target.step)
    return progress, new, event, notes
