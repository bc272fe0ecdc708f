"""Export: the metrics as CSV; the dashboard (every plot) as a PNG at 2x or an SVG; the whole
window as a PNG (--screenshot)."""
from __future__ import annotations

import csv
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

from PySide6.QtCore import QRect, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QImage, QPainter
from PySide6.QtWidgets import QApplication, QFileDialog, QGraphicsWidget, QMainWindow, QWidget

from app.core.preferences import Preferences
from app.model.metrics import STEP_COLUMNS, MetricsBuffer
from app.model.runmodel import RunModel
from app.model.scalars import read_scalars
from app.ui.shell.layout import settle
from engine.declarations.paths import default_runs_root

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


def window_png(window: QMainWindow, plots: Any, path: str) -> bool:
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
# An exported dashboard is laid out at this size whatever the window's (a 1024 x 640 laptop folds
# plots away for room; the export has every plot), and drawn at EXPORT_SCALE device pixels per
# pixel: sharp on a HiDPI screen, in a slide or a report.
EXPORT_SIZE = (1280, 800)
EXPORT_SCALE = 2
FORMATS = {"png": "PNG image, 2x (*.png)", "svg": "SVG drawing (*.svg)"}
EXPORT_DIR = "export_dir"  # preference: the folder the last export went to


def plot_title(model: Optional[RunModel], x_label: str = "", run_dir: str = "") -> str:
    """'run-name · mlp · x: samples seen' for the top of an exported PNG."""
    name = default_name(model, "", run_dir)
    task = str(model.info.get("task") or "") if model is not None else ""
    return " \u00b7 ".join(p for p in (name, task, f"x: {x_label}" if x_label else "") if p)


@contextmanager
def laid_out_at(plots: Any, size: tuple[int, int]) -> Iterator[Any]:
    """The plots' canvas at `size` for as long as the block runs, laid out for it as the panel
    lays out any canvas (every plot placed that has room: none folded away for a short window),
    then back as it was. Nothing is painted on screen in between, and no widget layout runs (it
    would put the canvas back): only the plots' own layouts are activated."""
    canvas = plots.canvas
    hover = getattr(plots, "hover", None)
    if hover is not None:
        hover.hide()  # the mouse's readout is not part of a shared view
    before = canvas.size()
    try:
        canvas.resize(*size)  # the panel lays its plots out for the new size (its canvas' resized signal)
        _layout_plots(canvas)
        plots.refresh(force=True)
        _layout_plots(canvas)
        # A plot never shown yet (folded since the start) learns its axes' widths from their tick
        # texts as they are painted: paint once where nobody sees it, then lay out again.
        scratch = QImage(canvas.viewport().size(), QImage.Format.Format_ARGB32)
        p = QPainter(scratch)
        canvas.render(p, QRectF(scratch.rect()), canvas.viewport().rect())
        p.end()
        _layout_plots(canvas)
        yield canvas
    finally:
        canvas.resize(before)
        _layout_plots(canvas)
        plots.refresh(force=True)


def _layout_plots(canvas: Any) -> None:
    """Activate the layouts of the canvas' items now, top down (a parent's sets its children's
    sizes, which invalidates theirs)."""
    for _ in range(3):
        # The canvas' own item fills it again: the view sized it before the panel laid the plots
        # out for the new size, so the old placement's least height could still hold it taller.
        canvas.ci.setGeometry(QRectF(canvas.viewport().rect()))
        for item in canvas.scene().items(Qt.SortOrder.AscendingOrder):
            lay = QGraphicsWidget.layout(item) if isinstance(item, QGraphicsWidget) else None  # pyqtgraph
            if lay is not None and item.isVisible():  # names an attribute `layout`
                lay.activate()


def draw_dashboard(device: Any, plots: Any, model: Optional[RunModel], run_dir: str, size: tuple[int, int]) -> None:
    """The dashboard laid out at `size`, under a line naming the run, painted on `device` (a 2x
    image, an SVG generator: the scene is drawn anew for the device, never a screen grab scaled)."""
    w, h = size
    with laid_out_at(plots, size) as canvas:
        p = QPainter(device)
        try:
            p.setRenderHint(QPainter.RenderHint.Antialiasing)
            p.setRenderHint(QPainter.RenderHint.TextAntialiasing)
            p.fillRect(QRectF(0, 0, w, h + HEADER_PX), QColor(plots.pal.background))
            view = canvas.viewport().rect()  # the scene as the canvas shows it
            canvas.render(p, QRectF(0, HEADER_PX, view.width(), view.height()), view)
            p.setPen(QColor(plots.pal.foreground))
            font = QFont(p.font())
            font.setBold(True)
            p.setFont(font)
            p.drawText(QRect(8, 0, w - 16, HEADER_PX), int(Qt.AlignmentFlag.AlignVCenter),
                       plot_title(model, plots.x_axis_box.currentText(), run_dir))
        finally:
            p.end()


def dashboard_image(plots: Any, model: Optional[RunModel], run_dir: str = "",
                    size: tuple[int, int] = EXPORT_SIZE, scale: int = EXPORT_SCALE) -> QImage:
    """The dashboard as an image `scale` times as wide and tall as `size` (its device pixel ratio)."""
    w, h = size
    img = QImage(w * scale, (h + HEADER_PX) * scale, QImage.Format.Format_ARGB32)
    img.setDevicePixelRatio(scale)
    dots = round(96 * scale / 0.0254)  # the PNG says 192 dpi: a viewer that reads it shows it at its size
    img.setDotsPerMeterX(dots)
    img.setDotsPerMeterY(dots)
    draw_dashboard(img, plots, model, run_dir, size)
    return img


def dashboard_svg(plots: Any, model: Optional[RunModel], path: str, run_dir: str = "",
                  size: tuple[int, int] = EXPORT_SIZE) -> None:
    """The dashboard as an SVG drawing (curves and text as vectors)."""
    from PySide6.QtSvg import QSvgGenerator
    w, h = size
    gen = QSvgGenerator()
    gen.setFileName(path)
    gen.setSize(QSize(w, h + HEADER_PX))
    gen.setViewBox(QRect(0, 0, w, h + HEADER_PX))
    screen = QApplication.primaryScreen()  # points as on screen: the titles' sizes are in pt
    gen.setResolution(round(screen.logicalDotsPerInch()) if screen is not None else 96)
    gen.setTitle(plot_title(model, plots.x_axis_box.currentText(), run_dir))
    gen.setDescription("Exported by Headroom")
    draw_dashboard(gen, plots, model, run_dir, size)


@dataclass(frozen=True)
class Exported:
    path: str
    size: tuple[int, int]  # px of the file (an SVG's: its drawing's size)
    kind: str  # "png" or "svg"

    def said(self) -> str:
        """'Wrote /runs/a.png (2560 x 1652 px, 2x)' for the status bar."""
        w, h = self.size
        how = f"{w} x {h} px, {EXPORT_SCALE}x" if self.kind == "png" else f"SVG, {w} x {h}"
        return f"Wrote {self.path} ({how})"


def export_plots(plots: Any, model: Optional[RunModel], path: str, run_dir: str = "") -> Exported:
    """The dashboard to `path`: SVG for a .svg name, else PNG at 2x. OSError if it cannot be written."""
    kind = "svg" if path.lower().endswith(".svg") else "png"
    if kind == "png" and not path.lower().endswith(".png"):
        path += ".png"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if kind == "svg":
        dashboard_svg(plots, model, path, run_dir)
        if not os.path.isfile(path):
            raise OSError(f"could not write {path}")
        return Exported(path, (EXPORT_SIZE[0], EXPORT_SIZE[1] + HEADER_PX), kind)
    img = dashboard_image(plots, model, run_dir)
    if not img.save(path, "PNG"):  # type: ignore[call-overload]  # the stub says bytes; PySide6 takes only a str
        raise OSError(f"could not write {path}")
    return Exported(path, (img.width(), img.height()), kind)


def plots_png(plots: Any, model: Optional[RunModel], path: str, run_dir: str = "") -> bool:
    """The dashboard as a PNG (export_plots); False if it could not be written."""
    try:
        export_plots(plots, model, path if path.lower().endswith(".png") else path + ".png", run_dir)
    except OSError:
        return False
    return True


def default_name(model: Optional[RunModel], suffix: str, shown: str = "") -> str:
    """The run's folder name (the one shown, else its run_dir) with suffix; 'headroom' if none."""
    run_dir = shown or (model.info.get("run_dir") if model else None) or "headroom"
    return os.path.basename(os.path.normpath(str(run_dir))) + suffix


def export_folder(preferences: Preferences) -> str:
    """Where an export's file dialog opens: the folder the last export went to, if it is still
    there, else the runs folder."""
    last = preferences.get_json(EXPORT_DIR, "")
    return last if isinstance(last, str) and last and os.path.isdir(last) else default_runs_root()


def csv_dialog(parent: QMainWindow, model: RunModel, on_error: Callable[[str, str], Any],
               preferences: Optional[Preferences] = None) -> None:
    """File > Export metrics (CSV)..."""
    prefs = preferences or Preferences()
    start = os.path.join(export_folder(prefs), default_name(model, ".csv"))
    path, _ = QFileDialog.getSaveFileName(parent, "Export metrics", start, "CSV (*.csv)")
    if not path:
        return
    try:
        n = write_csv(model, path)
    except OSError as e:
        on_error("Export failed", str(e))
        return
    prefs.set_json(EXPORT_DIR, os.path.dirname(os.path.abspath(path)))
    say(parent, f"Wrote {n} rows to {path}")


def png_dialog(parent: QWidget, model: RunModel, plots: Any, on_error: Callable[[str, str], Any],
               run_dir: str = "", preferences: Optional[Preferences] = None) -> Optional[Exported]:
    """File > Export plots...: the whole dashboard (every plot, folded ones too) as a PNG at 2x
    or an SVG, in the folder of the last export (else the runs folder)."""
    prefs = preferences or Preferences()
    start = os.path.join(export_folder(prefs), default_name(model, ".png", run_dir))
    path, chosen = QFileDialog.getSaveFileName(parent, "Export plots", start, ";;".join(FORMATS.values()))
    if not path:
        return None
    if chosen == FORMATS["svg"] and not path.lower().endswith(".svg"):
        path = os.path.splitext(path)[0] + ".svg"
    try:
        done = export_plots(plots, model, path, run_dir)
    except OSError as e:
        on_error("Export failed", str(e))
        return None
    prefs.set_json(EXPORT_DIR, os.path.dirname(os.path.abspath(done.path)))
    say(parent, done.said())
    return done


def say(parent: QWidget, text: str) -> None:
    """A line in the status bar's own place for news (never drawn over its progress bar)."""
    bar = parent.statusBar() if isinstance(parent, QMainWindow) else None
    if bar is not None and hasattr(bar, "say"):
        bar.say(text)
