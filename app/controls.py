"""The controls panel: run settings, Start/Pause/Resume/Stop, and live changes between epochs.

While a run goes, micro-batch, accumulation, lr, lr scaling and clip can change; the
change is sent as a command and shown as pending ("applies at epoch 4") until the
engine's settings_applied event arrives, then as applied (or refused, with the
engine's reason). Validators keep out anything the engine would refuse.
"""
from __future__ import annotations

import math
import os
from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QGridLayout, QGroupBox, QLabel, QLineEdit,
                               QPushButton, QSizePolicy, QSpinBox, QVBoxLayout, QWidget)

from engine.commands import Command, SetAccum, SetClip, SetLr, SetLrScaling, SetMicroBatch
from engine.config import LR_SCALINGS, PRECISIONS

from . import assets
from .runmodel import fmt_value
from .runs import BUILTIN_TASKS
from .shortcuts import SHORTCUTS
from .validators import DeviceValidator, FloatValidator, parse_float

OPEN_TASK = "Open task file..."
LIVE_FIELDS = ("micro_batch", "accum", "lr", "clip", "lr_scaling")
COMMAND_FIELD = {"set_micro_batch": "micro_batch", "set_accum": "accum", "set_lr": "lr", "set_clip": "clip",
                 "set_lr_scaling": "lr_scaling"}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


FITS_IDLE = "fits: shown during a GPU run"
FITS_NO_GPU = "fits: no GPU"
FITS_MEASURING = "fits: measuring the first steps..."


def _mib(n: Any) -> str:
    return f"{float(n or 0) / 2**20:,.0f} MiB"


def fits_text(d: dict[str, Any]) -> str:
    """A memory_forecast event's fields as one line, e.g.
    'fits: micro-batch up to 29 (×3 for 64) · 410 MiB/sample in bf16'."""
    return (f"fits: micro-batch up to {int(d.get('micro_batch_max') or 0):,} "
            f"(\u00d7{int(d.get('accum_for_effective') or 0)} for {int(d.get('effective_batch') or 0):,}) "
            f"\u00b7 {_mib(d.get('per_sample_bytes'))}/sample in {d.get('precision') or '?'}")


def fits_tooltip(d: dict[str, Any]) -> str:
    return (f"Forecast from the peaks measured so far: {_mib(d.get('capacity'))} usable, "
            f"{_mib(d.get('fixed_bytes'))} fixed (weights, gradients, optimizer state, workspace), "
            f"{_mib(d.get('per_sample_bytes'))} of activations per sample in {d.get('precision') or '?'}. "
            f"Micro-batch {int(d.get('micro_batch_max') or 0):,} with accumulation "
            f"{int(d.get('accum_for_effective') or 0)} keeps the effective batch of "
            f"{int(d.get('effective_batch') or 0):,}.")


def make_command(name: str, value: Any) -> Command:
    return {"micro_batch": lambda v: SetMicroBatch(int(v)), "accum": lambda v: SetAccum(int(v)),
            "lr": lambda v: SetLr(float(v)), "clip": lambda v: SetClip(float(v)),
            "lr_scaling": lambda v: SetLrScaling(str(v))}[name](value)


class ControlsPanel(QWidget):
    start_clicked = Signal()
    pause_clicked = Signal()
    resume_clicked = Signal()
    stop_clicked = Signal()
    apply_clicked = Signal()
    task_file_wanted = Signal()

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.state = "idle"
        self.world_size = 1
        self.remote = False  # the run is in another process (commands through run.db)
        self.engine: dict[str, Any] = {}  # the engine's current values of the live fields
        self.pending: dict[str, tuple[Any, int]] = {}  # name -> (value sent, epoch it applies at)
        self._syncing = False
        self._last_task_index = 0

        # -- run settings ----------------------------------------------------------------
        self.task = QComboBox()
        self.task.setToolTip("A built-in task, or a Python file with build_task(seed) (see resources/example_task.py)")
        for name in BUILTIN_TASKS:
            self.task.addItem(name, name)
        self.task.insertSeparator(self.task.count())
        self.task.addItem(assets.icon("open"), OPEN_TASK, OPEN_TASK)
        self.task.currentIndexChanged.connect(self._task_changed)
        self.task.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.task.setMinimumContentsLength(12)

        self.micro_batch = QSpinBox()
        self.micro_batch.setRange(1, 1_000_000)
        self.micro_batch.setValue(16)
        self.micro_batch.setToolTip("Samples per forward/backward pass")
        self.accum = QSpinBox()
        self.accum.setRange(1, 100_000)
        self.accum.setValue(4)
        self.accum.setToolTip("Micro-batches per optimizer step (one accumulation window)")
        self.effective = QLabel()
        self.effective.setObjectName("effective")
        self.effective.setToolTip("Samples per optimizer step: micro-batch x accumulation x devices")
        self.find_micro_batch = QCheckBox("Find micro-batch")
        self.find_micro_batch.setObjectName("find_micro_batch")
        self.find_micro_batch.setToolTip("Before training, probe the largest micro-batch that fits in memory and "
                                         "set accumulation to keep the effective batch (micro-batch x accumulation)")
        self.finder_status = QLabel("")
        self.finder_status.setObjectName("hint")
        self.finder_status.setWordWrap(True)
        self.finder_status.setVisible(False)
        self.fits = QLabel("")
        self.fits.setObjectName("fits")
        self.fits.setWordWrap(True)
        self.fits.setToolTip("What fits in GPU memory, forecast from the peaks measured so far")
        self.set_fits_text(FITS_IDLE)
        self.lr = QLineEdit("0.001")
        self.lr.setValidator(FloatValidator(0.0, 10.0, parent=self))
        self.lr.setToolTip("Learning rate: a number >= 0, e.g. 3e-4")
        self.lr_scaling = QComboBox()
        for rule in LR_SCALINGS:
            self.lr_scaling.addItem(rule, rule)
        self.lr_scaling.setToolTip("How lr follows the effective batch when accumulation or micro-batch changes "
                                   "without a new lr: none, linear or sqrt")
        self.clip = QLineEdit("1.0")
        self.clip.setValidator(FloatValidator(0.0, 1e9, parent=self))
        self.clip.setPlaceholderText("0 = off")
        self.clip.setToolTip("Clip the total gradient norm at this value (0 = off)")
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

        self.status: dict[str, QLabel] = {}
        self.fields: dict[str, QWidget] = {"micro_batch": self.micro_batch, "accum": self.accum, "lr": self.lr,
                                           "clip": self.clip, "lr_scaling": self.lr_scaling}
        for name in LIVE_FIELDS:
            lab = QLabel("")
            lab.setWordWrap(True)
            lab.setVisible(False)
            self.status[name] = lab

        run_box = QGroupBox("Run")
        form = QFormLayout(run_box)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        form.addRow("Task", self.task)
        form.addRow("Precision", self.precision)
        form.addRow("Epochs", self.epochs)
        form.addRow("Device", self.device)

        live_box = QGroupBox("Batch, lr and clip (change between epochs)")
        live = QFormLayout(live_box)
        live.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        live.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        for label, name in (("Micro-batch", "micro_batch"), ("Accumulation", "accum")):
            live.addRow(label, self.fields[name])
            live.addRow("", self.status[name])
        live.addRow("Effective batch", self.effective)
        live.addRow("", self.find_micro_batch)
        live.addRow("", self.finder_status)
        live.addRow("Memory", self.fits)
        for label, name in (("Learning rate", "lr"), ("lr scaling", "lr_scaling"), ("Clip norm", "clip")):
            live.addRow(label, self.fields[name])
            live.addRow("", self.status[name])
        self.apply_button = QPushButton(assets.icon("apply"), "Apply changes")
        self.apply_button.setToolTip(f"Send the changes to the run; they apply at the next epoch boundary "
                                     f"({SHORTCUTS['apply']})")
        self.apply_button.clicked.connect(self.apply_clicked)
        self.apply_hint = QLabel("")
        self.apply_hint.setObjectName("hint")
        self.apply_hint.setWordWrap(True)
        live.addRow("", self.apply_button)
        live.addRow("", self.apply_hint)

        self.start_button = QPushButton(assets.icon("start"), "Start")
        self.start_button.setObjectName("start")
        self.pause_button = QPushButton(assets.icon("pause"), "Pause")
        self.resume_button = QPushButton(assets.icon("resume"), "Resume")
        self.stop_button = QPushButton(assets.icon("stop"), "Stop")
        self.start_button.setToolTip(f"Start a run with these settings ({SHORTCUTS['start']})")
        self.pause_button.setToolTip(f"Pause after the current epoch ({SHORTCUTS['pause']})")
        self.resume_button.setToolTip(f"Resume a paused run ({SHORTCUTS['resume']})")
        self.stop_button.setToolTip(f"Stop at the next step and write a checkpoint ({SHORTCUTS['stop']})")
        self.start_button.clicked.connect(self.start_clicked)
        self.pause_button.clicked.connect(self.pause_clicked)
        self.resume_button.clicked.connect(self.resume_clicked)
        self.stop_button.clicked.connect(self.stop_clicked)
        buttons = QGridLayout()
        buttons.setSpacing(4)
        buttons.addWidget(self.start_button, 0, 0)
        buttons.addWidget(self.pause_button, 0, 1)
        buttons.addWidget(self.resume_button, 0, 2)
        buttons.addWidget(self.stop_button, 0, 3)
        self.run_state = QLabel("Ready")
        self.run_state.setObjectName("hint")
        self.run_state.setWordWrap(True)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.setSpacing(6)
        lay.addLayout(buttons)
        lay.addWidget(self.run_state)
        lay.addWidget(run_box)
        lay.addWidget(live_box)
        lay.addStretch(1)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)

        for w in (self.micro_batch, self.accum):
            w.valueChanged.connect(self._edited)
        for w in (self.lr, self.clip):
            w.textChanged.connect(self._edited)
        self.lr_scaling.currentIndexChanged.connect(self._edited)
        self._update_effective()
        self.set_state("idle")

    # -- values --------------------------------------------------------------------------
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
        if self.task.itemData(index) == OPEN_TASK:
            self._syncing = True
            self.task.setCurrentIndex(self._last_task_index)
            self._syncing = False
            self.task_file_wanted.emit()
        else:
            self._last_task_index = index

    def field_value(self, name: str) -> Any:
        if name in ("micro_batch", "accum"):
            return self.fields[name].value()
        if name in ("lr", "clip"):
            w: QLineEdit = self.fields[name]  # type: ignore[assignment]
            return parse_float(w.text()) if w.hasAcceptableInput() else None
        if name == "lr_scaling":
            return self.lr_scaling.currentData()
        raise KeyError(name)

    def set_field(self, name: str, value: Any) -> None:
        self._syncing = True
        try:
            w = self.fields[name]
            if name in ("micro_batch", "accum"):
                w.setValue(int(value))
            elif name in ("lr", "clip"):
                w.setText(fmt_value(float(value)) if isinstance(value, float) else str(value))
            elif name == "lr_scaling":
                i = w.findData(value)
                if i >= 0:
                    w.setCurrentIndex(i)
        finally:
            self._syncing = False
        self._update_effective()

    def values(self) -> tuple[Optional[dict[str, Any]], str]:
        """The form as TrainConfig fields, or (None, what is wrong)."""
        lr, clip = self.field_value("lr"), self.field_value("clip")
        if lr is None:
            return None, "Learning rate: enter a number >= 0, e.g. 0.001 or 3e-4"
        if clip is None:
            return None, "Clip norm: enter a number >= 0 (0 = off)"
        device = self.device.currentText().strip()
        if not self.device.lineEdit().hasAcceptableInput():
            return None, "Device: auto, cpu, cuda or cuda:N"
        out = {"task": self.task_spec(), "micro_batch": self.micro_batch.value(), "accum": self.accum.value(),
               "lr": lr, "clip": clip, "lr_scaling": self.lr_scaling.currentData(),
               "precision": self.precision.currentData(), "epochs": self.epochs.value(), "device": device,
               "find_micro_batch": self.find_micro_batch.isChecked()}
        if out["find_micro_batch"]:  # keep the effective batch the form shows; the engine picks the split
            out["effective_batch"] = self.micro_batch.value() * self.accum.value()
        return out, ""

    def set_values(self, d: dict[str, Any]) -> None:
        if "task" in d and d["task"]:
            self.set_task(str(d["task"]))
        for name in LIVE_FIELDS:
            if d.get(name) is not None:
                self.set_field(name, d[name])
        if d.get("precision") in PRECISIONS:
            self.precision.setCurrentIndex(self.precision.findData(d["precision"]))
        if isinstance(d.get("epochs"), int) and d["epochs"] >= 1:
            self.epochs.setValue(d["epochs"])
        if d.get("device"):
            self.device.setCurrentText(str(d["device"]))
        if "find_micro_batch" in d:
            self.find_micro_batch.setChecked(bool(d["find_micro_batch"]))
        self._update_effective()

    def _update_effective(self) -> None:
        m, k, w = self.micro_batch.value(), self.accum.value(), self.world_size
        devices = f" \u00d7 {w} devices" if w > 1 else " \u00d7 1 device"
        self.effective.setText(f"{m * k * w:,}  = {m} \u00d7 {k}{devices}")

    # -- run state -------------------------------------------------------------------------
    def set_state(self, state: str, detail: str = "") -> None:
        """idle | starting | training | pausing | paused | stopping | viewing (a finished run)."""
        was_running = self.is_running()
        self.state = state
        running = state in ("starting", "training", "pausing", "paused", "stopping")
        if running and not was_running:  # a new run: forget the last run's statuses
            for name in LIVE_FIELDS:
                self._set_status(name, "", "")
            self.finder_status.setVisible(False)
        controllable = running and (not self.remote or state != "starting")
        self.start_button.setEnabled(not running)
        self.stop_button.setEnabled(running and state != "stopping")
        self.pause_button.setEnabled(state == "training")
        self.resume_button.setEnabled(state in ("pausing", "paused"))
        for w in (self.task, self.precision, self.epochs, self.device, self.find_micro_batch):
            w.setEnabled(not running)
        for w in self.fields.values():
            w.setEnabled(not running or controllable)
        text = {"idle": "Ready", "starting": "Starting: loading torch and the task...",
                "training": "Training", "pausing": "Pausing after this epoch...",
                "paused": "Paused between epochs: changes apply at once, then Resume",
                "stopping": "Stopping at the next step (a checkpoint is written)...",
                "viewing": "Viewing a run folder"}.get(state, state)
        if self.remote and running:
            text += " (run in another process: commands go through its run.db)"
        self.run_state.setText(text + (f"\n{detail}" if detail else ""))
        if not running and self.pending:  # the run ended before its boundary: say so, keep the rest
            for name, (value, _epoch) in self.pending.items():
                self._set_status(name, "refused", f"not applied: the run ended first ({fmt_value(value)})")
            self.pending.clear()
        self._edited()

    # -- the micro-batch finder and the memory forecast ------------------------------------
    def on_micro_batch_found(self, micro_batch: int, accum: int, probes: int, peak_bytes: int = 0) -> None:
        self.set_engine_values({"micro_batch": micro_batch, "accum": accum})
        peak = f", peak {peak_bytes / 2**20:,.0f} MiB" if peak_bytes else ""
        self.finder_status.setText(f"found: micro-batch {micro_batch} \u00d7 accumulation {accum} "
                                   f"({probes} probes{peak})")
        self.finder_status.setVisible(True)

    def set_fits_text(self, text: str, tooltip: str = "") -> None:
        self.fits.setText(text)
        self.fits.setToolTip(tooltip or "What fits in GPU memory, forecast from the peaks measured so far")

    def on_memory_forecast(self, d: dict[str, Any]) -> None:
        self.set_fits_text(fits_text(d), fits_tooltip(d))

    def is_running(self) -> bool:
        return self.state in ("starting", "training", "pausing", "paused", "stopping")

    # -- live changes ----------------------------------------------------------------------
    def set_engine_values(self, values: dict[str, Any], update_fields: bool = True) -> None:
        """The engine's current settings (from run_started, a step, or settings_applied)."""
        for name, v in values.items():
            if name in LIVE_FIELDS and v is not None:
                self.engine[name] = v
                if update_fields and name not in self.pending:
                    self.set_field(name, v)
        self._edited()

    def changed_fields(self) -> dict[str, Any]:
        """Live fields whose form value differs from what the engine has (and not already sent)."""
        out = {}
        for name in LIVE_FIELDS:
            v = self.field_value(name)
            if v is None or name not in self.engine:
                continue
            sent = self.pending.get(name)
            if sent is not None and _same(sent[0], v):
                continue
            if not _same(self.engine[name], v) or sent is not None:
                out[name] = v
        return out

    def invalid_live_field(self) -> Optional[str]:
        for name in ("lr", "clip"):
            if self.field_value(name) is None:
                return name
        return None

    def mark_pending(self, name: str, value: Any, epoch: int) -> None:
        self.pending[name] = (value, epoch)
        when = f"epoch {epoch}" if self.state != "paused" else f"epoch {epoch} (now: the run is paused)"
        self._set_status(name, "pending", f"pending: {fmt_value(value)} applies at {when}")
        self._edited()

    def on_settings_applied(self, changes: tuple, step: int, epoch: int) -> None:
        for name, _old, new in changes:
            if name not in LIVE_FIELDS:
                continue
            self.engine[name] = new
            sent = self.pending.pop(name, None)
            how = "" if sent is not None else " (by the lr scaling rule)" if name == "lr" else ""
            self.set_field(name, new)
            self._set_status(name, "applied", f"applied: {fmt_value(new)} from epoch {epoch}, after step {step}{how}")
        # Sent values equal to what the engine already had change nothing: nothing to wait for.
        for name, (value, _e) in list(self.pending.items()):
            if name in self.engine and _same(self.engine[name], value):
                self.pending.pop(name)
                self._set_status(name, "applied", f"unchanged: {fmt_value(value)}")
        self._edited()

    def on_boundary_passed(self, epoch: int) -> None:
        """Steps of `epoch` arrived. A pending value meant for it that the engine already has
        changed nothing; one it does not have missed the boundary (sent just as the epoch began)
        and now applies at the next one."""
        for name, (value, target) in list(self.pending.items()):
            if target > epoch:
                continue
            if name in self.engine and _same(self.engine[name], value):
                self.pending.pop(name)
                self._set_status(name, "applied", f"unchanged: {fmt_value(value)}")
            else:
                self.mark_pending(name, value, epoch + 1)
        self._edited()

    def on_refused(self, command_kind: str, reason: str) -> None:
        name = COMMAND_FIELD.get(command_kind)
        if name is None:
            return
        self.pending.pop(name, None)
        self._set_status(name, "refused", f"refused: {reason}")
        if name in self.engine:
            self.set_field(name, self.engine[name])
        self._edited()

    def _set_status(self, name: str, state: str, text: str) -> None:
        lab = self.status[name]
        lab.setText(text)
        lab.setProperty("state", state)
        lab.setVisible(bool(text))
        lab.style().unpolish(lab)
        lab.style().polish(lab)
        field = self.fields[name]
        is_pending = state == "pending"
        if field.property("pending") != is_pending:
            field.setProperty("pending", is_pending)
            field.style().unpolish(field)
            field.style().polish(field)

    def status_text(self, name: str) -> str:
        return self.status[name].text()

    def _edited(self, *_args: Any) -> None:
        self._update_effective()
        if self._syncing:
            return
        running = self.is_running() and self.state != "stopping"
        changed = self.changed_fields() if running else {}
        bad = self.invalid_live_field()
        self.apply_button.setEnabled(running and bool(changed) and bad is None)
        if not running:
            self.apply_hint.setText("During a run: edit, then Apply. Changes take effect at the next epoch.")
        elif bad is not None:
            self.apply_hint.setText(f"{'Learning rate' if bad == 'lr' else 'Clip norm'}: enter a number >= 0")
        elif changed:
            self.apply_hint.setText("Edited: " + ", ".join(f"{n.replace('_', '-')} {fmt_value(v)}"
                                                            for n, v in changed.items())
                                    + f". Press Apply ({SHORTCUTS['apply']}).")
        else:
            self.apply_hint.setText("")
