"""The run table's menus: right-click a run (what can be done with it, here or on a server)
and right-click the header (which columns show), and the columns chosen and the sort as
preferences keep them (by column key: a new column does not undo the user's choice)."""
from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QTreeWidget

from app.core.runs import RunSummary
from app.model import lineage

from .run_columns import COLUMNS, INDEX


def run_menu(panel: Any, run: RunSummary) -> QMenu:
    """The actions on a run of the HistoryPanel `panel`, each a signal of the panel."""
    remote = panel.remote is not None and run.path.startswith(panel.remote[0] + ":")
    cps = [] if remote else lineage.checkpoints(run.path)
    menu = QMenu(panel)
    menu.setToolTipsVisible(True)

    def add(text: str, slot: Callable[[], Any], enabled: bool = True, tip: str = "") -> QAction:
        act = menu.addAction(text)
        act.triggered.connect(lambda *_: slot())
        act.setEnabled(enabled)
        act.setToolTip(tip)
        return act
    add("View", lambda: panel.open_requested.emit(run.path))
    compared = run.path in panel.checked
    add("Stop comparing" if compared else "Compare", lambda: panel.set_checked(run.path, not compared))
    add("Compare with family", lambda: panel.family_requested.emit(run.path))
    menu.addSeparator()
    add("Continue", lambda: panel.continue_requested.emit(run.path), bool(cps) and not run.live,
        "continue from its last checkpoint, with its settings" if not run.live else "it trains now")
    add("Fork...", lambda: panel.fork_requested.emit(run.path, cps[-1]), bool(cps),
        "a new run from its last checkpoint (pick an older one in Checkpoints)")
    menu.addSeparator()
    add("Edit tags...", lambda: panel.run_action.emit("tags", run.path))
    add("Edit note...", lambda: panel.run_action.emit("note", run.path))
    if not remote:  # a server's folders are its own to move or delete
        add("Show in file manager", lambda: panel.run_action.emit("folder", run.path))
        archived = run.labels.archived
        add("Show again" if archived else "Archive...",
            lambda: panel.run_action.emit("unarchive" if archived else "archive", run.path))
        add("Delete...", lambda: panel.run_action.emit("delete", run.path), not run.live,
            "a run that trains cannot be deleted" if run.live else "")
    return menu


def column_menu(tree: QTreeWidget, changed: Callable[[], Any]) -> QMenu:
    """A checkable entry per column (the run's name always shows)."""
    menu = QMenu(tree)
    for i, c in enumerate(COLUMNS):
        if c.key == "run":
            continue

        def show(on: bool, i: int = i) -> None:
            tree.setColumnHidden(i, not on)
            if on:
                tree.resizeColumnToContents(i)
            changed()
        act = menu.addAction(c.title)
        act.setCheckable(True)
        act.setChecked(not tree.isColumnHidden(i))
        act.toggled.connect(show)
    return menu


def table_view(tree: QTreeWidget) -> dict[str, Any]:
    """{"hidden": [column keys], "sort": [key, "asc" | "desc"]}: what preferences keep."""
    h = tree.header()
    col = h.sortIndicatorSection()
    return {"hidden": [c.key for i, c in enumerate(COLUMNS) if tree.isColumnHidden(i)],
            "sort": [COLUMNS[col].key if 0 <= col < len(COLUMNS) else "started",
                     "desc" if h.sortIndicatorOrder() == Qt.SortOrder.DescendingOrder else "asc"]}


def set_table_view(tree: QTreeWidget, view: Any) -> None:
    """The saved choice, any shape: what it does not name stays as it is."""
    if not isinstance(view, dict):
        return
    hidden = view.get("hidden")
    if isinstance(hidden, list):
        for i, c in enumerate(COLUMNS):
            tree.setColumnHidden(i, c.key in hidden and c.key != "run")
    sort = view.get("sort")
    if isinstance(sort, list) and len(sort) == 2 and sort[0] in INDEX:
        order = Qt.SortOrder.AscendingOrder if sort[1] == "asc" else Qt.SortOrder.DescendingOrder
        tree.sortByColumn(INDEX[sort[0]], order)
