"""A run on another machine, `[user@]host:path`, followed through headroom-ctl over ssh
(its client API, engine/ctl/client): the same view as a run folder here, fed by `follow`'s records
instead of run.db.

A thread reads the follow's records (rows, events, the run's info) into a queue the session
drains on its timer, as it drains a folder's reads. When the connection drops (the laptop
asleep, Wi-Fi gone) the thread says "reconnecting" and follows again from where the stream
broke (the step after the last row, the last event id): no row is lost or shown twice, and the
training never notices. Commands go through `headroom-ctl set/pause/unpause/stop` over ssh, off
the GUI thread; the engine's answers come back through the follow as they do for any run.
Qt-free.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Optional

import numpy as np

from app.model.metrics import COLUMN_DTYPES, STEP_COLUMNS, StepColumns
from app.model.notes import Note
from app.model.scalars import ScalarRows
from app.model.stored import whole
from engine.ctl import client
from engine.ctl.client import CtlError, ProtocolError, is_remote
from engine.declarations.commands import Command, Stop
from engine.store import StoreError

from .sources import FolderSource

log = logging.getLogger(__name__)
__all__ = ["RemoteSource", "is_remote"]

OPEN_TIMEOUT_S = 120.0  # the first read of a long run over a slow link
RECONNECT_S = (1.0, 2.0, 5.0, 10.0)  # waits between tries; the last repeats


class RemoteSource(FolderSource):
    """A FolderSource whose folder is on another machine (the session treats both alike)."""

    def __init__(self, target: str, remote_python: str = "", timeout: float = OPEN_TIMEOUT_S) -> None:
        try:
            remote = client.parse_target(target)
        except CtlError as e:
            raise StoreError(str(e)) from None
        if remote is None or not remote.path:
            raise StoreError(f"{target}: not [user@]host:path")
        self.remote = remote
        self.run_dir = target
        self.remote_python = remote_python or client.default_python()
        self.lazy = True
        self.reader = None  # type: ignore[assignment]  # no local run.db: discarded rows are not shown for a remote run
        self.info: dict[str, Any] = {}
        self.writer: Optional[dict[str, Any]] = None
        self.running = False
        self.connection = "connecting"  # connected, reconnecting, ended
        self._items: "deque[Any]" = deque()
        self._cursor: tuple[int, Optional[int]] = (0, None)  # the next step, the last event id
        self._ready = threading.Event()  # caught up (or ended, or failed)
        self._closing = threading.Event()
        self._error: Optional[BaseException] = None
        self._following: Optional[client.Following] = None
        self._thread = threading.Thread(target=self._follow, name="remote-follow", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.close()
            raise StoreError(f"{target}: no answer within {timeout:g} s")
        if self._error is not None:
            self.close()
            raise StoreError(str(self._error))

    # -- the follow thread -------------------------------------------------------------------------
    def _follow(self) -> None:
        tries = 0
        while not self._closing.is_set():
            step, event = self._cursor
            self._following = client.Following(self.remote, step, event, remote_python=self.remote_python)
            try:
                for record in self._following.records():
                    tries = 0
                    self._take(record)
                if not self._closing.is_set() and self.connection != "ended":  # cut without an error
                    raise CtlError(f"the follow of {self.run_dir} ended early", client.EXIT_REMOTE)
                return
            except (ProtocolError, CtlError) as e:
                if self._closing.is_set():
                    return
                if isinstance(e, ProtocolError) or e.code != client.EXIT_REMOTE or not self._ready.is_set():
                    self._error = e  # nothing to retry: a wrong path, an old engine, no way in at all
                    self._ready.set()
                    return
                self.connection = "reconnecting"
                log.warning("%s: %s; reconnecting", self.run_dir, e)
                self._closing.wait(RECONNECT_S[min(tries, len(RECONNECT_S) - 1)])
                tries += 1
            except Exception as e:  # a bug: said once, as an error at open or in the log
                log.exception("following %s failed", self.run_dir)
                self._error = e
                self._ready.set()
                return

    def _take(self, record: client.AnyRecord) -> None:
        if isinstance(record, client.Rows):
            steps = step_columns(record)
            if steps is not None:
                self._items.append(steps)
                self._cursor = (int(steps.steps()[-1]) + 1, self._cursor[1])
        elif isinstance(record, client.Event):
            self._items.append(Note.from_row(record.event))
            self._cursor = (self._cursor[0], record.id or 0)
        elif isinstance(record, client.Scalars):  # what a framework logged there: the Scalars plot's
            self._items.append(ScalarRows(record.dicts()))
        elif isinstance(record, client.Rewind):
            self._cursor = (record.to_step + 1, self._cursor[1])
        elif isinstance(record, client.Info):
            self.info = dict(record.info)
            self.writer = _named(record.writer, self.remote.host)
            self.running = record.live
        elif isinstance(record, client.CaughtUp):
            self.connection = "connected"
            self._ready.set()
        elif isinstance(record, client.Heartbeat):
            self.connection = "connected"
        elif isinstance(record, client.End):
            self.connection = "ended"
            self.running = False
            self.writer = None
            self._ready.set()

    # -- what the session asks ------------------------------------------------------------------
    def poll(self, force: bool = False) -> list[Any]:
        """What the follow brought since the last poll, in order."""
        out = []
        while self._items:
            out.append(self._items.popleft())
        return out

    def problems(self) -> list[Note]:
        return []  # the server's folder is not ours to inspect; the follow said what it could

    def send(self, command: Command) -> None:
        """The command through headroom-ctl on the server, off the GUI thread; a failure comes
        back as a refusal in the alerts."""
        try:
            request = client.request_for(command)
        except CtlError as e:
            raise StoreError(str(e)) from None
        threading.Thread(target=self._send, args=(command, request), name="remote-send", daemon=True).start()

    def stop(self) -> None:
        self.send(Stop())

    def _send(self, command: Command, request: client.SteerRequest) -> None:
        try:
            for _ in client.steer(self.remote, request, remote_python=self.remote_python):
                pass
        except CtlError as e:
            log.warning("%s: %s: %s", self.run_dir, command.kind, e)
            self._items.append(Note("command_refused", max(0, self._cursor[0] - 1), whole(self.info.get("epoch")),
                                    f"{command.kind} refused: {e}", {"command": command.kind, "reason": str(e)},
                                    time.time()))

    def close(self) -> None:
        self._closing.set()
        following = self._following
        if following is not None:
            following.close()


def _named(writer: Any, host: str) -> Optional[dict[str, Any]]:
    """The writer as the lock file says, its host named as the user reaches it if it has none."""
    if not isinstance(writer, dict):
        return None
    return dict(writer, host=writer.get("host") or host)


def step_columns(record: client.Rows) -> Optional[StepColumns]:
    """A `rows` record as the model's column arrays (what a run.db read gives it), without a
    dict per row: a long run opens in the time a local one takes plus the transfer. A column
    the server does not send (an older engine) is NaN; None is NaN too."""
    names = list(record.columns)
    rows = record.rows
    if not rows or "step" not in names:
        return None
    values = list(zip(*rows))
    columns: dict[str, np.ndarray] = {}
    for c in STEP_COLUMNS:
        if c not in names:
            columns[c] = np.full(len(rows), np.nan, dtype=COLUMN_DTYPES.get(c, np.float64))
            continue
        col = values[names.index(c)]
        try:
            a = np.array(col, dtype=np.float64)  # None -> NaN
        except (TypeError, ValueError, OverflowError):  # text, or an int past a float (damaged or hostile): NaN
            a = np.array([_number(v) for v in col], dtype=np.float64)
        columns[c] = a.astype(COLUMN_DTYPES.get(c, np.float64))
    return StepColumns(columns)


def _number(v: Any) -> float:
    try:
        return float(v) if v is not None else float("nan")
    except (TypeError, ValueError, OverflowError):
        return float("nan")
