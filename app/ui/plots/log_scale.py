"""A logarithmic y axis, chosen per plot: the loss, the gradient norm and the lr.

Each of these plots has "Log scale" in its right-click menu (and the loss also the toolbar's
box, the View menu's action and Ctrl+L); pyqtgraph's own "Plot Options > Transforms > Log Y"
is the same choice (both ways), so the panel's ranges always know which plots are
logarithmic (ranges.py reads the plot itself). The choices live here, outside the canvas:
a new canvas (a theme switch) is given them again by attach().
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction

from .parts import PlotSet

LOG_PLOTS = ("loss", "norm", "lr")  # the plots that offer a log scale (memory and throughput start at zero)
Y_LABELS = {"loss": "loss", "norm": "norm", "lr": "lr"}
ACTION_TEXT = "Log scale"


class LogScales(QObject):
    changed = Signal(str, bool)  # a plot's name in PlotSet, and whether its y axis is now logarithmic

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self.on: dict[str, bool] = {k: False for k in LOG_PLOTS}
        self.actions: dict[str, QAction] = {}
        self.plots: PlotSet | None = None

    def attach(self, plots: PlotSet) -> None:
        """Offer the choice on these plots (a new canvas's) and show the choices made."""
        self.plots = plots
        self.actions = {}
        for p in plots.all:
            p.ctrl.logXCheck.setEnabled(False)  # every plot shares one x axis, counted from 0: never log
            if p not in [getattr(plots, k) for k in LOG_PLOTS]:
                p.ctrl.logYCheck.setEnabled(False)
        for key in LOG_PLOTS:
            p = getattr(plots, key)
            action = QAction(ACTION_TEXT, p.getViewBox().menu)
            action.setCheckable(True)
            action.setObjectName(f"log_scale_{key}")
            action.setToolTip(f"Show the {Y_LABELS[key]} on a logarithmic y axis")
            _put_first(p.getViewBox().menu, action)
            action.toggled.connect(self._setter(key))
            p.ctrl.logYCheck.toggled.connect(self._setter(key))
            self.actions[key] = action
            self._show(key)

    def _setter(self, key: str) -> Callable[[bool], None]:
        return lambda on: self.set(key, on)

    def set(self, key: str, on: bool) -> None:
        """Make the plot `key` (one of LOG_PLOTS) logarithmic or not; `changed` says so."""
        if key not in self.on or self.on[key] == bool(on):
            return
        self.on[key] = bool(on)
        self._show(key)
        self.changed.emit(key, bool(on))

    def _show(self, key: str) -> None:
        if self.plots is None:
            return
        on = self.on[key]
        p = getattr(self.plots, key)
        if p.ctrl.logYCheck.isChecked() != on:
            p.setLogMode(y=on)  # comes back to set() through the check: already equal there
        p.getViewBox().disableAutoRange()  # pyqtgraph's log switch turns auto range on: the panel sets ranges
        p.setLabel("left", f"{Y_LABELS[key]} (log)" if on else Y_LABELS[key])
        action = self.actions.get(key)
        if action is not None and action.isChecked() != on:
            action.setChecked(on)


def _put_first(menu: object, action: QAction) -> None:
    """After the menu's first group ("Fork from here..."), before pyqtgraph's own entries."""
    acts = menu.actions()  # type: ignore[attr-defined]  # pyqtgraph's context menu (a QMenu): pyqtgraph has no stubs
    sep = next((i for i, a in enumerate(acts) if a.isSeparator()), -1)
    before = acts[sep + 1] if 0 <= sep + 1 < len(acts) else (acts[0] if acts else None)
    menu.insertAction(before, action)  # type: ignore[attr-defined]  # pyqtgraph's context menu (a QMenu): pyqtgraph has no stubs
    if before is not None:
        menu.insertSeparator(before)  # type: ignore[attr-defined]  # pyqtgraph's context menu (a QMenu): pyqtgraph has no stubs
