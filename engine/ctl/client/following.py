"""Following a run: its rows and events from a step on, as the engine commits them, until it
ends, here (engine/ctl/follow.py) or on a server through ssh. A `Following` is read on one
thread and closed from another (the window stops reading a run). Torch-free."""
from __future__ import annotations

import threading
from typing import Callable, Iterator, Optional

from .. import follow as follow_here
from ..protocol import CtlError
from .records import AnyRecord, typed
from .targets import Remote, Target, run_target, words

# The longest silence of a remote follow: its server writes a heartbeat every second
# (engine/ctl/follow.py HEARTBEAT_S), so this is a frozen server or connection, never a quiet run.
SILENCE_S = 20.0


class Following:
    """The records of one follow: `Info`, `Rows`, `Event`, `Rewind`, `CaughtUp`, `Heartbeat`,
    then `End`. Resumable exactly: after a broken stream, follow again from the step after the
    last row received and after the last event id received."""

    def __init__(self, target: Target, from_step: int = 0, after_event: Optional[int] = None, *,
                 remote_python: Optional[str] = None, watch_parent: bool = False,
                 idle: Optional[Callable[[], None]] = None, silence_s: float = SILENCE_S) -> None:
        """`silence_s`: a remote follow that hears nothing (not even the heartbeat the server
        writes every second) for this long ends with CtlError, exit 5: follow again from the cursor."""
        self.remote, self.path = run_target(target)
        self.from_step, self.after_event = from_step, after_event
        self.watch_parent, self.idle = watch_parent, idle
        self._closed = threading.Event()
        self._command: Optional[Remote] = None
        if self.remote is not None:
            options = ["--from-step", str(from_step)]
            options += ["--after-event", str(after_event)] if after_event is not None else []
            self._command = Remote(self.remote, words("follow", *options, "--", self.path), remote_python, silence_s)

    def records(self) -> Iterator[AnyRecord]:
        """The records until the run ends, or until `close`. CtlError for whatever broke it
        (exit 5 for a connection that broke: follow again from the cursor)."""
        if self._command is not None:
            yield from self._command.records()
            return
        if self.after_event is not None and self.from_step == 0:
            raise CtlError("--after-event goes with --from-step (the step after the last row received)")
        for record in follow_here.follow(self.path, self.from_step, self.after_event, watch_parent=self.watch_parent,
                                         idle=self.idle):
            if self._closed.is_set():  # a heartbeat comes at least once a second
                return
            yield typed(record)

    @property
    def ssh_pid(self) -> Optional[int]:
        """The ssh client's process id while a remote follow runs (None here, or before it started)."""
        return self._command.pid if self._command is not None else None

    def close(self) -> None:
        """End the follow (from any thread): the ssh command ends, a follow here within a second."""
        self._closed.set()
        if self._command is not None:
            self._command.close()


__all__ = ["Following", "SILENCE_S"]
