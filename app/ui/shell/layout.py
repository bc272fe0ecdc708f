"""The window's dock layout: the default one, or the one the user left.

The plots are built just after the window first paints (pyqtgraph's import is most of
start-up). They used to replace the "Loading plots..." placeholder as the window's central
widget, and QMainWindow re-fits its docks around a new central widget: from the second
launch on (a restored state) the docks took the room and the plots were left a strip (one
title and an x axis) under the Alerts dock. The window's central widget is now one stack
for its whole life (app/main_window.py), the plots replacing the placeholder inside it. And a
restored layout that still leaves the plots under half the window's height (or under
MIN_PLOT_WIDTH of its width: a state saved by an older version, a screen that shrank) is not
kept: the default layout is used instead.

Every dock's panel sits in a scroll area: a panel's own minimum size (a wide table, a row of
buttons) scrolls inside its dock instead of setting the window's minimum width. What must stay
in reach (Apply changes) is pinned under the scroll area instead.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Sequence

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFrame,
    QMainWindow,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

log = logging.getLogger("headroom.window")

MIN_PLOT_HEIGHT = 0.5  # of the window's height
MIN_PLOT_WIDTH = 0.4  # of the window's width
CONTROLS_WIDTH = 360  # the default layout: the Controls panel without a horizontal scroll bar, at most
CONTROLS_SHARE = 0.36  # this share of the window's width
ALERTS_HEIGHT = 170  # at most a quarter of the window's height


def scrolled(widget: QWidget, horizontal: bool = True) -> QScrollArea:
    """`widget` in a frameless scroll area that gives it the whole width and height it can."""
    s = QScrollArea()
    s.setWidget(widget)
    s.setWidgetResizable(True)
    s.setFrameShape(QFrame.Shape.NoFrame)
    # Not Expanding (a scroll area's default): QMainWindow shares extra room between the plots
    # and every dock that expands, so a window growing (its first resize, a restored geometry)
    # would grow the docks too. Preferred: the plots take it.
    s.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
    if not horizontal:
        s.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    return s


def pinned_under(body: QWidget, footer: Sequence[QWidget]) -> QWidget:
    """`body` (a scroll area) over `footer`, which stays in view however the body is scrolled:
    Apply changes under the Controls panel, never below the fold of a 640 px high window."""
    box = QWidget()
    lay = QVBoxLayout(box)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.setSpacing(0)
    lay.addWidget(body, 1)
    pinned = QFrame()
    pinned.setObjectName("dock_footer")
    pinned.setFrameShape(QFrame.Shape.NoFrame)
    foot = QVBoxLayout(pinned)
    foot.setContentsMargins(8, 6, 8, 6)
    foot.setSpacing(2)
    for w in footer:
        foot.addWidget(w)
    lay.addWidget(pinned)
    box.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)  # as scrolled(): see there
    return box


def make_dock(window: QMainWindow, title: str, name: str, widget: QWidget, area: Qt.DockWidgetArea,
              footer: Sequence[QWidget] = ()) -> QDockWidget:
    """A dock of the window; its panel scrolls inside it, `footer` (widgets taken from the
    panel) stays pinned at its bottom, outside the scroll area."""
    d = QDockWidget(title, window)
    d.setObjectName(f"dock_{name}")
    body = widget if isinstance(widget, QScrollArea) else scrolled(widget)
    d.setWidget(pinned_under(body, footer) if footer else body)
    d.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                  | QDockWidget.DockWidgetFeature.DockWidgetFloatable
                  | QDockWidget.DockWidgetFeature.DockWidgetClosable)
    window.addDockWidget(area, d)
    return d


def plot_share(window: QMainWindow) -> tuple[float, float]:
    """(height, width) of the central widget (the plots) as shares of the window's."""
    c = window.centralWidget()
    if c is None or window.height() <= 0 or window.width() <= 0:
        return 0.0, 0.0
    return c.height() / window.height(), c.width() / window.width()


def plots_visible_enough(window: QMainWindow) -> bool:
    h, w = plot_share(window)
    return h >= MIN_PLOT_HEIGHT and w >= MIN_PLOT_WIDTH


def settle(window: QMainWindow, probe: Callable[[], Any] = lambda: None, timeout: float = 3.0,
           rounds: int = 3) -> bool:
    """Process events until the window's layout has stopped changing (the window, its central
    widget and docks, and whatever `probe` returns the same `rounds` times in a row, ~20 ms
    apart), at most `timeout` seconds. A scripted screenshot waits for this, so it shows the
    window as a person would see it. True if it settled."""
    app = QApplication.instance()
    if app is None:
        return False

    def shape() -> tuple:
        parts = [window.geometry().getRect()]
        parts += [w.geometry().getRect() for w in [window.centralWidget(), *window.findChildren(QDockWidget)]
                  if w is not None]
        return (*parts, probe())

    deadline = time.monotonic() + timeout
    last, same = None, 0
    while time.monotonic() < deadline:
        app.processEvents()
        now = shape()
        same = same + 1 if now == last else 0
        if same >= rounds:
            return True
        last = now
        time.sleep(0.02)
    return False


class DockLayout(QObject):
    """The docks' layout: the saved state if there is one and it leaves the plots room once they
    are in, else the default."""

    def __init__(self, window: QMainWindow, controls: QDockWidget, bottom: QDockWidget) -> None:
        super().__init__(window)
        self.w, self.controls, self.bottom = window, controls, bottom
        self.restored = False  # a saved state was restored (and, once checked, kept)
        self._check_when_shown = False
        window.installEventFilter(self)

    def default(self) -> None:
        w = self.w
        w.resizeDocks([self.bottom], [min(ALERTS_HEIGHT, max(80, w.height() // 4))], Qt.Orientation.Vertical)
        w.resizeDocks([self.controls], [min(CONTROLS_WIDTH, max(220, int(w.width() * CONTROLS_SHARE)))],
                      Qt.Orientation.Horizontal)

    def restore(self, state: Optional[Any]) -> bool:
        """The saved state (QMainWindow.saveState), at start; checked once the plots are in."""
        self.restored = state is not None and bool(self.w.restoreState(state))
        if not self.restored:
            self.default()  # now, so the plots are built at their size; again once they are in
        return self.restored

    def forget_saved(self) -> None:
        """The default layout whatever was saved (scripted screenshots: the same every time)."""
        self.restored = False

    def plots_in(self) -> None:
        """The plots are in the window: keep the restored layout if it leaves them room, else
        lay out the default."""
        if self.restored:
            if self.w.isVisible():
                QTimer.singleShot(0, self, self.check)
            else:
                self._check_when_shown = True
            return
        self.default()
        QTimer.singleShot(0, self, self.default)  # again once the plots' size hints are in the layout

    def check(self) -> bool:
        """True if the layout leaves the plots room; else lays out the default one."""
        lay = self.w.layout()
        if lay is not None:
            lay.activate()
        if plots_visible_enough(self.w):
            return True
        h, wd = plot_share(self.w)
        log.info("restored layout left the plots %.0f%% of the height, %.0f%% of the width: default layout",
                 100 * h, 100 * wd)
        self.restored = False
        self.default()
        QTimer.singleShot(0, self, self.default)
        return False

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802 - Qt name
        if obj is self.w and ev.type() == QEvent.Type.Show and self._check_when_shown:
            self._check_when_shown = False
            QTimer.singleShot(0, self, self.check)
        return False
