"""View choices kept in the user's preferences as soon as they change: the plots' x axis, their
smoothing, which of them have a log scale, and when Apply's changes take effect (the next epoch
or the next step)."""
from __future__ import annotations

from typing import Any

from app.core.preferences import Preferences
from app.model.smoothing import DEFAULT_WEIGHT, clamp_weight
from app.model.x_axis import DEFAULT_AXIS, axis_or_default

X_AXIS_KEY = "x_axis"
APPLY_AT_KEY = "apply_at"
SMOOTHING_KEY = "plots/smoothing"
HISTORY_KEY = "history/table"  # {"hidden": [column keys], "sort": [key, "asc" | "desc"]}
LOG_KEY = "plots/log_scales"  # {"loss": bool, "norm": bool, "lr": bool}
LEGACY_LOG_KEY = "log_scale"  # the loss's alone, as saved before each plot had its own


class ViewPrefs:
    def __init__(self, preferences: Preferences, restore: bool = True) -> None:
        """restore: take the saved choices (a window opened with restore_settings=False does not)."""
        self.p = preferences
        self.restore = restore
        self.log_scales = saved_log_scales(preferences)  # kept whole: a change to one plot's keeps the others'

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
        if self.restore:  # each plot's log scale (app/ui/plots/log_scale.py)
            for plot, on in self.log_scales.items():
                panel.set_log(plot, on)
        panel.log_scales_changed.connect(self._log_scale_chosen)

    def bind_history(self, history: Any) -> None:
        """The run table's columns shown and its sort (app/ui/runs/run_columns.py)."""
        if self.restore:
            history.set_table_view(self.p.get_json(HISTORY_KEY, None))
        history.table_view_changed.connect(lambda view: self.p.set_json(HISTORY_KEY, view))

    def bind_log_action(self, action: Any) -> None:
        """The loss's log scale, the window's action (View menu, Ctrl+L, the plots' toolbar box):
        restored and kept from the start, before the plots are built."""
        if self.restore and self.log_scales.get("loss"):
            action.setChecked(True)
        action.toggled.connect(lambda on: self._log_scale_chosen("loss", on))

    def _log_scale_chosen(self, plot: str, on: bool) -> None:
        if self.log_scales.get(plot) != on:
            self.log_scales[plot] = on
            self.p.set_json(LOG_KEY, self.log_scales)


def saved_log_scales(p: Preferences) -> dict[str, bool]:
    """plot name -> log scale on, as saved (an older version saved the loss's alone)."""
    saved = p.get_json(LOG_KEY, None)
    if not isinstance(saved, dict):
        saved = {"loss": p.get_json(LEGACY_LOG_KEY, False) is True}
    return {k: v for k, v in saved.items() if isinstance(k, str) and isinstance(v, bool)}
