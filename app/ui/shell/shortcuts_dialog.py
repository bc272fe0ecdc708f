"""Help > Keyboard shortcuts: every shortcut of the window, read from its actions (whose keys come
from app/core/shortcuts.py), so the list is the keys that work, never a copy that drifts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QMainWindow,
    QMenu,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)


@dataclass(frozen=True)
class ShortcutRow:
    where: str  # the menu that has the action ("File", "Run"...), or "Window"
    what: str  # the action's text, as the menu shows it without "&" and "..."
    keys: str  # as this platform writes them ("Ctrl+Shift+E")


def _plain(text: str) -> str:
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").removesuffix("...")


def _keys(a: QAction) -> str:
    return ", ".join(k.toString(QKeySequence.SequenceFormat.NativeText) for k in a.shortcuts() if not k.isEmpty())


def shortcut_rows(window: QMainWindow) -> list[ShortcutRow]:
    """Every action of the window with a shortcut: those in the menus in menu order, then any other."""
    rows: list[ShortcutRow] = []
    seen: set[int] = set()

    def walk(menu: QMenu, where: str) -> None:
        for a in menu.actions():
            sub = a.menu()
            if isinstance(sub, QMenu):
                walk(sub, where)
            elif _keys(a) and id(a) not in seen:
                seen.add(id(a))
                rows.append(ShortcutRow(where, _plain(a.text()), _keys(a)))

    for top in window.menuBar().actions():
        sub = top.menu()
        if isinstance(sub, QMenu):
            walk(sub, _plain(top.text()))
    for a in window.findChildren(QAction):
        if _keys(a) and id(a) not in seen:
            seen.add(id(a))
            rows.append(ShortcutRow("Window", _plain(a.text()), _keys(a)))
    return rows


class ShortcutsDialog(QDialog):
    def __init__(self, window: QMainWindow, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent or window)
        self.setWindowTitle("Keyboard shortcuts")
        self.setObjectName("shortcuts_dialog")
        self.rows = shortcut_rows(window)
        self.table = QTableWidget(len(self.rows), 3)
        self.table.setHorizontalHeaderLabels(["Menu", "Action", "Keys"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        for r, row in enumerate(self.rows):
            for c, text in enumerate((row.where, row.what, row.keys)):
                self.table.setItem(r, c, QTableWidgetItem(text))
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        h.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        note = QLabel("They work wherever the keyboard focus is, in a field of the Controls panel too. After Apply "
                      "changes the focus leaves the field, so the next keys typed edit nothing that was sent.")
        note.setObjectName("hint")
        note.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.table, 1)
        lay.addWidget(note)
        lay.addWidget(buttons)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # a list to read, no cell to edit or pick
        self.table.resizeRowsToContents()
        rows_px = self.table.verticalHeader().length() + self.table.horizontalHeader().height() + 4
        self.resize(520, min(720, rows_px + 150))  # every row in view, the note and Close under them

    def texts(self) -> list[tuple[str, str, str]]:
        """(menu, action, keys) as the table shows them."""
        t = self.table
        def cell(r: int, c: int) -> str:
            item = t.item(r, c)
            return item.text() if item is not None else ""
        return [(cell(r, 0), cell(r, 1), cell(r, 2)) for r in range(t.rowCount())]
