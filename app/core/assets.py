"""Files under resources/: stylesheets, icons, the app icon. Missing files degrade to nothing."""
from __future__ import annotations

import os
from functools import lru_cache

from PySide6.QtGui import QIcon


def _find_resources() -> str:
    """$HEADROOM_RESOURCES, else resources/ beside app/ (a checkout, an editable install or the
    frozen bundle), else share/headroom/resources under the installation prefix (a wheel)."""
    import sys
    app_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this file is app/core/assets.py
    candidates = [os.environ.get("HEADROOM_RESOURCES", ""),
                  os.path.join(os.path.dirname(app_dir), "resources"),
                  os.path.join(sys.prefix, "share", "headroom", "resources")]
    for c in candidates:
        if c and os.path.isdir(c):
            return c
    return candidates[1]


RESOURCES = _find_resources()


def path(*parts: str) -> str:
    return os.path.join(RESOURCES, *parts)


@lru_cache(maxsize=None)
def icon(name: str) -> QIcon:
    p = path("icons", f"{name}.svg")
    return QIcon(p) if os.path.isfile(p) else QIcon()


def app_icon() -> QIcon:
    p = path("headroom.svg")
    return QIcon(p) if os.path.isfile(p) else QIcon()


def stylesheet(theme: str) -> str:
    """The theme's QSS, with @RES@ replaced by the resources folder (QSS url()s need a full path)."""
    p = path(f"{theme}.qss")
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return ""
    return text.replace("@RES@", RESOURCES.replace(os.sep, "/"))
