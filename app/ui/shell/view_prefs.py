"""View choices kept in the user's preferences as soon as they change: the plots' x axis, their
smoothing, and when Apply's changes take effect (the next epoch or the next step)."""
from __future__ import annotations

from typing import Any

from app.core.preferences import Preferences
from app.model.smoothing import DEFAULT_WEIGHT, clamp_weight
from app.model.x_axis import DEFAULT_AXIS, axis_or_default

X_AXIS_KEY = "x_axis"
APPLY_AT_KEY = "apply_at"
SMOOTHING_KEY = "plots/smoothing"


class ViewPrefs:
    def __init__(self, preferences: Preferences, restore: bool = True) -> None:
        """restore: take the saved choices (a window opened with restore_settings=False does not)."""
        self.p = preferences
        self.restore = restore

    def bind_controls(self, controls: Any) -> None:
        """The Controls panel's "Apply at" choice."""
        if self.restore:
            controls.set_apply_when(str(self.p.get_json(APPLY_AT_KEY, "epoch")))
        controls.apply_at.currentIndexChanged.connect(lambda _i: self.p.set_json(APPLY_AT_KEY, controls.apply_when()))

    def bind_plots(self, panel: Any, history: Any) -> None:
        """The plots' x axis (the run history's Compare overlays follow it)."""
        if self.restore:
            panel.set_x_axis(axis_or_default(self.p.get_json(X_AXIS_KEY, DEFAULT_AXIS)))
        history.set_x_axis(panel.axis)
        panel.x_axis_changed.connect(lambda key: self.p.set_json(X_AXIS_KEY, key))
        panel.x_axis_changed.connect(history.set_x_axis)
        if self.restore:  # the smoothing weight (app/model/smoothing.py)
            panel.set_smoothing(clamp_weight(self.p.get_json(SMOOTHING_KEY, DEFAULT_WEIGHT)))
        panel.smoothing_changed.connect(lambda w: self.p.set_json(SMOOTHING_KEY, w))
