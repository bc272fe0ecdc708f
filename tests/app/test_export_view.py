"""Export plots makes a view to share: the whole dashboard, the plots folded away on a short
window included, laid out at one export size whatever the window's, drawn at 2x (or as an SVG,
which the file dialog offers too); the dialog opens in the runs folder, then in the folder of
the last export; the status bar says which file and how many pixels. The window's own layout is
as it was."""
from __future__ import annotations

import os

import pytest
from PySide6.QtGui import QColor, QImage
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QFileDialog
from test_window_layout import settle, synthetic_run

from app.ui import export


def plot_geometries(w) -> list:
    return ([(p.isVisible(), p.geometry().getRect()) for p in w.plots.parts.plot_set.all]
            + [w.plots.canvas.ci.geometry().getRect()])


@pytest.mark.slow
def test_export_plots_writes_the_whole_dashboard_at_2x_or_svg(qtbot, make_window, tmp_path, monkeypatch):
    w = make_window()
    w.resize(1024, 640)  # a laptop: plots fold away for room
    assert w.open_run(synthetic_run(tmp_path / "shared-run", 300))
    settle(qtbot, w)
    assert w.plots.hint.text(), "nothing folded at 1024 x 640: the test shows nothing"
    before = plot_geometries(w)
    with export.laid_out_at(w.plots, export.EXPORT_SIZE):
        assert w.plots.hint.text() == ""  # every plot placed for the export
    assert plot_geometries(w) == before

    out = tmp_path / "shared" / "view"
    out.parent.mkdir()
    asked: list[tuple[str, str]] = []

    def save_as(path: str, kind: str):
        def dialog(_parent, _caption, start, filters, *_a, **_k):
            asked.append((start, filters))
            return path, export.FORMATS[kind]
        monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(dialog))

    save_as(str(out) + ".png", "png")
    w.app_actions.png.trigger()
    start, filters = asked[-1]
    assert os.path.dirname(start) == os.environ["HEADROOM_RUNS"] and os.path.basename(start) == "shared-run.png"
    assert export.FORMATS["png"] in filters and export.FORMATS["svg"] in filters
    img = QImage(str(out) + ".png")
    width, height = export.EXPORT_SIZE
    assert (img.width(), img.height()) == (2 * width, 2 * (height + export.HEADER_PX))  # 2x, whatever the window
    bg = QColor(w.plots.pal.background).rgb()
    lowest = {img.pixel(x, y) for x in range(0, img.width(), 7) for y in range(int(img.height() * 0.8),
                                                                               int(img.height() * 0.95), 5)}
    assert len(lowest - {bg}) > 3  # the lowest row (folded on screen) is drawn in the file
    assert w.status.note.text() == f"Wrote {out}.png ({img.width()} x {img.height()} px, 2x)"
    assert plot_geometries(w) == before  # the window's plots as they were

    save_as(str(out), "svg")  # no extension typed: the chosen format's
    w.app_actions.png.trigger()
    assert os.path.dirname(asked[-1][0]) == str(out.parent)  # the folder of the last export
    svg = QSvgRenderer(str(out) + ".svg")
    assert svg.isValid() and svg.viewBox().size().toTuple() == (width, height + export.HEADER_PX)
    assert w.status.note.text().startswith(f"Wrote {out}.svg (SVG, ")
