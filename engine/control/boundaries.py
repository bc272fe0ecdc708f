"""Where commands act: the epoch boundary (pending settings, pause and resume) and the
step boundary (settings sent with at="step"). Never inside a window.

`Boundaries` takes the pending commands from the inbox, applies the setting changes
through the pure `CommandRules`, marks run.db's rows, emits the events that report them
and returns the new settings: what follows a change (the lr, the watchers) is the run
loop's, which compares them with the settings it had.
"""
from __future__ import annotations

import time
from typing import Callable

from engine.declarations.rules import CommandRules
from engine.declarations.commands import Pause, Resume, Stop
from engine.declarations.events import CommandRefused, Event, Paused, Resumed
from .inbox import CommandInbox, Pending
from engine.declarations.settings import LiveSettings

PAUSE_POLL_S = 0.05
NOTHING_PAUSED = "nothing is paused (a pause takes effect at the end of the epoch)"


class Boundaries:
    def __init__(self, inbox: CommandInbox, rules: CommandRules, emit: Callable[[Event], None]) -> None:
        self.inbox, self.rules, self.emit = inbox, rules, emit

    def epoch(self, step: int, epoch: int, settings: LiveSettings) -> LiveSettings:
        """Apply what is pending; wait here while paused (a stop ends the wait)."""
        paused = False
        while True:
            self.inbox.poll(step, epoch, epoch, force=True)
            batch = self.inbox.take()
            for cmd, row_id in batch:
                if isinstance(cmd, Pause):
                    if not paused:
                        self.emit(Paused(step, epoch - 1))
                    paused = True
                    self.inbox.mark(row_id, "", step)
                elif isinstance(cmd, Resume):
                    if paused:
                        self.emit(Resumed(step, epoch))
                        self.inbox.mark(row_id, "", step)
                    else:  # said, not dropped: the sender sees why nothing happened
                        self.inbox.mark(row_id, NOTHING_PAUSED, step)
                        self.emit(CommandRefused(step, epoch, command=cmd.kind, reason=NOTHING_PAUSED))
                    paused = False
            settings = self.apply(settings, [(c, r) for c, r in batch if not isinstance(c, (Pause, Resume, Stop))],
                                  step, epoch, "epoch")
            if not paused or self.inbox.stop.is_set():
                return settings
            time.sleep(PAUSE_POLL_S)

    def step(self, step: int, epoch: int, settings: LiveSettings, ranks_agreed: bool) -> LiveSettings:
        """Settings sent with at="step". Under torchrun every rank learnt from the step's all-reduce
        that rank 0 holds some (`ranks_agreed`), and joins the broadcast that brings them."""
        if self.inbox.ctx.enabled:
            if not ranks_agreed:
                return settings
            self.inbox.poll(step, epoch, epoch + 1, force=True)
        elif not self.inbox.has_step_commands():
            return settings
        return self.apply(settings, self.inbox.take(at="step"), step, epoch, "step")

    def apply(self, settings: LiveSettings, batch: list[Pending], step: int, epoch: int, at: str) -> LiveSettings:
        if not batch:
            return settings
        applied = self.rules.apply(settings, [c for c, _ in batch], step, epoch, at)
        for (_, row_id), note in zip(batch, applied.notes):
            self.inbox.mark(row_id, note, step)
        for e in applied.events:
            self.emit(e)
        return applied.settings
