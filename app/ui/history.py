"""Run history: the runs under the runs folder (and any opened elsewhere); open one, or tick
several to overlay their loss curves on the loss plot, against the plots' x axis (runs with
different accumulation line up by samples or tokens seen, not by steps)."""
from __future__ import annotations

import time
from typing import Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QPushButton, QTreeWidget,
                               QTreeWidgetItem, QVBoxLayout, QWidget)

from ..core import assets
from ..core.runs import RunSummary, list_runs
from .x_axis import BY_KEY, COMPARE_HINT, DEFAULT_AXIS

PATH_ROLE = Qt.ItemDataRole.UserRole


class HistoryPanel(QWidget):
    open_requested = Signal(str)  # view this run folder
    browse_requested = Signal()  # "Open folder..."
    overlay_toggled = Signal(str, bool)

    def __init__(self, root: str, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.root = root
        self.extra: list[str] = []
        self.runs: list[RunSummary] = []
        self._filling = False
        self.root_label = QLabel()
        self.root_label.setObjectName("hint")
        self.root_label.setWordWrap(True)
        self.compare_label = QLabel()
        self.compare_label.setObjectName("hint")
        self.compare_label.setWordWrap(True)
        self.tree = QTreeWidget()
        self.tree.setColumnCount(5)
        self.tree.setHeaderLabels(["Compare", "Run", "Task", "Status", "Started"])
        self.tree.setRootIsDecorated(False)
        self.tree.setAlternatingRowColors(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        h = self.tree.header()
        h.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        for c in (2, 3, 4):
            h.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.itemDoubleClicked.connect(lambda item, _c: self.open_requested.emit(item.data(1, PATH_ROLE)))
        self.tree.itemChanged.connect(self._item_changed)
        open_b = QPushButton(assets.icon("open"), "View")
        open_b.setToolTip("Show the selected run's plots (double-click does the same)")
        open_b.clicked.connect(self._open_selected)
        browse = QPushButton(assets.icon("open"), "Open folder...")
        browse.setToolTip("Open any run folder (one holding run.db)")
        browse.clicked.connect(self.browse_requested)
        refresh = QPushButton(assets.icon("refresh"), "")
        refresh.setToolTip("Refresh the list")
        refresh.clicked.connect(self.refresh)
        row = QHBoxLayout()
        row.addWidget(open_b)
        row.addWidget(browse)
        row.addStretch(1)
        row.addWidget(refresh)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.root_label)
        lay.addWidget(self.compare_label)
        lay.addWidget(self.tree, 1)
        lay.addLayout(row)
        self.checked: set[str] = set()
        self._update_root_label()
        self.set_x_axis(DEFAULT_AXIS)

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

    def refresh(self) -> None:
        self.runs = list_runs(self.root, tuple(self.extra))
        self._filling = True
        try:
            self.tree.clear()
            for r in self.runs:
                when = time.strftime("%m-%d %H:%M", time.localtime(r.started)) if r.started else ""
                item = QTreeWidgetItem(["", r.name, r.task, r.status, when])
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(0, Qt.CheckState.Checked if r.path in self.checked else Qt.CheckState.Unchecked)
                item.setData(1, PATH_ROLE, r.path)
                item.setToolTip(1, r.path)
                self.tree.addTopLevelItem(item)
        finally:
            self._filling = False

    def _open_selected(self) -> None:
        item = self.tree.currentItem()
        if item is not None:
            self.open_requested.emit(item.data(1, PATH_ROLE))

    def _item_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if self._filling or column != 0:
            return
        path = item.data(1, PATH_ROLE)
        on = item.checkState(0) == Qt.CheckState.Checked
        if on:
            self.checked.add(path)
        else:
            self.checked.discard(path)
        self.overlay_toggled.emit(path, on)

    def set_checked(self, path: str, on: bool) -> None:
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            if item.data(1, PATH_ROLE) == path:
                item.setCheckState(0, Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)
                return
        if on:
            self.checked.add(path)
            self.overlay_toggled.emit(path, True)
