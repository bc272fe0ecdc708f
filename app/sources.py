"""Where a run's data comes from: the in-process engine's EventBuffer, or a run folder's run.db.

Both give the window the same thing on each timer tick: new items in order (steps and
notes), and both take commands (an in-process queue, or run.db's `commands` table).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

from engine.commands import Command
from engine.events import EventBuffer, StepMetrics
from engine.store import RunReader, StoreError, send_command

from .runmodel import Note


class LiveSource:
    """The run this window started: events drained from the worker's EventBuffer."""

    live = True
    step_get: Callable[[Any, str], Any] = staticmethod(getattr)

    def __init__(self, buffer: EventBuffer, send: Callable[[Command], None]) -> None:
        self.buffer = buffer
        self._send = send
        self.run_dir: Optional[str] = None

    def poll(self) -> list[Any]:
        items = self.buffer.drain()
        if not items:
            return items
        now = time.time()
        return [e if isinstance(e, StepMetrics) else Note.from_event(e, now) for e in items]

    def send(self, command: Command) -> None:
        self._send(command)

    def close(self) -> None:
        pass


def pid_alive(pid: Any) -> bool:
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists, not ours
    return True


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

    def close(self) -> None:
        try:
            self.reader.close()
        except Exception:
            pass
