"""The Run group of the Controls panel: what is fixed once a run starts (task and its
arguments, precision, epochs, device, data-loading workers, token budget and micro-tokens, and
how many epoch checkpoints are kept).
Every number's bounds are the engine's (engine/declarations/limits.py, through app/ui/controls/limited.py)."""
from __future__ import annotations

import os
from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QAbstractButton, QComboBox, QFormLayout, QGroupBox, QLabel, QLineEdit, QWidget

from app.core import assets
from engine.declarations.config import PRECISIONS, ConfigError
from engine.declarations.paths import BUILTIN_TASKS
from engine.declarations.settings import BY_NAME, Setting

from . import task_args
from .limited import LimitedLine, LimitedSpin
from .validators import DeviceValidator

OPEN_TASK = "Open task file..."


def form_layout(box: QGroupBox) -> QFormLayout:
    form = QFormLayout(box)
    form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
    form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return form


def setting_tip(s: Setting) -> str:
    """A setting's tooltip: its help line, as --help gives it (with the default)."""
    text = s.help_text()
    return text[:1].upper() + text[1:]


def setting_row(form: QFormLayout, name: str, widget: QWidget) -> None:
    """The form row of a declared setting: its label from the declaration (a check box carries
    it as its text), its help as the tooltip where the widget has none of its own."""
    s = BY_NAME[name]
    if not widget.toolTip():
        widget.setToolTip(setting_tip(s))
    if isinstance(widget, QAbstractButton):
        widget.setText(s.label)
        form.addRow("", widget)
    else:
        form.addRow(s.label, widget)


class Folding:
    """A group of start-time settings that folds to one line of text while a run goes (they
    cannot change then), so the live settings below stay in view."""

    def __init__(self, form: QFormLayout) -> None:
        self.form = form
        self.summary = QLabel("")
        self.summary.setObjectName("hint")
        self.summary.setWordWrap(True)
        self.summary.setVisible(False)
        form.insertRow(0, self.summary)

    def show(self, text: str) -> None:
        """The line's text: the group's values as they are now (called again whenever they are
        set, folded or not, so a followed run's settings replace the form's in the line too)."""
        self.summary.setText(text)

    def fold(self, folded: bool, text: str) -> None:
        self.show(text)
        for row in range(1, self.form.rowCount()):
            self.form.setRowVisible(row, not folded)
        self.form.setRowVisible(0, folded)


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
        self.epochs = LimitedSpin("epochs", 3)
        self.device = QComboBox()
        self.device.setEditable(True)
        for d in ("auto", "cpu", "cuda", "cuda:0", "cuda:1"):
            self.device.addItem(d)
        edit = self.device.lineEdit()
        assert edit is not None  # an editable combo box has one
        edit.setValidator(DeviceValidator(self))
        self.device.setToolTip("auto picks CUDA when present; cpu, cuda or cuda:N")
        self.workers = LimitedSpin("workers", None, auto_text="auto")
        self.workers.setToolTip("DataLoader worker processes loading the data (0 = in the training process); "
                                "auto: 0 for data in memory, up to 4 when loading a micro-batch is slow")
        self.token_budget = LimitedLine("token_budget", None, optional=True)
        self.token_budget.setPlaceholderText("off")
        self.token_budget.setToolTip("Close an accumulation window once it holds this many counted items "
                                     "(tokens); empty = a fixed number of micro-batches")
        self.micro_tokens = LimitedLine("micro_tokens", None, optional=True)
        self.micro_tokens.setPlaceholderText("off")
        self.micro_tokens.setToolTip("With a token budget: at most this many counted items in one micro-batch")
        # One step below 1 is "all": every epoch checkpoint kept (None, as --keep-epoch-checkpoints all)
        self.keep_epoch_checkpoints = LimitedSpin("keep_epoch_checkpoints", BY_NAME["keep_epoch_checkpoints"].default,
                                                  auto_text="all")
        self.task_args = QLineEdit()
        self.task_args.setObjectName("task_args")
        self.task_args.setPlaceholderText("KEY=VALUE ...")
        self._task_args_tip = ("Passed to the task's build_task(seed, KEY=VALUE, ...), like --task-arg: pairs "
                               "separated by spaces, VALUE read as JSON where it parses (hidden=256 name=\"my data\")")
        self.task_args.setToolTip(self._task_args_tip)
        self.task_args.textChanged.connect(self._check_task_args)
        self.notify = QLineEdit()  # kept with the form's last values: the runs this window starts send there
        self.notify.setObjectName("notify")
        self.notify.setPlaceholderText("ntfy://topic  mailto://...  (Apprise URLs)")
        form = form_layout(self)
        setting_row(form, "task", self.task)
        if task_args.AVAILABLE:
            setting_row(form, "task_args", self.task_args)
        for name in ("precision", "epochs", "device", "workers", "token_budget", "micro_tokens",
                     "keep_epoch_checkpoints", "notify"):
            setting_row(form, name, getattr(self, name))
        self._numbers = (self.epochs, self.workers, self.token_budget, self.micro_tokens, self.keep_epoch_checkpoints)
        self.folding = Folding(form)

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
        """The group's settings as TrainConfig fields, or (None, what is wrong: for a number out
        of range, the engine's own line)."""
        edit = self.device.lineEdit()
        if edit is not None and not edit.hasAcceptableInput():
            return None, "Device: auto, cpu, cuda or cuda:N"
        for w in self._numbers:
            if w.problem():
                return None, w.problem()
        out = {"task": self.task_spec(), "precision": self.precision.currentData(), "epochs": self.epochs.given(),
               "device": self.device.currentText().strip(), "workers": self.workers.given(),
               "token_budget": self.token_budget.given(), "micro_tokens": self.micro_tokens.given(),
               "keep_epoch_checkpoints": self.keep_epoch_checkpoints.given(),
               "notify": tuple(self.notify.text().split())}
        if task_args.AVAILABLE:
            try:
                out["task_args"] = task_args.parse(self.task_args.text())
            except ConfigError as e:
                return None, str(e)
        return out, ""

    def set_values(self, d: dict[str, Any]) -> None:
        if "task" in d and d["task"]:
            self.set_task(str(d["task"]))
        if d.get("precision") in PRECISIONS:
            self.precision.setCurrentIndex(self.precision.findData(d["precision"]))
        if d.get("epochs") is not None:
            self.epochs.set_given(d["epochs"])
        if d.get("device"):
            self.device.setCurrentText(str(d["device"]))
        for name in ("workers", "token_budget", "micro_tokens", "keep_epoch_checkpoints"):  # None is a value: auto, off, all
            if name in d:
                getattr(self, name).set_given(d[name])
        if isinstance(d.get("notify"), (list, tuple)) and d["notify"]:  # a run's saved config has none
            self.notify.setText(" ".join(map(str, d["notify"])))
        if "task_args" in d and task_args.AVAILABLE:
            self.task_args.setText(task_args.format_args(d["task_args"]))
        self.folding.show(self.summary())

    def _check_task_args(self, text: str) -> None:
        bad = ""
        try:
            task_args.parse(text)
        except ConfigError as e:
            bad = str(e)
        self.task_args.setProperty("invalid", bool(bad))
        self.task_args.setToolTip(f"{bad}\n\n{self._task_args_tip}" if bad else self._task_args_tip)
        self.task_args.style().unpolish(self.task_args)
        self.task_args.style().polish(self.task_args)

    def summary(self) -> str:
        """The group in one line, e.g. 'mlp · fp32 · 3 epochs · cpu · workers auto'."""
        parts = [self.task.currentText(), str(self.precision.currentData()), f"{self.epochs.value():,} epochs",
                 self.device.currentText().strip(), f"workers {self.workers.text()}"]
        if self.token_budget.text().strip():
            parts.append(f"token budget {self.token_budget.text().strip()}")
        if self.micro_tokens.text().strip():
            parts.append(f"micro-tokens {self.micro_tokens.text().strip()}")
        if self.keep_epoch_checkpoints.given() != BY_NAME["keep_epoch_checkpoints"].default:
            parts.append(f"epoch checkpoints kept {self.keep_epoch_checkpoints.text()}")
        if self.task_args.text().strip():
            parts.append(self.task_args.text().strip())
        return " \u00b7 ".join(parts)

    def set_running(self, running: bool) -> None:
        for w in (self.task, self.precision, self.epochs, self.device, self.workers, self.token_budget,
                  self.micro_tokens, self.keep_epoch_checkpoints, self.task_args, self.notify):
            w.setEnabled(not running)
        self.folding.fold(running, self.summary())
