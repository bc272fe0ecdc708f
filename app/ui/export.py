"""Export: the metrics as CSV, the plots (or the whole window) as PNG."""
from __future__ import annotations

import csv
import math
import os
from typing import Any, Callable, Optional

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QColor, QFont, QImage, QPainter
from PySide6.QtWidgets import QApplication, QFileDialog, QMainWindow, QWidget

from app.model.metrics import STEP_COLUMNS, MetricsBuffer
from app.model.runmodel import RunModel
from app.model.scalars import read_scalars
from app.ui.shell.layout import settle

CSV_COLUMNS = (*STEP_COLUMNS, "loss_ema")
INT_COLUMNS = {"step", "epoch", "accum", "micro_batch", "samples", "tokens", "clipped", "nonfinite",
               "mem_allocated", "mem_reserved", "mem_peak", "mem_used", "mem_total", "mem_params", "mem_grads",
               "mem_optimizer", "mem_activations"}


def _cell(name: str, v: float) -> str:
    if isinstance(v, float) and math.isnan(v):
        return ""
    if name in INT_COLUMNS and math.isfinite(v):
        return str(int(v))
    return repr(float(v))


def write_csv(model: RunModel, path: str) -> int:
    """One row per optimizer step, plus val_loss on each epoch's last step and a column per scalar
    the framework logged (run.db's `scalars`: its value at that step). A step with scalars but no
    metrics row (a run written by a logger alone) is a row of its own. Returns the row count."""
    buf: MetricsBuffer = model.metrics
    val = {step: v for _e, step, _t, v in model.epochs}
    run_dir = model.info.get("run_dir")
    scalars = read_scalars(run_dir if isinstance(run_dir, str) else None)
    names = scalars.names()
    at = scalars.by_step()
    tmp = path + ".tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        taken = {*CSV_COLUMNS, "val_loss"}  # a logged "loss" (the framework's own) is not the row's loss
        w.writerow([*CSV_COLUMNS, "val_loss", *(f"logged_{k}" if k in taken else k for k in names)])
        n = 0

        def extra(step: int) -> list[str]:
            got = at.pop(step, {})
            return ["" if k not in got else repr(float(got[k])) for k in names]

        def alone(step: int) -> list[str]:  # scalars logged at a step with no metrics row
            return [str(step)] + [""] * len(CSV_COLUMNS) + extra(step)

        pending, i = sorted(at), 0
        for row in buf.rows(CSV_COLUMNS):
            step = int(row[0])
            while i < len(pending) and pending[i] < step:
                if pending[i] in at:  # not taken by a metrics row of its own
                    w.writerow(alone(pending[i]))
                    n += 1
                i += 1
            v = val.get(step)
            w.writerow([_cell(c, x) for c, x in zip(CSV_COLUMNS, row)] + ["" if v is None else repr(float(v))]
                       + extra(step))
            n += 1
        for s in pending[i:]:
            if s in at:
                w.writerow(alone(s))
                n += 1
    os.replace(tmp, path)
    return n


def window_png(window: QWidget, plots: Any, path: str) -> bool:
    """The whole window once its layout has stopped changing (the plots' own too)."""
    plots.refresh(force=True)
    settle(window, lambda: plots.canvas.ci.geometry().getRect())
    plots.refresh(force=True)
    QApplication.processEvents()
    return write_png(window, path)


def write_png(widget: QWidget, path: str) -> bool:
    """A PNG of what the widget shows now."""
    if not path.lower().endswith(".png"):
        path += ".png"
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    return bool(widget.grab().save(path, "PNG"))


HEADER_PX = 26  # the line above an exported plot: the run's name and what the x axis counts


def plot_title(model: Optional[RunModel], x_label: str = "", run_dir: str = "") -> str:
    """'run-name · mlp · x: samples seen' for the top of an exported PNG."""
    name = default_name(model, "", run_dir)
    task = str(model.info.get("task") or "") if model is not None else ""
    return " \u00b7 ".join(p for p in (name, task, f"x: {x_label}" if x_label else "") if p)


def plots_png(plots: Any, model: Optional[RunModel], path: str, run_dir: str = "") -> bool:
    """The plots alone (not the row of controls above them) under a line naming the run."""
    if not path.lower().endswith(".png"):
        path += ".png"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    plots.refresh(force=True)
    QApplication.processEvents()
    shot = plots.canvas.grab()
    img = QImage(shot.width(), shot.height() + HEADER_PX, QImage.Format.Format_ARGB32)
    img.fill(QColor(plots.pal.background))
    p = QPainter(img)
    try:
        p.drawPixmap(0, HEADER_PX, shot)
        p.setPen(QColor(plots.pal.foreground))
        font = QFont(p.font())
        font.setBold(True)
        p.setFont(font)
        p.drawText(QRect(8, 0, img.width() - 16, HEADER_PX), int(Qt.AlignmentFlag.AlignVCenter),
                   plot_title(model, plots.x_axis_box.currentText(), run_dir))
    finally:
        p.end()
    return bool(img.save(path, "PNG"))


def default_name(model: Optional[RunModel], suffix: str, shown: str = "") -> str:
    """The run's folder name (the one shown, else its run_dir) with suffix; 'headroom' if none."""
    run_dir = shown or (model.info.get("run_dir") if model else None) or "headroom"
    return os.path.basename(os.path.normpath(str(run_dir))) + suffix


def csv_dialog(parent: QMainWindow, model: RunModel, on_error: Callable[[str, str], Any]) -> None:
    """File > Export metrics (CSV)..."""
    path, _ = QFileDialog.getSaveFileName(parent, "Export metrics", default_name(model, ".csv"), "CSV (*.csv)")
    if not path:
        return
    try:
        n = write_csv(model, path)
    except OSError as e:
        on_error("Export failed", str(e))
        return
    say(parent, f"Wrote {n} rows to {path}")


def png_dialog(parent: QWidget, model: RunModel, plots: Any, on_error: Callable[[str, str], Any],
               run_dir: str = "") -> None:
    """File > Export plots (PNG)...: the plots as they are now, redrawn first."""
    path, _ = QFileDialog.getSaveFileName(parent, "Export plots", default_name(model, ".png", run_dir), "PNG (*.png)")
    if not path:
        return
    if not plots_png(plots, model, path, run_dir):
        on_error("Export failed", f"could not write {path}")
        return
    say(parent, f"Wrote {path}")


def say(parent: QWidget, text: str) -> None:
    """A line in the status bar's own place for news (never drawn over its progress bar)."""
    bar = parent.statusBar() if isinstance(parent, QMainWindow) else None
    if bar is not None and hasattr(bar, "say"):
        bar.say(text)
