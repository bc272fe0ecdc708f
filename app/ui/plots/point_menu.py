"""'Fork from here...' in every plot's right-click menu. The view box remembers where the
menu was raised; the panel turns that x (on whichever axis the plots use) into the step
drawn there, and the action asks for a fork from the nearest checkpoint at or before it."""
from __future__ import annotations

from typing import Callable, Optional

import pyqtgraph as pg
from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction

FORK_TEXT = "Fork from here..."


class PointMenu(QObject):
    fork_requested = Signal(int)  # the step under the point clicked

    def __init__(self, to_step: Callable[[float], Optional[int]], parent: Optional[QObject] = None) -> None:
        """to_step: x on the plots' axis -> the step drawn there (None: no step there)."""
        super().__init__(parent)
        self.to_step = to_step
        self.step: Optional[int] = None
        self.actions: list[QAction] = []  # one per plot's menu

    def attach(self, vb: pg.ViewBox) -> None:
        menu = vb.menu
        action = QAction(FORK_TEXT, menu)
        action.setToolTip("Start a new run from the nearest checkpoint at or before this step, "
                          "with settings you change")
        action.triggered.connect(lambda *_: self._fork())
        first = menu.actions()[0] if menu.actions() else None
        menu.insertAction(first, action)
        menu.insertSeparator(first)
        self.actions.append(action)

    def remember(self, x: float) -> Optional[int]:
        """The menu is raised at x: name the step in the actions' text."""
        self.step = self.to_step(x)
        text = FORK_TEXT if self.step is None else f"Fork from step {self.step:,}..."
        for a in self.actions:
            a.setText(text)
            a.setEnabled(self.step is not None)
        return self.step

    def _fork(self) -> None:
        if self.step is not None:
            self.fork_requested.emit(self.step)


class PointViewBox(pg.ViewBox):
    """A plot's view box whose right-click menu starts with 'Fork from here...'."""

    def __init__(self, point_menu: PointMenu) -> None:
        super().__init__()
        self.point_menu = point_menu
        point_menu.attach(self)

    def getMenu(self, ev):  # noqa: N802 - pyqtgraph's name
        self.point_menu.remember(self.mapSceneToView(ev.scenePos()).x())
        return super().getMenu(ev)
