"""Where a run's data comes from: the in-process engine's EventBuffer, or a run folder's run.db.

Both give the session the same thing on each timer tick: new items in order (steps and
notes), and both take commands (an in-process queue, or run.db's `commands` table) and a
stop (a flag the engine thread checks every micro-batch, or a Stop row). Qt-free.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional, Protocol

from engine.commands import Command, Stop
from engine.events import EventBuffer, StepMetrics
from engine.store import RunReader, StoreError, send_command

from ..core.runs import pid_alive
from ..model.metrics import MetricsBuffer
from ..model.notes import Note


class Source(Protocol):
    live: bool  # the engine thread of this window (True) or a run folder (False)
    run_dir: Optional[str]
    step_get: Callable[[Any, str], Any]  # how to read a field of a step item

    def poll(self, force: bool = False) -> list[Any]: ...

    def send(self, command: Command) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


class LiveSource:
    """The run this window started: events drained from the worker's EventBuffer."""

    live = True
    step_get: Callable[[Any, str], Any] = staticmethod(getattr)

    def __init__(self, buffer: EventBuffer, send: Callable[[Command], None],
                 stop: Optional[Callable[[], None]] = None) -> None:
        self.buffer = buffer
        self._send = send
        self._stop = stop
        self.run_dir: Optional[str] = None  # known once the engine has prepared the run

    def poll(self, force: bool = False) -> list[Any]:
        items = self.buffer.drain()
        if not items:
            return items
        now = time.time()
        return [e if isinstance(e, StepMetrics) else Note.from_event(e, now) for e in items]

    def send(self, command: Command) -> None:
        self._send(command)

    def stop(self) -> None:
        """The worker's stop flag: the trainer stops at the next micro-batch, even inside an
        epoch or before its first step (a Stop command would wait for the next step)."""
        if self._stop is not None:
            self._stop()
        else:
            self._send(Stop())

    def close(self) -> None:
        pass


class FolderSource:
    """A run folder, finished or still training in another process: polls run.db."""

    live = False
    step_get: Callable[[Any, str], Any] = staticmethod(dict.get)
    POLL_S = 0.5

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.reader = RunReader(run_dir)  # raises StoreError (a ConfigError) if not a run folder
        self.info = self.reader.info()
        self._last_step = -1
        self._last_event = 0
        self._next_poll = 0.0
        self.running = self._is_running()

    def _is_running(self) -> bool:
        return self.info.get("status") == "running" and pid_alive(self.info.get("pid"))

    def interrupted(self) -> bool:
        """run.db says running, but no process is writing it (killed, or crashed)."""
        return self.info.get("status") == "running" and not pid_alive(self.info.get("pid"))

    def poll(self, force: bool = False) -> list[Any]:
        """New rows since the last poll, at most every POLL_S unless forced."""
        now = time.monotonic()
        if not force and now < self._next_poll:
            return []
        self._next_poll = now + self.POLL_S
        try:
            rows = self.reader.metrics(after_step=self._last_step)
            events = self.reader.events(after_id=self._last_event)
            if events or rows:
                self.info = self.reader.info()
        except StoreError:
            return []
        self.running = self._is_running()
        if rows:
            self._last_step = int(rows[-1]["step"])
        if events:
            self._last_event = int(events[-1]["id"])
        notes = [Note.from_row(e) for e in events]
        # Merge by step: a note at step s comes after the steps up to s.
        out: list[Any] = []
        i = 0
        for note in notes:
            while i < len(rows) and rows[i]["step"] <= note.step:
                out.append(rows[i])
                i += 1
            out.append(note)
        out.extend(rows[i:])
        return out

    def problems(self) -> list[Note]:
        """What this folder lacks or could not be read, as alert rows (shown once, on opening)."""
        notes = [Note("run_damaged", 0, 0, p) for p in self.reader.problems]
        if not os.path.exists(os.path.join(self.run_dir, "checkpoints", "last.pt")) and not self.running:
            notes.append(Note("run_damaged", self._last_step if self._last_step > 0 else 0, 0,
                              "no checkpoint (checkpoints/last.pt is missing): the plots are all there is; "
                              "this run cannot be resumed"))
        return notes

    def send(self, command: Command) -> None:
        send_command(self.run_dir, command)

    def stop(self) -> None:
        send_command(self.run_dir, Stop())

    def close(self) -> None:
        try:
            self.reader.close()
        except Exception:
            pass


def read_metrics(run_dir: str) -> MetricsBuffer:
    """Every step a run folder holds, as a metrics buffer (an overlay of another run). Raises
    StoreError."""
    reader = RunReader(run_dir)
    try:
        rows = reader.metrics()
    finally:
        reader.close()
    buf = MetricsBuffer(max(16, len(rows)))
    buf.extend_records(rows, dict.get)
    return buf
