"""Keyboard shortcuts, in one place: the actions take their keys from here (app/ui/actions.py),
and Help > Keyboard shortcuts lists the actions' keys (app/ui/shell/shortcuts_dialog.py)."""
from __future__ import annotations

SHORTCUTS = {
    "start": "F5",
    "pause": "F6",
    "resume": "F7",
    "stop": "Shift+F5",
    "continue": "Ctrl+F5",
    "apply": "Ctrl+Return",
    "open_run": "Ctrl+O",
    "open_task": "Ctrl+Shift+O",
    "export_csv": "Ctrl+E",
    "export_png": "Ctrl+Shift+E",
    "log_scale": "Ctrl+L",
    "theme": "Ctrl+T",
    "quit": "Ctrl+Q",
    "shortcuts": "F1",
}
