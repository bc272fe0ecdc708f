"""Scripted runs, for demos, tests and the README screenshot (`python -m app` flags):

  --x-axis step|samples|tokens|time   what the plots' x axis counts (as the toolbar's choice)
  --apply-at epoch|step               when Apply's changes take effect (the Controls panel's choice)
  --change STEP:NAME=VALUE            when the run reaches optimizer step STEP, set the live setting
                                      NAME (micro-batch, accum, lr, ...: engine LIVE_SETTINGS) to VALUE
                                      and press Apply, as a user would (repeatable)
  --screenshot-step N                 take --screenshot when the window shows step N rather than at
                                      the end (with --quit-when-done the run is then stopped, with
                                      its checkpoint: a few more steps may train while the picture
                                      is taken, and none is lost)

A bad value is one `error: ...` line and exit 2, with the engine's own message for a value
out of range (the same check the Apply button's command goes through).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Optional

from app.model.x_axis import X_AXES
from engine.declarations.commands import APPLY_AT, command_for
from engine.declarations.config import RANGES, ConfigError
from engine.declarations.settings import BY_NAME, LIVE_NAMES


@dataclass(frozen=True)
class Change:
    step: int
    name: str  # a live field
    value: Any


def add_flags(group: Any) -> None:
    group.add_argument("--x-axis", choices=[a.key for a in X_AXES], help="what the plots' x axis counts")
    group.add_argument("--apply-at", choices=APPLY_AT, help="when Apply's changes take effect (default: as last "
                                                            "chosen, else the next epoch)")
    group.add_argument("--change", action="append", default=[], metavar="STEP:NAME=VALUE",
                       help=f"at optimizer step STEP, set live field NAME ({_names()}) to VALUE and Apply "
                            "(repeatable)")
    group.add_argument("--screenshot-step", type=int, metavar="N",
                       help="take --screenshot when the window shows step N (with --quit-when-done the run is then "
                            "stopped, with a checkpoint)")


def parse_change(text: str) -> Change:
    """'40:accum=8' -> Change(40, 'accum', 8). Raises ConfigError with one line."""
    head, sep, rest = str(text).partition(":")
    name, eq, raw = rest.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not eq or not head.strip().isdigit():
        raise ConfigError(f"--change must be STEP:NAME=VALUE (e.g. 40:accum=8), got {text!r}")
    step = RANGES["max_steps"].check(int(head), "--change STEP", ConfigError)
    if name not in LIVE_NAMES:
        raise ConfigError(f"--change: {name!r} is not a live setting (one of {_names()})")
    try:
        value = BY_NAME[name].reader(raw.strip())  # the flag's own reader: 4, 3e-4, sqrt, on
    except ConfigError as e:
        raise ConfigError(f"--change {name.replace('_', '-')}: cannot read {raw.strip()!r} ({e})") from None
    command_for(name, value)  # the engine's range check, its message
    return Change(step, name, value)


def _names() -> str:
    return ", ".join(n.replace("_", "-") for n in LIVE_NAMES)


def check(ns: argparse.Namespace) -> list[Change]:
    """The scripted changes, in step order. Raises ConfigError."""
    changes = sorted((parse_change(t) for t in ns.change), key=lambda c: c.step)
    if ns.screenshot_step is not None:
        RANGES["max_steps"].check(ns.screenshot_step, "--screenshot-step", ConfigError)
        if not ns.screenshot:
            raise ConfigError("--screenshot-step needs --screenshot PATH")
    if (changes or ns.screenshot_step is not None) and not ns.autostart:
        raise ConfigError("--change and --screenshot-step need --autostart")
    return changes


class Script:
    """Plays the scripted changes and the mid-run screenshot on a window as its run goes."""

    def __init__(self, window: Any, changes: list[Change], shot_step: Optional[int], shot_path: Optional[str],
                 stop_after_shot: bool) -> None:
        self.w = window
        self.changes = list(changes)
        self.shot_step, self.shot_path, self.stop_after_shot = shot_step, shot_path, stop_after_shot
        self.shot_taken = False
        window.driver.signals.data_changed.connect(self._on_data)

    def _on_data(self) -> None:
        w = self.w
        step = w.model.step
        due = [c for c in self.changes if c.step <= step]
        if due and w.session.state.is_live:
            self.changes = [c for c in self.changes if c.step > step]
            for c in due:
                self._set_field(c.name, c.value)
            w.apply_changes()
        if self.shot_step is not None and not self.shot_taken and step >= self.shot_step and self.shot_path:
            self.shot_taken = True
            w.screenshot(self.shot_path)
            if self.stop_after_shot:
                w.stop_run()

    def _set_field(self, name: str, value: Any) -> None:
        """As a user would: the field's edit signals fire, the hint follows."""
        field = self.w.controls.fields[name]
        if name == "lr_scaling":
            field.setCurrentIndex(field.findData(value))
        else:
            field.set_given(value)


def install(window: Any, ns: argparse.Namespace, changes: list[Change]) -> Optional[Script]:
    if ns.x_axis:
        window.plot_listeners.append(lambda panel: panel.set_x_axis(ns.x_axis))
        if window._plots is not None:
            window._plots.set_x_axis(ns.x_axis)
    if ns.apply_at:
        window.controls.set_apply_when(ns.apply_at)
    if changes or ns.screenshot_step is not None:
        return Script(window, changes, ns.screenshot_step, ns.screenshot, bool(ns.quit_when_done))
    return None
