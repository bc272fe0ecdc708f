"""Hover values (app/ui/plots/hover.py): the mouse over a plot shows a line across the plots at
the nearest step and a readout naming the x and every series' value there, the run's own and a
compared run's, and what a marker says there; it goes when the mouse leaves."""
from __future__ import annotations

import pytest
from app_helpers import open_comparing
from PySide6.QtCore import QEvent, QPoint, QPointF
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication
from recorded_runs import write_run
from test_window_layout import settle


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return write_run(root / "a", 120, 1.0, 0, changes_at=(60,)), write_run(root / "b", 100, 0.7, 1)


def move_to(qtbot, panel, plot, x: float, view=None) -> str:
    """A real mouse move onto the canvas (or another view of the panel's), over x (data) in the
    middle of `plot`'s height."""
    view = view or panel.canvas
    vb = plot.getViewBox()

    def where() -> QPoint:
        (_x0, _x1), (y0, y1) = vb.viewRange()
        return view.mapFromScene(vb.mapViewToScene(QPointF(x, (y0 + y1) / 2)))

    at, same = where(), 0
    for _ in range(250):  # until the plots' layout has settled: x stays where it is on the screen
        if same == 3:
            break
        qtbot.wait(20)
        now = where()
        at, same = now, (same + 1 if now == at else 0)
    assert same == 3, "the plots' layout never settled"
    before = panel.hover.text()
    QTest.mouseMove(view.viewport(), at + QPoint(0, 3))  # Qt takes the first move into a window as an enter
    QTest.mouseMove(view.viewport(), at)
    qtbot.waitUntil(lambda: bool(panel.hover.text()) and panel.hover.text() != before, timeout=3000)
    return panel.hover.text()


@pytest.mark.slow
def test_hovering_shows_the_step_and_every_runs_values(qtbot, make_window, runs):
    from app.ui.plots.hover import fmt
    a, b = runs
    w = make_window()
    w.resize(1440, 900)
    open_comparing(w, a, b)  # Compare: b over a
    p = w.plots
    settle(qtbot, w)  # the places of the steps on the screen stay put
    own = w.model.metrics
    other = p.overlays["b"][0]

    text = move_to(qtbot, p, p.parts.plot_set.loss, 60.2)
    i = 59  # step 60, the nearest
    assert text.splitlines()[0] == "step 60", text
    assert f"loss  {fmt(own.view('loss_ema')[i])}  (raw {fmt(own.view('loss')[i])})" in text
    assert f"b  {fmt(other.view('loss_ema')[i])}  (raw {fmt(other.view('loss')[i])})" in text
    assert "validation" in text  # the last validation before: step 40's
    assert "accum 4\u21925" in text  # what the marker after step 60 says
    lines = p.hover.lines
    assert all(lines[n].isVisible() and lines[n].value() == 60 for n in ("loss", "norm", "lr"))
    assert p.hover.label.isVisible() and p.canvas.viewport().rect().contains(p.hover.label.geometry())

    text = move_to(qtbot, p, p.parts.plot_set.norm, 90)  # another plot: its own series, and b's there
    assert text.splitlines()[0] == "step 90", text
    assert f"norm  {fmt(own.view('grad_norm')[89])}" in text
    assert f"b  {fmt(other.view('grad_norm_ema')[89])}" in text
    text = move_to(qtbot, p, p.parts.plot_set.norm, 110)  # past b's last step: only the run's own
    assert "step 110" in text and "b  " not in text

    p.set_x_axis("samples")  # the x in the axis' unit, and the step
    settle(qtbot, w)
    x = float(own.view("samples_seen")[29])
    text = move_to(qtbot, p, p.parts.plot_set.loss, x)
    assert text.splitlines()[0] == f"{x:,.0f} samples \u00b7 step 30", text

    QApplication.sendEvent(p.canvas.viewport(), QEvent(QEvent.Type.Leave))  # the mouse leaves the plots
    assert p.hover.text() == "" and not p.hover.label.isVisible()
    assert not any(line.isVisible() for line in p.hover.lines.values())


@pytest.mark.slow
def test_hovering_the_scalars_plot_reads_every_runs_scalars(qtbot, make_window, tmp_path):
    from test_app_scalars import scalar_run
    a, b = scalar_run(tmp_path / "sa"), scalar_run(tmp_path / "sb", steps=8)
    w = make_window()
    w.resize(1440, 900)
    for path in (a, b):
        w.history.add_extra(path)
    w.history.refresh()
    assert w.open_run(a)
    w.history.set_checked(b, True)
    p, sp = w.plots, w.plots.scalars
    qtbot.waitUntil(lambda: sp.isVisible() and ("sb", "eval_accuracy") in sp.compared_curves, timeout=5000)
    settle(qtbot, w)
    color = p.parts.overlays.runs["sb"].color  # the compared run's scalars in its colour on the other plots
    assert sp.compared_curves[("sb", "eval_accuracy")].opts["pen"].color().name() == color
    text = move_to(qtbot, p, sp.plot.getPlotItem(), 7.8, view=sp.plot)
    assert text.splitlines()[0] == "step 8", text
    assert "eval_accuracy  0.5  (step 8)" in text and "sb: eval_accuracy  0.5  (step 8)" in text
    assert p.hover.lines["loss"].isVisible() and p.hover.lines["loss"].value() == 8  # the line across the plots
