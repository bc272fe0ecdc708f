"""The learning-rate schedule group of the Controls panel: schedule, warmup and the ratio the
decay ends at. Fixed once a run starts; the peak is the live Learning rate (set_lr moves it,
the curve keeps its shape). The schedule runs over samples seen (engine/declarations/schedule.py)."""
from __future__ import annotations

from typing import Any, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QGroupBox, QWidget

from engine.declarations.config import LR_SCHEDULES, TrainConfig

from .limited import LimitedLine
from .limited import number_text
from .run_fields import Folding, form_layout

DEFAULTS = TrainConfig()
SCHEDULE_TIPS = {"constant": "the peak all along (after any warmup)",
                 "linear": "down in a straight line to min ratio x the peak at the run's end",
                 "cosine": "down along a half cosine to min ratio x the peak at the run's end"}


class ScheduleFields(QGroupBox):
    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__("Learning-rate schedule (over samples seen)", parent)
        self.lr_schedule = QComboBox()
        self.lr_schedule.setObjectName("lr_schedule")
        for name in LR_SCHEDULES:
            self.lr_schedule.addItem(name, name)
            self.lr_schedule.setItemData(self.lr_schedule.count() - 1, SCHEDULE_TIPS.get(name, ""),
                                         Qt.ItemDataRole.ToolTipRole)
        self.lr_schedule.setToolTip("How the lr moves over the run; the Learning rate field is its peak")
        self.warmup = LimitedLine("warmup", DEFAULTS.warmup, blank="Warmup: enter a number >= 0 (0 = none)")
        self.warmup.setToolTip("Linear warmup from 0 to the peak: below 1 a fraction of the run's samples "
                               "(0.05 = the first 5%), 1 or more a number of samples; 0 = none")
        self.min_lr_ratio = LimitedLine("min_lr_ratio", DEFAULTS.min_lr_ratio,
                                        blank="Min lr ratio: enter a number from 0 to 1")
        self.min_lr_ratio.setToolTip("Linear and cosine end at this fraction of the peak (0 to 1)")
        self.lr_schedule.currentIndexChanged.connect(lambda _i: self._follow_schedule())
        form = form_layout(self)
        form.addRow("Schedule", self.lr_schedule)
        form.addRow("Warmup", self.warmup)
        form.addRow("Min lr ratio", self.min_lr_ratio)
        self.folding = Folding(form)
        self._running = False
        self.set_values({"lr_schedule": DEFAULTS.lr_schedule})
        self._follow_schedule()

    def _follow_schedule(self) -> None:
        """The end ratio means nothing to a constant schedule."""
        self.min_lr_ratio.setEnabled(not self._running and self.lr_schedule.currentData() != "constant")

    def values(self) -> tuple[Optional[dict[str, Any]], str]:
        for w in (self.warmup, self.min_lr_ratio):
            if w.problem():
                return None, w.problem()
        return {"lr_schedule": self.lr_schedule.currentData(), "warmup": float(self.warmup.given()),
                "min_lr_ratio": float(self.min_lr_ratio.given())}, ""

    def set_values(self, d: dict[str, Any]) -> None:
        i = self.lr_schedule.findData(d.get("lr_schedule"))
        if i >= 0:
            self.lr_schedule.setCurrentIndex(i)
        for name in ("warmup", "min_lr_ratio"):
            if d.get(name) is not None:
                getattr(self, name).set_given(d[name])

    def summary(self) -> str:
        """E.g. 'cosine · warmup 0.1 of the run · down to 0.05 × the peak'."""
        kind = str(self.lr_schedule.currentData())
        parts = [kind]
        w = self.warmup.given()
        if w:
            parts.append(f"warmup {number_text(w)} of the run" if w < 1 else f"warmup {number_text(w)} samples")
        r = self.min_lr_ratio.given()
        if kind != "constant" and r is not None:
            parts.append(f"down to {number_text(r)} \u00d7 the peak")
        return " \u00b7 ".join(parts)

    def set_running(self, running: bool) -> None:
        self._running = running
        self.lr_schedule.setEnabled(not running)
        self.warmup.setEnabled(not running)
        self._follow_schedule()
        self.folding.fold(running, self.summary())
