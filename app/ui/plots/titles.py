"""The plots' titles, each with its legend inline; what a legend lists follows what is drawn
(setting markers, non-finite steps, rollbacks, continued runs, discarded steps, the planned lr, the runs compared, named
on every plot they are drawn on)."""
from __future__ import annotations

import os
from typing import Optional

from app.model.runmodel import RunModel
from app.ui.theme import Palette

from .overlays import Overlays
from .parts import PlotSet, legend
from .planned_lr import PlannedLr
from .rollbacks import RollbackMarks


def set_titles(plots: PlotSet, pal: Palette, model: Optional[RunModel], planned: PlannedLr, overlays: Overlays,
               rollbacks: RollbackMarks) -> None:
    fg = pal.foreground
    extra = []
    if model is not None and model.markers:
        extra.append((pal.marker, "\u2506", "setting applied"))
    if model is not None and model.metrics.nonfinite_steps:
        extra.append((pal.nonfinite, "\u2506", "non-finite step"))
    rolled, discarded, continued = rollbacks.legend(model) if model is not None else (False, False, False)
    if rolled:
        extra.append((pal.rollback, "\u21b6", "rollback"))
    if continued:
        extra.append((pal.foreground, "\u2506", "continued"))
    if discarded:
        extra.append((pal.discarded, "\u2588", "discarded steps"))
    name = ""
    if model is not None and overlays.entries and model.info.get("run_dir"):  # which curves are this run's
        name = " \u00b7 " + os.path.basename(os.path.normpath(str(model.info["run_dir"])))
    plots.loss.setTitle(legend("Loss" + name, [(pal.loss, "\u2501", "per step"), (pal.ema, "\u2501", "smoothed"),
                                               (pal.val, "\u25cf", "validation (per epoch)")]
                               + extra + overlays.legend("loss"), fg))
    plots.norm.setTitle(legend("Gradient norm, before clipping",
                               [(pal.norm, "\u2501", "norm"), (pal.clip, "\u2505", "clip"),
                                (pal.clipped, "\u25cf", "clipped")] + overlays.legend("norm"), fg))
    lr_extra = [(pal.lr, "\u2501", "per step"), (pal.planned, "\u2505", "planned")] if planned.curve is not None else []
    if planned.changes:
        lr_extra.append((pal.marker, "\u25b2", "peak changed"))
    plots.lr.setTitle(legend("Learning rate", lr_extra + overlays.legend("lr"), fg))
    plots.tput.setTitle(legend("Throughput", [(pal.throughput_raw, "\u2501", "per step"),
                                              (pal.throughput, "\u2501", "smoothed")] + overlays.legend("tput"), fg))
