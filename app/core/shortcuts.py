"""Keyboard shortcuts, in one place (the menus and the tests read them from here)."""
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
}
