"""The user's preferences, kept in QSettings: window layout, the form's last values, theme,
recent task files and runs. (Not the live knobs of a run: those are the engine's settings.)

HEADROOM_SETTINGS=/path/file.ini puts them in one INI file (tests and benchmarks use
it so they never touch the user's settings).
"""
from __future__ import annotations

import json
import os
from typing import Any

from PySide6.QtCore import QSettings

ORG, APP = "Headroom", "Headroom"
MAX_RECENT = 10


def open_qsettings() -> QSettings:
    path = os.environ.get("HEADROOM_SETTINGS")
    if path:
        return QSettings(path, QSettings.Format.IniFormat)
    return QSettings(ORG, APP)


class Preferences:
    def __init__(self) -> None:
        self.q = open_qsettings()

    def get_json(self, key: str, default: Any) -> Any:
        raw = self.q.value(key)
        if raw is None:
            return default
        try:
            return json.loads(str(raw))
        except ValueError:
            return default

    def set_json(self, key: str, value: Any) -> None:
        self.q.setValue(key, json.dumps(value))

    def get_bytes(self, key: str) -> Any:
        return self.q.value(key)

    def set_bytes(self, key: str, value: Any) -> None:
        self.q.setValue(key, value)

    def theme(self) -> str:
        return str(self.q.value("theme", "") or "")

    def set_theme(self, theme: str) -> None:
        self.q.setValue("theme", theme)

    def recent(self, key: str) -> list[str]:
        v = self.get_json(key, [])
        return [str(x) for x in v] if isinstance(v, list) else []

    def add_recent(self, key: str, item: str) -> None:
        items = [x for x in self.recent(key) if x != item]
        self.set_json(key, [item] + items[: MAX_RECENT - 1])

    def sync(self) -> None:
        self.q.sync()
