"""The window's central widget: what stands where the plots go while pyqtgraph loads, just
after the window first shows, then the plots; and a banner over them when what they show may be
behind the run."""
from __future__ import annotations

import time
from typing import Any, Callable

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QStackedWidget, QVBoxLayout, QWidget


class LoadingPlots(QWidget):
    def __init__(self) -> None:
        super().__init__()
        self.paint_listeners: list[Callable[[float], None]] = []  # each called once, at the first paint
        lay = QVBoxLayout(self)
        label = QLabel("Loading plots...")
        label.setObjectName("hint")
        label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(label)

    def paintEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().paintEvent(ev)
        listeners, self.paint_listeners = self.paint_listeners, []
        for fn in listeners:
            fn(time.perf_counter())


class PlotsArea(QWidget):
    """The window's central widget for its whole life: "Loading plots..." until the plots are
    built, just after the window first paints (pyqtgraph's import is the largest part of
    start-up, and the controls are usable before it is done), then the plots in its place.
    One widget throughout: QMainWindow re-fits its docks around a new central widget, and
    while the plots' size hints were not in yet the docks took the room (plots a strip,
    Alerts the window). Over them, a banner while what they show may be behind the run
    ("connection lost: reconnecting, last row at step N")."""

    def __init__(self, make_panel: Callable[[], Any], on_built: Callable[[Any], None]) -> None:
        super().__init__()
        self.setObjectName("plots_area")
        self.panel: Any = None  # the plots, once built
        self._make_panel, self._on_built = make_panel, on_built
        self.banner = QLabel("")
        self.banner.setObjectName("plots_banner")
        self.banner.setWordWrap(True)
        self.banner.setAlignment(Qt.AlignmentFlag.AlignCenter)
        # Its own colours, the same in both themes: a warning, readable on the light and the dark.
        self.banner.setStyleSheet("QLabel#plots_banner { background: #fef3c7; color: #78350f; font-weight: 600; "
                                  "border: 1px solid #d97706; border-radius: 4px; padding: 4px 8px; margin: 2px 4px; }")
        self.banner.setVisible(False)
        self.stack = QStackedWidget()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(self.banner)
        lay.addWidget(self.stack, 1)
        self.placeholder = LoadingPlots()
        self.placeholder.paint_listeners.append(lambda _t: QTimer.singleShot(0, self, self.build))
        self.stack.addWidget(self.placeholder)
        QTimer.singleShot(250, self, self.build)  # in case the window is never painted (hidden)

    def set_banner(self, text: str) -> None:
        """The banner over the plots; '' hides it."""
        if text != self.banner.text():
            self.banner.setText(text)
        if self.banner.isHidden() == bool(text):
            self.banner.setVisible(bool(text))

    def build(self) -> Any:
        """The plots, built now if the event loop has not built them yet."""
        if self.panel is None:
            self.panel = self._make_panel()
            self.stack.addWidget(self.panel)
            self.stack.setCurrentWidget(self.panel)
            self.stack.removeWidget(self.placeholder)
            self.placeholder.deleteLater()
            self._on_built(self.panel)
        return self.panel
