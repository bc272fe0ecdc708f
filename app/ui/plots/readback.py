"""What the plot panel's curves show now, by name: for the tests, the benchmarks and export."""
from __future__ import annotations

from typing import Any

import numpy as np

from .mem_stack import LAYERS


def curve_data(panel: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a PlotPanel's curve: loss, loss_ema, val, grad_norm, clip, clipped, lr,
    lr_planned, lr_peak_changes, throughput, mem_used, mem_total, discarded_loss,
    discarded_grad_norm, stack_mem_params ... stack_mem_activations (each layer's top, in the
    stack's unit)."""
    p = panel
    item = {"loss": p.loss_raw, "loss_ema": p.loss_ema, "val": p.val_item, "grad_norm": p.norm_item,
            "clip": p.clip_item, "clipped": p.clipped_item, "lr": p.lr_item,
            "lr_planned": p.planned.item, "lr_peak_changes": p.planned.peaks,
            "throughput": p.tput_item, "mem_used": p.mem_used, "mem_total": p.mem_total,
            "discarded_loss": p.rollbacks.loss, "discarded_grad_norm": p.rollbacks.norm,
            **{f"stack_{c}": item for (c, _n), item in zip(LAYERS, p.stack.layers)}}[name]
    x, y = (item.xData, item.yData) if name.startswith("lr_p") else item.getData()  # the plan: all of it
    x, y = np.asarray(x if x is not None else []), np.asarray(y if y is not None else [])
    if name == "clipped":  # drawn as zero-length segments: each point twice
        x, y = x[::2], y[::2]
    return x, y
