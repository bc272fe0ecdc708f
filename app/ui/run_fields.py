"""The Run group of the Controls panel: what is fixed once a run starts (task, precision,
epochs, device)."""
from __future__ import annotations

import os
from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QSpinBox, QWidget

from engine.config import PRECISIONS
from engine.paths import BUILTIN_TASKS

from ..core import assets
from .validators import DeviceValidator

OPEN_TASK = "Open task file..."


def form_layout(box: QGroupBox) -> QFormLayout:
    form = QFormLayout(box)
    form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
    form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return form


class RunFields(QGroupBox):
    task_file_wanted = Signal()  # "Open task file..." was picked in the task list

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__("Run", parent)
        self._syncing = False
        self._last_task_index = 0
        self.task = QComboBox()
        self.task.setToolTip("A built-in task, or a Python file with build_task(seed) (see resources/example_task.py)")
        for name in BUILTIN_TASKS:
            self.task.addItem(name, name)
        self.task.insertSeparator(self.task.count())
        self.task.addItem(assets.icon("open"), OPEN_TASK, OPEN_TASK)
        self.task.currentIndexChanged.connect(self._task_changed)
        self.task.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.task.setMinimumContentsLength(12)
        self.precision = QComboBox()
        for p in PRECISIONS:
            self.precision.addItem(p, p)
        self.epochs = QSpinBox()
        self.epochs.setRange(1, 1_000_000)
        self.epochs.setValue(3)
        self.device = QComboBox()
        self.device.setEditable(True)
        for d in ("auto", "cpu", "cuda", "cuda:0", "cuda:1"):
            self.device.addItem(d)
        self.device.lineEdit().setValidator(DeviceValidator(self))
        self.device.setToolTip("auto picks CUDA when present; cpu, cuda or cuda:N")
        form = form_layout(self)
        form.addRow("Task", self.task)
        form.addRow("Precision", self.precision)
        form.addRow("Epochs", self.epochs)
        form.addRow("Device", self.device)

    # -- the task ------------------------------------------------------------------------
    def task_spec(self) -> str:
        return str(self.task.currentData() or self.task.currentText())

    def set_task(self, spec: str) -> None:
        i = self.task.findData(spec)
        if i < 0:
            i = self.task.count() - 2  # before the separator and "Open task file..."
            label = os.path.basename(spec) if (spec.endswith(".py") or os.sep in spec) else spec
            self.task.insertItem(i, assets.icon("open") if spec.endswith(".py") else assets.icon("info"), label, spec)
            self.task.setItemData(i, spec, Qt.ItemDataRole.ToolTipRole)
        self._syncing = True
        self.task.setCurrentIndex(i)
        self._syncing = False
        self._last_task_index = i

    def _task_changed(self, index: int) -> None:
        if self._syncing:
            return
        if self.task.itemData(index) == OPEN_TASK:  # not a task: put the last one back, ask for a file
            self._syncing = True
            self.task.setCurrentIndex(self._last_task_index)
            self._syncing = False
            self.task_file_wanted.emit()
        else:
            self._last_task_index = index

    # -- values --------------------------------------------------------------------------
    def values(self) -> tuple[Optional[dict[str, Any]], str]:
        """task, precision, epochs and device as TrainConfig fields, or (None, what is wrong)."""
        if not self.device.lineEdit().hasAcceptableInput():
            return None, "Device: auto, cpu, cuda or cuda:N"
        return {"task": self.task_spec(), "precision": self.precision.currentData(), "epochs": self.epochs.value(),
                "device": self.device.currentText().strip()}, ""

    def set_values(self, d: dict[str, Any]) -> None:
        if "task" in d and d["task"]:
            self.set_task(str(d["task"]))
        if d.get("precision") in PRECISIONS:
            self.precision.setCurrentIndex(self.precision.findData(d["precision"]))
        if isinstance(d.get("epochs"), int) and d["epochs"] >= 1:
            self.epochs.setValue(d["epochs"])
        if d.get("device"):
            self.device.setCurrentText(str(d["device"]))

    def set_running(self, running: bool) -> None:
        for w in (self.task, self.precision, self.epochs, self.device):
            w.setEnabled(not running)
