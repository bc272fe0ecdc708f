"""Headroom's desktop app: live plots of a training run and point-and-click tuning between epochs.

The app imports the engine, never the reverse, and holds no training logic: it starts
`engine.Trainer` in a worker thread (app/worker.py), drains the engine's events on a
~30 Hz timer into growable numpy arrays, and sends commands back. torch loads in the
worker thread when a run starts, so the window shows before torch is imported.
"""

from . import compat as _compat  # noqa: E402,F401 - must run before any plotting (see app/compat.py)
