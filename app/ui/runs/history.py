"""Run history: the runs under the runs folder (and any opened elsewhere) as a table, each fork
under the run it came from with what it changed (its run table's `parent` key, read by
app/model/lineage.py). It follows the folder live (a run started here, in a terminal or by a
fork shows as running while it trains), filters on name, task, tag, note and status, sorts
on any column, and keeps the columns chosen (right-click the header) across launches.
Right-click a run to view, compare, continue, fork, tag, note, archive or delete it; tick
several to overlay their loss curves against the plots' x axis (runs with different
accumulation line up by samples or tokens seen, not by steps); beside the table, the
selected run's checkpoints (run_checkpoints.py). A row is the run's summary
(engine/store/summary.py), the same as `headroom-ctl runs` prints."""
from __future__ import annotations

import os
from typing import Any, Optional

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QTreeWidgetItemIterator,
    QVBoxLayout,
    QWidget,
)

from app.core import assets
from app.core.runs import RunSummary, list_runs
from app.model import lineage
from app.model.ending import Ending, ending
from app.model.run_time import RunTime
from app.model.x_axis import BY_KEY, COMPARE_HINT, DEFAULT_AXIS

from .run_checkpoints import CheckpointsPane
from .run_columns import COLUMNS, INDEX, PATH_ROLE, RunItem, RunRow, fill, fmt_when, summary_time, trained_seconds
from .run_menu import column_menu, run_menu, set_table_view, table_view

REFRESH_MS = 3000  # the table follows runs that start, train and end, here or in another process
RUN = INDEX["run"]
MAX_COLUMN_PX = 220


def summary_ending(r: RunSummary) -> Ending:
    """How a listed run ended, as the status bar and the alerts say it (app/model/ending.py)."""
    return ending(r.status, r.finish_reason, r.steps or 0, r.nonfinite_mode, r.rollbacks,
                  error=r.finish_reason or "" if r.status == "failed" else "")


def matches(row: RunRow, words: list[str]) -> bool:
    """Every word of the filter is in the run's name, task, tags, note, status or fork change."""
    r = row.run
    hay = " ".join((r.name, r.task, row.status, r.status, " ".join(r.labels.tags), r.labels.note, row.change,
                    "archived" if r.labels.archived else "")).lower()
    return all(w in hay for w in words)


def segments_tip(rt: RunTime) -> str:
    """'Continued 2 times: trained 12-01 10:02-10:31, 12-01 14:00-14:12, 12-02 09:00-...'."""
    if not rt.continued:
        return ""
    spans = ", ".join(f"{fmt_when(s.started)}\u2013{fmt_when(s.ended, '%H:%M') if s.ended is not None else '...'}"
                      for s in rt.segments)
    return (f"Continued {len(rt.segments) - 1} time{'s' if len(rt.segments) > 2 else ''} (--resume): trained "
            f"{spans}. Duration is the time trained, the time between them left out.")


class HistoryPanel(QWidget):
    open_requested = Signal(str)  # view this run folder
    overlay_toggled = Signal(str, bool)
    fork_requested = Signal(str, object)  # (run folder, lineage.Checkpoint): "Fork from here..."
    continue_requested = Signal(str)  # continue this run folder from its last checkpoint
    export_requested = Signal(str, object)  # (run folder, lineage.Checkpoint): export its weights
    family_requested = Signal(str)  # compare this run with its ancestors, siblings and forks
    compare_cleared = Signal()  # "Clear compare": no run overlaid
    run_action = Signal(str, str)  # (action, run path): tags, note, archive, unarchive, delete, folder
    remote_refresh_requested = Signal()  # the refresh button: list a server's runs again too
    table_view_changed = Signal(dict)  # the columns shown, the sort: kept in preferences

    def __init__(self, root: str, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.root = root
        self.extra: list[str] = []
        self.runs: list[RunSummary] = []
        self.rows: dict[str, RunRow] = {}
        self.nodes: dict[str, lineage.RunNode] = {}
        # Another machine's runs (a remote run is open): (host, its runs, a note: listing, or why not)
        self.remote: Optional[tuple[str, list[RunSummary], str]] = None
        self._filling = False
        self._shape: tuple[Any, ...] = ()  # the rows and their parents last drawn: the same shape is updated in place
        self.checked: set[str] = set()
        self.root_label = QLabel()
        self.root_label.setObjectName("hint")
        self.root_label.setWordWrap(True)
        self.compare_label = QLabel()
        self.compare_label.setObjectName("hint")
        self.compare_label.setWordWrap(True)
        self.filter_box = QLineEdit()
        self.filter_box.setPlaceholderText("Filter runs: name, task, tag, note, status")
        self.filter_box.setClearButtonEnabled(True)
        self.filter_box.textChanged.connect(lambda _t: self.apply_filter())
        self.show_archived = QCheckBox("Show archived")
        self.show_archived.setToolTip("List the runs archived (right-click a run: Archive) too")
        self.show_archived.toggled.connect(lambda _on: self.refresh())
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels([c.title for c in COLUMNS])
        for i, c in enumerate(COLUMNS):
            self.tree.headerItem().setToolTip(i, c.tip)
        self.tree.setRootIsDecorated(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setUniformRowHeights(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.tree.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.tree.customContextMenuRequested.connect(self._run_menu)
        h = self.tree.header()
        h.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        h.setStretchLastSection(False)
        h.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        h.customContextMenuRequested.connect(self._column_menu)
        h.sortIndicatorChanged.connect(lambda *_: self.table_view_changed.emit(self.table_view()))
        self.tree.setSortingEnabled(True)
        self.tree.sortByColumn(INDEX["started"], Qt.SortOrder.DescendingOrder)
        for i, c in enumerate(COLUMNS):
            self.tree.setColumnHidden(i, not c.shown)
        self.tree.itemDoubleClicked.connect(lambda item, _c: self._open(item.data(RUN, PATH_ROLE)))
        self.tree.itemChanged.connect(self._item_changed)
        self.tree.currentItemChanged.connect(lambda *_: self._show_checkpoints())
        open_b = QPushButton(assets.icon("open"), "View")
        open_b.setToolTip("Show the selected run's plots (double-click does the same)")
        open_b.clicked.connect(self._open_selected)
        self.family_button = QPushButton("Family")
        self.family_button.setToolTip("Compare with family: the selected run with its parent runs, the other forks "
                                      "of its parent and its own forks overlaid, each from its fork point")
        self.family_button.clicked.connect(self._family)
        self.clear_button = QPushButton("Clear compare")
        self.clear_button.setToolTip("Untick every compared run: only the run shown stays on the plots")
        self.clear_button.clicked.connect(self.compare_cleared)
        self.refresh_button = QPushButton(assets.icon("refresh"), "")
        self.refresh_button.setToolTip("List the runs again (a server's too); the list also follows the runs "
                                       "folder by itself every few seconds")
        self.refresh_button.clicked.connect(self._refresh_all)
        # The actions above the table: the dock opens short, and what is below its fold is not found.
        # (Any run folder opens with the window's Open run folder, Ctrl+O.)
        row = QHBoxLayout()
        row.addWidget(self.filter_box, 1)
        row.addWidget(self.show_archived)
        for b in (open_b, self.family_button, self.clear_button, self.refresh_button):
            row.addWidget(b)

        self.checkpoints = CheckpointsPane(self)
        self.checkpoint_label, self.checkpoint_list = self.checkpoints.label, self.checkpoints.list
        self.fork_button = self.checkpoints.fork_button
        self.checkpoints.fork_requested.connect(self.fork_requested)
        self.checkpoints.continue_requested.connect(self.continue_requested)
        self.checkpoints.export_requested.connect(self.export_requested)
        main = QWidget()
        main_lay = QVBoxLayout(main)
        main_lay.setContentsMargins(0, 0, 0, 0)
        main_lay.addLayout(row)
        main_lay.addWidget(self.tree, 1)
        main_lay.addWidget(self.compare_label)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(main)
        split.addWidget(self.checkpoints)
        split.setStretchFactor(0, 5)
        split.setStretchFactor(1, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.root_label)
        lay.addWidget(split, 1)
        self._update_root_label()
        self.set_x_axis(DEFAULT_AXIS)
        self.live_timer = QTimer(self)
        self.live_timer.setInterval(REFRESH_MS)
        self.live_timer.timeout.connect(self._follow)
        self.live_timer.start()

    def set_x_axis(self, key: str) -> None:
        """Say what the Compare overlays are drawn against (the plots' x axis)."""
        axis = BY_KEY.get(key, BY_KEY[DEFAULT_AXIS])
        advice = "" if key in ("samples", "tokens") else " " + COMPARE_HINT
        self.compare_label.setText(f"Compare draws each ticked run's loss against {axis.label.split(' (')[0]}"
                                   f" (the plots' X axis).{advice}")

    def _update_root_label(self) -> None:
        self.root_label.setText(f"Runs folder: {self.root}")
        self.root_label.setToolTip(self.root)

    def add_extra(self, path: str) -> None:
        if path not in self.extra:
            self.extra.append(path)

    # -- the columns chosen, kept across launches ---------------------------------------------
    def table_view(self) -> dict[str, Any]:
        return table_view(self.tree)

    def set_table_view(self, view: Any) -> None:
        set_table_view(self.tree, view)

    def _column_menu(self, pos: QPoint) -> QMenu:
        self.column_menu = column_menu(self.tree, lambda: self.table_view_changed.emit(self.table_view()))
        self.column_menu.popup(self.tree.header().mapToGlobal(pos))
        return self.column_menu

    # -- the table ---------------------------------------------------------------------------
    def _follow(self) -> None:
        if self.isVisible():
            self.refresh()

    def _refresh_all(self) -> None:
        self.refresh()
        if self.remote is not None:
            self.remote_refresh_requested.emit()

    def refresh(self) -> None:
        """List the runs again: rows of the same runs are updated in place (the selection, the
        scroll and the sort stay); a run that came, went or moved in the tree rebuilds it."""
        self.runs = [r for r in list_runs(self.root, tuple(self.extra))
                     if self.show_archived.isChecked() or not r.labels.archived]
        self.nodes = lineage.build_tree([r.path for r in self.runs])
        names = {r.path: r.name for r in self.runs}
        self.rows = {r.path: self._row(r, self.nodes.get(r.path), names) for r in self.runs}
        remote = self.remote[1] if self.remote is not None else []
        for r in remote:
            self.rows[r.path] = self._row(r, None, {})
        shape = (tuple((r.path, self._up(r.path)) for r in self.runs), self.remote and self.remote[0],
                 self.remote and self.remote[2], tuple(r.path for r in remote))
        if shape == self._shape:
            self._filling = True
            try:
                for item in self.items():
                    path = item.data(RUN, PATH_ROLE)
                    if path in self.rows:
                        self._fill(item, self.rows[path])
            finally:
                self._filling = False
            self.apply_filter()
            return
        self._shape = shape
        current = self.selected_path()
        self._filling = True
        self.tree.setSortingEnabled(False)  # no re-sorting at each row added
        try:
            self.tree.clear()
            items: dict[str, QTreeWidgetItem] = {}
            for r in self.runs:
                items[r.path] = self._item(self.rows[r.path])
            for r in self.runs:
                up = self._up(r.path)
                if up in items:
                    items[up].addChild(items[r.path])
                else:
                    self.tree.addTopLevelItem(items[r.path])
            items.update(self._add_remote())
            self.tree.expandAll()
            if current in items:
                self.tree.setCurrentItem(items[current])
        finally:
            self.tree.setSortingEnabled(True)
            self._filling = False
        for i in range(len(COLUMNS)):
            if not self.tree.isColumnHidden(i):
                self.tree.resizeColumnToContents(i)
                if self.tree.columnWidth(i) > MAX_COLUMN_PX:  # a long fork change or note: its tooltip has it all
                    self.tree.setColumnWidth(i, MAX_COLUMN_PX)
        self.apply_filter()
        self._show_checkpoints()

    def _up(self, path: str) -> Optional[str]:
        node = self.nodes.get(path)
        return node.up if node is not None else None  # a forest: parent loops are cut (lineage.build_tree)

    def apply_filter(self) -> None:
        """Hide the rows the filter's words do not match (a matching fork keeps its parents shown)."""
        words = self.filter_box.text().lower().split()

        def visit(item: Optional[QTreeWidgetItem]) -> bool:
            if item is None:
                return False
            kids = [visit(item.child(i)) for i in range(item.childCount())]
            row = self.rows.get(item.data(RUN, PATH_ROLE))
            shown = any(kids) or (row is not None and matches(row, words)) or (row is None and not words)
            item.setHidden(not shown)
            return shown
        for i in range(self.tree.topLevelItemCount()):
            visit(self.tree.topLevelItem(i))

    # -- another machine's runs --------------------------------------------------------------
    def set_remote(self, host: str, runs: list[RunSummary], note: str = "") -> None:
        """Show host's runs in a section of their own ("Runs on HOST"), each as host:path."""
        self.remote = (host, list(runs), note)
        self.refresh()

    def clear_remote(self) -> None:
        if self.remote is not None:
            self.remote = None
            self.refresh()

    def _add_remote(self) -> dict[str, QTreeWidgetItem]:
        if self.remote is None:
            return {}
        host, runs, note = self.remote
        head = RunItem(["", f"Runs on {host}" + (f" ({note})" if note else "")])
        font = head.font(RUN)
        font.setBold(True)
        head.setFont(RUN, font)
        head.setToolTip(RUN, f"The runs under {host}'s runs root and beside the run opened there, listed with "
                             "headroom-ctl runs over ssh; Compare reads a run's loss through its follow")
        self.tree.addTopLevelItem(head)
        items = {}
        for r in runs:
            if r.labels.archived and not self.show_archived.isChecked():
                continue
            items[r.path] = self._item(self.rows[r.path])
            head.addChild(items[r.path])
        return items

    def _open(self, path: Optional[str]) -> None:
        if path:  # not a section's heading
            self.open_requested.emit(path)

    def _row(self, r: RunSummary, node: Optional[lineage.RunNode], names: dict[str, str]) -> RunRow:
        rt = summary_time(r)  # a continued run is one run: its first start, its segments' time together
        change = ""
        if node is not None and node.parent is not None:
            p = node.parent
            change = lineage.fork_text(p)
            if p.run_dir not in names:
                change = f"fork of {os.path.basename(os.path.normpath(p.run_dir))} {change}"
            if node.loops:
                change = f"{change} (parent record loops back: shown as a top-level run)"
        return RunRow(r, change, summary_ending(r).word, trained_seconds(r, rt), rt.first_started)

    def _item(self, row: RunRow) -> QTreeWidgetItem:
        item = RunItem()
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(0, Qt.CheckState.Checked if row.run.path in self.checked else Qt.CheckState.Unchecked)
        self._fill(item, row)
        return item

    def _fill(self, item: QTreeWidgetItem, row: RunRow) -> None:
        fill(item, row)
        r = row.run
        item.setToolTip(INDEX["status"], summary_ending(r).text)
        tip = segments_tip(summary_time(r))
        item.setToolTip(INDEX["duration"], tip)
        item.setToolTip(INDEX["started"], tip)
        item.setToolTip(RUN, r.path + (f"\n\n{r.labels.note}" if r.labels.note else ""))
        item.setToolTip(INDEX["note"], r.labels.note)
        node = self.nodes.get(r.path)
        if row.change and node is not None and node.parent is not None:
            item.setToolTip(INDEX["change"], f"{row.change}\nparent: {node.parent.run_dir}")
        if r.labels.archived:
            for i in range(len(COLUMNS)):
                item.setForeground(i, self.palette().placeholderText())

    # -- right-click on a run ------------------------------------------------------------------
    def summary_of(self, path: Optional[str]) -> Optional[RunSummary]:
        row = self.rows.get(path or "")
        return row.run if row is not None else None

    def _run_menu(self, pos: QPoint) -> Optional[QMenu]:
        item = self.tree.itemAt(pos)
        path = item.data(RUN, PATH_ROLE) if item is not None else None
        run = self.summary_of(path)
        if item is None or path is None or run is None:
            return None
        self.tree.setCurrentItem(item)
        menu = self.run_menu(run)
        menu.popup(self.tree.viewport().mapToGlobal(pos))
        return menu

    def run_menu(self, run: RunSummary) -> QMenu:
        """The actions on a run (also what a test triggers, by their text)."""
        self.context_menu = run_menu(self, run)
        return self.context_menu

    def forks_of(self, path: str) -> int:
        return sum(1 for n in self.nodes.values() if n.parent is not None and n.parent.run_dir == path)

    # -- rows ------------------------------------------------------------------------------
    def items(self) -> list[QTreeWidgetItem]:
        """Every row of the tree, parents before their forks."""
        out = []
        it = QTreeWidgetItemIterator(self.tree)
        while it.value() is not None:
            out.append(it.value())
            it += 1
        return out

    def item_for(self, path: str) -> Optional[QTreeWidgetItem]:
        for item in self.items():
            if item.data(RUN, PATH_ROLE) == path:
                return item
        return None

    def shown_paths(self) -> list[str]:
        """The runs the filter leaves in the table, in its order."""
        return [i.data(RUN, PATH_ROLE) for i in self.items() if not i.isHidden() and i.data(RUN, PATH_ROLE)]

    def selected_path(self) -> Optional[str]:
        item = self.tree.currentItem()
        return item.data(RUN, PATH_ROLE) if item is not None else None

    def select(self, path: str) -> None:
        item = self.item_for(path)
        if item is not None:
            self.tree.setCurrentItem(item)

    def family(self, path: str) -> list[str]:
        """The runs a run is compared with: ancestors, siblings and forks among those listed."""
        return lineage.family(path, self.nodes)

    def _open_selected(self) -> None:
        self._open(self.selected_path())

    def _family(self) -> None:
        path = self.selected_path()
        if path:
            self.family_requested.emit(path)

    def _item_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if self._filling or column != 0:
            return
        path = item.data(RUN, PATH_ROLE)
        on = item.checkState(0) == Qt.CheckState.Checked
        if on:
            self.checked.add(path)
        else:
            self.checked.discard(path)
        self.overlay_toggled.emit(path, on)

    def set_checked(self, path: str, on: bool) -> None:
        item = self.item_for(path)
        if item is not None:
            item.setCheckState(0, Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
            return
        if on:
            self.checked.add(path)
            self.overlay_toggled.emit(path, True)

    # -- checkpoints -----------------------------------------------------------------------
    def _show_checkpoints(self) -> None:
        path = self.selected_path()
        remote = path is not None and self.remote is not None and path.startswith(self.remote[0] + ":")
        run = self.summary_of(path)
        self.checkpoints.show_run(path, remote, run.live if run is not None else False)

    def checkpoints_shown(self) -> list[lineage.Checkpoint]:
        return self.checkpoints.shown()
