"""The plots: loss, gradient norm, lr, GPU memory and memory by kind, drawn from preallocated
buffers on a timer; markers, overlays, ranges and the x-axis items. `panel.PlotPanel` is the interface."""
