"""Run history: the runs under the runs folder (and any opened elsewhere) as a tree, each fork
under the run it came from with what it changed (its run table's `parent` key, read by
app/model/lineage.py). Open one, tick several to overlay their loss curves on the loss plot
against the plots' x axis (runs with different accumulation line up by samples or tokens
seen, not by steps; a fork's curve starts at its fork point), or compare a run with its
family (ancestors, siblings, forks) at once. Beside the tree, the selected run's checkpoints,
each a place to fork from."""
from __future__ import annotations

import os
import time
from typing import Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
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
from app.model.epoch_progress import fmt_duration
from app.model.run_time import Mark, RunTime, run_time, single
from app.model.stored import number
from app.model.x_axis import BY_KEY, COMPARE_HINT, DEFAULT_AXIS

PATH_ROLE = Qt.ItemDataRole.UserRole
COLUMNS = ("Compare", "Run", "Fork: what changed", "Task", "Status", "Steps", "Final loss", "Duration", "Started")
RUN, CHANGE, STATUS, DURATION, STARTED = 1, 2, 4, 7, 8


def summary_ending(r: RunSummary) -> Ending:
    """How a listed run ended, as the status bar and the alerts say it (app/model/ending.py)."""
    return ending(r.status, r.finish_reason, r.steps or 0, r.nonfinite_mode, r.rollbacks,
                  error=r.finish_reason or "" if r.status == "failed" else "")


def fmt_loss(v: Optional[float]) -> str:
    return "" if v is None else f"{v:.4g}"


def summary_time(r: RunSummary) -> RunTime:
    """A listed run's segments: from its run.db's events, or (a run on another machine, listed
    by headroom-ctl) its run table's started and finished."""
    return run_time(Mark(*m) for m in r.marks) if r.marks else single(r.started, r.finished)


def trained_seconds(r: RunSummary, rt: RunTime, now: Optional[float] = None) -> Optional[float]:
    """Every segment together: a run going counts to now, one whose process died to its last row."""
    until = (now or time.time()) if r.status == "running" else number(r.last_row, None)
    return rt.seconds(until)


def fmt_when(t: Optional[float], pattern: str = "%m-%d %H:%M") -> str:
    try:
        return time.strftime(pattern, time.localtime(t)) if t is not None else ""
    except (OverflowError, ValueError, OSError):  # a time no calendar holds (a damaged run.db)
        return ""


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
    browse_requested = Signal()  # "Open folder..."
    overlay_toggled = Signal(str, bool)
    fork_requested = Signal(str, object)  # (run folder, lineage.Checkpoint): "Fork from here..."
    family_requested = Signal(str)  # compare this run with its ancestors, siblings and forks
    compare_cleared = Signal()  # "Clear compare": no run overlaid

    def __init__(self, root: str, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.root = root
        self.extra: list[str] = []
        self.runs: list[RunSummary] = []
        self.nodes: dict[str, lineage.RunNode] = {}
        # Another machine's runs (a remote run is open): (host, its runs, a note: listing, or why not)
        self.remote: Optional[tuple[str, list[RunSummary], str]] = None
        self._filling = False
        self.root_label = QLabel()
        self.root_label.setObjectName("hint")
        self.root_label.setWordWrap(True)
        self.compare_label = QLabel()
        self.compare_label.setObjectName("hint")
        self.compare_label.setWordWrap(True)
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setRootIsDecorated(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        h = self.tree.header()
        for c in range(len(COLUMNS)):
            h.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(CHANGE, QHeaderView.ResizeMode.Stretch)
        self.tree.itemDoubleClicked.connect(lambda item, _c: self._open(item.data(RUN, PATH_ROLE)))
        self.tree.itemChanged.connect(self._item_changed)
        self.tree.currentItemChanged.connect(lambda *_: self._show_checkpoints())
        open_b = QPushButton(assets.icon("open"), "View")
        open_b.setToolTip("Show the selected run's plots (double-click does the same)")
        open_b.clicked.connect(self._open_selected)
        browse = QPushButton(assets.icon("open"), "Open folder...")
        browse.setToolTip("Open any run folder (one holding run.db)")
        browse.clicked.connect(self.browse_requested)
        self.family_button = QPushButton("Compare with family")
        self.family_button.setToolTip("Show the selected run with its parent runs, the other forks of its parent "
                                      "and its own forks overlaid, each from its fork point")
        self.family_button.clicked.connect(self._family)
        self.clear_button = QPushButton("Clear compare")
        self.clear_button.setToolTip("Untick every compared run: only the run shown stays on the plots")
        self.clear_button.clicked.connect(self.compare_cleared)
        refresh = QPushButton(assets.icon("refresh"), "")
        refresh.setToolTip("Refresh the list")
        refresh.clicked.connect(self.refresh)
        row = QHBoxLayout()
        for b in (open_b, browse, self.family_button, self.clear_button):
            row.addWidget(b)
        row.addStretch(1)
        row.addWidget(refresh)

        self.checkpoint_label = QLabel("Checkpoints")
        self.checkpoint_label.setObjectName("hint")
        self.checkpoint_list = QListWidget()
        self.checkpoint_list.setObjectName("checkpoints")
        self.checkpoint_list.itemDoubleClicked.connect(lambda _i: self._fork_selected())
        self.checkpoint_list.currentRowChanged.connect(lambda _r: self._sync_fork_button())
        self.fork_button = QPushButton("Fork from here...")
        self.fork_button.setToolTip("Start a new run from the selected checkpoint, with settings you change")
        self.fork_button.clicked.connect(self._fork_selected)
        side = QWidget()
        side_lay = QVBoxLayout(side)
        side_lay.setContentsMargins(0, 0, 0, 0)
        side_lay.addWidget(self.checkpoint_label)
        side_lay.addWidget(self.checkpoint_list, 1)
        side_lay.addWidget(self.fork_button)
        main = QWidget()
        main_lay = QVBoxLayout(main)
        main_lay.setContentsMargins(0, 0, 0, 0)
        main_lay.addWidget(self.compare_label)
        main_lay.addWidget(self.tree, 1)
        main_lay.addLayout(row)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(main)
        split.addWidget(side)
        split.setStretchFactor(0, 4)
        split.setStretchFactor(1, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(self.root_label)
        lay.addWidget(split, 1)
        self.checked: set[str] = set()
        self._update_root_label()
        self.set_x_axis(DEFAULT_AXIS)
        self._sync_fork_button()

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

    # -- the tree --------------------------------------------------------------------------
    def refresh(self) -> None:
        current = self.selected_path()
        self.runs = list_runs(self.root, tuple(self.extra))
        self.nodes = lineage.build_tree([r.path for r in self.runs])
        names = {r.path: r.name for r in self.runs}
        self._filling = True
        try:
            self.tree.clear()
            items: dict[str, QTreeWidgetItem] = {}
            for r in self.runs:
                items[r.path] = self._item(r, self.nodes.get(r.path), names)
            for r in self.runs:
                node = self.nodes.get(r.path)
                up = node.up if node is not None else None  # a forest: parent loops are cut (lineage.build_tree)
                if up in items:
                    items[up].addChild(items[r.path])
                else:
                    self.tree.addTopLevelItem(items[r.path])
            items.update(self._add_remote())
            self.tree.expandAll()
            if current in items:
                self.tree.setCurrentItem(items[current])
        finally:
            self._filling = False
        self._show_checkpoints()

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
        head = QTreeWidgetItem(["", f"Runs on {host}" + (f" ({note})" if note else "")])
        font = head.font(RUN)
        font.setBold(True)
        head.setFont(RUN, font)
        head.setToolTip(RUN, f"The runs under {host}'s runs root and beside the run opened there, listed with "
                             "headroom-ctl runs over ssh; Compare reads a run's loss through its follow")
        self.tree.addTopLevelItem(head)
        items = {}
        for r in runs:
            items[r.path] = self._item(r, None, {})
            head.addChild(items[r.path])
        return items

    def _open(self, path: Optional[str]) -> None:
        if path:  # not a section's heading
            self.open_requested.emit(path)

    def _item(self, r: RunSummary, node: Optional[lineage.RunNode], names: dict[str, str]) -> QTreeWidgetItem:
        rt = summary_time(r)  # a continued run is one run: its first start, its segments' time together
        when = fmt_when(rt.first_started)
        change = ""
        if node is not None and node.parent is not None:
            p = node.parent
            change = lineage.fork_text(p)
            if p.run_dir not in names:
                change = f"fork of {os.path.basename(os.path.normpath(p.run_dir))} {change}"
            if node.loops:
                change = f"{change} (parent record loops back: shown as a top-level run)"
        end = summary_ending(r)
        seconds = trained_seconds(r, rt)
        duration = fmt_duration(seconds) if seconds is not None else ""
        item = QTreeWidgetItem(["", r.name, change, r.task, end.word, f"{r.steps:,}" if r.steps else "",
                                fmt_loss(r.final_loss), duration, when])
        item.setToolTip(STATUS, end.text)
        tip = segments_tip(rt)
        if tip:
            item.setToolTip(DURATION, tip)
            item.setToolTip(STARTED, tip)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        item.setCheckState(0, Qt.CheckState.Checked if r.path in self.checked else Qt.CheckState.Unchecked)
        item.setData(RUN, PATH_ROLE, r.path)
        item.setToolTip(RUN, r.path)
        if change:
            item.setToolTip(CHANGE, f"{change}\nparent: {node.parent.run_dir}")  # type: ignore[union-attr]  # a change is shown only for a forked run, which has a parent
        return item

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
        self.checkpoint_list.clear()
        if not path:
            self.checkpoint_label.setText("Checkpoints (select a run)")
            self._sync_fork_button()
            return
        if self.remote is not None and path.startswith(self.remote[0] + ":"):  # not read over ssh
            self.checkpoint_label.setText("Checkpoints: on the server (fork there with headroom-ctl start --fork)")
            self._sync_fork_button()
            return
        cps = lineage.checkpoints(path)
        name = os.path.basename(os.path.normpath(path))
        self.checkpoint_label.setText(f"Checkpoints of {name}" if cps else f"{name}: no checkpoints")
        for c in reversed(cps):  # newest first
            li = QListWidgetItem(c.label)
            li.setData(PATH_ROLE, c)
            li.setToolTip(c.path)
            self.checkpoint_list.addItem(li)
        if cps:
            self.checkpoint_list.setCurrentRow(0)
        self._sync_fork_button()

    def checkpoints_shown(self) -> list[lineage.Checkpoint]:
        return [self.checkpoint_list.item(i).data(PATH_ROLE) for i in range(self.checkpoint_list.count())]

    def _sync_fork_button(self) -> None:
        self.fork_button.setEnabled(self.checkpoint_list.currentItem() is not None)

    def _fork_selected(self) -> None:
        li, path = self.checkpoint_list.currentItem(), self.selected_path()
        if li is not None and path:
            self.fork_requested.emit(path, li.data(PATH_ROLE))
