"""A field says what it refused: a key the range does not allow is named with the range, in
a tooltip at the field, and a learning rate of 0 is said to train nothing."""
from __future__ import annotations

import pytest

from PySide6.QtWidgets import QToolTip


@pytest.mark.slow
def test_refused_keys_and_lr_zero_are_said_at_the_field(qtbot, make_window):
    w = make_window()
    c, notices = w.controls, w.field_notices
    c.lr.clear()
    c.lr.setFocus()
    qtbot.keyClicks(c.lr, "-")
    assert c.lr.text() == ""  # not taken, as before...
    assert "'-' not taken" in notices.last and "learning rate" in notices.last.lower()  # ...but said
    assert ">=" in notices.last or "0" in notices.last
    assert QToolTip.isVisible() and QToolTip.text() == notices.last
    qtbot.keyClicks(c.lr, "0.5abc")
    assert c.lr.text() == "0.5" and "'c' not taken" in notices.last  # each refused key is said
    c.accum.lineEdit().selectAll()
    qtbot.keyClicks(c.accum.lineEdit(), "x")
    assert "'x' not taken" in notices.last and "ccumulation" in notices.last
    c.lr.clear()
    qtbot.keyClicks(c.lr, "0")
    assert "will not change" in notices.last
