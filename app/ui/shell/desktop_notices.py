"""A desktop notification when a run the window follows ends or diverges while the window is
not the active one: the system tray's message (QSystemTrayIcon.showMessage), where the desktop
has a tray; where it has none, nothing (the alerts panel says it all the same).

News only: the notes of a run folder read when it is opened (its past) are not announced;
a divergence (a non-finite step, a rollback) is said once a run, its end once.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

from PySide6.QtWidgets import QSystemTrayIcon, QWidget

from app.core import assets
from app.model.notes import Note
from app.runner.signals import SessionSignals

ENDS = ("run_ended", "run_failed")
DIVERGES = ("nonfinite", "rolled_back")
SHOWN_MS = 10_000  # how long the desktop keeps the message up (where it lets the app choose)


def tray_where_there_is_one(parent: QWidget) -> Optional[QSystemTrayIcon]:
    """The app's tray icon, or None where the desktop has no tray (or its tray takes no messages)."""
    if not QSystemTrayIcon.isSystemTrayAvailable() or not QSystemTrayIcon.supportsMessages():
        return None
    return QSystemTrayIcon(assets.app_icon(), parent)


class DesktopNotices:
    """Watches the session's alerts (SessionSignals) and shows the ones worth a notification."""

    def __init__(self, window: QWidget, signals: SessionSignals, tray: Optional[Any] = None) -> None:
        self.window = window
        self.tray = tray if tray is not None else tray_where_there_is_one(window)
        self.away: Callable[[], bool] = lambda: not window.isActiveWindow()
        self.shown: list[tuple[str, str]] = []  # (title, message) of each notification shown
        self._past = False  # the alerts of the update that opened a run are its past, not news
        self._diverged = False
        self._name = ""
        signals.model_replaced.connect(self._new_run)
        signals.run_started.connect(self._named)
        signals.alerts_added.connect(self.on_alerts)
        signals.data_changed.connect(self._news_from_now)  # the last signal of that update

    def _new_run(self, _model: Any) -> None:
        self._past, self._diverged, self._name = True, False, ""

    def _news_from_now(self) -> None:
        self._past = False

    def _named(self, info: dict[str, Any]) -> None:
        run_dir = str(info.get("run_dir") or "")
        self._name = os.path.basename(os.path.normpath(run_dir)) if run_dir else ""

    def on_alerts(self, notes: list[Note]) -> None:
        if self._past or self.tray is None:
            return
        for n in notes:
            if n.kind in ENDS:
                word = "failed" if n.kind == "run_failed" else str(n.data.get("word") or "ended").lower()
                self._show(f"Run {self._name} {word}".replace("  ", " "), n.message, n.kind == "run_failed")
            elif n.kind in DIVERGES and not self._diverged:
                self._diverged = True
                self._show(f"Run {self._name} diverges".replace("  ", " "), f"step {n.step:,}: {n.message}", True)

    def _show(self, title: str, message: str, bad: bool) -> None:
        if self.tray is None or not self.away():
            return  # no tray; or the user is looking at the window: the alerts panel says it
        icon = QSystemTrayIcon.MessageIcon.Warning if bad else QSystemTrayIcon.MessageIcon.Information
        if isinstance(self.tray, QSystemTrayIcon) and not self.tray.isVisible():
            self.tray.show()  # a hidden tray icon shows no message
        self.tray.showMessage(title, message, icon, SHOWN_MS)
        self.shown.append((title, message))
