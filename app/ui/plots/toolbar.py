"""The row above the plots: the x axis choice, log scale, ignore outliers, Fit all, Clear
compare and a hint. The controls sit in a QToolBar, so on a narrow window the ones that do
not fit go behind its ">>" button instead of setting the window's minimum width."""
from __future__ import annotations

from typing import Optional

from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QLabel, QPushButton, QToolBar, QWidget

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
        self.row = QToolBar()
        self.row.setObjectName("plot_toolbar")
        for w in (x_label, self.x_axis_box, self.log_box, self.outliers_box, self.fit_button):
            self.row.addWidget(w)
        self._clear_action = self.row.addWidget(self.clear_compare)
        self._clear_action.setVisible(False)  # while runs are compared
        bar.addWidget(self.row)
        bar.addWidget(self.hint, 1)

    def show_clear_compare(self, on: bool) -> None:
        self._clear_action.setVisible(on)

    def clear_compare_shown(self) -> bool:
        """In the row (or behind its ">>" when the row is short of room)."""
        return self._clear_action.isVisible()
