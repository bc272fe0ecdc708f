"""Qt-free data about a run: the run model (metrics, epochs, markers, notes), the pending
changes to its live settings, and the growable numpy buffers under the plots. Imports no
PySide6 and nothing from the layers above."""
