"""A label that never sets its window's minimum width: with less room than its text it ends
in "..." (the whole text in its tooltip); with room, it is a QLabel."""
from __future__ import annotations

from typing import Optional

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QWidget


class ElidedLabel(QLabel):
    def __init__(self, text: str = "", parent: Optional[QWidget] = None, keep: int = 24) -> None:
        """keep: the width (px) it keeps of its text before the others have shrunk to theirs."""
        self._tip = ""  # the tooltip given; when the text is cut, the whole text comes first
        super().__init__(text, parent)
        self.keep = keep

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt name
        hint = super().minimumSizeHint()
        return QSize(min(self.keep, hint.width()), hint.height())

    def is_elided(self) -> bool:
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def setToolTip(self, tip: str) -> None:  # noqa: N802 - Qt name
        self._tip = tip
        self._sync_tip()

    def _sync_tip(self) -> None:
        whole = self.text() if self.is_elided() else ""
        super().setToolTip("\n".join(t for t in (whole, self._tip) if t))

    def setText(self, text: str) -> None:  # noqa: N802 - Qt name
        super().setText(text)
        self._sync_tip()

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().resizeEvent(ev)
        self._sync_tip()

    def paintEvent(self, ev) -> None:  # noqa: N802 - Qt name
        if not self.is_elided():
            super().paintEvent(ev)
            return
        fm = self.fontMetrics()
        p = QPainter(self)
        p.setPen(self.palette().color(self.foregroundRole()))
        p.drawText(self.contentsRect(), int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter),
                   fm.elidedText(self.text(), Qt.TextElideMode.ElideRight, self.contentsRect().width()))
