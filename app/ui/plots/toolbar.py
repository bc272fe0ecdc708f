"""The row above the plots: the x axis choice, log scale, ignore outliers, Fit all and a hint."""
from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QLabel, QPushButton, QWidget

from app.model.x_axis import COMPARE_HINT, X_AXES
from app.ui.elided import ElidedLabel


class PlotToolbar(QWidget):
    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        bar = QHBoxLayout(self)
        bar.setContentsMargins(6, 4, 6, 0)
        self.log_box = QCheckBox("Log scale (loss)")
        self.log_box.setToolTip("Show the loss on a logarithmic y axis")
        self.outliers_box = QCheckBox("Ignore outliers")
        self.outliers_box.setToolTip("Range the y axes on the finite values without outliers (outside Tukey's fences "
                                     "around the 5th and 95th percentiles): one spike no longer flattens the curve. "
                                     "On by itself once a run has non-finite steps or rollbacks.")
        self.clear_compare = QPushButton("Clear compare")
        self.clear_compare.setToolTip("Take the other runs' curves off the loss plot (Run history's Compare)")
        self.clear_compare.setVisible(False)  # while runs are compared
        self.fit_button = QPushButton("Fit all")
        self.fit_button.setToolTip("Show the whole run and follow new steps (zooming with the mouse stops following)")
        self.hint = ElidedLabel("")
        self.hint.setObjectName("hint")
        self.x_axis_box = QComboBox()
        self.x_axis_box.setObjectName("x_axis")
        for a in X_AXES:
            self.x_axis_box.addItem(a.name, a.key)
        self.x_axis_box.setToolTip("What the x axis of every plot (and of the runs compared) counts. "
                                   + COMPARE_HINT)
        x_label = QLabel("X axis")
        x_label.setBuddy(self.x_axis_box)
        bar.addWidget(x_label)
        bar.addWidget(self.x_axis_box)
        bar.addSpacing(12)
        bar.addWidget(self.log_box)
        bar.addWidget(self.outliers_box)
        bar.addWidget(self.fit_button)
        bar.addWidget(self.clear_compare)
        bar.addStretch(1)
        bar.addWidget(self.hint, 100)
