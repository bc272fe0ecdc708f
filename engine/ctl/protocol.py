"""headroom-ctl's protocol: what `python -m engine.ctl <command> --json` writes, one JSON
object per line, and what a client on another machine (headroom-ctl over ssh, the app) reads.

The first line is always the hello, {"kind": "hello", "protocol": N, "engine": VERSION}: a
client that speaks another protocol says so and stops before it reads anything else. Every
other line is a record with a "kind":

  rows       {"columns": [name, ...], "rows": [[value, ...], ...]}   optimizer steps in step order,
             each as run.db holds it (the values in the order of "columns")
  event      {"event": {id, time, step, epoch, kind, message, data}}
  info       {"info": {run table}, "live": bool, "writer": {pid, host, started} | null}
  scalars    {"columns": [step, epoch, name, value, time], "rows": [[...], ...]}   what a framework
             logged besides the loss (run.db's scalars table), in the order logged
  rewind     {"to_step": S}       rows past S were superseded (a rollback): drop them, rows follow
  caught_up  {"step": N}          follow of a live run: everything it held at the start was sent
  heartbeat  {"time": T}          follow writes one a second while nothing else comes
  end        {"status": S, "step": N, "last_event": ID}   the run ended; the stream ends here
  status     {run_dir, live, writer, status, step, epoch, loss, settings, eta_s, ...}
  command    {id, command, payload, status, applied_step, from_step, note}   status: pending, received,
             applied, refused, expired, or superseded (applied, and a later command changing the
             same setting at the same step holds: the note says which)
  run        {path, name, status, live, step, task, started, finished, loss}   one line of `runs`
  started    {run_dir, started, pid, host, detach, session, console, command}   `start`: the engine
             holds its run folder (started false: still starting when the wait ran out)
  labels     {run_dir, tags: [TEXT, ...], note, archived}   `tag`, `note`, `archive`, `unarchive`:
             the run's labels as the command left them (engine/store/labels.py)
  error      {"message": TEXT, "exit": CODE}   the command failed; the process exits CODE

Numbers are JSON numbers; a non-finite one is written NaN, Infinity or -Infinity (as Python's
json module writes and reads them). A client ignores kinds it does not know, so a newer
engine may add kinds without a new protocol number; a change to an existing kind's meaning
takes a new number. Torch-free (a laptop follows a remote run without torch).
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional

PROTOCOL = 1

# Exit codes every command shares (documented in the README and in --help).
EXIT_OK = 0
EXIT_FAILED = 1  # an unexpected failure
EXIT_BAD_INPUT = 2  # bad input: nothing was sent
EXIT_REFUSED = 3  # set --wait: the engine refused a change
EXIT_NOT_LIVE = 4  # no live run to send to, or the run ended before it answered
EXIT_REMOTE = 5  # the remote could not be reached, spoke another protocol, or the stream broke


class CtlError(Exception):
    """A failure with the one line to show and the exit code to leave with."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


class ProtocolError(CtlError):
    """The other side does not speak this protocol (or wrote something that is not one)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_REMOTE)


def hello() -> dict[str, Any]:
    from engine import __version__
    return {"kind": "hello", "protocol": PROTOCOL, "engine": __version__}


def error(message: str, code: int) -> dict[str, Any]:
    return {"kind": "error", "message": message, "exit": code}


def encode(record: dict[str, Any]) -> str:
    """One line (without the newline). Values a run.db may hold that JSON lacks (bytes from a
    damaged file) are written as text rather than failing the stream."""
    return json.dumps(record, default=str, separators=(",", ":"))


def decode(line: str) -> dict[str, Any]:
    """A record from one line; ProtocolError for anything that is not a JSON object with a kind."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        raise ProtocolError(f"not a headroom-ctl record: {line[:80]!r}") from None
    if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
        raise ProtocolError(f"not a headroom-ctl record: {line[:80]!r}")
    return record


def check_hello(line: Optional[str], peer: str) -> dict[str, Any]:
    """The hello a peer wrote first, checked: ProtocolError naming both protocols otherwise."""
    if not line:
        raise ProtocolError(f"{peer} said nothing (no hello line)")
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        record = None
    if not isinstance(record, dict) or "protocol" not in record:
        raise ProtocolError(f"{peer} did not answer as headroom-ctl (first line {line.strip()[:80]!r}): "
                            f"is Headroom with engine.ctl installed there?")
    theirs = record.get("protocol")
    if theirs != PROTOCOL:
        engine = record.get("engine") or "an unknown version"
        raise ProtocolError(f"{peer} speaks headroom-ctl protocol {theirs} (engine {engine}), this side speaks "
                            f"protocol {PROTOCOL}: install the same Headroom version on both machines")
    return record


def finite_or_none(value: Any) -> Optional[float]:
    """A number for a status line: None for missing or non-finite values."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)  # an int past what a float holds (stored input) is none
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def rows_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The metrics rows a `rows` record carries, each as {column: value}."""
    columns, rows = record.get("columns"), record.get("rows")
    if not isinstance(columns, (list, tuple)) or not isinstance(rows, (list, tuple)):  # a server's record is input
        return []
    return [dict(zip(map(str, columns), values)) for values in rows if isinstance(values, (list, tuple))]
