"""Colours that say what they mean: the planned lr is not drawn in the actual lr's colour, and
in the dark theme the per-step loss stands out from the background."""
from __future__ import annotations

import pytest
from PySide6.QtGui import QColor


def luminance(c: QColor) -> float:
    def lin(v: float) -> float:
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
    return 0.2126 * lin(c.redF()) + 0.7152 * lin(c.greenF()) + 0.0722 * lin(c.blueF())


def contrast(a: QColor, b: QColor) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.slow
def test_planned_lr_and_dark_loss_colours(qtbot, make_window):
    w = make_window()
    for theme in ("light", "dark"):
        w.set_theme(theme)
        p = w.plots
        planned = p.parts.planned.item.opts["pen"].color()
        lr = p.parts.curves.lr.opts["pen"].color()
        assert planned.name() != lr.name(), theme
    loss = w.plots.parts.curves.loss_raw.opts["pen"].color()  # dark: the per-step loss was dark blue on black
    assert contrast(loss, QColor(w.plots.pal.background)) >= 3.0, loss.name()
