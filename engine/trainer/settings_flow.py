"""The trainer's settings at its boundaries: what a step or an epoch boundary applies, what
follows a change (a switch, a new lr peak or length and the re-planned schedule, the watchers'
word, run.db on disk), and where a run's live length ends it. A part of Trainer (trainer.py),
kept apart so each file reads on its own; the trainer's state it uses is declared below."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from engine import distributed
from engine.declarations.events import Event
from engine.declarations.settings import LiveSettings
from engine.steering.boundaries import Boundaries
from engine.store import RunStore

from .setup import samples_left_total
from .views import TrainerViews
from .watchers import Watcher


class SettingsFlow(TrainerViews):
    settings: LiveSettings
    ctx: distributed.DistContext
    boundaries: Boundaries
    watchers: list[Watcher]
    store: Optional[RunStore]
    _step_commands_agreed: bool
    _emit: Callable[[Event], None]  # the trainer's: an event to run.db and the listeners
    _emit_all: Callable[[Sequence[Event]], None]

    def _step_boundary(self) -> bool:
        """Settings sent with at="step" apply here, between two windows. True if that changed
        how the epoch is cut into windows."""
        agreed, self._step_commands_agreed = self._step_commands_agreed, False
        before = self.settings
        self._settings_changed(self.boundaries.step(self.step, self.epoch, before, agreed))
        return before.window_samples != self.settings.window_samples

    def _epoch_boundary(self) -> None:
        self._settings_changed(self.boundaries.epoch(self.step, self.epoch, self.settings))

    def _settings_changed(self, after: LiveSettings) -> None:
        """What follows a change: the new lr curve, the watchers' word, and run.db on disk."""
        before, self.settings = self.settings, after
        if after is before:  # every step boundary with nothing applied: to_dict (asdict) costs ~25 us a step
            return
        changed = {f for f in before.to_dict() if getattr(before, f) != getattr(after, f)}
        if not changed:
            return
        if "checkpointing" in changed:
            switch = self.parts.switch
            assert switch is not None  # CommandRules refused it if there is no switch
            switch(after.checkpointing)
        if "lr" in changed:
            self.parts.lr.new_peak(before.lr, after.lr)
        if changed & {"epochs", "max_steps"}:
            self._new_length()
        if changed & {"lr", "epochs", "max_steps"}:
            self._emit(self.parts.lr.planned(self.step, self.epoch, after.lr, self.progress.samples,
                                             replanned=bool(changed & {"epochs", "max_steps"})))
        for w in self.watchers:
            self._emit_all(w.on_settings(self.step, self.epoch, after, changed))
        if self.store is not None:
            self.store.commit()

    def _at_max_steps(self) -> bool:
        """The run reached its max steps (a change of its length still waiting applies first)."""
        limit = self.settings.max_steps
        if limit is None or self.step < limit:
            return False
        self._settings_changed(self.boundaries.at_end(self.step, self.epoch, self.settings))
        return self.settings.max_steps is not None and self.step >= self.settings.max_steps

    def _extended(self) -> bool:
        """The last epoch is done: True if a change of the run's length waiting for its boundary
        extended it."""
        self._settings_changed(self.boundaries.at_end(self.step, self.epoch, self.settings))
        return self.progress.epoch <= self.settings.epochs

    def _new_length(self) -> None:
        """The run's length changed: the lr schedule re-planned from here (LrSchedule.replanned),
        kept in the progress a checkpoint saves."""
        p, lr = self.progress, self.parts.lr
        lr.new_length(samples_left_total(self.settings, len(self.parts.task.train_data), self.ctx.world,
                                         self.step, p.samples), p.samples)
        p.plan_total, p.plan_from, p.plan_factor = lr.schedule.total, lr.schedule.from_samples, lr.schedule.from_factor
