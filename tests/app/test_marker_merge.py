"""Markers that keep the signal (app/ui/plots/markers.py): markers of a kind that crowd at the
current zoom merge into one with a count, merged again as the zoom changes; no two labels on
a plot overlap; a continued (resumed) run is marked where it was continued."""
from __future__ import annotations

import re

import pytest
from recorded_runs import write_run
from test_window_layout import settle

STEPS, EVERY = 700, 7  # a non-finite step every 7th: 100 of them


@pytest.fixture(scope="module")
def crowded(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("runs") / "crowded", STEPS, per_epoch=350, nonfinite_every=EVERY,
                     changes_at=(300, 301, 302), resumed_at=(500,))


def counted(text: str) -> int:
    """How many markers a label stands for: 'NaN \u00d712' -> 12, 'NaN' -> 1."""
    m = re.search("\u00d7(\\d+)$", text)
    return int(m.group(1)) if m else 1


def assert_no_labels_overlap(p) -> None:
    from app.ui.plots.markers import layout_for
    p.canvas.grab()  # painted, as on the screen: the labels' places follow the new zoom when the view is drawn
    for plot in p.parts.plot_set.all:
        lines = [line for s in layout_for(p.parts.plot_set).sets for pl, line in s.lines() if pl is plot]
        shown = [line for line in lines if getattr(line, "label", None) is not None and line.label.isVisible()
                 and line.isVisible()]
        for i, a in enumerate(shown):
            for b in shown[i + 1:]:
                r1, r2 = a.label.sceneBoundingRect(), b.label.sceneBoundingRect()
                assert not r1.intersects(r2), (a.label.toPlainText(), a.value(), b.label.toPlainText(), b.value())


def loss_lines(lines, p):
    return sorted((line for plot, line in lines if plot is p.parts.plot_set.loss), key=lambda line: line.value())


@pytest.mark.slow
def test_crowded_markers_merge_and_their_labels_never_overlap(qtbot, make_window, crowded):
    from app.ui.plots.markers import MIN_GAP_PX
    w = make_window()
    w.resize(1024, 640)
    assert w.open_run(crowded)
    settle(qtbot, w)
    p = w.plots
    vb = p.parts.plot_set.loss.getViewBox()
    (x0, x1), _ = vb.viewRange()
    px_per_step = vb.width() / (x1 - x0)
    assert px_per_step * EVERY < MIN_GAP_PX  # the whole run: they crowd

    nan = loss_lines(p.parts.marks.nonfinite_lines, p)
    assert 1 <= len(nan) <= vb.width() / MIN_GAP_PX + 1  # a few markers, not a wall of 100 lines
    assert sum(counted(line.label.toPlainText()) for line in nan) == STEPS // EVERY  # every one counted
    assert any("\u00d7" in line.label.toPlainText() for line in nan)
    gaps = [(b.value() - a.value()) * px_per_step for a, b in zip(nan, nan[1:])]
    assert all(g >= MIN_GAP_PX for g in gaps), gaps
    changes = loss_lines(p.parts.marks.marker_lines, p)
    assert [line.label.toPlainText() for line in changes] == ["changes \u00d73"]  # steps 300-302: one marker
    continued = loss_lines(p.rollbacks.continued_lines, p)
    assert [c.value() for c in continued] == [500.5] and "continued" in continued[0].label.toPlainText()
    ps = p.parts.plot_set
    assert {id(plot) for plot, _l in p.rollbacks.continued_lines} >= {id(ps.loss), id(ps.norm), id(ps.lr)}
    assert "continued" in p.parts.plot_set.loss.titleLabel.text
    assert_no_labels_overlap(p)

    p.parts.plot_set.loss.setXRange(281, 320, padding=0)  # zoomed in: each marker on its own again
    nan = loss_lines(p.parts.marks.nonfinite_lines, p)
    assert [line.value() for line in nan] == [287, 294, 301, 308, 315]
    assert {line.label.toPlainText() for line in nan} == {"NaN", "inf"}
    changes = loss_lines(p.parts.marks.marker_lines, p)
    assert [line.value() for line in changes] == [300.5, 301.5, 302.5]
    assert "accum 4\u21925" in changes[0].label.toPlainText()
    assert_no_labels_overlap(p)  # long labels a step apart: staggered, or left out

    p.fit()  # the whole run again: merged again
    nan = loss_lines(p.parts.marks.nonfinite_lines, p)
    assert len(nan) <= vb.width() / MIN_GAP_PX + 1
    assert sum(counted(line.label.toPlainText()) for line in nan) == STEPS // EVERY
    assert [line.label.toPlainText() for line in loss_lines(p.parts.marks.marker_lines, p)] == ["changes \u00d73"]
