"""Closing the window (or Ctrl+Q) while this window's run trains asks first: "Stop and quit"
stops the run at the next step with a checkpoint (nothing is lost; Continue run goes on from
there), "Cancel" keeps it training. "Don't ask again" is kept in the preferences, and File >
"Ask before closing during a run" turns the question back on. A close that is not a person's
does not ask: a signal (Ctrl+C, SIGTERM), --quit-when-done, or a window opened without the
user's preferences (tests, benchmarks)."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QCheckBox, QMessageBox, QPushButton, QWidget

from app.core.preferences import Preferences

log = logging.getLogger("headroom.window")

ASK_KEY = "ask_before_closing_a_run"
QUESTION = "A run is training in this window. Stop it (a checkpoint is written: Continue run goes on from there) " \
           "and quit?"


class CloseQuestion:
    def __init__(self, parent: QWidget, preferences: Preferences, action: QAction, uses_preferences: bool) -> None:
        self.parent, self.preferences, self.action = parent, preferences, action
        self.uses_preferences = uses_preferences
        self.confirmed = False  # the user said Stop and quit: the next close goes through
        self.box: Optional[QMessageBox] = None
        self.dont_ask: Optional[QCheckBox] = None
        self.stop_button: Optional[QPushButton] = None
        action.setCheckable(True)
        action.setChecked(self.enabled())
        action.toggled.connect(lambda on: self.preferences.set_json(ASK_KEY, bool(on)))

    def enabled(self) -> bool:
        return self.uses_preferences and bool(self.preferences.get_json(ASK_KEY, True))

    def wanted(self) -> bool:
        return self.enabled() and not self.confirmed

    def ask(self, on_stop: Callable[[], object]) -> QMessageBox:
        """Non-blocking: the run goes on while the question is open."""
        if self.box is not None:
            self.box.raise_()
            return self.box
        box = QMessageBox(QMessageBox.Icon.Question, "Quit while a run trains?", QUESTION,
                          QMessageBox.StandardButton.NoButton, self.parent)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        self.stop_button = box.addButton("Stop and quit", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        self.dont_ask = QCheckBox("Don't ask again")
        box.setCheckBox(self.dont_ask)

        def answered(_result: int) -> None:
            stop = box.clickedButton() is self.stop_button
            if self.dont_ask is not None and self.dont_ask.isChecked():
                self.action.setChecked(False)  # kept in the preferences
            self.box = self.dont_ask = self.stop_button = None
            box.deleteLater()
            if stop:
                self.confirmed = True
                QTimer.singleShot(0, on_stop)  # once the question is gone, not from inside its signal

        box.finished.connect(answered)
        self.box = box
        box.open()
        return box


def stop_engine(runner: Any, wait_s: float) -> bool:
    """Stop the window's engine at its next micro-batch (with a checkpoint) and wait up to
    wait_s for its thread. False: still inside something it cannot leave yet (torch loading,
    a long micro-batch); it is never terminated, the window closes once it has stopped."""
    runner.stop()
    t0 = time.perf_counter()
    if not runner.join(wait_s):
        log.warning("engine thread still busy after %.1fs; closing when it stops", wait_s)
        return False
    log.info("engine thread joined in %.2fs", time.perf_counter() - t0)
    return True
