"""The session's news as typed Qt signals: the thin adapter between the Qt-free session and
the views. Each view connects to what it shows; nothing downstream looks at event kinds.

`publish` fires at most once per signal per update (one update per ~30 Hz tick), never
once per training step.
"""
from __future__ import annotations

from typing import Callable, Optional

from PySide6.QtCore import QObject, Signal

from app.model.notes import Note
from app.model.stored import whole
from app.session.session import RunSession, Update


class SessionSignals(QObject):
    model_replaced = Signal(object)  # RunModel: a new run or folder; views start over
    state_changed = Signal(object)  # RunState (also when only `busy` changed)
    run_started = Signal(dict)  # run_started's fields: device, world_size, config, ...
    # micro-batch, accum, probes, peak bytes: Python ints (a Qt int is 32 bits: a GPU's peak bytes are more)
    micro_batch_found = Signal(object, object, object, object)
    memory_forecast = Signal(dict)  # memory_forecast's fields
    memory_levers = Signal(dict)  # the latest memory_levers' fields and step (the "what fits" table), once per update
    engine_values = Signal(dict)  # live settings the engine has now (the form follows them)
    pending_changed = Signal(list)  # names of live fields whose pending change moved on
    alerts_added = Signal(list)  # Notes for the alerts panel
    data_changed = Signal()  # steps, markers, epochs or notes: the plots and status bar are due

    def __init__(self, parent: Optional[QObject] = None) -> None:
        super().__init__(parent)
        # The notes a view shows as they come, each to its own typed signal.
        self._relay: dict[str, Callable[[Note], None]] = {
            "run_started": lambda n: self.run_started.emit(dict(n.data)),
            "micro_batch_found": lambda n: self.micro_batch_found.emit(  # stored input: app/model/stored.py
                whole(n.data.get("micro_batch"), 1) or 1, whole(n.data.get("accum"), 1) or 1,
                whole(n.data.get("probes"), 0), whole(n.data.get("peak_bytes"), 0)),
            "memory_forecast": lambda n: self.memory_forecast.emit(dict(n.data)),
        }

    def publish(self, u: Update, session: RunSession) -> None:
        if u.reset:
            self.model_replaced.emit(session.model)
        levers = None
        for note in u.delta.notes:
            relay = self._relay.get(note.kind)
            if relay is not None:
                relay(note)
            elif note.kind == "memory_levers":
                levers = note  # only the newest table matters
        if levers is not None:
            self.memory_levers.emit({**levers.data, "step": levers.step})
        if u.engine_values:
            self.engine_values.emit(dict(u.engine_values))
        if u.pending:
            self.pending_changed.emit(list(dict.fromkeys(u.pending)))
        if u.delta.alerts:
            self.alerts_added.emit(list(u.delta.alerts))
        if u.state:
            self.state_changed.emit(session.state)
        if u.delta or u.reset:
            self.data_changed.emit()
