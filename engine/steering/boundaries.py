"""Where commands act: the epoch boundary (pending settings, pause and resume) and the
step boundary (settings sent with at="step"). Never inside a window.

`Boundaries` takes the pending commands from the inbox, applies the setting changes
through the pure `CommandRules`, marks run.db's rows, emits the events that report them
and returns the new settings: what follows a change (the lr, the watchers) is the run
loop's, which compares them with the settings it had.
"""
from __future__ import annotations

from typing import Callable

from engine.declarations.commands import Command, Pause, Resume, SettingCommand, Stop
from engine.declarations.events import Event, Paused, Resumed
from engine.declarations.rules import CommandRules
from engine.declarations.settings import LENGTH_NAMES, LiveSettings

from .inbox import CommandInbox
from .lifecycle import Received, while_paused


def is_length(cmd: Command) -> bool:
    """A change of the run's length (epochs, max steps)."""
    return isinstance(cmd, SettingCommand) and cmd.setting in LENGTH_NAMES


NOTHING_PAUSED = "nothing is paused (a pause takes effect at the end of the epoch)"


class Boundaries:
    def __init__(self, inbox: CommandInbox, rules: CommandRules, emit: Callable[[Event], None]) -> None:
        self.inbox, self.rules, self.emit = inbox, rules, emit
        self.paused = False

    def epoch(self, step: int, epoch: int, settings: LiveSettings) -> LiveSettings:
        """Apply what is pending; wait here while paused (a stop ends the wait)."""
        self.paused = False  # a pause lasts one boundary's wait: the run is paused only while it waits here
        settings = self._look(step, epoch, settings)
        for _ in while_paused(lambda: self.paused and not self.inbox.stop.is_set()):
            settings = self._look(step, epoch, settings)
        return settings

    def _look(self, step: int, epoch: int, settings: LiveSettings) -> LiveSettings:
        """One look at the epoch boundary: pause and resume, then the settings."""
        life = self.inbox.life
        self.inbox.poll(step, epoch, epoch, force=True)
        batch = self.inbox.take()
        for item in batch:
            if isinstance(item.cmd, (Pause, Resume)):
                self.paused = life.pause_or_resume(item, self.paused, step, epoch, Paused(step, epoch - 1),
                                                   Resumed(step, epoch), idle_resume=NOTHING_PAUSED)
            elif isinstance(item.cmd, Stop):  # its flag ends the wait and the run here: taken, it is applied
                life.applied(item, step)
        return self.apply(settings, [r for r in batch if not isinstance(r.cmd, (Pause, Resume, Stop))],
                          step, epoch, "epoch")

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

    def at_end(self, step: int, epoch: int, settings: LiveSettings) -> LiveSettings:
        """The run reached its length (its last epoch, or max steps): a change of that length
        still waiting for its boundary applies here, whatever boundary it asked for, so a run
        extended in its last epoch goes on. Nothing else is taken (a pause waits for none)."""
        self.inbox.poll(step, epoch, epoch, force=True)
        life = self.inbox.life
        now = [r for r in life.pending if is_length(r.cmd)]
        if not now:
            return settings
        life.pending = [r for r in life.pending if not is_length(r.cmd)]
        return self.apply(settings, now, step, epoch, "end")

    def apply(self, settings: LiveSettings, batch: list[Received], step: int, epoch: int, at: str) -> LiveSettings:
        if not batch:
            return settings
        applied = self.rules.apply(settings, [r.cmd for r in batch], step, epoch, at)
        for item, note in zip(batch, applied.notes):
            self.inbox.life.settle(item, note, step)  # the rules wrote the events that say why
        for e in applied.events:
            self.emit(e)
        return applied.settings
