"""The "Fork from here..." dialog: which checkpoint the fork starts from (the nearest at or
before the step asked for, named), and the settings it may change, prefilled with what the
run had at that checkpoint. Only the fields edited away from those values are the fork's
change; the rest continue as the checkpoint holds them."""
from __future__ import annotations

from typing import Any, Optional

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QVBoxLayout, QWidget

from app.model.fields import same
from app.model.lineage import Checkpoint, changed_text
from app.ui.controls import task_args
from app.ui.controls.limited import LimitedLine, LimitedSpin
from engine.declarations.config import LR_SCHEDULES, ConfigError, upgrade_keys
from engine.declarations.settings import BY_NAME

# The fields, in the order shown, with the labels of the settings' declaration
# (engine/declarations/settings.py); a setting the form has no field for is named by its flag.
KEYS = ("lr", "accum", "micro_batch", "clip", "lr_schedule", "warmup_samples", "warmup_fraction", "min_lr_ratio",
        "epochs", "max_steps", "task_args")
FIELDS = tuple((key, BY_NAME[key].label or BY_NAME[key].option) for key in KEYS)


def where_text(run_name: str, ckpt: Checkpoint, asked: Optional[int]) -> str:
    """'From step-40 of run-1 (step 40), the nearest checkpoint at or before step 43.'"""
    at = f" (step {ckpt.step})" if ckpt.step is not None and not ckpt.name.startswith("step-") else ""
    why = ("" if asked is None else " (the checkpoint at that step)" if ckpt.step == asked
           else f", the nearest checkpoint at or before step {asked}")
    return f"From checkpoint <b>{ckpt.name}</b> of <b>{run_name}</b>{at}{why}."


class ForkDialog(QDialog):
    fork_wanted = Signal(dict)  # the edited fields (TrainConfig names -> new values)

    def __init__(self, run_name: str, ckpt: Checkpoint, prefill: dict[str, Any], asked: Optional[int] = None,
                 parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("fork_dialog")
        self.setWindowTitle(f"Fork {run_name}")
        self.checkpoint, self.prefill = ckpt, dict(upgrade_keys(prefill))
        self.where = QLabel(where_text(run_name, ckpt, asked))
        self.where.setObjectName("fork_where")
        self.where.setWordWrap(True)
        self.widgets: dict[str, QWidget] = {}
        form = QFormLayout()
        for key, label in FIELDS:
            w = self._widget(key, self.prefill.get(key))
            self.widgets[key] = w
            form.addRow(label, w)
        self.summary = QLabel("")
        self.summary.setObjectName("hint")
        self.summary.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.ok_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.ok_button.setText("Start fork")
        self.buttons.accepted.connect(self._accept)
        self.buttons.rejected.connect(self.reject)
        note = QLabel("The fork is a new run folder: it continues this checkpoint exactly (weights, optimizer, "
                      "schedule, data order) with the changes below from its first step.")
        note.setObjectName("hint")
        note.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.addWidget(self.where)
        lay.addWidget(note)
        lay.addLayout(form)
        lay.addWidget(self.summary)
        lay.addWidget(self.buttons)
        self._update_summary()

    def _widget(self, key: str, value: Any) -> QWidget:
        w: QWidget
        if key == "lr_schedule":
            w = QComboBox()
            for name in LR_SCHEDULES:
                w.addItem(name, name)
            w.setCurrentIndex(max(0, w.findData(value or "constant")))
            w.currentIndexChanged.connect(lambda _i: self._update_summary())
        elif key == "task_args":
            w = QLineEdit(task_args.format_args(value or {}))
            w.setPlaceholderText("KEY=VALUE ...")
            w.textChanged.connect(lambda _t: self._update_summary())
        elif key in ("accum", "micro_batch", "epochs"):
            w = LimitedSpin(key, value)
            w.valueChanged.connect(lambda _v: self._update_summary())
        else:
            w = LimitedLine(key, value, optional=key == "max_steps")
            w.textChanged.connect(lambda _t: self._update_summary())
        w.setObjectName(f"fork_{key}")
        return w

    # -- values ----------------------------------------------------------------------------
    def set_field(self, key: str, value: Any) -> None:
        """Fill one field (the tests, as a user types)."""
        w = self.widgets[key]
        if isinstance(w, QComboBox):
            w.setCurrentIndex(w.findData(value))
        elif isinstance(w, QLineEdit) and key == "task_args":
            w.setText(task_args.format_args(value))
        else:
            w.set_given(value)  # type: ignore[attr-defined]  # one of the form's own field widgets (given, set_given, problem)

    def _value(self, key: str) -> Any:
        w = self.widgets[key]
        if isinstance(w, QComboBox):
            return w.currentData()
        if key == "task_args":
            return task_args.parse(w.text())  # type: ignore[attr-defined]  # one of the form's own field widgets (given, set_given, problem)
        problem = w.problem()  # type: ignore[attr-defined]  # one of the form's own field widgets (given, set_given, problem)
        if problem:
            raise ConfigError(problem)
        return w.given()  # type: ignore[attr-defined]  # one of the form's own field widgets (given, set_given, problem)

    def edits(self) -> dict[str, Any]:
        """The fields edited away from what the checkpoint has. Raises ConfigError."""
        out = {}
        for key, _label in FIELDS:
            v = self._value(key)
            if not same(v, self.prefill.get(key)):
                out[key] = v
        return out

    def _update_summary(self) -> None:
        try:
            edits = self.edits()
        except ConfigError as e:
            self.summary.setText(f"<span style='color:#dc2626'>{e}</span>")
            self.ok_button.setEnabled(False)
            return
        self.ok_button.setEnabled(True)
        text = (f"Changes: {changed_text(edits)}" if edits else
                "No change: the fork repeats the run from here (edit a setting to try another).")
        limit, at = self._value("max_steps"), self.checkpoint.step
        if limit is not None and at is not None and limit <= at:
            text += (f"<br><span style='color:#b45309'>Max steps {limit:,}: the fork goes on from step {at:,}, "
                     "so it would stop at once. Raise it or empty the field.</span>")
        self.summary.setText(text)

    def _accept(self) -> None:
        try:
            edits = self.edits()
        except ConfigError as e:
            self.summary.setText(f"<span style='color:#dc2626'>{e}</span>")
            return
        self.accept()
        self.fork_wanted.emit(edits)
