"""The learning-rate schedule group of the Controls panel: schedule, warmup (a number of
samples or a fraction of the run, one of the two) and the ratio the decay ends at. Fixed once
a run starts; the peak is the live Learning rate (set_lr moves it, the curve keeps its shape). The schedule runs over samples seen (engine/declarations/schedule.py)."""
from __future__ import annotations

from typing import Any, Optional

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QGroupBox, QWidget

from engine.declarations.config import LR_SCHEDULES, TrainConfig, upgrade_keys

from .limited import LimitedLine, number_text
from .run_fields import Folding, form_layout, setting_row

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
        self.warmup_samples = LimitedLine("warmup_samples", DEFAULTS.warmup_samples)
        self.warmup_fraction = LimitedLine("warmup_fraction", DEFAULTS.warmup_fraction)
        self.min_lr_ratio = LimitedLine("min_lr_ratio", DEFAULTS.min_lr_ratio)
        self.lr_schedule.currentIndexChanged.connect(lambda _i: self._follow_schedule())
        self._numbers = (self.warmup_samples, self.warmup_fraction, self.min_lr_ratio)
        form = form_layout(self)
        for name in ("lr_schedule", "warmup_samples", "warmup_fraction", "min_lr_ratio"):
            setting_row(form, name, getattr(self, name))
        self.folding = Folding(form)
        self._running = False
        self.set_values({"lr_schedule": DEFAULTS.lr_schedule})
        self._follow_schedule()

    def _follow_schedule(self) -> None:
        """The end ratio means nothing to a constant schedule."""
        self.min_lr_ratio.setEnabled(not self._running and self.lr_schedule.currentData() != "constant")

    def values(self) -> tuple[Optional[dict[str, Any]], str]:
        for w in self._numbers:
            if w.problem():
                return None, w.problem()
        samples, fraction, ratio = (w.given() for w in self._numbers)
        # None of these fields has an "auto": problem() said each value is good.
        assert samples is not None and fraction is not None and ratio is not None
        return {"lr_schedule": self.lr_schedule.currentData(), "warmup_samples": int(samples),
                "warmup_fraction": float(fraction), "min_lr_ratio": float(ratio)}, ""

    def set_values(self, d: dict[str, Any]) -> None:
        """A config's values (an older one's `warmup` read as today's two fields)."""
        d = upgrade_keys(d)
        i = self.lr_schedule.findData(d.get("lr_schedule"))
        if i >= 0:
            self.lr_schedule.setCurrentIndex(i)
        for name in ("warmup_samples", "warmup_fraction", "min_lr_ratio"):
            if d.get(name) is not None:
                getattr(self, name).set_given(d[name])
        self.folding.show(self.summary())

    def summary(self) -> str:
        """E.g. 'cosine · warmup 0.1 of the run · down to 0.05 × the peak'."""
        kind = str(self.lr_schedule.currentData())
        parts = [kind]
        samples, fraction = self.warmup_samples.given(), self.warmup_fraction.given()
        if samples:
            parts.append(f"warmup {number_text(samples)} samples")
        elif fraction:
            parts.append(f"warmup {number_text(fraction)} of the run")
        r = self.min_lr_ratio.given()
        if kind != "constant" and r is not None:
            parts.append(f"down to {number_text(r)} \u00d7 the peak")
        return " \u00b7 ".join(parts)

    def set_running(self, running: bool) -> None:
        self._running = running
        self.lr_schedule.setEnabled(not running)
        self.warmup_samples.setEnabled(not running)
        self.warmup_fraction.setEnabled(not running)
        self._follow_schedule()
        self.folding.fold(running, self.summary())
