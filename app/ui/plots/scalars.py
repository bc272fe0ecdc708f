"""The Scalars plot: what a framework logged besides the loss (accuracy, F1, eval_loss ...),
from run.db's `scalars` table, one curve per name picked from its menu.

Shown under the other plots once the run has any scalars (runs written through
engine.integrations); the names picked are kept per run folder in the preferences, so a
run opened again shows what was picked for it. The x axis is the panel's (a scalar's step
placed like the steps of the other plots). The folder is read on the GUI thread at most
every READ_S, from the last row read (a few rows a read).

Compare: each run overlaid on the loss plot draws the same picked scalars here, dashed in
its overlay colour and placed on the x axis by its own steps (samples or tokens seen line
runs up as on the loss plot); the menu offers the names any of them logged.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMenu, QToolButton, QVBoxLayout, QWidget

from app.core.preferences import Preferences
from app.model.metrics import MetricsBuffer
from app.model.scalars import Scalars
from app.model.x_axis import columns
from app.ui.theme import Palette

from .parts import adopt_menus

READ_S = 0.5
HEIGHT_PX = 150
PREF_KEY = "scalars/picked"  # {run folder: [names]}
MAX_KEPT = 200  # run folders whose picks are kept


class ScalarsPlot(QWidget):
    """One plot of picked scalars of the panel's run (see the module doc)."""

    def __init__(self, pal: Palette, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.pal = pal
        self.scalars = Scalars(None)
        self._pushed = False  # self.scalars is the model's (a follow's), not a reader of a run.db here
        self.picked: list[str] = []
        self._chosen = False  # the user picked for this run (else the defaults follow new names)
        self._names: list[str] = []
        self._key: tuple = ()
        self._next_read = 0.0
        self.button = QToolButton()
        self.button.setText("Scalars")
        self.button.setToolTip("Pick what the framework logged to plot (kept for this run)")
        self.button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.menu = QMenu(self.button)
        self.button.setMenu(self.menu)
        self.note = QLabel("")
        self.note.setObjectName("hint")
        top = QHBoxLayout()
        top.setContentsMargins(4, 0, 4, 0)
        top.addWidget(self.button)
        top.addWidget(self.note, 1)
        self.plot = pg.PlotWidget()
        adopt_menus(self.plot.getPlotItem(), self.plot)  # freed with this widget
        self.plot.setBackground(pal.background)
        self.plot.showGrid(x=True, y=True, alpha=pal.grid_alpha)
        self.plot.setLabel("left", "scalars")
        self.plot.setFixedHeight(HEIGHT_PX)  # the other plots keep the rest of the panel
        self.plot.getAxis("left").setWidth(64)  # as the panel's plots: the x axes line up
        self.plot.getViewBox().disableAutoRange(pg.ViewBox.XAxis)
        self.plot.addLegend(offset=(-10, 5))  # top right: the curves start at the left
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.compared: dict[str, tuple[Scalars, MetricsBuffer]] = {}  # Compare's runs, by overlay name
        self.compared_colors: dict[str, str] = {}  # each one's colour on the other plots
        self.compared_curves: dict[tuple[str, str], pg.PlotDataItem] = {}  # (run, scalar)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(top)
        lay.addWidget(self.plot)
        self.setVisible(False)

    # -- the run ----------------------------------------------------------------------------
    def set_run(self, run_dir: Optional[str], pushed: Optional[Scalars] = None) -> None:
        """The run whose scalars to show (None: none); `pushed`: its scalars as a follow brings
        them (a run on another machine), shown instead of reading its run.db here."""
        if pushed is not None and pushed is self.scalars:
            return
        if pushed is None and run_dir == self.scalars.run_dir and not self._pushed:
            return
        if not self._pushed:
            self.scalars.close()
        self._pushed = pushed is not None
        self.scalars = pushed if pushed is not None else Scalars(run_dir)
        kept = _kept().get(run_dir or "") if run_dir else None
        self._chosen = isinstance(kept, list)
        self.picked = [str(n) for n in kept] if isinstance(kept, list) else []
        self._names, self._key, self._next_read = [], (), 0.0
        for item in self.curves.values():
            self.plot.removeItem(item)
        self.curves.clear()
        self.menu.clear()
        self.setVisible(False)

    def refresh(self, steps_to_x: Callable[[np.ndarray], np.ndarray], axis: str, force: bool = False) -> None:
        """Read new rows (at most every READ_S) and redraw what changed."""
        now = time.monotonic()
        if force or now >= self._next_read:
            self._next_read = now + READ_S
            self.scalars.poll()
            for other, _buf in self.compared.values():
                other.poll()
        key = self._state_key(axis)
        if key == self._key and not force:
            return  # the per-frame cost: a clock read and this comparison
        names = sorted(set(self.scalars.names()).union(*(o.names() for o, _b in self.compared.values())))
        if names != self._names:
            self._names = names
            if not self._chosen:
                self.picked = self.scalars.default_picks()
            self._build_menu()
            self.setVisible(bool(names))
        self._key = self._state_key(axis)
        self._draw(steps_to_x)
        self._draw_compared(axis)

    def _state_key(self, axis: str) -> tuple:
        return (self.scalars.version, axis, tuple(self.picked),
                tuple((n, o.version, b.version) for n, (o, b) in self.compared.items()))

    # -- Compare ----------------------------------------------------------------------------
    def add_compared(self, name: str, run_dir: str, buf: MetricsBuffer, color: str = "") -> None:
        """A run overlaid on the loss plot: its picked scalars too (`buf`: its metrics, which
        place its steps on the x axis; `color`: its colour on the other plots)."""
        self.remove_compared(name)
        self.compared[name] = (Scalars(run_dir), buf)
        if color:
            self.compared_colors[name] = color
        self._key, self._next_read = (), 0.0

    def remove_compared(self, name: str) -> None:
        entry = self.compared.pop(name, None)
        self.compared_colors.pop(name, None)
        if entry is not None:
            entry[0].close()
        for key in [k for k in self.compared_curves if k[0] == name]:
            self.plot.removeItem(self.compared_curves.pop(key))
        self._key = ()

    def _draw_compared(self, axis: str) -> None:
        wanted = {(run, n) for run in self.compared for n in self.picked}
        for key in [k for k in self.compared_curves if k not in wanted]:
            self.plot.removeItem(self.compared_curves.pop(key))
        colors = self.pal.overlay
        for i, (run, (other, buf)) in enumerate(self.compared.items()):
            c = self.compared_colors.get(run) or colors[i % len(colors)]
            for name in self.picked:
                steps, values = other.arrays(name)
                item = self.compared_curves.get((run, name))
                if item is None:
                    pen = pg.mkPen(c, width=1.5, style=Qt.PenStyle.DashLine)
                    item = self.plot.plot(pen=pen, symbol="t", symbolSize=5, symbolBrush=c, symbolPen=c,
                                          name=f"{run}: {name}")
                    self.compared_curves[(run, name)] = item
                item.setData(columns(buf).at_steps(axis, steps) if len(steps) else steps, values)

    def match_x(self, x0: float, x1: float) -> None:
        """The panel's x range (the loss plot's), so a step sits under the same step above."""
        if self.isVisible() and x1 > x0:
            self.plot.setXRange(x0, x1, padding=0)

    def set_palette(self, pal: Palette) -> None:
        """The other theme: redrawn in its colours at the next refresh."""
        self.pal = pal
        self.plot.setBackground(pal.background)
        for item in [*self.curves.values(), *self.compared_curves.values()]:
            self.plot.removeItem(item)
        self.curves.clear()
        self.compared_curves.clear()
        self._key = ()

    # -- picking ----------------------------------------------------------------------------
    def _build_menu(self) -> None:
        self.menu.clear()
        for name in self._names:
            act = QAction(name, self.menu)
            act.setCheckable(True)
            act.setChecked(name in self.picked)
            act.toggled.connect(lambda on, n=name: self.pick(n, on))
            self.menu.addAction(act)
        self.note.setText(f"{len(self._names)} logged; {len(self.picked)} shown" if self._names else "")

    def pick(self, name: str, on: bool) -> None:
        """Show or hide one scalar; kept for this run folder."""
        if on and name not in self.picked:
            self.picked.append(name)
        elif not on and name in self.picked:
            self.picked.remove(name)
        else:
            return
        self._chosen = True
        run_dir = self.scalars.run_dir
        if run_dir:
            kept = _kept()
            kept.pop(run_dir, None)
            kept[run_dir] = list(self.picked)
            Preferences().set_json(PREF_KEY, dict(list(kept.items())[-MAX_KEPT:]))
        for act in self.menu.actions():
            if act.text() == name and act.isChecked() != on:
                act.setChecked(on)
        self.note.setText(f"{len(self._names)} logged; {len(self.picked)} shown")
        self._key = ()

    def _draw(self, steps_to_x: Callable[[np.ndarray], np.ndarray]) -> None:
        for name in [n for n in self.curves if n not in self.picked]:
            self.plot.removeItem(self.curves.pop(name))
        colors = self.pal.overlay
        for i, name in enumerate(self.picked):
            steps, values = self.scalars.arrays(name)
            item = self.curves.get(name)
            if item is None:
                c = colors[i % len(colors)]
                item = self.plot.plot(pen=pg.mkPen(c, width=1.5), symbol="o", symbolSize=5, symbolBrush=c,
                                      symbolPen=c, name=name)
                self.curves[name] = item
            item.setData(steps_to_x(steps) if len(steps) else steps, values)

    def curve(self, name: str, run: str = "") -> tuple[np.ndarray, np.ndarray]:
        """What the curve of `name` shows (x, y), for tests; empty if not picked. run: an
        overlaid run's name (Compare) instead of the panel's run."""
        item = self.compared_curves.get((run, name)) if run else self.curves.get(name)
        if item is None:
            return np.empty(0), np.empty(0)
        x, y = item.getData()
        return (np.empty(0), np.empty(0)) if x is None else (np.asarray(x), np.asarray(y))


def _kept() -> dict:
    v = Preferences().get_json(PREF_KEY, {})
    return v if isinstance(v, dict) else {}
