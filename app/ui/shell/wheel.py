"""The mouse wheel never changes a setting by passing over it: a spin box or a drop-down list
takes the wheel only once it has the keyboard focus (a click or Tab), the convention of most
desktop apps; otherwise the wheel scrolls what holds it (the Controls panel). One event
filter on the application does it for every such field, present and future: each is made
Qt.StrongFocus as it is polished (the default, WheelFocus, would take the focus on the wheel
itself), and an unfocused one hands its wheel events to the scroll area that holds it."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QAbstractScrollArea, QAbstractSpinBox, QApplication, QComboBox, QWidget

GUARDED = (QAbstractSpinBox, QComboBox)


class WheelGuard(QObject):
    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802 - Qt name
        kind = ev.type()
        if kind == QEvent.Type.Polish and isinstance(obj, GUARDED):
            if obj.focusPolicy() == Qt.FocusPolicy.WheelFocus:
                obj.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        elif kind == QEvent.Type.Wheel and isinstance(ev, QWheelEvent) and isinstance(obj, GUARDED) and not obj.hasFocus():
            self._scroll_holder(obj, ev)
            return True
        return False

    @staticmethod
    def _scroll_holder(field: QWidget, ev: QWheelEvent) -> None:
        """The wheel to the scroll area that holds the field (its viewport, where a scroll area
        takes the wheel), at the same place on screen."""
        area = field.parentWidget()
        while area is not None and not isinstance(area, QAbstractScrollArea):
            area = area.parentWidget()
        if area is None:
            return
        view = area.viewport()
        pos = QPointF(view.mapFromGlobal(ev.globalPosition().toPoint()))
        moved = QWheelEvent(pos, ev.globalPosition(), ev.pixelDelta(), ev.angleDelta(), ev.buttons(),
                            ev.modifiers(), ev.phase(), ev.inverted())
        QApplication.sendEvent(view, moved)


def install(app: QApplication) -> WheelGuard:
    """Once per application (a second window finds it there)."""
    guard = app.findChild(WheelGuard)
    if guard is None:
        guard = WheelGuard(app)
        app.installEventFilter(guard)
    return guard
