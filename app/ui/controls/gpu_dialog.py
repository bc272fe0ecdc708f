"""The "Run on N GPUs" dialog: how many processes, and how they share the model (--strategy,
FSDP's gradient reduction, CPU offload). Each setting's label and tooltip are its declaration's
(engine/declarations/settings.py, LAUNCH_GROUP); the command line the launch will run shows
below, built by the same function the launch uses, so what is shown is what runs."""
from __future__ import annotations

import shlex
from typing import Any, Callable, Optional

from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.session.launch_command import MIN_GPUS
from engine.declarations.config import ConfigError
from engine.declarations.settings import BY_NAME

from .run_fields import setting_row

# (processes, the choices) -> (the command the launch runs, its run folder); raises ConfigError or
# ValueError when the form's settings cannot start.
Preview = Callable[[int, dict[str, Any]], tuple[list[str], str]]


MIN_WIDTH = 560


class CommandView(QPlainTextEdit):
    """A read-only command line in a fixed box of a few lines; text() as a QLabel's."""

    LINES = 5

    def __init__(self) -> None:
        super().__init__()
        self.setReadOnly(True)
        self.setObjectName("command")
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        margins = 2 * (self.frameWidth() + int(self.document().documentMargin())) + 4
        self.setFixedHeight(int(self.fontMetrics().lineSpacing() * (self.LINES + 0.4)) + margins)

    def setText(self, text: str) -> None:  # noqa: N802 - as QLabel's
        self.setPlainText(text)

    def text(self) -> str:
        return self.toPlainText()


def command_and_start(dialog: QDialog, form: QFormLayout) -> tuple[CommandView, QDialogButtonBox]:
    """A launch dialog's layout: its form, the whole command it will run (selectable, scrolled
    within a few lines: a wrapped label was cut off at the dialog's bottom edge, its height not
    asked again when the text grew), then Start and Cancel."""
    command = CommandView()
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
    buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Start")
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    lay = QVBoxLayout(dialog)
    lay.addLayout(form)
    lay.addWidget(command)
    lay.addWidget(buttons)
    return command, buttons


class GpuLaunchDialog(QDialog):
    def __init__(self, parent: Optional[QWidget], count: int, preview: Preview,
                 initial: Optional[dict[str, Any]] = None) -> None:
        """count: the GPUs torch sees; initial: the window's command-line flags (--strategy ...)."""
        super().__init__(parent)
        self.setWindowTitle("Run on N GPUs")
        self.setObjectName("gpu_launch_dialog")
        self.setMinimumWidth(MIN_WIDTH)
        self._preview = preview
        self.run_dir = ""
        self._command: list[str] = []
        init = {name: BY_NAME[name].default for name in ("strategy", "fsdp_reduce", "cpu_offload")}
        init.update({k: v for k, v in (initial or {}).items() if k in init and v is not None})
        self.processes = QSpinBox()
        self.processes.setRange(MIN_GPUS, max(MIN_GPUS, count))
        self.processes.setValue(max(MIN_GPUS, count))
        self.processes.setToolTip("torchrun --nproc-per-node: one process per GPU, each with its own micro-batches "
                                  "(the effective batch is micro-batch x accumulation x processes)")
        self.strategy = QComboBox()
        self.fsdp_reduce = QComboBox()
        for box, name in ((self.strategy, "strategy"), (self.fsdp_reduce, "fsdp_reduce")):
            box.addItems(list(BY_NAME[name].choices))
            box.setCurrentText(str(init[name]))
        self.cpu_offload = QCheckBox()
        self.cpu_offload.setChecked(bool(init["cpu_offload"]))
        form = QFormLayout()
        form.addRow(f"Processes ({count} GPUs here)", self.processes)
        for name in ("strategy", "fsdp_reduce", "cpu_offload"):
            setting_row(form, name, getattr(self, name))
        self.command_text, self.buttons = command_and_start(self, form)
        self.processes.valueChanged.connect(self._sync)
        self.strategy.currentTextChanged.connect(self._sync)
        self.fsdp_reduce.currentTextChanged.connect(self._sync)
        self.cpu_offload.toggled.connect(self._sync)
        self._sync()

    def choices(self) -> dict[str, Any]:
        """The settings chosen here (TrainConfig fields): fsdp's own only with fsdp."""
        out: dict[str, Any] = {"strategy": self.strategy.currentText()}
        if out["strategy"] == "fsdp":
            out.update(fsdp_reduce=self.fsdp_reduce.currentText(), cpu_offload=self.cpu_offload.isChecked())
        return out

    def command(self) -> list[str]:
        """What Start runs ([] when the settings cannot start)."""
        return list(self._command)

    def _sync(self, *_: Any) -> None:
        fsdp = self.strategy.currentText() == "fsdp"
        self.fsdp_reduce.setEnabled(fsdp)
        self.cpu_offload.setEnabled(fsdp)
        try:
            self._command, self.run_dir = self._preview(self.processes.value(), self.choices())
            text = "Runs: " + shlex.join(self._command)
        except (ConfigError, ValueError) as e:
            self._command, self.run_dir = [], ""
            text = f"Cannot start: {e}"
        self.command_text.setText(text)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(bool(self._command))
