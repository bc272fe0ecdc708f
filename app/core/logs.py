"""The log file: full tracebacks go here, the user sees one line in a dialog or an alert."""
from __future__ import annotations

import inspect
import logging
import logging.handlers
import os
import sys
import weakref
from types import TracebackType
from typing import Any, Callable, Optional

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


# -- exceptions nobody caught ------------------------------------------------------------------
# PySide6 hands an exception raised in a slot (a menu action, a timer, a signal's lambda) to
# sys.excepthook and goes on: by default a traceback on stderr, which a user of the window never
# sees. One hook, installed once at the root, logs it here and tells the windows open (an alert).

Reporter = Callable[[str], None]
_reporters: list["weakref.ref[Any]"] = []


def _hook(etype: type[BaseException], value: BaseException, tb: Optional[TracebackType],
          previous: Callable[..., Any]) -> None:
    if not issubclass(etype, KeyboardInterrupt):
        logging.getLogger("headroom.errors").error("uncaught exception", exc_info=(etype, value, tb))
        line = f"{etype.__name__}: {value}".strip().splitlines()[0][:300] if str(value) else etype.__name__
        for ref in list(_reporters):
            report = ref()
            if report is None:
                _reporters.remove(ref)
                continue
            try:
                report(line)
            except Exception:  # noqa: BLE001 - a window half closed: the log has it, never a loop
                logging.getLogger("headroom.errors").exception("reporting an uncaught exception failed")
    previous(etype, value, tb)  # what was there before (stderr; a test runner's own hook)


def install_excepthook() -> None:
    """sys.excepthook logs every uncaught exception here, tells the reporters (report_uncaught),
    then calls the hook it replaced. Once: a second call finds it in place."""
    if getattr(sys.excepthook, "headroom_hook", False):
        return
    previous = sys.excepthook

    def hook(etype: type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
        _hook(etype, value, tb, previous)

    hook.headroom_hook = True  # type: ignore[attr-defined]  # a marker on the function object
    sys.excepthook = hook


def report_uncaught(report: Reporter) -> None:
    """`report` (a bound method: held weakly, dropped with its object) is told one line for each
    uncaught exception; the hook is installed if it is not yet."""
    install_excepthook()
    _reporters.append(weakref.WeakMethod(report) if inspect.ismethod(report) else weakref.ref(report))


def stop_reporting(report: Reporter) -> None:
    for ref in list(_reporters):
        if ref() in (None, report):
            _reporters.remove(ref)
