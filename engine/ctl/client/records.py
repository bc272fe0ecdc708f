"""headroom-ctl's records as typed values: one frozen dataclass per kind of the protocol
(engine/ctl/protocol.py), read from a record with `typed`. Each keeps the record it was read
from (`raw`), so headroom-ctl relays exactly what a server wrote, fields a newer engine added
included; a kind this side does not know is an `Other` (a client ignores it). Torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from engine.store.summary import RunSummary, from_record

from ..protocol import rows_of


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> Optional[float]:
    """A number as it came (NaN and infinities too: a loss may be one); None for anything else."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:  # an int past what a float holds (a server's record is input)
        return None


def _finite(value: Any) -> Optional[float]:
    number = _float(value)
    return number if number is not None and math.isfinite(number) else None


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _writer(value: Any) -> Optional[dict[str, Any]]:
    return dict(value) if isinstance(value, dict) else None


def _text(value: Any, default: str = "") -> str:
    return str(value) if value is not None else default


def _maybe_text(value: Any) -> Optional[str]:
    return str(value) if value is not None else None


@dataclass(frozen=True)
class Record:
    """A protocol record; `raw` is the record as written (what headroom-ctl relays)."""
    raw: dict[str, Any] = field(repr=False, compare=False, kw_only=True)

    @property
    def kind(self) -> str:
        return str(self.raw.get("kind") or "")


@dataclass(frozen=True)
class Rows(Record):
    """Optimizer steps in step order, each as run.db holds it (values in the order of `columns`)."""
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def dicts(self) -> list[dict[str, Any]]:
        """Each row as {column: value}."""
        return rows_of(self.raw)

    @property
    def last_step(self) -> Optional[int]:
        if not self.rows or "step" not in self.columns:
            return None
        return _int(self.rows[-1][self.columns.index("step")])


@dataclass(frozen=True)
class Scalars(Record):
    """What a framework logged besides the loss (run.db's scalars), in the order logged."""
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def dicts(self) -> list[dict[str, Any]]:
        """Each row as {step, epoch, name, value, time}."""
        return rows_of(self.raw)


@dataclass(frozen=True)
class Event(Record):
    """One row of the run's events table: {id, time, step, epoch, kind, message, data}."""
    event: dict[str, Any]

    @property
    def id(self) -> Optional[int]:
        return _int(self.event.get("id"))


@dataclass(frozen=True)
class Info(Record):
    """The run table, whether a process writes the run, and that writer (pid, host, started)."""
    info: dict[str, Any]
    live: bool
    writer: Optional[dict[str, Any]]


@dataclass(frozen=True)
class Rewind(Record):
    """Rows past `to_step` were superseded (a rollback): drop them; rows from there follow."""
    to_step: int


@dataclass(frozen=True)
class CaughtUp(Record):
    """A follow of a live run sent everything the run held when it began."""
    step: Optional[int]


@dataclass(frozen=True)
class Heartbeat(Record):
    """Nothing new for a second; the connection is alive."""
    time: Optional[float]


@dataclass(frozen=True)
class End(Record):
    """The run ended; the stream ends here."""
    status: str
    step: Optional[int]
    last_event: Optional[int]


@dataclass(frozen=True)
class Status(Record):
    """A run's state: live or not, step, epoch, settings, last loss, ETA."""
    run_dir: str
    live: bool
    writer: Optional[dict[str, Any]]
    state: str
    status: Optional[str]
    reason: Optional[str]
    task: Optional[str]
    step: Optional[int]
    epoch: Optional[int]
    loss: Optional[float]
    settings: dict[str, Any]
    eta_s: Optional[float]
    started: Optional[float]
    finished: Optional[float]
    checkpoint: bool


@dataclass(frozen=True)
class CommandAnswer(Record):
    """A command sent to a run, and the engine's answer so far (pending, applied, refused, expired)."""
    id: Optional[int]
    command: str
    payload: dict[str, Any]
    status: str
    applied_step: Optional[int]
    from_step: Optional[int]
    note: str


@dataclass(frozen=True)
class RunListing(Record):
    """One run folder of `runs`, with its state; `path` as the machine that holds it names it."""
    path: str
    name: str
    status: str
    live: bool
    step: Optional[int]
    task: Optional[str]
    started: Optional[float]
    finished: Optional[float]
    loss: Optional[float]
    note: str  # why it cannot be read ("" when it can)
    summary: RunSummary  # the run table's row (engine/store/summary.py); path as the holding machine names it


@dataclass(frozen=True)
class Started(Record):
    """`start`: the engine holds its run folder (started False: still starting when the wait ran out)."""
    run_dir: str
    started: bool
    pid: Optional[int]
    host: Optional[str]
    detach: str
    session: Optional[str]
    console: str
    command: tuple[str, ...]
    target: Optional[str]  # host:run_dir when it was started on another machine


@dataclass(frozen=True)
class Labelled(Record):
    """A run's labels (engine/store/labels.py) as `tag`, `note`, `archive` or `unarchive` left
    them; `run_dir` as the machine that holds it names it."""
    run_dir: str
    tags: tuple[str, ...]
    note: str
    archived: bool


@dataclass(frozen=True)
class Other(Record):
    """A kind this side does not know (a newer engine's): ignored by a client, relayed by headroom-ctl."""


AnyRecord = Union[Rows, Scalars, Event, Info, Rewind, CaughtUp, Heartbeat, End, Status, CommandAnswer, RunListing, Started,
                  Labelled, Other]


def _list(value: Any) -> list[Any]:
    """A list as a server sent it (a tuple from a follow here); [] for anything else (a server's
    records are input)."""
    return list(value) if isinstance(value, (list, tuple)) else []


def _table(r: dict[str, Any]) -> tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]]:
    """The columns and rows of a `rows` or `scalars` record (rows that are not lists left out)."""
    return tuple(str(c) for c in _list(r.get("columns"))), tuple(tuple(row) for row in _list(r.get("rows"))
                                                                  if isinstance(row, (list, tuple)))


def _rows(r: dict[str, Any]) -> Rows:
    return Rows(*_table(r), raw=r)


def _status(r: dict[str, Any]) -> Status:
    return Status(_text(r.get("run_dir")), bool(r.get("live")), _writer(r.get("writer")),
                  _text(r.get("state"), "unknown"), _maybe_text(r.get("status")), _maybe_text(r.get("reason")),
                  _maybe_text(r.get("task")), _int(r.get("step")),
                  _int(r.get("epoch")), _float(r.get("loss")), _dict(r.get("settings")), _finite(r.get("eta_s")),
                  _finite(r.get("started")), _finite(r.get("finished")), bool(r.get("checkpoint")), raw=r)


def _command(r: dict[str, Any]) -> CommandAnswer:
    return CommandAnswer(_int(r.get("id")), _text(r.get("command")), _dict(r.get("payload")),
                         _text(r.get("status"), "pending"), _int(r.get("applied_step")), _int(r.get("from_step")),
                         _text(r.get("note")), raw=r)


def _run(r: dict[str, Any]) -> RunListing:
    return RunListing(_text(r.get("path")), _text(r.get("name")) or "?", _text(r.get("status")) or "unknown",
                      bool(r.get("live")), _int(r.get("step")), _maybe_text(r.get("task")), _finite(r.get("started")),
                      _finite(r.get("finished")), _finite(r.get("loss")), _text(r.get("note")), from_record(r), raw=r)


def _started(r: dict[str, Any]) -> Started:
    return Started(_text(r.get("run_dir")), bool(r.get("started")), _int(r.get("pid")), _maybe_text(r.get("host")),
                   _text(r.get("detach")), _maybe_text(r.get("session")), _text(r.get("console")),
                   tuple(str(w) for w in _list(r.get("command"))), _maybe_text(r.get("target")), raw=r)


def _labelled(r: dict[str, Any]) -> Labelled:
    tags = r.get("tags")
    return Labelled(_text(r.get("run_dir")), tuple(str(t) for t in tags) if isinstance(tags, list) else (),
                    _text(r.get("note")), r.get("archived") is True, raw=r)


def typed(record: dict[str, Any]) -> AnyRecord:
    """The typed value of a protocol record (an `Other` for a kind this side does not know)."""
    kind = record.get("kind")
    if kind == "rows":
        return _rows(record)
    if kind == "scalars":
        return Scalars(*_table(record), raw=record)
    if kind == "event":
        return Event(_dict(record.get("event")), raw=record)
    if kind == "info":
        return Info(_dict(record.get("info")), bool(record.get("live")), _writer(record.get("writer")), raw=record)
    if kind == "rewind":
        return Rewind(_int(record.get("to_step")) or 0, raw=record)
    if kind == "caught_up":
        return CaughtUp(_int(record.get("step")), raw=record)
    if kind == "heartbeat":
        return Heartbeat(_float(record.get("time")), raw=record)
    if kind == "end":
        return End(_text(record.get("status"), "unknown"), _int(record.get("step")), _int(record.get("last_event")),
                   raw=record)
    if kind == "status":
        return _status(record)
    if kind == "command":
        return _command(record)
    if kind == "run":
        return _run(record)
    if kind == "started":
        return _started(record)
    if kind == "labels":
        return _labelled(record)
    return Other(raw=record)


__all__ = ["Record", "Rows", "Scalars", "Event", "Info", "Rewind", "CaughtUp", "Heartbeat", "End", "Status", "CommandAnswer",
           "RunListing", "Started", "Labelled", "Other", "AnyRecord", "typed"]
