"""Headroom's desktop app: live plots of a training run and point-and-click tuning between epochs.

The app imports the engine, never the reverse, and holds no training logic: it starts
`engine.Trainer` in a worker thread (app/runner/worker.py), drains the engine's events on a
~30 Hz timer into growable numpy arrays, and sends commands back. torch loads in the
worker thread when a run starts, so the window shows before torch is imported.

Layers, each importing only the ones below it:
    app.main         the entry point (argument parsing, QApplication)
    app.main_window  the main window: layout and wiring
    app.ui           widgets and views (controls, plots, alerts, history, status bar, actions)
    app.runner       the Qt side of running: the engine thread, torchrun launches, the typed
                     signals and the session driver that joins them to the session
    app.session      the run session (Qt-free state machine), its sources and what a start,
                     a launch or a start on a server sends
    app.model        Qt-free data: the run model, pending changes, metrics buffers
    app.core         resources, log, preferences, run folders, shortcuts
"""

from .core import compat as _compat  # noqa: E402,F401 - must run before any plotting (see app/core/compat.py)
