"""Hover values: the mouse over any plot shows a vertical line across the plots at the nearest
step and, by the mouse, a readout of that plot: the x in the chosen axis' unit (step, samples,
tokens, wall time; the step too on the other axes), then every series drawn there, the run's
own and each compared run's (its smoothed value with its raw one, as TensorBoard's and W&B's
tooltips do), and what the markers say there (a setting changed, a non-finite step: the label
left out where markers crowd). Hidden when the mouse leaves the plots.

Cheap: the scene's mouse moves reach it through one pg.SignalProxy (at most RATE_HZ a second),
each a searchsorted on the x columns and a few values read; nothing runs while the mouse is
still, except that a refresh of the plots (new steps) reads the values under the line again.
"""
from __future__ import annotations

import bisect
import html
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QObject, QPoint, QPointF, Qt
from PySide6.QtWidgets import QLabel, QWidget

from app.model.metrics import MetricsBuffer
from app.model.runmodel import RunModel
from app.model.x_axis import BY_KEY, XColumns, columns, fmt_clock, nearest
from app.ui.theme import Palette

from .build import CanvasParts
from .parts import PlotCanvas
from .scalars import ScalarsPlot

RATE_HZ = 40
GAP_PX = 14  # between the mouse and the readout
PLOT_NAMES = ("loss", "norm", "lr", "mem", "tput", "stack")  # the canvas' plots (PlotSet); and "scalars"


class HoverPanel(Protocol):
    """What the hover reads of the plot panel (PlotPanel, panel.py, which makes the hover)."""
    axis: str
    model: Optional[RunModel]
    pal: Palette
    parts: CanvasParts
    scalars: ScalarsPlot
    on_updated: list[Callable[[], None]]

    @property
    def canvas(self) -> PlotCanvas: ...

    def steps_to_x(self, steps: np.ndarray) -> np.ndarray: ...


@dataclass
class Readout:
    """What the readout says for one place on one plot."""
    x: float  # where the line goes (the nearest step of the run, on the chosen axis)
    head: str  # "step 120", "7,680 samples \u00b7 step 120"
    rows: list[tuple[str, str]] = field(default_factory=list)  # (colour, text)

    def text(self) -> str:
        """The readout as plain text (for tests and the tooltip of a screen reader)."""
        return "\n".join([self.head] + [t for _c, t in self.rows])


def nearest_unsorted(xs: np.ndarray, x: float) -> int:
    """The index of the value of xs nearest x (xs not empty, in any order: scalars come as logged)."""
    return int(np.nanargmin(np.abs(np.asarray(xs, dtype=np.float64) - x)))


def fmt(v: float) -> str:
    """A value as the readout shows it: 4 significant digits; large ones with separators."""
    if not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if abs(v) >= 1e4 and abs(v) < 1e9:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def fmt_x(axis: str, x: float, step: int) -> str:
    if axis == "step":
        return f"step {step}"
    if axis == "time":
        return f"{fmt_clock(x)} \u00b7 step {step}"
    return f"{x:,.0f} {BY_KEY[axis].label.split()[0]} \u00b7 step {step}"


def _at(buf: MetricsBuffer, column: str, i: int) -> float:
    try:
        return buf.value_at(column, i)
    except (KeyError, IndexError):
        return math.nan


def _row_index(buf: MetricsBuffer, axis: str, x: float) -> Optional[int]:
    """The row of `buf` drawn at x (nearest), None when x lies beyond its rows by more than a
    row's width (a shorter run compared says nothing there)."""
    n = len(buf)
    if not n:
        return None
    xs = columns(buf).values(axis)
    i = nearest(xs, x)
    gap = (float(xs[-1]) - float(xs[0])) / (n - 1) if n > 1 else 1.0
    if x < xs[0] - gap or x > xs[-1] + gap:
        return None
    return i


def readout(panel: HoverPanel, plot: str, x: float) -> Optional[Readout]:
    """The readout of PlotSet plot `plot` at x on the panel's axis (None: nothing drawn there)."""
    axis, model, pal = panel.axis, panel.model, panel.pal
    own = model.metrics if model is not None else None
    compared = panel.parts.overlays.runs.values()
    ref = own if own is not None and len(own) else next((r.buf for r in compared if len(r.buf)), None)
    if ref is None:
        return None
    i = nearest(columns(ref).values(axis), x)
    x_line = float(columns(ref).values(axis)[i])
    out = Readout(x_line, fmt_x(axis, x_line, int(ref.view("step")[i])))
    if plot == "scalars":
        out.rows += _scalar_rows(panel, x_line)
        return out
    if own is not None and ref is own:
        out.rows += _own_rows(panel, plot, own, i, pal)
        out.rows += _marks_at(panel, int(own.view("step")[i]))
    for run in panel.parts.overlays.runs.values():
        j = _row_index(run.buf, axis, x_line)
        if j is None:
            continue
        drawn = run.series(plot)
        if not drawn:
            continue
        smooth = [s for s in drawn if s.column.endswith(("_ema", "_inliers")) or s.column == "lr"]
        raw = [s for s in drawn if s not in smooth]
        value = _at(run.buf, smooth[0].column, j) if smooth else _at(run.buf, raw[0].column, j)
        text = f"{run.name}  {fmt(value)}"
        if smooth and raw:
            text += f"  (raw {fmt(_at(run.buf, raw[0].column, j))})"
        if axis != "step":
            text += f"  @ step {int(run.buf.view('step')[j])}"
        out.rows.append((run.color, text))
    return out


def _steps_to_x(panel: HoverPanel, c: XColumns) -> Callable[[np.ndarray], np.ndarray]:
    """A compared run's steps to x on its own columns, on the axis the panel shows at the call."""
    return lambda steps: c.at_steps(panel.axis, steps)


def _scalar_rows(panel: HoverPanel, x: float) -> list[tuple[str, str]]:
    """The picked scalars of the run and of each compared run: each one's point nearest x (a
    framework logs them now and then, not every step), with its step."""
    sp, rows = panel.scalars, []
    sources: list[tuple[str, Any, Callable[[np.ndarray], np.ndarray], Optional[str]]] = [
        ("", sp.scalars, panel.steps_to_x, None)]
    for run, (other, buf) in sp.compared.items():  # placed by their own steps, as the plot draws them
        sources.append((run, other, _steps_to_x(panel, columns(buf)), sp.compared_colors.get(run)))
    for run, scalars, to_x, color in sources:
        for name in sp.picked:
            steps, values = scalars.arrays(name)
            if not len(steps):
                continue
            j = nearest_unsorted(to_x(steps), x)
            item = sp.curves.get(name) if not run else sp.compared_curves.get((run, name))
            c = color or (item.opts["pen"].color().name() if item is not None else panel.pal.foreground)
            rows.append((c, f"{run + ': ' if run else ''}{name}  {fmt(float(values[j]))}  (step {int(steps[j])})"))
    return rows


def _marks_at(panel: HoverPanel, step: int) -> list[tuple[str, str]]:
    """What the markers say at this step (a label left out where markers crowd is read here):
    a setting changed after it, or the step was non-finite."""
    model, pal = panel.model, panel.pal
    if model is None:
        return []
    rows = [(pal.marker, m.label) for m in model.markers if math.floor(m.step) == step]
    bad = model.metrics.nonfinite_steps
    k = bisect.bisect_left(bad, step)
    if k < len(bad) and bad[k] == step:
        rows.append((pal.nonfinite, "non-finite step"))
    return rows


def _own_rows(panel: HoverPanel, plot: str, buf: MetricsBuffer, i: int, pal: Palette) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if plot == "loss":
        smoothed = panel.parts.series[1].column
        rows.append((pal.ema, f"loss  {fmt(_at(buf, smoothed, i))}  (raw {fmt(_at(buf, 'loss', i))})"))
        step = int(buf.view("step")[i])
        epochs = panel.model.epochs if panel.model is not None else []
        vals = [(s, v) for _e, s, _t, v in epochs if v is not None and s <= step and math.isfinite(v)]
        if vals:
            rows.append((pal.val, f"validation  {fmt(vals[-1][1])}  (step {vals[-1][0]})"))
    elif plot == "norm":
        rows.append((pal.norm, f"norm  {fmt(_at(buf, 'grad_norm', i))}"))
        clip = _at(buf, "clip_line", i)
        if math.isfinite(clip):
            rows.append((pal.clip, f"clip  {fmt(clip)}"))
    elif plot == "lr":
        rows.append((pal.lr, f"lr  {fmt(_at(buf, 'lr', i))}"))
    elif plot == "tput":
        unit = "tokens/s" if buf.counts_tokens() else "samples/s"
        rows.append((pal.throughput, f"{fmt(_at(buf, 'throughput_ema', i))} {unit}  "
                                     f"(raw {fmt(_at(buf, 'throughput', i))})"))
    elif plot in ("mem", "stack"):
        from .mem_stack import LAYERS  # the kinds, in the stack's order
        gib = float(2 ** 30)
        if plot == "stack":
            stack = panel.parts.stack
            for (col, name), color in zip(LAYERS, pal.mem_kinds):
                if col in stack.kinds:
                    rows.append((color, f"{name}  {fmt(_at(buf, col, i) / stack.scale)} {stack.unit}"))
        for col, name, color in (("mem_used", "used", pal.mem_used), ("mem_total", "device total", pal.mem_total)):
            v = _at(buf, col, i)
            if math.isfinite(v):
                rows.append((color, f"{name}  {fmt(v / gib)} GiB"))
    return rows


def _readout_label(parent: QWidget) -> QLabel:
    label = QLabel(parent)
    label.setObjectName("hover_readout")
    label.setTextFormat(Qt.TextFormat.RichText)
    label.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
    label.hide()
    return label


class PlotHover(QObject):
    """The line and the readout (see the module doc), made once per panel; attach() puts the
    lines on the plots each time they are built (a theme switch builds them again, on a new
    canvas perhaps). The Scalars plot under the canvas (scalars.py, a view of its own) has its
    line and readout too."""

    def __init__(self, panel: HoverPanel, parent: QObject) -> None:
        super().__init__(parent)
        self.panel = panel
        self.canvas: Optional[pg.GraphicsLayoutWidget] = None
        self.label: Optional[QLabel] = None
        self._proxy: Optional[pg.SignalProxy] = None
        self.lines: dict[str, pg.InfiniteLine] = {}
        self.shown: Optional[Readout] = None
        self._where: Optional[tuple[str, float, QPointF]] = None  # (plot, x, scene position) under the mouse
        scalars = panel.scalars.plot
        self.scalars_label = _readout_label(scalars.viewport())
        self.scalars_line = pg.InfiniteLine(angle=90, movable=False)
        self.scalars_line.setZValue(90)
        self.scalars_line.hide()
        scalars.getPlotItem().addItem(self.scalars_line, ignoreBounds=True)
        self._scalars_proxy = pg.SignalProxy(scalars.scene().sigMouseMoved, rateLimit=RATE_HZ,
                                             slot=self._moved_scalars)
        scalars.viewport().installEventFilter(self)
        panel.on_updated.append(self._data_changed)

    def _bind(self, canvas: pg.GraphicsLayoutWidget) -> None:
        """Listen to this canvas' mouse: its scene's moves, its viewport's leave."""
        if self._proxy is not None:
            self._proxy.disconnect()
        if self.canvas is not None:
            self.canvas.viewport().removeEventFilter(self)
        self.canvas = canvas
        self.label = _readout_label(canvas.viewport())
        self._proxy = pg.SignalProxy(canvas.scene().sigMouseMoved, rateLimit=RATE_HZ, slot=self._moved)
        canvas.viewport().installEventFilter(self)

    def attach(self) -> None:
        """Lines on the panel's plots as built now, in its palette."""
        if self.canvas is not self.panel.canvas:
            self._bind(self.panel.canvas)
        assert self.label is not None
        pal = self.panel.pal
        self.lines.clear()
        pen = pg.mkPen(pg.mkColor(pal.foreground), width=1, style=Qt.PenStyle.DashLine)
        for name in PLOT_NAMES:
            line = pg.InfiniteLine(angle=90, movable=False, pen=pen)
            line.setZValue(90)
            line.hide()
            getattr(self.panel.parts.plot_set, name).addItem(line, ignoreBounds=True)
            self.lines[name] = line
        self.scalars_line.setPen(pen)
        bg = pg.mkColor(pal.background)
        for label in (self.label, self.scalars_label):
            label.setStyleSheet(
                f"QLabel#hover_readout {{ background: rgba({bg.red()},{bg.green()},{bg.blue()},230); "
                f"color: {pal.foreground}; border: 1px solid {pal.note}; border-radius: 3px; padding: 3px 6px; }}")
        self.hide()

    # -- events -----------------------------------------------------------------------------
    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802 - Qt name
        if ev.type() == QEvent.Type.Leave:
            self.hide()
        return False

    def _moved(self, args: tuple) -> None:
        self.at_scene(args[0])

    def _moved_scalars(self, args: tuple) -> None:
        self.at_scene(args[0], scalars=True)

    def _data_changed(self) -> None:
        if self._where is not None:
            plot, x, pos = self._where
            self._show(plot, x, pos)

    # -- showing ----------------------------------------------------------------------------
    def _plot_at(self, pos: QPointF, scalars: bool) -> Optional[str]:
        if scalars:
            vb = self.panel.scalars.plot.getPlotItem().getViewBox()
            return "scalars" if self.panel.scalars.isVisible() and vb.sceneBoundingRect().contains(pos) else None
        ps = self.panel.parts.plot_set
        for name in PLOT_NAMES:
            p = getattr(ps, name)
            if p.isVisible() and p.scene() is not None and p.getViewBox().sceneBoundingRect().contains(pos):
                return name
        return None

    def _view(self, plot: str) -> tuple[Optional[QLabel], Any, pg.ViewBox]:
        """The readout label, the view (a QGraphicsView) and the view box of a plot."""
        if plot == "scalars":
            w = self.panel.scalars.plot
            return self.scalars_label, w, w.getPlotItem().getViewBox()
        return self.label, self.canvas, getattr(self.panel.parts.plot_set, plot).getViewBox()

    def at_scene(self, pos: QPointF, scalars: bool = False) -> Optional[Readout]:
        """Show the readout for the mouse at scene position `pos` of the canvas (or of the Scalars
        plot); hidden outside the plots."""
        plot = self._plot_at(pos, scalars)
        if plot is None:
            self.hide()
            return None
        x = self._view(plot)[2].mapSceneToView(pos).x()
        return self._show(plot, x, pos)

    def _show(self, plot: str, x: float, pos: QPointF) -> Optional[Readout]:
        r = readout(self.panel, plot, x) if math.isfinite(x) else None
        if r is None:
            self.hide()
            return None
        self._where = (plot, x, pos)
        self.shown = r
        for line in [*self.lines.values(), self.scalars_line]:
            line.setValue(r.x)
            line.show()
        rows = "".join(f"<br><span style='color:{c}'>\u25cf</span>&nbsp;{html.escape(t)}" for c, t in r.rows)
        label, view, _vb = self._view(plot)
        other = self.scalars_label if plot != "scalars" else self.label
        if other is not None:
            other.hide()
        assert label is not None and view is not None
        label.setText(f"<b>{html.escape(r.head)}</b>{rows}")
        label.adjustSize()
        self._place(label, view.mapFromScene(pos))
        label.show()
        label.raise_()
        return r

    @staticmethod
    def _place(label: QLabel, at: QPoint) -> None:
        """By the mouse, on the side with room (right and below first), inside its view."""
        vp = label.parentWidget()
        assert vp is not None  # the label is made inside its view
        w, h = label.width(), label.height()
        x = at.x() + GAP_PX if at.x() + GAP_PX + w <= vp.width() else at.x() - GAP_PX - w
        y = at.y() + GAP_PX if at.y() + GAP_PX + h <= vp.height() else at.y() - GAP_PX - h
        label.move(max(0, x), max(0, y))

    def hide(self) -> None:
        self._where = None
        self.shown = None
        for label in (self.label, self.scalars_label):
            if label is not None:
                label.hide()
        for line in [*self.lines.values(), self.scalars_line]:
            line.hide()

    def text(self) -> str:
        """What the readout says now ('' when hidden)."""
        label = self.label if self._where is None or self._where[0] != "scalars" else self.scalars_label
        return self.shown.text() if self.shown is not None and label is not None and label.isVisible() else ""
