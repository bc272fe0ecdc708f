"""When the plots redraw: at ~30 Hz, slower when a frame costs more than PLOT_BUDGET of the
GUI thread's time (a slow or busy machine), so the event loop stays responsive and training
keeps its CPU, and new points still reach the screen within a few frames."""
from __future__ import annotations

import time
from typing import Any, Callable

from PySide6.QtCore import QObject, Qt, QTimer

TICK_MS = 33  # ~30 Hz: the window's drain-and-repaint timer
PLOT_BUDGET = 0.5  # at most this share of the GUI thread's time goes to redrawing plots...
PLOT_MAX_INTERVAL = 0.066  # ...but a new step is on screen within ~15 frames a second whatever the cost


class PlotPacer(QObject):
    def __init__(self, plots: Callable[[], Any], parent: QObject) -> None:
        """plots: the PlotPanel, or None while pyqtgraph has not loaded yet."""
        super().__init__(parent)
        self._plots = plots
        self._due = False
        self._next = 0.0
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._timer.timeout.connect(self.refresh)

    def mark_due(self) -> None:
        """New data: redraw as soon as the pacing allows."""
        self._due = True
        self.refresh()

    def catch_up(self) -> None:
        """Each tick: a small plot that skipped its turn last frame is due again."""
        panel = self._plots()
        if panel is not None and panel.stale:
            self._due = True
        self.refresh()

    def refresh(self, force: bool = False) -> None:
        panel = self._plots()
        now = time.perf_counter()
        if panel is None or (not force and not self._due):
            return
        if not force and now < self._next:
            if not self._timer.isActive():  # redraw as soon as the pacing allows, not a tick later
                self._timer.start(max(1, int((self._next - now) * 1000)))
            return
        self._timer.stop()
        self._due = False
        panel.refresh(force=force)
        self._next = now + min(PLOT_MAX_INTERVAL, max(TICK_MS / 1000 * 0.9, panel.frame_cost() / PLOT_BUDGET))
