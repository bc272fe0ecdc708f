"""Where headroom-ctl's records go: JSON lines (--json, what a client on another machine reads)
or lines for a person at a terminal. Either way a reader that went away (a closed pipe, an ssh
session that ended) is `ClientGone`, never a traceback. Torch-free.
"""
from __future__ import annotations

import math
import os
import re
import shlex
import sys
import time
from typing import Any, Optional, TextIO

from engine.store import labels, stored, summary

from .protocol import encode, hello, rows_of

# What a terminal acts on rather than prints: escape sequences whole (CSI such as a screen clear,
# OSC such as a window title or OSC 52, which writes the clipboard; DCS, APC, PM, SOS; the 8-bit
# forms), then every control character left (a lone ESC, BEL, backspace, carriage return, C1),
# and the bidirectional overrides that make a line read other than it is. Newline and tab stay.
_SEQUENCE = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
                       r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                       r"|\x1b[ -/]*[0-~]?")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Text from a run folder or a server as a terminal should show it: what it would act on
    (escape sequences, control characters) removed. Every line headroom-ctl prints for a person
    goes through here (Output.write, the error line)."""
    return _CONTROL.sub("", _SEQUENCE.sub("", text))


class ClientGone(Exception):
    """Whoever read our output went away (EPIPE)."""


class Output:
    """Writes records; flush() is called before any wait, so a reader sees what was written."""

    def __init__(self, stream: Optional[TextIO] = None, as_json: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.as_json = as_json

    def hello(self) -> None:
        if self.as_json:
            self.write(hello())
            self.flush()

    def write(self, record: dict[str, Any], part: str = "") -> None:
        """`part`: the part of a `labels` record a person asked for (tags, note, archived)."""
        text = encode(record) if self.as_json else render(record, part)
        if text is None:
            return
        if not self.as_json:
            text = printable(text)
        try:
            self.stream.write(text + "\n")
            if not self.as_json and record.get("kind") not in ("rows", "event"):
                self.stream.flush()
        except (BrokenPipeError, ConnectionResetError):
            raise ClientGone() from None

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError):
            raise ClientGone() from None

    def silence(self) -> None:
        """After EPIPE: point stdout at /dev/null, so the interpreter's last flush at exit does
        not print a second failure (the recipe in Python's signal documentation)."""
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
        except (OSError, ValueError, AttributeError):
            pass


# -- for a person ---------------------------------------------------------------------------------
def _num(v: Any, fmt: str = "{:.6g}") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    try:
        return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
    except (OverflowError, ValueError):  # an int past what a float holds (stored input): its digits, shortened
        text = str(v) if not isinstance(v, int) or v.bit_length() < 10_000 else "a number too long to print"
        return text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "unknown"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s:02d} s" if m else f"{s} s"


def _settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {_num(v)}" for k, v in settings.items() if v is not None)


def _status(r: dict[str, Any]) -> str:
    w = stored.mapping(r.get("writer"))  # a server's record is input: any shape
    who = f" (pid {w.get('pid')}{' on ' + w['host'] if w.get('host') else ''})" if r.get("live") else ""
    state = str(r.get("state") or "unknown")
    if r.get("reason") and not r.get("live"):
        state += f" ({r['reason']})"
    lines = [str(r.get("run_dir") or ""), f"  state     {state}{who}",
             f"  step      {_num(r.get('step'))} (epoch {_num(r.get('epoch'))})",
             f"  loss      {_num(r.get('loss'))}", f"  settings  {_settings(stored.mapping(r.get('settings')))}"]
    if r.get("live"):
        lines.append(f"  eta       {_duration(stored.number(r.get('eta_s'), None))}")
    if r.get("task"):
        lines.append(f"  task      {r['task']}")
    return "\n".join(lines)


# What an applied command that changes no setting did, said as such: "stop: stopped at step 2801".
DONE = {"stop": ("stopped", "at"), "pause": ("paused", "after"), "unpause": ("resumed", "at")}


def _command(r: dict[str, Any]) -> str:
    payload = stored.mapping(r.get("payload"))
    what = r.get("command", "")
    values = " ".join(f"{k}={v}" for k, v in payload.items() if k not in ("at", "sent_by"))  # bookkeeping, not values
    head = f"{what} {values}".strip() + (f" (at {payload['at']})" if "at" in payload else "")
    status = r.get("status")
    if status == "applied":
        note = f" ({r['note']})" if r.get("note") else ""
        step = r.get("applied_step")
        if what in DONE:  # a stop, pause or unpause: what happened, where (no setting holds "from" a step)
            word, where = DONE[what]
            return f"{head}: {word}" + (f" {where} step {step}" if step is not None else "") + note
        where = f" from step {r['from_step']}" if r.get("from_step") is not None else (
            f" at step {step}" if step is not None else "")
        return f"{head}: applied{where}{note}"
    if status == "refused":
        return f"{head}: refused: {r.get('note') or 'no reason given'}"
    if status == "superseded":  # applied, and overwritten at the same boundary by a later command
        return f"{head}: superseded: {r.get('note') or 'a later change of the same setting holds'}"
    if status == "expired":
        return f"{head}: expired: {r.get('note') or 'the engine stopped before it read it'}"
    return f"{head}: sent (the engine reads commands within about a second)"


def _row(row: dict[str, Any]) -> str:
    parts = [f"step {row.get('step')}", f"epoch {_num(row.get('epoch'))}", f"loss {_num(row.get('loss'))}",
             f"grad {_num(row.get('grad_norm'), '{:.4g}')}", f"lr {_num(row.get('lr'), '{:.4g}')}",
             f"accum {_num(row.get('accum'))}", f"micro-batch {_num(row.get('micro_batch'))}"]
    if row.get("nonfinite"):
        parts.append("NON-FINITE")
    return "  ".join(parts)


def _event(e: dict[str, Any]) -> str:
    return f"step {e.get('step')}  [{e.get('kind')}] {e.get('message') or ''}".rstrip()


def _run(r: dict[str, Any]) -> str:
    """One run of `runs`: the summary the window's run table shows (engine/store/summary.py),
    its size as the table shows it, its tags, and its note's first line under it."""
    s = summary.from_record(r)
    live = " (live)" if s.live else ""
    try:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.started)) if s.started is not None else ""
    except (OverflowError, ValueError, OSError):  # a time no calendar holds (a damaged run.db)
        when = ""
    archived = "  archived" if s.labels.archived else ""
    tags = f"  [{', '.join(s.labels.tags)}]" if s.labels.tags else ""
    line = (f"{s.name}  {s.status}{live}  step {_num(s.steps)}  {r.get('task') or ''}  {when}  "
            f"{labels.fmt_bytes(s.size)}{archived}{tags}").rstrip()
    note = s.labels.note.splitlines()[0] if s.labels.note else ""
    return f"{line}\n  {note}" if note else line


def _started(r: dict[str, Any]) -> str:
    where = str(r.get("target") or r.get("run_dir") or "")
    if not r.get("started"):
        return (f"starting: {where} (the engine has not taken its folder yet; what it says is in "
                f"{r.get('console')})")
    host = f" on {r['host']}" if r.get("host") else ""
    lines = [f"started: {where} (pid {r.get('pid')}{host})"]
    if r.get("session"):
        lines.append(f"  in tmux session {r['session']} (on that machine: tmux attach -t {r['session']})")
    else:
        lines.append(f"  detached; its output goes to {r.get('console')}")
    lines.append(f"  follow it: headroom-ctl follow {shlex.quote(where)}")
    return "\n".join(lines)


def _labels(r: dict[str, Any], part: str) -> Optional[str]:
    """`tag`: the tags, one a line; `note`: the note as written (nothing for none: a script reads
    them); `archive`: what the run is now; else all three under the run's folder."""
    given = r.get("tags")
    tags = [str(t) for t in given] if isinstance(given, list) else []
    note = str(r.get("note") or "")
    if part == "tags":
        return "\n".join(tags) or None
    if part == "note":
        return note or None
    if part == "archived":
        return f"{'archived' if r.get('archived') else 'not archived'}: {r.get('run_dir') or ''}"
    lines = [str(r.get("run_dir") or ""), f"  tags      {', '.join(tags) or '-'}",
             f"  archived  {'yes' if r.get('archived') else 'no'}"]
    lines += [("  note      " if i == 0 else " " * 12) + line for i, line in enumerate(note.splitlines())]
    return "\n".join(lines)


def render(record: dict[str, Any], part: str = "") -> Optional[str]:
    """The line(s) a person reads for a record; None for those only a program needs."""
    kind = record.get("kind")
    if kind == "status":
        return _status(record)
    if kind == "command":
        return _command(record)
    if kind == "rows":
        return "\n".join(_row(r) for r in rows_of(record)) or None
    if kind == "scalars":
        return "\n".join(f"step {r.get('step')}  [scalar] {r.get('name')} {_num(r.get('value'))}"
                         for r in rows_of(record)) or None
    if kind == "event":
        return _event(stored.mapping(record.get("event")))
    if kind == "rewind":
        return f"(rolled back to step {record.get('to_step')}: the rows after it are superseded)"
    if kind == "end":
        return f"run ended: {record.get('status')} at step {record.get('step')}"
    if kind == "run":
        return _run(record)
    if kind == "started":
        return _started(record)
    if kind == "labels":
        return _labels(record, part)
    return None  # hello, info, heartbeat, kinds a newer engine added
