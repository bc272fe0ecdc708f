"""The window's dialogs: errors (non-blocking, one per problem, never a flood), About, Keyboard
shortcuts, and the file pickers."""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QVBoxLayout,
    QWidget,
)

from app.core import assets
from app.core.preferences import Preferences

from . import remote_fields

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


def open_shortcuts(window: QMainWindow) -> Any:
    """Help > Keyboard shortcuts (non-blocking)."""
    from .shortcuts_dialog import ShortcutsDialog
    dlg = ShortcutsDialog(window)
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


def remote_python_for(target: str) -> str:
    """The python remembered for target's host ('' if none: headroom-ctl's default)."""
    return remote_fields.remembered_python(Preferences(), remote_fields.host_of(target))


class RemoteRunDialog(QDialog):
    """File > Open remote run...: [user@]host:path, the python there (remembered per host) and
    the ssh command (a preference)."""

    def __init__(self, parent: Optional[QWidget], prefs: Preferences) -> None:
        from engine.ctl.client import SSH_ENV
        super().__init__(parent)
        self.setWindowTitle("Open remote run")
        self.setObjectName("remote_run_dialog")
        self.setMinimumWidth(520)
        self.prefs = prefs
        self.target = QLineEdit(str(prefs.get_json(remote_fields.REMOTE_LAST, "") or ""))
        self.target.setObjectName("remote_target")
        self.target.setPlaceholderText("[user@]host:path/to/run")
        self.target.setToolTip(f"A run on another machine, reached with your ssh and its config ({SSH_ENV} or the "
                               "ssh command below changes the command); a relative path starts in the remote home")
        form = QFormLayout()
        form.addRow("Run", self.target)
        self.fields = remote_fields.RemoteFields(prefs, form)
        self.fields.host_changed(remote_fields.host_of(self.target.text()))
        self.target.editingFinished.connect(lambda: self.fields.host_changed(remote_fields.host_of(self.target.text())))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(buttons)

    def chosen(self) -> str:
        """The run, with the python and ssh command remembered; '' if none was given."""
        target = self.target.text().strip()
        if not target or not self.fields.python.text().strip():
            return ""
        self.fields.save(remote_fields.host_of(target))
        self.prefs.set_json(remote_fields.REMOTE_LAST, target)
        return target


def ask_remote_run(parent: QWidget) -> str:
    """[user@]host:path of a run on another machine ('' if cancelled)."""
    dlg = RemoteRunDialog(parent, Preferences())
    return dlg.chosen() if dlg.exec() == QDialog.DialogCode.Accepted else ""
