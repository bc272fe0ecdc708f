"""The window's shortcuts work wherever the keyboard focus is. A focused field claims the keys
its own key bindings use before any shortcut sees them (Qt's ShortcutOverride): on X11 a line
edit takes Ctrl+E (end of line), so Export metrics did nothing while a Controls field had the
focus. One event filter on the application refuses that claim for the keys of the windows'
actions (app/core/shortcuts.py), for every field, present and future; a field keeps every other
key."""
from __future__ import annotations

import weakref

from PySide6.QtCore import QEvent, QObject
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import QApplication, QWidget


class ShortcutsFirst(QObject):
    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self.windows: list["weakref.ref[QWidget]"] = []

    def keys(self) -> set[str]:
        """The shortcuts of every action of the windows open, as QKeySequence text."""
        out: set[str] = set()
        for ref in list(self.windows):
            w = ref()
            try:
                actions = w.findChildren(QAction) if w is not None else None
            except RuntimeError:  # its C++ side is gone
                actions = None
            if actions is None:
                self.windows.remove(ref)
                continue
            for a in actions:
                out.update(k.toString() for k in a.shortcuts() if not k.isEmpty())
        return out

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802 - Qt name
        if ev.type() == QEvent.Type.ShortcutOverride and isinstance(ev, QKeyEvent):
            if QKeySequence(ev.keyCombination()).toString() in self.keys():
                ev.ignore()
                return True  # the field never sees the claim: the shortcut fires
        return False


def install(app: QApplication, window: QWidget) -> ShortcutsFirst:
    """Once per application; each window adds itself (a second one finds the filter there)."""
    first = app.findChild(ShortcutsFirst)
    if first is None:
        first = ShortcutsFirst(app)
        app.installEventFilter(first)
    first.windows.append(weakref.ref(window))
    return first


def leave_field(area: QWidget) -> None:
    """Take the keyboard focus out of the field in `area` that has it (after Apply: the next keys
    typed edit nothing that was just sent)."""
    w = QApplication.focusWidget()
    if w is not None and area.isAncestorOf(w):
        w.clearFocus()
