"""Export: CSV rows are run.db's rows; PNGs are real images."""
from __future__ import annotations

import csv

import pytest
from app_helpers import run_to_end, start
from PySide6.QtGui import QImage

from engine.store import RunReader

pytestmark = pytest.mark.slow  # a real run, then exported


def test_csv_and_png_export(qtbot, make_window, tmp_path):
    w = make_window()
    run_dir = tmp_path / "run"
    start(w, max_steps=20, epochs=1, run_dir=str(run_dir))
    run_to_end(qtbot, w)
    out = tmp_path / "metrics.csv"
    assert w.export_csv(str(out)) == 20
    with open(out, newline="") as f:
        table = list(csv.DictReader(f))
    reader = RunReader(str(run_dir))
    rows = reader.metrics()
    reader.close()
    assert len(table) == len(rows) == 20
    for got, want in zip(table, rows):
        assert int(got["step"]) == want["step"] and int(got["accum"]) == want["accum"]
        assert float(got["loss"]) == want["loss"] and float(got["lr"]) == want["lr"]
        assert got["mem_used"] == ""  # no GPU: empty, not 0
    png = tmp_path / "plots.png"
    assert w.export_png(str(png))
    img = QImage(str(png))
    assert not img.isNull() and img.width() > 400 and img.height() > 300
    whole = tmp_path / "window.png"
    assert w.export_png(str(whole), whole_window=True)
    assert QImage(str(whole)).size() == w.grab().size()  # the window as it is; the plots' export is 2x (test_export_view)
