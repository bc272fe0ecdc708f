"""Export plots (PNG): the plots under a line naming the run, without the row of controls above
them; the message that says where it went has its own place in the status bar."""
from __future__ import annotations

import pytest
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QFileDialog
from test_window_layout import synthetic_run

from app.ui.export import EXPORT_SIZE, HEADER_PX, plot_title


@pytest.mark.slow
def test_exported_plots_name_the_run_and_leave_out_the_toolbar(qtbot, make_window, tmp_path, monkeypatch):
    w = make_window()
    assert w.open_run(synthetic_run(tmp_path / "named-run"))
    out = tmp_path / "plots.png"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(out), "")))
    w.app_actions.png.trigger()
    img = QImage(str(out))
    width, height = EXPORT_SIZE  # the dashboard at the export size (test_export_view.py), at 2x: no toolbar row
    assert (img.width(), img.height()) == (2 * width, 2 * (height + HEADER_PX))
    assert "named-run" in plot_title(w.model, w.plots.x_axis_box.currentText(), w.views.shown_dir)
    bg = QColor(w.plots.pal.background).rgb()
    header = {img.pixel(x, y) for x in range(0, 600) for y in range(8, 2 * HEADER_PX - 8)}
    assert len(header - {bg}) > 0  # the run's name is written there
    assert "Wrote" in w.status.note.text() and str(out) in w.status.note.text()
    assert w.status.currentMessage() == ""  # nothing drawn over the progress bar
