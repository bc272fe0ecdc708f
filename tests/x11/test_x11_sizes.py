"""Issue 28, "It does not fit a laptop": the issue's run training in another process, followed in
the window at 1024 x 640 and 1366 x 768 (the size the window manager really gives, asserted).
Every toolbar action stays reachable (on the toolbar, or behind an overflow button a person can
see), the status bar shows where the run stands and the epoch's progress and ETA whole, the loss
plot keeps at least 40% of the window's height, and Apply changes is in view without scrolling.

One window a size for the module's tests (they look, the toolbar test alone presses a button and
puts it back): a window costs seconds, a look milliseconds."""
from __future__ import annotations

from typing import Any, Iterator

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QAbstractButton, QToolBar, QToolButton
from x11_window import colours, lasting_window, pixels, rect_in, settle, shown_whole, text_cut, wait_quietly, wait_until

pytestmark = [pytest.mark.x11, pytest.mark.slow]

SIZES = [(1024, 640), (1366, 768)]
LOSS_PLOT_SHARE = 0.4  # of the window's height


@pytest.fixture(scope="module", params=SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def followed(request: pytest.FixtureRequest, qapp: Any, live_run: str,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A window at the size following the live run, its status bar saying it trains."""
    size = request.param
    with lasting_window(tmp_path_factory.mktemp("x11_sizes"), size) as w:
        assert w.size().toTuple() == size, f"asked {size}, the window manager gave {w.size().toTuple()}"
        assert w.open_run(live_run), w.last_error
        wait_until(lambda: w.status.state.text().startswith("Training") and w.status.epoch_text.isVisible()
                   and "ETA" in w.status.epoch_text.text(), 30, "the status bar to show the live run")
        settle(w)
        assert w.size().toTuple() == size, "following the run changed the window's size"
        yield w


def on_toolbar(w: Any, toolbar: QToolBar, action: QAction) -> bool:
    button = toolbar.widgetForAction(action)
    return button is not None and shown_whole(button, w) and toolbar.rect().contains(rect_in(button, toolbar))


def menu_actions(button: QToolButton) -> list[QAction]:
    """Every action in the button's menu and its submenus."""
    out, menus = [], [button.menu()] if button.menu() is not None else []
    while menus:
        for a in menus.pop().actions():
            out.append(a)
            if a.menu() is not None:
                menus.append(a.menu())
    return out


def unreachable(qtbot: Any, w: Any, toolbar: QToolBar) -> list[str]:
    """The toolbar's actions a person cannot reach from it: neither shown on it, nor in the menu of
    a button it shows, nor shown once its overflow (Qt's extension button) is pressed. A button
    counts only if something is painted on it (a 12-px extension button with no room left for
    its arrow is drawn blank: nobody sees it)."""
    actions = [a for a in toolbar.actions() if not a.isSeparator() and a.isVisible()]
    hidden = [a for a in actions if not on_toolbar(w, toolbar, a)]
    seen_buttons = [b for b in toolbar.findChildren(QToolButton) if shown_whole(b, w) and colours(pixels(w, b)) > 1]
    in_menus = {id(a) for b in seen_buttons for a in menu_actions(b)}
    hidden = [a for a in hidden if id(a) not in in_menus]
    ext = toolbar.findChild(QToolButton, "qt_toolbar_ext_button")
    if hidden and ext is not None and ext in seen_buttons:
        qtbot.mouseClick(ext, Qt.MouseButton.LeftButton)
        wait_quietly(lambda: all(on_toolbar(w, toolbar, a) for a in hidden), 2.0)
        hidden = [a for a in hidden if not on_toolbar(w, toolbar, a)]
        qtbot.mouseClick(ext, Qt.MouseButton.LeftButton)  # folded again
    return [a.text() for a in hidden]


def test_every_toolbar_action_is_reachable(qtbot, followed):
    w = followed
    toolbars = [t for t in w.findChildren(QToolBar) if t.parentWidget() is w and t.isVisible()]  # the window's own
    assert w.run_toolbar in toolbars
    for toolbar in toolbars:
        lost = unreachable(qtbot, w, toolbar)
        assert not lost, f"at {w.size().toTuple()}, not reachable from the toolbar {toolbar.windowTitle()!r}: {lost}"


def test_the_status_bar_shows_the_state_and_the_epoch_whole(followed):
    w = followed
    st = w.status
    fields = {"state": st.state, "epoch": st.epoch_text}
    if st.eta.isVisible():
        fields["ETA"] = st.eta
    for name, label in fields.items():
        assert shown_whole(label, w) and st.rect().contains(rect_in(label, st)), (
            f"at {w.size().toTuple()} the status bar's {name} field is not in view: {label.text()!r}")
        assert not text_cut(label), (
            f"at {w.size().toTuple()} the status bar's {name} field is cut: {label.text()!r} needs "
            f"{label.fontMetrics().horizontalAdvance(label.text())} px, has {label.contentsRect().width()}")


def test_the_loss_plot_keeps_two_fifths_of_the_window_height(followed):
    w = followed
    loss = w.plots.parts.plot_set.loss
    assert loss.isVisible() and shown_whole(w.plots.canvas, w)
    height = loss.sceneBoundingRect().height()
    assert height >= LOSS_PLOT_SHARE * w.height(), (
        f"at {w.size().toTuple()} the loss plot is {height:.0f} px tall, {height / w.height():.0%} of the window "
        f"(at least {LOSS_PLOT_SHARE:.0%}: {LOSS_PLOT_SHARE * w.height():.0f} px)")


def test_apply_changes_is_in_view_without_scrolling(followed):
    w = followed
    buttons = [b for b in w.controls_dock.findChildren(QAbstractButton) if b.text().replace("&", "") == "Apply changes"]
    assert buttons, "no Apply changes button in the Controls dock"
    assert any(shown_whole(b, w) for b in buttons), (
        f"at {w.size().toTuple()} Apply changes is below the fold: at y={rect_in(buttons[0], w.controls_dock).y()} "
        f"in a Controls dock {w.controls_dock.height()} px tall")
