"""The window's dialogs: errors (non-blocking, one per problem, never a flood), About, and
the file pickers."""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QMessageBox, QWidget

from app.core import assets
from app.core.preferences import Preferences

log = logging.getLogger("headroom.window")


class ErrorDialogs:
    """Error boxes that do not block: the window (and any run) keeps going behind them."""

    def __init__(self, parent: QWidget) -> None:
        self.parent = parent
        self.open: list[QMessageBox] = []
        self.last: Optional[tuple[str, str]] = None  # (title, message) of the last one

    def show(self, title: str, message: str) -> QMessageBox:
        self.last = (title, message)
        log.warning("%s: %s", title, message)
        box = QMessageBox(QMessageBox.Icon.Critical, title, message, QMessageBox.StandardButton.Ok, self.parent)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.finished.connect(lambda *_: self.open.remove(box) if box in self.open else None)
        self.open.append(box)
        box.open()
        return box

    def close_all(self) -> None:
        for box in list(self.open):
            box.close()


def open_about(parent: QWidget) -> Any:
    """Help > About Headroom (non-blocking). torch loads here, not at start-up."""
    from .about import AboutDialog
    QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
    try:
        dlg = AboutDialog(parent)
    finally:
        QApplication.restoreOverrideCursor()
    dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    dlg.open()
    return dlg


def ask_task_file(parent: QWidget, preferences: Preferences) -> str:
    """A task file picked by the user ('' if none), starting where the last one was."""
    recent = preferences.recent("recent_tasks")
    start = os.path.dirname(recent[0]) if recent else assets.RESOURCES
    path, _ = QFileDialog.getOpenFileName(parent, "Open a task file", start, "Python files (*.py)")
    if path:
        preferences.add_recent("recent_tasks", path)
    return path


def ask_run_folder(parent: QWidget, start: str) -> str:
    return QFileDialog.getExistingDirectory(parent, "Open a run folder", start)


# A remote run: the last one opened, and each host's python (the app remembers it per host).
REMOTE_LAST, REMOTE_PYTHONS = "remote_last", "remote_python"


def remote_python_for(target: str) -> str:
    """The python remembered for target's host ('' if none: headroom-ctl's default)."""
    saved = Preferences().get_json(REMOTE_PYTHONS, {})
    return str(saved.get(target.partition(":")[0]) or "") if isinstance(saved, dict) else ""


def ask_remote_run(parent: QWidget) -> str:
    """[user@]host:path of a run on another machine, and (remembered for that host) the python
    that has Headroom there. '' if cancelled."""
    from engine.ctl.remote import SSH_ENV, default_python
    prefs = Preferences()
    target, ok = QInputDialog.getText(parent, "Open remote run", "A run on another machine, as [user@]host:path\n"
                                      f"(reached with your ssh and its config; {SSH_ENV} changes the command):",
                                      text=str(prefs.get_json(REMOTE_LAST, "") or ""))
    target = target.strip()
    if not ok or not target:
        return ""
    host = target.partition(":")[0]
    saved = prefs.get_json(REMOTE_PYTHONS, {})
    saved = saved if isinstance(saved, dict) else {}
    python, ok = QInputDialog.getText(parent, "Open remote run", f"The python with Headroom on {host}:",
                                      text=str(saved.get(host) or default_python()))
    if not ok or not python.strip():
        return ""
    saved[host] = python.strip()
    prefs.set_json(REMOTE_PYTHONS, saved)
    prefs.set_json(REMOTE_LAST, target)
    return target
