"""What the window keeps between sessions in the user's preferences: its geometry and dock
layout, the form's last values and the theme (the plots' view choices: view_prefs.py)."""
from __future__ import annotations

from typing import Any, Optional

from PySide6.QtCore import QByteArray
from PySide6.QtWidgets import QMainWindow

from app.core.preferences import Preferences
from app.ui.controls.panel import ControlsPanel


def restore(window: QMainWindow, p: Preferences, controls: ControlsPanel,
            base_config: dict[str, Any]) -> tuple[bool, Optional[Any]]:
    """Restores the geometry and the form's last values (unless the command line gave run
    flags). Returns (geometry restored, the saved dock state or None): the window's
    DockLayout restores that state and checks it leaves the plots room (app/ui/shell/layout.py)."""
    restored = False
    geo = p.get_bytes("geometry")
    if isinstance(geo, (QByteArray, bytes)):
        restored = bool(window.restoreGeometry(geo))
    st = p.get_bytes("window_state")
    state = st if isinstance(st, (QByteArray, bytes)) else None
    last = p.get_json("last_config", {})
    if isinstance(last, dict) and not base_config:
        controls.set_values(last)
    return restored, state


def save(window: QMainWindow, p: Preferences, controls: ControlsPanel, theme: str) -> None:
    p.set_bytes("geometry", window.saveGeometry())
    p.set_bytes("window_state", window.saveState())
    values, _err = controls.values()
    if values:
        p.set_json("last_config", values)
    p.set_theme(theme)
    p.sync()
