"""The row above the plots: the x axis choice, log scale, ignore outliers, smoothing, Fit all,
Clear compare and a hint. The controls sit in a QToolBar, so on a narrow window the ones that do
not fit go behind its ">>" button instead of setting the window's minimum width."""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QToolBar,
    QToolButton,
    QWidget,
)

from app.core import assets
from app.model.smoothing import DEFAULT_WEIGHT, MAX_WEIGHT, WEIGHT_DECIMALS, clamp_weight
from app.model.x_axis import COMPARE_HINT, X_AXES
from app.ui.elided import ElidedLabel

SLIDER_STEPS = round(MAX_WEIGHT * 10 ** WEIGHT_DECIMALS)  # the slider counts thousandths
SMOOTHING_TIP = ("Smoothing of the loss, the throughput and the runs compared: TensorBoard's debiased exponential "
                 "moving average, 0 (none) to 0.999. The raw values stay drawn faintly behind.")


class SmoothingControl(QWidget):
    """A slider and a spin box for one weight (TensorBoard's); `changed` says the new weight.
    A drag of the slider says it when the slider rests DRAG_MS (a million-step run smooths
    again in tens of milliseconds: not once per pixel of the drag)."""

    changed = Signal(float)
    DRAG_MS = 60

    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(6, 0, 2, 0)
        lay.setSpacing(4)
        self.label = QLabel("Smoothing")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setObjectName("smoothing_slider")
        self.slider.setRange(0, SLIDER_STEPS)
        self.slider.setFixedWidth(80)
        self.box = QDoubleSpinBox()
        self.box.setObjectName("smoothing")
        self.box.setRange(0.0, MAX_WEIGHT)
        self.box.setDecimals(WEIGHT_DECIMALS)
        self.box.setSingleStep(0.05)
        self.box.setKeyboardTracking(False)  # typing "0.95" is one change, not three
        self.label.setBuddy(self.box)
        for w in (self, self.slider, self.box):
            w.setToolTip(SMOOTHING_TIP)
        lay.addWidget(self.label)
        lay.addWidget(self.slider)
        lay.addWidget(self.box)
        self._weight = DEFAULT_WEIGHT
        self._show(DEFAULT_WEIGHT)
        self._drag = QTimer(self)
        self._drag.setSingleShot(True)
        self._drag.setInterval(self.DRAG_MS)
        self._drag.timeout.connect(lambda: self.set_weight(self.box.value()))
        self.slider.valueChanged.connect(self._slid)
        self.slider.sliderReleased.connect(lambda: self.set_weight(self.box.value()))
        self.box.valueChanged.connect(self.set_weight)

    def weight(self) -> float:
        return self._weight

    def _show(self, w: float) -> None:
        for widget in (self.slider, self.box):
            widget.blockSignals(True)
        self.slider.setValue(round(w * 10 ** WEIGHT_DECIMALS))
        self.box.setValue(w)
        for widget in (self.slider, self.box):
            widget.blockSignals(False)

    def _slid(self, value: int) -> None:
        self.box.blockSignals(True)
        self.box.setValue(value / 10 ** WEIGHT_DECIMALS)
        self.box.blockSignals(False)
        self._drag.start()

    def set_weight(self, weight: float) -> None:
        """Show this weight (the user's, or a saved one) and say so if it changed."""
        self._drag.stop()
        w = clamp_weight(weight)
        self._show(w)
        if w != self._weight:
            self._weight = w
            self.changed.emit(w)


class PlotToolbar(QWidget):
    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        bar = QHBoxLayout(self)
        bar.setContentsMargins(6, 4, 6, 0)
        self.log_box = QCheckBox("Log scale (loss)")
        self.log_box.setToolTip("Show the loss on a logarithmic y axis (the gradient norm and the lr: "
                                "\"Log scale\" in their right-click menu)")
        self.outliers_box = QCheckBox("Ignore outliers")
        self.outliers_box.setToolTip("Range the y axes on the finite values without outliers (outside Tukey's fences "
                                     "around the 5th and 95th percentiles): one spike no longer flattens the curve. "
                                     "On by itself once a run has non-finite steps or rollbacks.")
        self.smoothing = SmoothingControl()
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
        for w in (x_label, self.x_axis_box, self.log_box, self.outliers_box, self.smoothing, self.fit_button):
            self.row.addWidget(w)
        self._clear_action = self.row.addWidget(self.clear_compare)
        self._clear_action.setVisible(False)  # while runs are compared
        ext = self.row.findChild(QToolButton, "qt_toolbar_ext_button")
        if ext is not None:  # as the main toolbar's (app/ui/actions.py): the style sheets draw no arrow on it
            ext.setIcon(assets.icon("more"))
            ext.setStyleSheet("QToolButton { padding: 0px; }")
            ext.setToolTip("More plot controls")
        bar.addWidget(self.row)
        bar.addWidget(self.hint, 1)

    def show_clear_compare(self, on: bool) -> None:
        self._clear_action.setVisible(on)

    def clear_compare_shown(self) -> bool:
        """In the row (or behind its ">>" when the row is short of room)."""
        return self._clear_action.isVisible()
