"""The alerts panel: one row per occurrence (time, step, what, message), never a dialog flood."""
from __future__ import annotations

import os
import time
from typing import Optional, Sequence

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QHeaderView, QLabel, QPushButton, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from app.core import assets
from app.model.notes import Note

MAX_ROWS = 5000  # the oldest rows go first; run.db keeps every event
TITLES = {
    "nonfinite": "Non-finite", "clip_saturation": "Clip saturation", "vram_low": "GPU memory low",
    "batchnorm_small_batch": "BatchNorm, small batch", "lr_hint": "lr hint", "oom_recovered": "Out of memory",
    "command_refused": "Refused", "scaler_skip": "fp16 overflow", "run_failed": "Run failed",
    "micro_batch_found": "Micro-batch found", "run_damaged": "Run folder damaged", "rolled_back": "Rolled back",
    "memory_snapshot": "Memory snapshot", "run_ended": "Run ended", "loss_weighting": "Not the exact step",
    "step_skipped": "Micro-batches skipped", "store_problem": "run.db problem",
    "framework_checkpoints": "Checkpoints",
}
SEVERITY = {"nonfinite": "error", "run_failed": "error", "oom_recovered": "alert", "vram_low": "alert",
            "clip_saturation": "alert", "command_refused": "alert", "batchnorm_small_batch": "info",
            "lr_hint": "info", "scaler_skip": "info", "micro_batch_found": "info",
            "run_damaged": "error", "rolled_back": "alert", "memory_snapshot": "alert", "run_ended": "info",
            "loss_weighting": "alert", "step_skipped": "alert", "store_problem": "alert",
            "framework_checkpoints": "info"}
# A run_ended row as bad news: the run gave up or stopped at a non-finite step.
ENDED_BADLY = ("gave_up", "nonfinite")


def severity(n: Note) -> str:
    if n.kind == "run_ended" and n.data.get("key") in ENDED_BADLY:
        return "error"
    return SEVERITY.get(n.kind, "info")


class AlertsPanel(QWidget):
    count_changed = Signal(int)
    serious_added = Signal()  # an alert or an error came in (not only info rows): worth a look
    step_clicked = Signal(int)

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["Time", "Step", "Alert", "Details"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        h = self.table.horizontalHeader()
        h.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        # Size the columns to the rows in view and 100 around them, not Qt's default 1,000:
        # each alert added re-sizes them, which cost ~12 ms at 1,000+ rows (~2.5 ms now).
        h.setResizeContentsPrecision(100)
        self.table.cellDoubleClicked.connect(self._double_clicked)
        self.summary = QLabel("No alerts")
        self.summary.setObjectName("hint")
        clear = QPushButton("Clear")
        clear.setToolTip("Clear the list (run.db keeps every event)")
        clear.clicked.connect(self.clear)
        top = QHBoxLayout()
        top.setContentsMargins(4, 2, 4, 0)
        top.addWidget(self.summary, 1)
        top.addWidget(clear)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addLayout(top)
        lay.addWidget(self.table, 1)
        self.total = 0
        self.by_kind: dict[str, int] = {}
        self.snapshot_paths: list[str] = []  # memory snapshots the rows link to

    def add(self, notes: Sequence[Note]) -> None:
        if not notes:
            return
        t = self.table
        t.setUpdatesEnabled(False)
        try:
            for n in notes:
                row = t.rowCount()
                t.insertRow(row)
                when = time.strftime("%H:%M:%S", time.localtime(n.time or time.time()))
                items = [QTableWidgetItem(when), QTableWidgetItem(str(n.step)),
                         QTableWidgetItem(assets.icon(severity(n)), TITLES.get(n.kind, n.kind)),
                         QTableWidgetItem(n.message)]
                items[1].setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                items[3].setToolTip(n.message)
                items[2].setData(Qt.ItemDataRole.UserRole, n.kind)
                for col, it in enumerate(items):
                    t.setItem(row, col, it)
                path = n.data.get("path") if n.kind == "memory_snapshot" else None
                if isinstance(path, str) and path:
                    t.setCellWidget(row, 3, self._snapshot_cell(n.message, path))
                self.total += 1
                self.by_kind[n.kind] = self.by_kind.get(n.kind, 0) + 1
            excess = t.rowCount() - MAX_ROWS
            for _ in range(max(0, excess)):
                t.removeRow(0)
        finally:
            t.setUpdatesEnabled(True)
        t.scrollToBottom()
        self._update_summary()
        if any(severity(n) != "info" for n in notes):
            self.serious_added.emit()

    def _snapshot_cell(self, message: str, path: str) -> QWidget:
        """The message, and a button that opens the snapshot's folder (the file itself opens at
        pytorch.org/memory_viz)."""
        cell = QWidget()
        cell.setAutoFillBackground(True)
        lay = QHBoxLayout(cell)
        lay.setContentsMargins(4, 0, 4, 0)
        text = QLabel(message)
        text.setToolTip(path)
        button = QPushButton("Open folder")
        button.setObjectName("open_snapshot_folder")
        button.setToolTip(os.path.dirname(path))
        button.clicked.connect(lambda: self.open_folder(path))
        lay.addWidget(text, 1)
        lay.addWidget(button)
        self.snapshot_paths.append(path)
        return cell

    @staticmethod
    def open_folder(path: str) -> bool:
        return QDesktopServices.openUrl(QUrl.fromLocalFile(os.path.dirname(os.path.abspath(path))))

    def clear(self) -> None:
        self.snapshot_paths = []
        self.table.setRowCount(0)
        self.total = 0
        self.by_kind = {}
        self._update_summary()

    def kinds(self) -> list[str]:
        return [self.table.item(r, 2).data(Qt.ItemDataRole.UserRole) for r in range(self.table.rowCount())]

    def rows(self) -> list[tuple[str, int, str]]:
        return [(self.table.item(r, 2).data(Qt.ItemDataRole.UserRole), int(self.table.item(r, 1).text()),
                 self.table.item(r, 3).text()) for r in range(self.table.rowCount())]

    def _update_summary(self) -> None:
        if not self.total:
            self.summary.setText("No alerts")
        else:
            parts = ", ".join(f"{TITLES.get(k, k)}: {v}" for k, v in sorted(self.by_kind.items()))
            self.summary.setText(f"{self.total} alert{'s' if self.total != 1 else ''} ({parts})")
        self.count_changed.emit(self.total)

    def _double_clicked(self, row: int, _col: int) -> None:
        item = self.table.item(row, 1)
        if item is not None:
            self.step_clicked.emit(int(item.text()))
