"""A blocking call (ssh to a server, mostly) run off the GUI thread, its result handed back on
the GUI thread: the window's timer-driven way, no signal crossing threads."""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from PySide6.QtCore import QObject, QTimer

log = logging.getLogger("headroom.background")
POLL_MS = 100


class Background(QObject):
    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self._jobs: list[tuple[threading.Thread, list[Any], Callable[[Any], None]]] = []
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self._check)

    def run(self, fn: Callable[[], Any], done: Callable[[Any], None], name: str = "background") -> None:
        """fn() in a thread; done(its result, or the exception it raised) on the GUI thread."""
        box: list[Any] = []

        def work() -> None:
            try:
                box.append(fn())
            except Exception as e:  # handed to done(), which says it; the traceback goes to the log
                log.debug("%s failed", name, exc_info=True)
                box.append(e)
        thread = threading.Thread(target=work, name=name, daemon=True)
        self._jobs.append((thread, box, done))
        thread.start()
        self._timer.start()

    def busy(self) -> bool:
        return bool(self._jobs)

    def _check(self) -> None:
        for job in list(self._jobs):
            thread, box, done = job
            if thread.is_alive() or not box:
                continue
            self._jobs.remove(job)
            done(box[0])
        if not self._jobs:
            self._timer.stop()
