"""The log file: full tracebacks go here, the user sees one line in a dialog."""
from __future__ import annotations

import logging
import logging.handlers
import os
from typing import Optional

from engine.declarations.paths import data_dir

_handler: Optional[logging.Handler] = None
_path: Optional[str] = None


def log_path() -> str:
    return os.environ.get("HEADROOM_LOG") or os.path.join(data_dir(), "headroom.log")


def setup() -> str:
    """Log to the file (rotating, 1 MiB x 3). Returns its path. Idempotent; follows HEADROOM_LOG."""
    global _handler, _path
    path = log_path()
    if _handler is not None and path == _path:
        return path
    logger = logging.getLogger("headroom")
    logger.setLevel(logging.INFO)
    if _handler is not None:
        logger.removeHandler(_handler)
        _handler.close()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        _handler = logging.handlers.RotatingFileHandler(path, maxBytes=1 << 20, backupCount=3, encoding="utf-8")
    except OSError:
        _handler = logging.StreamHandler()  # read-only home: stderr rather than nothing
    _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(_handler)
    logger.propagate = False
    _path = path
    return path
