"""Compare overlays belong to the run they were chosen for: viewing another run takes them
off, and "Clear compare" (plots toolbar and Run history) takes them off at once."""
from __future__ import annotations

import pytest
from test_plot_outliers import diverged_run
from test_window_layout import synthetic_run


@pytest.mark.slow
def test_overlays_go_with_the_view_and_clear_compare_clears_them(qtbot, make_window, tmp_path):
    a = synthetic_run(tmp_path / "runs" / "a")
    b = synthetic_run(tmp_path / "runs" / "b")
    c = diverged_run(tmp_path / "runs" / "c")
    w = make_window()
    for path in (a, b, c):
        w.history.add_extra(path)
    w.history.refresh()
    assert w.open_run(a)
    w.history.set_checked(b, True)  # Compare: b over a
    assert "b" in w.plots.overlays
    assert w.open_run(c)  # another run viewed: a's comparison is not c's
    assert not w.plots.overlays and not w.history.checked
    assert w.history.item_for(b).checkState(0).name == "Unchecked"
    assert not w.plots.toolbar.clear_compare_shown()
    assert "b (EMA)" not in w.plots.parts.plot_set.loss.titleLabel.text
    w.history.set_checked(a, True)
    w.history.set_checked(b, True)
    assert set(w.plots.overlays) == {"a", "b"} and w.plots.toolbar.clear_compare_shown()
    w.plots.toolbar.clear_compare.click()
    assert not w.plots.overlays and not w.history.checked
    w.history.set_checked(b, True)
    w.history.clear_button.click()  # the same from Run history
    assert not w.plots.overlays and not w.history.checked
