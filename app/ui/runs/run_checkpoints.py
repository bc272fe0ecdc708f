"""The selected run's checkpoints beside the run table, newest first, each a place to start
from: right-click (or the button) to fork from it, continue the run (from its last one: a
run continues from where it ended), or export its weights."""
from __future__ import annotations

import os
from typing import Optional

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import QLabel, QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget

from app.model import lineage

CKPT_ROLE = Qt.ItemDataRole.UserRole


class CheckpointsPane(QWidget):
    fork_requested = Signal(str, object)  # (run folder, lineage.Checkpoint)
    continue_requested = Signal(str)  # the run folder, from its last checkpoint
    export_requested = Signal(str, object)  # (run folder, lineage.Checkpoint)

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.run_dir: Optional[str] = None
        self.live = False
        self.label = QLabel("Checkpoints")
        self.label.setObjectName("hint")
        self.label.setWordWrap(True)
        self.list = QListWidget()
        self.list.setObjectName("checkpoints")
        self.list.itemDoubleClicked.connect(lambda _i: self._fork_selected())
        self.list.currentRowChanged.connect(lambda _r: self._sync_button())
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu_at)
        self.fork_button = QPushButton("Fork from here...")
        self.fork_button.setToolTip("Start a new run from the selected checkpoint, with settings you change "
                                    "(right-click a checkpoint for more)")
        self.fork_button.clicked.connect(self._fork_selected)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.label)
        lay.addWidget(self.fork_button)  # above the list: the dock opens short
        lay.addWidget(self.list, 1)
        self._sync_button()

    def show_run(self, path: Optional[str], remote: bool = False, live: bool = False) -> None:
        self.run_dir, self.live = path, live
        self.list.clear()
        if not path:
            self.label.setText("Checkpoints (select a run)")
        elif remote:  # not read over ssh
            self.label.setText("Checkpoints: on the server (fork there with headroom-ctl start --fork)")
            self.run_dir = None
        else:
            cps = lineage.checkpoints(path)
            name = os.path.basename(os.path.normpath(path))
            self.label.setText(f"Checkpoints of {name}" if cps else f"{name}: no checkpoints")
            for c in reversed(cps):  # newest first
                li = QListWidgetItem(c.label)
                li.setData(CKPT_ROLE, c)
                li.setToolTip(c.path)
                self.list.addItem(li)
            if cps:
                self.list.setCurrentRow(0)
        self._sync_button()

    def shown(self) -> list[lineage.Checkpoint]:
        return [self.list.item(i).data(CKPT_ROLE) for i in range(self.list.count())]

    def selected(self) -> Optional[lineage.Checkpoint]:
        li = self.list.currentItem()
        return li.data(CKPT_ROLE) if li is not None else None

    def _sync_button(self) -> None:
        self.fork_button.setEnabled(self.list.currentItem() is not None)

    def _fork_selected(self) -> None:
        ckpt = self.selected()
        if ckpt is not None and self.run_dir:
            self.fork_requested.emit(self.run_dir, ckpt)

    def _menu_at(self, pos: QPoint) -> Optional[QMenu]:
        li = self.list.itemAt(pos)
        if li is None:
            return None
        self.list.setCurrentItem(li)
        menu = self.menu()
        if menu is not None:
            menu.popup(self.list.viewport().mapToGlobal(pos))
        return menu

    def menu(self) -> Optional[QMenu]:
        """The actions on the selected checkpoint (also what a test triggers, by their text)."""
        ckpt, run_dir = self.selected(), self.run_dir
        if ckpt is None or not run_dir:
            return None
        newest = self.list.row(self.list.currentItem()) == 0
        menu = QMenu(self)
        menu.setToolTipsVisible(True)
        menu.addAction("Fork from here...").triggered.connect(lambda *_: self.fork_requested.emit(run_dir, ckpt))
        cont = menu.addAction("Continue from here")
        cont.triggered.connect(lambda *_: self.continue_requested.emit(run_dir))
        cont.setEnabled(newest and not self.live)
        cont.setToolTip("the run continues from its newest checkpoint" if newest else
                        "a run continues from its newest checkpoint (its history after this one is kept): "
                        "fork from here to train on from this one")
        menu.addAction("Export weights...").triggered.connect(lambda *_: self.export_requested.emit(run_dir, ckpt))
        self.context_menu = menu
        return menu
