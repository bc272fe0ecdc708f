"""How the app compares and shows the values of run settings. The settings themselves (names,
labels, order, commands) are the engine's one declaration, used as it is:
engine/declarations/settings.py (SETTINGS, LIVE_SETTINGS) and engine/declarations/commands.py
(command_for, setting_of). Qt-free, torch-free.
"""
from __future__ import annotations

import math
from typing import Any

from engine.declarations.settings import BY_NAME


def words(name: str) -> str:
    """How a sentence names setting `name` ("micro-batch", "lr scaling"); any other config key
    with its underscores as spaces."""
    s = BY_NAME.get(name)
    return s.words if s is not None else name.replace("_", " ")


def same(a: Any, b: Any) -> bool:
    """Equal values of a setting: floats compared with a relative tolerance (the form rounds)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def fmt_value(v: Any) -> str:
    if isinstance(v, bool):  # a switch (activation checkpointing), as its flag says it
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
