"""The "Ignore outliers" box: the user's choice, or, until the user makes one, on by itself
once the run has non-finite steps or rollbacks (their neighbours are often spikes)."""
from __future__ import annotations

from typing import Callable

from PySide6.QtWidgets import QCheckBox

from app.model.runmodel import RunModel


class OutliersChoice:
    def __init__(self, box: QCheckBox, on_toggled: Callable[[], None]) -> None:
        """on_toggled: the box changed (not when follow_run sets it)."""
        self.box = box
        self.chosen = False  # the user ticked or cleared it: no longer set by itself
        box.toggled.connect(lambda _on: on_toggled())

    @property
    def on(self) -> bool:
        return self.box.isChecked()

    def choose(self, on: bool) -> None:
        """As the user's choice (the box is then no longer set by itself)."""
        self.chosen = True
        if self.box.isChecked() != on:
            self.box.setChecked(on)

    def follow_run(self, model: RunModel) -> None:
        """On by itself for a run with non-finite steps or rollbacks, unless the user chose."""
        want = bool(len(model.metrics.nonfinite_steps) or model.rollbacks)
        if not self.chosen and want != self.box.isChecked():
            self.box.blockSignals(True)
            self.box.setChecked(want)
            self.box.blockSignals(False)
