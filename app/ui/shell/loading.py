"""What stands where the plots go while pyqtgraph loads, just after the window first shows."""
from __future__ import annotations

import time
from typing import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget


class LoadingPlots(QWidget):
    def __init__(self) -> None:
        super().__init__()
        self.paint_listeners: list[Callable[[float], None]] = []  # each called once, at the first paint
        lay = QVBoxLayout(self)
        label = QLabel("Loading plots...")
        label.setObjectName("hint")
        label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(label)

    def paintEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().paintEvent(ev)
        listeners, self.paint_listeners = self.paint_listeners, []
        for fn in listeners:
            fn(time.perf_counter())
