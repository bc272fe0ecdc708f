"""The run table under a real X server, as a person uses it: the run training in another process
is listed as running; its row's right-click menu and the header's column menu open on the screen,
next to where the mouse was, with their actions; the filter keeps the runs that match; and the
actions above the table are shown whole at 1024 x 640 (the dock opens short)."""
from __future__ import annotations

import os
import shutil

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QContextMenuEvent
from PySide6.QtWidgets import QApplication
from x11_window import on_x11, settle, shown_whole, wait_until

from app.ui.runs.run_columns import INDEX

pytestmark = [pytest.mark.x11, pytest.mark.slow]


def right_click(widget, pos):
    """What the X server sends for a right button press: a context menu event at `pos`."""
    QApplication.sendEvent(widget, QContextMenuEvent(QContextMenuEvent.Reason.Mouse, pos, widget.mapToGlobal(pos)))


def on_screen(menu, near):
    """Inside the screen, next to the mouse (under X11: offscreen's screen is smaller than these
    windows, and Qt moves a menu into it)."""
    g = menu.frameGeometry()
    return not on_x11() or (menu.screen().availableGeometry().contains(g) and (g.topLeft() - near).manhattanLength() < 400)


@pytest.mark.parametrize("size", [(1024, 640), (1440, 900)])
def test_right_click_a_running_run_and_the_header_and_filter_the_table(qtbot, window, live_run, size):
    root = os.environ["HEADROOM_RUNS"]
    os.makedirs(root, exist_ok=True)
    shutil.copytree(live_run, os.path.join(root, "copied"), ignore=shutil.ignore_patterns(".writer.lock", "checkpoints"))
    w = window(size)
    settle(w)
    w.history_dock.raise_()
    panel = w.history
    panel.add_extra(live_run)
    panel.refresh()
    item = panel.item_for(live_run)
    assert item is not None and item.text(INDEX["status"]) == "Running"
    assert panel.item_for(os.path.join(root, "copied")).text(INDEX["status"]) == "Interrupted"  # no live writer
    for wid in (panel.filter_box, panel.refresh_button, panel.fork_button):
        assert shown_whole(wid, w), wid

    tree = panel.tree
    tree.scrollToItem(item)
    pos = tree.visualItemRect(item).center()
    right_click(tree.viewport(), pos)
    menu = panel.context_menu
    wait_until(lambda: menu.isVisible(), 10, "the run's menu")
    assert on_screen(menu, tree.viewport().mapToGlobal(pos))
    texts = [a.text() for a in menu.actions() if a.text()]
    assert texts[:3] == ["View", "Compare", "Compare with family"] and "Delete..." in texts
    assert not [a for a in menu.actions() if a.text() == "Delete..."][0].isEnabled()  # it trains
    menu.close()

    header = tree.header()
    hpos = QPoint(header.sectionViewportPosition(INDEX["status"]) + 5, header.height() // 2)
    right_click(header.viewport(), hpos)
    wait_until(lambda: panel.column_menu.isVisible(), 10, "the column menu")
    assert on_screen(panel.column_menu, header.viewport().mapToGlobal(hpos))
    panel.column_menu.close()

    panel.filter_box.setText("copied")
    assert panel.shown_paths() == [os.path.join(root, "copied")]
    panel.filter_box.setText("running")
    assert panel.shown_paths() == [live_run]
    panel.filter_box.clear()
    assert Qt.CheckState.Unchecked == item.checkState(0)
