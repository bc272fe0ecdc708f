"""The live group of the Controls panel: one field per live setting of the engine's
declaration (engine/declarations/settings.py LIVE_SETTINGS, in its order, with its label),
each with the line that says what became of its last change; the effective batch, the
memory readout, when a change applies (the next epoch or the next optimizer step) and the
Apply button. Every number's bounds are the engine's (engine/declarations/limits.py, through
app/ui/controls/limited.py)."""
from __future__ import annotations

from typing import Any, Optional

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QCheckBox, QComboBox, QGroupBox, QHBoxLayout, QLabel, QPushButton, QWidget

from app.model.pending import SettingChange
from app.ui.actions import ActionButton
from engine.declarations.commands import APPLY_AT
from engine.declarations.settings import BY_NAME, LIVE_SETTINGS, Setting

from .limited import LimitedLine, LimitedSpin
from .readouts import FITS_IDLE, FITS_TOOLTIP
from .run_fields import form_layout, setting_row, setting_tip

# When an applied change takes effect: the engine's boundaries (engine/declarations/commands.py APPLY_AT).
APPLY_AT_TEXT = {"epoch": "next epoch", "step": "next step"}
assert set(APPLY_AT_TEXT) == set(APPLY_AT)
BATCH_GROUP = "Batch and accumulation"  # after its live settings: the effective batch and the memory rows


def live_widget(s: Setting) -> QWidget:
    """The field of a live setting, by what it holds: a list of its words, a check box for a
    switch, a spin box for a whole number, a line for a number (or a whole number a spin box
    cannot hold, or one that may be left empty)."""
    w: QWidget
    if s.choices:
        w = QComboBox()
        for word in s.choices:
            w.addItem(word, word)
        w.setCurrentIndex(max(0, w.findData(s.default)))
    elif s.type is bool:
        w = QCheckBox(s.label)
        w.setChecked(bool(s.default))
    elif s.type is int and not s.none_means and s.range is not None and s.range.high < 2**31:
        w = LimitedSpin(s.name, s.default)
    elif s.type is int:  # past a spin box's 2**31, or None allowed (max steps: empty is no limit)
        w = LimitedLine(s.name, s.default, optional=bool(s.none_means))
    else:
        w = LimitedLine(s.name, s.default)
    w.setObjectName(s.name)
    w.setToolTip(setting_tip(s))
    return w


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
    # Two of the fields set from the declarations in __init__ (setattr), as the type checker sees them.
    micro_batch: LimitedSpin
    accum: LimitedSpin

    def __init__(self, apply_action: QAction, parent: Optional[QWidget] = None) -> None:
        super().__init__("Batch, lr and clip (change while training)", parent)
        self.world_size = 1  # the engine's, once run_started says: the effective batch counts every rank
        self._syncing = False
        # The fields the user edited since each was last given a value (the run's, a saved form's):
        # Apply sends these and only these, so a value the form shows is never sent by accident.
        self.touched: set[str] = set()
        self.fields: dict[str, QWidget] = {s.name: live_widget(s) for s in LIVE_SETTINGS}
        for name, w in self.fields.items():
            setattr(self, name, w)  # self.micro_batch, self.accum, self.lr, ...: the panel and the tests use them
        self.effective = QLabel()
        self.effective.setObjectName("effective")
        self.effective.setToolTip("Samples per optimizer step: micro-batch x accumulation x devices")
        self.find_micro_batch = QCheckBox(BY_NAME["find_micro_batch"].label)
        self.find_micro_batch.setObjectName("find_micro_batch")
        self.find_micro_batch.setToolTip(setting_tip(BY_NAME["find_micro_batch"]))
        self.finder_status = _hint()
        self.finder_status.setVisible(False)
        self.fits = QLabel("")
        self.fits.setObjectName("fits")
        self.fits.setWordWrap(True)
        self.set_fits_text(FITS_IDLE)
        self.status: dict[str, QLabel] = {name: QLabel("") for name in self.fields}
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
        self.what_fits = QPushButton("What fits...")
        self.what_fits.setObjectName("what_fits_button")
        self.what_fits.setToolTip("The micro-batch x precision x checkpointing table: predicted peaks, what fits, "
                                  "and a cell to apply")

        form = form_layout(self)
        last_batch = [s.name for s in LIVE_SETTINGS if s.group == BATCH_GROUP][-1:]
        for s in LIVE_SETTINGS:
            setting_row(form, s.name, self.fields[s.name])
            form.addRow("", self.status[s.name])
            if [s.name] == last_batch:
                self._batch_rows(form)
        form.addRow("Apply at", self.apply_at)
        form.addRow("", self.apply_button)
        form.addRow("", self.apply_hint)

        for name, w in self.fields.items():
            for signal in ("valueChanged", "textChanged", "currentIndexChanged", "toggled"):
                if hasattr(w, signal):
                    getattr(w, signal).connect(lambda *_a, name=name: self._changed(name))
                    break
        self.apply_at.currentIndexChanged.connect(lambda *_a: self._changed(None))
        self.update_effective()

    def _batch_rows(self, form: Any) -> None:
        """The effective batch, the micro-batch finder and the memory readout, under the batch settings."""
        form.addRow("Effective batch", self.effective)
        form.addRow("", self.find_micro_batch)
        form.addRow("", self.finder_status)
        memory = QHBoxLayout()
        memory.setContentsMargins(0, 0, 0, 0)
        memory.addWidget(self.fits, 1)
        memory.addWidget(self.what_fits, 0, Qt.AlignmentFlag.AlignTop)
        form.addRow("Memory", memory)

    # -- values --------------------------------------------------------------------------
    def field_value(self, name: str) -> Any:
        """The form's value of a live field; None for a number field that is not a number yet."""
        w = self.fields[name]
        if isinstance(w, (LimitedSpin, LimitedLine)):
            return None if w.problem() else w.given()
        if isinstance(w, QComboBox):
            return w.currentData()
        return w.isChecked()  # type: ignore[attr-defined]  # the remaining kind of field is a QCheckBox

    def values(self) -> dict[str, Any]:
        return {name: self.field_value(name) for name in self.fields}

    def invalid_field(self) -> Optional[str]:
        return next((name for name in self.fields if self.problem(name)), None)

    def problem(self, name: str) -> str:
        """Why a number field cannot be used ("" if it can): the engine's line when out of range."""
        w = self.fields[name]
        return w.problem() if isinstance(w, (LimitedSpin, LimitedLine)) else ""

    def at(self) -> str:
        """When Apply's changes take effect: "epoch" or "step"."""
        return str(self.apply_at.currentData())

    def set_at(self, at: str) -> None:
        i = self.apply_at.findData(at)
        if i >= 0:
            self.apply_at.setCurrentIndex(i)

    def set_field(self, name: str, value: Any) -> None:
        """Show a value (the engine's, a saved one); not an edit: the field is no longer touched."""
        self.touched.discard(name)
        self._syncing = True
        try:
            w = self.fields[name]
            if isinstance(w, (LimitedSpin, LimitedLine)):
                w.set_given(value)
            elif isinstance(w, QComboBox):
                i = w.findData(value)
                if i >= 0:
                    w.setCurrentIndex(i)
            elif isinstance(w, QCheckBox) and isinstance(value, bool):
                w.setChecked(value)
        finally:
            self._syncing = False
        self.update_effective()

    def set_values(self, d: dict[str, Any]) -> None:
        for name in self.fields:
            if d.get(name) is not None:
                self.set_field(name, d[name])
        if "find_micro_batch" in d:
            self.find_micro_batch.setChecked(bool(d["find_micro_batch"]))

    def user_edits(self) -> dict[str, Any]:
        """The touched fields' values (None for a number field that is not a number yet)."""
        return {name: self.field_value(name) for name in self.fields if name in self.touched}

    def untouch(self, name: str) -> None:
        """The user's edit of `name` is on its way to the run (or taken back): no longer an edit."""
        self.touched.discard(name)

    def _changed(self, name: Optional[str]) -> None:
        self.update_effective()
        if not self._syncing:
            if name is not None:
                self.touched.add(name)
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
