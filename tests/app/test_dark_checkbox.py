"""Dark theme: a check box's indicator stands out from the panel (Qt's own was drawn dark on
dark, so "Log scale" and "Ignore outliers" looked like bare labels), and ticked differs from
not ticked."""
from __future__ import annotations

import pytest
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QStyle, QStyleOptionButton
from test_plot_colours import contrast


def _indicator_colours(box) -> tuple[list[QColor], QColor]:
    """The indicator's pixels and the colour just right of the box's text (the background)."""
    opt = QStyleOptionButton()
    box.initStyleOption(opt)
    rect = box.style().subElementRect(QStyle.SubElement.SE_CheckBoxIndicator, opt, box)
    img = box.grab().toImage()
    pixels = [img.pixelColor(x, y) for x in range(rect.left(), rect.right() + 1)
              for y in range(rect.top(), rect.bottom() + 1)]
    return pixels, img.pixelColor(img.width() - 2, img.height() // 2)


@pytest.mark.slow
def test_dark_check_boxes_are_visible_ticked_or_not(qtbot, make_window):
    w = make_window()
    w.set_theme("dark")
    w.show()
    qtbot.waitExposed(w)
    box = w.plots.toolbar.outliers_box
    for ticked in (False, True):
        box.setChecked(ticked)
        qtbot.wait(20)
        pixels, background = _indicator_colours(box)
        best = max(contrast(p, background) for p in pixels)
        assert best >= 3.0, (ticked, best, background.name())  # WCAG's figure for graphics
    box.setChecked(False)
    off, _ = _indicator_colours(box)
    box.setChecked(True)
    on, _ = _indicator_colours(box)
    assert sum(p.blue() for p in on) > 1.5 * sum(p.blue() for p in off)  # ticked reads as ticked
