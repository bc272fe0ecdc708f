"""What the plot panel's curves show now, by name: for the tests, the benchmarks and export."""
from __future__ import annotations

import numpy as np

from .build import CanvasParts
from .mem_stack import LAYERS


def curve_data(parts: CanvasParts, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a curve on the plot panel's canvas (PlotPanel.parts): loss, loss_ema, val,
    grad_norm, clip, clipped, lr, lr_planned, lr_peak_changes, throughput, mem_used, mem_total,
    discarded_loss, discarded_grad_norm, stack_mem_params ... stack_mem_activations (each
    layer's top, in the stack's unit)."""
    cv, p = parts.curves, parts
    item = {"loss": cv.loss_raw, "loss_ema": cv.loss_ema, "val": cv.val, "grad_norm": cv.grad_norm,
            "clip": cv.clip, "clipped": cv.clipped, "lr": cv.lr,
            "lr_planned": p.planned.item, "lr_peak_changes": p.planned.peaks,
            "throughput": cv.tput, "mem_used": p.memory.used, "mem_total": p.memory.total,
            "discarded_loss": p.rollbacks.loss, "discarded_grad_norm": p.rollbacks.norm,
            **{f"stack_{c}": item for (c, _n), item in zip(LAYERS, p.stack.layers)}}[name]
    x, y = (item.xData, item.yData) if name.startswith("lr_p") else item.getData()  # the planned lr: all of it
    x, y = np.asarray(x if x is not None else []), np.asarray(y if y is not None else [])
    if name == "clipped":  # drawn as zero-length segments: each point twice
        x, y = x[::2], y[::2]
    return x, y
