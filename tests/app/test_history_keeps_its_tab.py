"""Viewing a run from Run history keeps Run history in front: the Alerts tab comes forward for
news during a run, not for a run folder's past alerts."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QTabBar
from test_plot_outliers import diverged_run


def front_tab(w) -> str:
    """The tab in front among the bottom docks (Alerts, Run history, What fits)."""
    for bar in w.findChildren(QTabBar):
        texts = [bar.tabText(i) for i in range(bar.count())]
        if any(t.startswith("Run history") for t in texts):
            return bar.tabText(bar.currentIndex())
    return ""


@pytest.mark.slow
def test_viewing_from_run_history_keeps_its_tab(qtbot, make_window, tmp_path):
    run = diverged_run(tmp_path / "runs" / "diverged")  # a non-finite step: an error alert
    w = make_window()
    w.history.add_extra(run)
    w.history.refresh()
    w.history_dock.raise_()
    qtbot.wait(50)
    assert front_tab(w) == "Run history"
    w.history.select(run)
    w.history.open_requested.emit(run)  # "View"
    qtbot.wait(50)
    assert w.alerts.total > 0 and "Alerts (" in w.alerts_dock.windowTitle()
    assert front_tab(w) == "Run history"
