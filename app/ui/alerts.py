"""The alerts panel: one row per alert kind (time, steps, what, message), never a dialog flood.

Repeated alerts of a kind are one row, updated in place: "Non-finite x 218", steps 12-2104, the
latest message (app/model/notes.py NoteGroups). A task that is non-finite every 97th micro-batch
made 218 rows in 19 s, which buried every other alert. Double-click zooms the plots to the
latest step; the row's context menu offers the first. The Alerts tab comes forward
(serious_added) when a kind first turns serious, and the dock title's count (count_changed)
counts rows: neither fires again for a repeat."""
from __future__ import annotations

import os
import time
from typing import Optional, Sequence

from PySide6.QtCore import QPoint, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core import assets, logs
from app.model.notes import Note, NoteGroup, NoteGroups

STEPS_ROLE = Qt.ItemDataRole.UserRole  # on the Step cell: (first step, last step)
RANK = {"info": 0, "alert": 1, "error": 2}
TITLES = {
    "nonfinite": "Non-finite", "clip_saturation": "Clip saturation", "vram_low": "GPU memory low",
    "batchnorm_small_batch": "BatchNorm, small batch", "lr_hint": "lr hint", "oom_recovered": "Out of memory",
    "command_refused": "Refused", "scaler_skip": "fp16 overflow", "run_failed": "Run failed",
    "micro_batch_found": "Micro-batch found", "run_damaged": "Run folder damaged", "rolled_back": "Rolled back",
    "memory_snapshot": "Memory snapshot", "run_ended": "Run ended", "loss_weighting": "Not the exact step",
    "step_skipped": "Micro-batches skipped", "store_problem": "run.db problem",
    "framework_checkpoints": "Checkpoints", "window_error": "Window error",
    "notify_failed": "Notification not sent",
}
SEVERITY = {"nonfinite": "error", "run_failed": "error", "oom_recovered": "alert", "vram_low": "alert",
            "clip_saturation": "alert", "command_refused": "alert", "batchnorm_small_batch": "info",
            "lr_hint": "info", "scaler_skip": "info", "micro_batch_found": "info",
            "run_damaged": "error", "rolled_back": "alert", "memory_snapshot": "alert", "run_ended": "info",
            "loss_weighting": "alert", "step_skipped": "alert", "store_problem": "alert",
            "framework_checkpoints": "info", "window_error": "error", "notify_failed": "alert"}
# A run_ended row as bad news: the run gave up or stopped at a non-finite step.
ENDED_BADLY = ("gave_up", "nonfinite")


def severity(n: Note) -> str:
    if n.kind == "run_ended" and n.data.get("key") in ENDED_BADLY:
        return "error"
    return SEVERITY.get(n.kind, "info")


def fmt_when(t: float) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(t or time.time()))
    except (OverflowError, ValueError, OSError):  # a damaged row's time
        return "?"


def steps_text(g: NoteGroup) -> str:
    first, last = g.first.step, g.last.step
    return f"{first}" if g.count == 1 or first == last else f"{first}\u2013{last}"


class AlertsPanel(QWidget):
    count_changed = Signal(int)  # the rows (alert kinds) shown: changes when a kind first comes, or on Clear
    serious_added = Signal()  # a kind became an alert or an error (not info, not a repeat): worth a look
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
        for col in range(3):
            h.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        self.table.cellDoubleClicked.connect(self._double_clicked)
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(self._context_menu)
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
        self.groups = NoteGroups()
        self._row: dict[str, int] = {}  # kind -> its row
        self._severity: dict[str, str] = {}  # kind -> the worst severity it has had
        self.total = 0  # occurrences, all kinds
        self.by_kind: dict[str, int] = {}  # occurrences by kind
        self.snapshot_paths: list[str] = []  # memory snapshots the rows have linked to

    def window_error(self, line: str, step: int, epoch: int) -> None:
        """An exception no slot of the window caught (app/core/logs.py logged its traceback)."""
        self.add([Note("window_error", step, epoch, f"{line} (a fault in the window; the traceback is in "
                                                      f"{logs.log_path()})", time=time.time())])

    def add(self, notes: Sequence[Note]) -> None:
        if not notes:
            return
        new, grown = self.groups.add(notes)
        serious = False
        for n in notes:
            self.total += 1
            self.by_kind[n.kind] = self.by_kind.get(n.kind, 0) + 1
            was = self._severity.get(n.kind)
            now = severity(n)
            if was is None or RANK[now] > RANK[was]:
                self._severity[n.kind] = now
                serious = serious or (now != "info" and (was is None or was == "info"))
        t = self.table
        t.setUpdatesEnabled(False)
        try:
            for g in new:
                self._row[g.kind] = t.rowCount()
                t.insertRow(t.rowCount())
            for g in new + grown:
                self._show(self._row[g.kind], g)
        finally:
            t.setUpdatesEnabled(True)
        if new:
            t.scrollToBottom()
        self._update_summary(count_changed=bool(new))
        if serious:
            self.serious_added.emit()

    def _show(self, row: int, g: NoteGroup) -> None:
        """Write a group's row: its latest time, first-last step, kind and count, latest message."""
        t, last = self.table, g.last
        title = TITLES.get(g.kind, g.kind) + (f" \u00d7 {g.count:,}" if g.count > 1 else "")
        items = [QTableWidgetItem(fmt_when(last.time)), QTableWidgetItem(steps_text(g)),
                 QTableWidgetItem(assets.icon(self._severity.get(g.kind, "info")), title),
                 QTableWidgetItem(last.message)]
        items[1].setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        items[1].setData(STEPS_ROLE, (g.first.step, last.step))
        items[2].setData(Qt.ItemDataRole.UserRole, g.kind)
        if g.count > 1:
            items[0].setToolTip(f"first at {fmt_when(g.first.time)}, latest at {fmt_when(last.time)}")
            items[1].setToolTip(f"{g.count:,} times: first at step {g.first.step}, latest at step {last.step}. "
                                "Double-click zooms the plots to the latest; right-click offers the first")
            items[3].setToolTip(f"{g.count:,} times; the latest message of each kind of wording:\n{g.details()}")
        else:
            items[1].setToolTip("Double-click zooms the plots to this step")
            items[3].setToolTip(last.message)
        for col, it in enumerate(items):
            t.setItem(row, col, it)
        path = last.data.get("path") if g.kind == "memory_snapshot" else None
        if isinstance(path, str) and path:
            t.setCellWidget(row, 3, self._snapshot_cell(last.message, path))
        elif t.cellWidget(row, 3) is not None:
            t.removeCellWidget(row, 3)

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
        self.groups.clear()
        self._row, self._severity = {}, {}
        self.total = 0
        self.by_kind = {}
        self._update_summary(count_changed=True)

    def kinds(self) -> list[str]:
        """The kind of each row, top to bottom."""
        items = (self.table.item(r, 2) for r in range(self.table.rowCount()))
        return [item.data(Qt.ItemDataRole.UserRole) for item in items if item is not None]

    def rows(self) -> list[tuple[str, int, str]]:
        """(kind, latest step, each wording's latest message) of each row, top to bottom."""
        return [(g.kind, g.last.step, g.details()) for g in self.groups]

    def steps(self, row: int) -> Optional[tuple[int, int]]:
        """A row's first and latest step."""
        item = self.table.item(row, 1)
        return item.data(STEPS_ROLE) if item is not None else None

    def _update_summary(self, count_changed: bool) -> None:
        if not self.total:
            self.summary.setText("No alerts")
        else:
            parts = ", ".join(f"{TITLES.get(k, k)}: {v:,}" for k, v in sorted(self.by_kind.items()))
            self.summary.setText(f"{self.total:,} alert{'s' if self.total != 1 else ''} ({parts})")
        if count_changed:
            self.count_changed.emit(self.table.rowCount())

    def _double_clicked(self, row: int, _col: int) -> None:
        steps = self.steps(row)
        if steps is not None:
            self.step_clicked.emit(steps[1])

    def zoom_menu(self, row: int) -> Optional[QMenu]:
        """The row's menu: zoom the plots to its latest step, or (a repeated alert) its first."""
        steps = self.steps(row)
        if steps is None:
            return None
        first, last = steps
        menu = QMenu(self)
        if first != last:
            menu.addAction(f"Zoom to the first (step {first})", lambda: self.step_clicked.emit(first))
            menu.addAction(f"Zoom to the latest (step {last})", lambda: self.step_clicked.emit(last))
        else:
            menu.addAction(f"Zoom to step {last}", lambda: self.step_clicked.emit(last))
        return menu

    def _context_menu(self, pos: QPoint) -> None:
        menu = self.zoom_menu(self.table.rowAt(pos.y()))
        if menu is not None:
            menu.exec(self.table.viewport().mapToGlobal(pos))
