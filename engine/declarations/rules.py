"""Applying a batch of setting commands to the live settings: a pure function.

`CommandRules.apply(settings, commands)` returns the new settings, the events that
report what happened (settings_applied, command_refused, lr_hint) and, per command,
the refusal note ('' when applied). No trainer, no store, no torch: the lr
arithmetic is tested on its own (tests/engine/test_declarations.py, test_split_units.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, Sequence

from engine.declarations.commands import Command, SetLr, setting_change
from engine.declarations.events import CommandRefused, Event, LrHint, SettingsApplied
from engine.declarations.settings import LIVE_SETTINGS, LiveSettings, scale_lr


class Applied(NamedTuple):
    settings: LiveSettings
    events: list[Event]
    notes: list[str]  # one per command: '' if applied, else why it was refused


def samples_a_window(settings: LiveSettings) -> int:
    return settings.window_samples


@dataclass(frozen=True)
class CommandRules:
    """What a run can take: its data set size and its window policy's refusals. `window_size`
    is the policy's effective batch under given settings (micro-batch x accum per rank, or,
    under --token-budget, the budget whatever the micro-batch): the lr scaling rule follows
    its change, and only its change."""
    data_len: int
    refusal: Callable[[str], Optional[str]] = lambda setting: None
    window_size: Callable[[LiveSettings], float] = samples_a_window

    def apply(self, settings: LiveSettings, commands: Sequence[Command], step: int, epoch: int,
              at: str = "epoch") -> Applied:
        events: list[Event] = []
        notes: list[str] = []
        new = settings
        for cmd in commands:
            change = setting_change(cmd)
            if change is None:
                refusal = getattr(cmd, "refusal", "")  # a command no boundary can apply (set_precision)
                if refusal:
                    events.append(CommandRefused(step, epoch, command=cmd.kind, reason=refusal))
                notes.append(refusal)  # else pause, resume, stop: nothing to apply here
                continue
            setting, value = change
            note = self.refusal(setting.name) or self._out_of_range(setting.name, value) \
                or length_passed(setting.name, value, step, epoch)
            if note:
                events.append(CommandRefused(step, epoch, command=cmd.kind, reason=note))
            else:
                new = new.with_(**{setting.name: value})
            notes.append(note)
        asked = new
        new, hint = _scale_lr(settings, new, explicit_lr=any(isinstance(c, SetLr) for c in commands),
                              step=step, epoch=epoch, size=self.window_size)
        events.extend(hint)
        changes = tuple((s.name, getattr(settings, s.name), getattr(new, s.name))
                        for s in LIVE_SETTINGS if getattr(settings, s.name) != getattr(new, s.name))
        by_rule = tuple(s.name for s in LIVE_SETTINGS if getattr(asked, s.name) != getattr(new, s.name))
        if changes:
            events.append(SettingsApplied(step, epoch, changes=changes, at=at, from_step=step + 1, by_rule=by_rule))
        return Applied(new, events, notes)

    def _out_of_range(self, name: str, value: object) -> str:
        if name == "micro_batch" and isinstance(value, int) and value > self.data_len:
            return f"micro-batch {value} is larger than the data set ({self.data_len} samples)"
        return ""


def length_passed(name: str, value: object, step: int, epoch: int) -> str:
    """Why a new run length is one the run has already passed ('' if it is not): epochs below
    the epoch being trained (or about to start, at an epoch boundary), max steps at or below
    the steps done. The run ends at a length it has yet to reach, never mid-way through it."""
    if name == "epochs" and isinstance(value, int) and value < epoch:
        done = epoch - 1
        return f"epochs={value} refused: the run has finished {done} epoch{'s' if done != 1 else ''}; " \
               f"give at least {epoch}"
    if name == "max_steps" and isinstance(value, int) and value <= step:
        return f"max_steps={value} refused: the run has done {step} steps; give at least {step + 1}"
    return ""


def _scale_lr(before: LiveSettings, after: LiveSettings, explicit_lr: bool, step: int, epoch: int,
              size: Callable[[LiveSettings], float] = samples_a_window) -> tuple[LiveSettings, list[Event]]:
    """The effective batch changed and the user set no lr: apply the lr scaling rule, or
    (rule 'none') suggest what the linear rule would give."""
    old_eff, new_eff = size(before), size(after)
    if new_eff == old_eff or explicit_lr:
        return after, []
    ratio = new_eff / old_eff
    if after.lr_scaling != "none":
        return after.with_(lr=scale_lr(after.lr, after.lr_scaling, ratio)), []
    return after, [lr_hint(step, epoch, before.accum, after.accum, after.lr, ratio)]


def lr_hint(step: int, epoch: int, accum_old: int, accum_new: int, lr: float, ratio: float) -> LrHint:
    """The hint, where the effective batch changed by `ratio` and the lr did not: what the linear
    rule would give. The engine's (rule 'none') and a plain loop's (engine.integrations) alike."""
    return LrHint(step, epoch, accum_old=accum_old, accum_new=accum_new, suggested_lr=scale_lr(lr, "linear", ratio))
