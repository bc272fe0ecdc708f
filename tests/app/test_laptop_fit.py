"""The window on a laptop (1024 x 640): every toolbar action stays on the toolbar (its words
dropped first, the extension arrow last), the status bar shows its most important fields whole
and leaves out the least important ones (never "elap..." in each), and Apply changes is in view
without scrolling the Controls panel. At 1440 x 900 everything is shown with its words."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QScrollArea
from test_window_layout import settle, synthetic_run

from app.model.state import RunState
from app.ui.elided import ElidedLabel
from app.ui.shell.statusbar import PRIORITY


def toolbar_buttons(w) -> dict[str, object]:
    tb = w.run_toolbar
    return {a.text(): tb.widgetForAction(a) for a in tb.actions() if not a.isSeparator()}


def training_status(qtbot, w, state: str) -> None:
    """The status bar as a live run has it (the model of the run opened), then laid out."""
    w.timer.stop()  # the window's own status updates would say "Viewing"
    w.status.update_from(w.model, RunState.TRAINING, state)
    w.live_label.show_text("live: pid 123456 on gpu-server-17")
    qtbot.wait(30)


def cut_labels(w) -> list[str]:
    return [lab.text() for lab in w.status.findChildren(ElidedLabel) if lab.isVisible() and lab.is_elided()]


@pytest.mark.slow
def test_at_1024_by_640_every_action_the_status_and_apply_are_in_reach(qtbot, make_window, tmp_path):
    w = make_window()
    w.resize(1024, 640)
    assert w.open_run(synthetic_run(tmp_path / "run"))
    settle(qtbot, w)
    assert w.size().toTuple() == (1024, 640)

    buttons = toolbar_buttons(w)
    assert len(buttons) == 10
    assert [t for t, b in buttons.items() if not b.isVisible()] == []  # none dropped off the end
    assert all(b.toolTip() for b in buttons.values())  # a button without its words says them on hover

    for state in ("Training", "Connection lost: reconnecting"):
        training_status(qtbot, w, state)
        shown = w.status.shown()
        assert shown[:3] == ["state", "epoch", "eta"], shown  # the most important, whole
        assert w.status.state.text() == state and w.status.state.isVisible()
        assert cut_labels(w) == []  # a field is shown whole or not at all
        left_out = w.status.left_out
        assert left_out and "torch" in left_out  # a laptop has no room for all of them
        assert all(PRIORITY.index(n) > PRIORITY.index("eta") for n in left_out)  # the least important leave
        for name in left_out:  # what is left out is in the bar's tooltip
            assert w.status.fields[name].text() in w.status.toolTip()

    apply = w.controls.apply_button
    scroll = w.controls_dock.findChild(QScrollArea)
    assert not scroll.isAncestorOf(apply)  # pinned under the panel's scroll area
    top_left = apply.mapTo(w, apply.rect().topLeft())
    assert apply.isVisible() and w.rect().contains(top_left) and top_left.y() + apply.height() <= w.height()
    assert scroll.verticalScrollBar().maximum() > 0  # the panel itself does scroll at this size


@pytest.mark.slow
def test_at_1440_by_900_everything_has_its_words(qtbot, make_window, tmp_path):
    w = make_window()
    w.resize(1440, 900)
    assert w.open_run(synthetic_run(tmp_path / "run"))
    settle(qtbot, w)
    training_status(qtbot, w, "Training")
    assert w.status.left_out == [] and cut_labels(w) == []
    tb = w.run_toolbar
    assert [t for t, b in toolbar_buttons(w).items() if not b.isVisible()] == []
    assert all(b.toolButtonStyle() == b.toolButtonStyle().ToolButtonTextBesideIcon for b in toolbar_buttons(w).values())
    assert tb.sizeHint().width() <= tb.width()
