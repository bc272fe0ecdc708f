"""The live group of the Controls panel: micro-batch, accumulation, lr, lr scaling and clip,
which change while a run goes, each with the line that says what became of its last change;
the effective batch, the memory readout, when a change applies (the next epoch or the next
optimizer step) and the Apply button. Every number's bounds are the engine's
(engine/declarations/limits.py, through app/ui/controls/limited.py)."""
from __future__ import annotations

from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QCheckBox, QComboBox, QGroupBox, QHBoxLayout, QLabel, QPushButton, QWidget

from engine.declarations.commands import APPLY_AT
from engine.declarations.config import LR_SCALINGS

from app.model.fields import LIVE_FIELDS
from app.model.pending import SettingChange
from app.ui.actions import ActionButton
from .limited import LimitedLine, LimitedSpin
from .readouts import FITS_IDLE, FITS_TOOLTIP
from .run_fields import form_layout

FLOAT_FIELDS = ("lr", "clip")
INT_FIELDS = ("micro_batch", "accum")
# When an applied change takes effect: the engine's boundaries (engine/declarations/commands.py APPLY_AT).
APPLY_AT_TEXT = {"epoch": "next epoch", "step": "next step"}
assert set(APPLY_AT_TEXT) == set(APPLY_AT)
LR_BLANK = "Learning rate: enter a number >= 0, e.g. 0.001 or 3e-4"
CLIP_BLANK = "Clip norm: enter a number >= 0 (0 = off)"


def _hint(text: str = "") -> QLabel:
    lab = QLabel(text)
    lab.setObjectName("hint")
    lab.setWordWrap(True)
    return lab


def _repolish(w: QWidget) -> None:
    """Make the stylesheet see a changed dynamic property."""
    w.style().unpolish(w)
    w.style().polish(w)


class LiveFields(QGroupBox):
    edited = Signal()  # the user changed a live field (not set_field)

    def __init__(self, apply_action: QAction, parent: Optional[QWidget] = None) -> None:
        super().__init__("Batch, lr and clip (change while training)", parent)
        self.world_size = 1  # the engine's, once run_started says: the effective batch counts every rank
        self._syncing = False
        self.micro_batch = LimitedSpin("micro_batch", 16)
        self.micro_batch.setToolTip("Samples per forward/backward pass")
        self.accum = LimitedSpin("accum", 4)
        self.accum.setToolTip("Micro-batches per optimizer step (one accumulation window)")
        self.effective = QLabel()
        self.effective.setObjectName("effective")
        self.effective.setToolTip("Samples per optimizer step: micro-batch x accumulation x devices")
        self.find_micro_batch = QCheckBox("Find micro-batch")
        self.find_micro_batch.setObjectName("find_micro_batch")
        self.find_micro_batch.setToolTip("Before training, probe the largest micro-batch that fits in memory and "
                                         "set accumulation to keep the effective batch (micro-batch x accumulation)")
        self.finder_status = _hint()
        self.finder_status.setVisible(False)
        self.fits = QLabel("")
        self.fits.setObjectName("fits")
        self.fits.setWordWrap(True)
        self.set_fits_text(FITS_IDLE)
        self.lr = LimitedLine("lr", 0.001, blank=LR_BLANK)
        self.lr.setToolTip("Learning rate (the schedule's peak): a number from 0 to 10000, e.g. 3e-4")
        self.lr_scaling = QComboBox()
        for rule in LR_SCALINGS:
            self.lr_scaling.addItem(rule, rule)
        self.lr_scaling.setToolTip("How lr follows the effective batch when accumulation or micro-batch changes "
                                   "without a new lr: none, linear or sqrt")
        self.clip = LimitedLine("clip", 1.0, blank=CLIP_BLANK)
        self.clip.setPlaceholderText("0 = off")
        self.clip.setToolTip("Clip the total gradient norm at this value (0 = off)")
        self.fields: dict[str, QWidget] = {"micro_batch": self.micro_batch, "accum": self.accum, "lr": self.lr,
                                           "clip": self.clip, "lr_scaling": self.lr_scaling}
        self.status: dict[str, QLabel] = {name: QLabel("") for name in LIVE_FIELDS}
        for lab in self.status.values():
            lab.setWordWrap(True)
            lab.setVisible(False)
        self.apply_at = QComboBox()
        self.apply_at.setObjectName("apply_at")
        for at in APPLY_AT:
            self.apply_at.addItem(APPLY_AT_TEXT[at], at)
        self.apply_at.setToolTip("When an applied change takes effect: at the next epoch boundary, or at the next "
                                 "optimizer step (mid-epoch; no accumulation window is ever split)")
        self.apply_button = ActionButton(apply_action)
        self.apply_hint = _hint()

        form = form_layout(self)
        for label, name in (("Micro-batch", "micro_batch"), ("Accumulation", "accum")):
            form.addRow(label, self.fields[name])
            form.addRow("", self.status[name])
        form.addRow("Effective batch", self.effective)
        form.addRow("", self.find_micro_batch)
        form.addRow("", self.finder_status)
        self.what_fits = QPushButton("What fits...")
        self.what_fits.setObjectName("what_fits_button")
        self.what_fits.setToolTip("The micro-batch x precision x checkpointing table: predicted peaks, what fits, "
                                  "and a cell to apply")
        memory = QHBoxLayout()
        memory.setContentsMargins(0, 0, 0, 0)
        memory.addWidget(self.fits, 1)
        memory.addWidget(self.what_fits, 0, Qt.AlignmentFlag.AlignTop)
        form.addRow("Memory", memory)
        for label, name in (("Learning rate", "lr"), ("lr scaling", "lr_scaling"), ("Clip norm", "clip")):
            form.addRow(label, self.fields[name])
            form.addRow("", self.status[name])
        form.addRow("Apply at", self.apply_at)
        form.addRow("", self.apply_button)
        form.addRow("", self.apply_hint)

        for w in (self.micro_batch, self.accum):
            w.valueChanged.connect(self._changed)
        for w in (self.lr, self.clip):
            w.textChanged.connect(self._changed)
        self.lr_scaling.currentIndexChanged.connect(self._changed)
        self.apply_at.currentIndexChanged.connect(self._changed)
        self.update_effective()

    # -- values --------------------------------------------------------------------------
    def field_value(self, name: str) -> Any:
        """The form's value of a live field; None for a float field that is not a number yet."""
        if name in INT_FIELDS or name in FLOAT_FIELDS:
            w = self.fields[name]
            return None if w.problem() else w.given()  # type: ignore[attr-defined]
        if name == "lr_scaling":
            return self.lr_scaling.currentData()
        raise KeyError(name)

    def values(self) -> dict[str, Any]:
        return {name: self.field_value(name) for name in LIVE_FIELDS}

    def invalid_field(self) -> Optional[str]:
        return next((name for name in INT_FIELDS + FLOAT_FIELDS if self.problem(name)), None)

    def problem(self, name: str) -> str:
        """Why a number field cannot be used ("" if it can): the engine's line when out of range."""
        w = self.fields[name]
        return w.problem() if hasattr(w, "problem") else ""  # type: ignore[attr-defined]

    def at(self) -> str:
        """When Apply's changes take effect: "epoch" or "step"."""
        return str(self.apply_at.currentData())

    def set_at(self, at: str) -> None:
        i = self.apply_at.findData(at)
        if i >= 0:
            self.apply_at.setCurrentIndex(i)

    def set_field(self, name: str, value: Any) -> None:
        """Show a value (the engine's, a saved one); not an edit."""
        self._syncing = True
        try:
            w = self.fields[name]
            if name in INT_FIELDS or name in FLOAT_FIELDS:
                w.set_given(value)  # type: ignore[attr-defined]
            elif name == "lr_scaling":
                i = self.lr_scaling.findData(value)
                if i >= 0:
                    self.lr_scaling.setCurrentIndex(i)
        finally:
            self._syncing = False
        self.update_effective()

    def set_values(self, d: dict[str, Any]) -> None:
        for name in LIVE_FIELDS:
            if d.get(name) is not None:
                self.set_field(name, d[name])
        if "find_micro_batch" in d:
            self.find_micro_batch.setChecked(bool(d["find_micro_batch"]))

    def _changed(self, *_args: Any) -> None:
        self.update_effective()
        if not self._syncing:
            self.edited.emit()

    def update_effective(self) -> None:
        m, k, w = self.micro_batch.value(), self.accum.value(), self.world_size
        devices = f" \u00d7 {w} devices" if w > 1 else " \u00d7 1 device"
        self.effective.setText(f"{m * k * w:,}  = {m} \u00d7 {k}{devices}")

    # -- what became of the changes ------------------------------------------------------
    def show_change(self, name: str, change: Optional[SettingChange]) -> None:
        lab = self.status[name]
        lab.setText(change.text if change else "")
        lab.setProperty("state", change.style if change else "")
        lab.setVisible(change is not None)
        _repolish(lab)
        field = self.fields[name]
        pending = change is not None and change.pending
        if field.property("pending") != pending:
            field.setProperty("pending", pending)
            _repolish(field)

    def set_editable(self, live: bool, start_options: bool) -> None:
        """live: the live fields; start_options: Find micro-batch (it acts before training only)."""
        for w in self.fields.values():
            w.setEnabled(live)
        self.apply_at.setEnabled(live)
        self.find_micro_batch.setEnabled(start_options)

    # -- the memory readouts -------------------------------------------------------------
    def set_fits_text(self, text: str, tooltip: str = "") -> None:
        self.fits.setText(text)
        self.fits.setToolTip(tooltip or FITS_TOOLTIP)

    def show_found(self, text: str) -> None:
        self.finder_status.setText(text)
        self.finder_status.setVisible(bool(text))
