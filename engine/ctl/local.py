"""headroom-ctl against a run folder on this machine: status, set, pause, unpause, stop, runs.

Built only on the run store's public interface: `RunReader` reads, `send_command` queues a
command row for the live engine, `runlock.writer` says whether a process writes the folder.
The commands are the validated ones the app sends (engine/declarations/commands.py), built
from the live settings' declarations (engine/declarations/settings.py): a value the engine
would refuse as input is refused here, before anything is sent. Each function returns or
yields the protocol's records (engine/ctl/protocol.py); failures raise CtlError. Torch-free.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any, Iterator, Optional

from engine.declarations import checkpoint_names, limits
from engine.declarations.commands import Command, Pause, SetPrecision, SettingCommand, Stop, Unpause, command_for
from engine.declarations.config import ConfigError
from engine.declarations.paths import default_runs_root
from engine.declarations.settings import BY_NAME as SETTINGS_BY_NAME
from engine.declarations.settings import LIVE_SETTINGS
from engine.store import DB_NAME, RunReader, StoreError, runlock, send_command, stored, summary

from .protocol import EXIT_NOT_LIVE, CtlError, finite_or_none

WAIT_POLL_S = 0.1
SAME_BOUNDARY_S = 3.0  # how long the later commands of one boundary may take to be marked after the first
OPENING_S = 10.0  # how long a run.db whose engine is still making it is waited for
ANSWERED = ("applied", "refused", "expired")
# Settings `set` takes: the live ones, and precision (which the engine refuses, saying why).
SETTABLE = tuple(s.name for s in LIVE_SETTINGS) + ("precision",)
ACTIONS: dict[str, type[Command]] = {"pause": Pause, "unpause": Unpause, "stop": Stop}
ETA_ROWS = 20  # status: the pace of the last 20 steps
WARMUP_STEPS, MIN_PACED = 2, 5  # no ETA from a segment's first steps (as app/model/epoch_progress.py)


def run_path(path: str) -> str:
    """The folder as given, `~` expanded (a remote path arrives quoted, so the shell left it)."""
    return os.path.abspath(os.path.expanduser(path))


def open_run(path: str) -> RunReader:
    """A reader of the run folder; CtlError (bad input) if it is not one."""
    run_dir = run_path(path)
    if not os.path.isdir(run_dir):
        raise CtlError(f"{path}: no such run folder")
    deadline = time.monotonic() + OPENING_S
    while True:
        try:
            return RunReader(run_dir)
        except ConfigError as e:  # StoreError: no run.db, or one that cannot be read
            # An engine that holds the folder and has not made its tables yet: a moment.
            if "no such table" in str(e) and runlock.holder(run_dir) is not None and time.monotonic() < deadline:
                time.sleep(WAIT_POLL_S)
                continue
            raise CtlError(limits.one_line(e)) from None


def has_last_checkpoint(run_dir: str) -> bool:
    """Whether the run holds its `last` checkpoint: checkpoints/last.pt, or a sharded run's
    checkpoints/last/ folder (by name, as the engine resumes: engine/declarations/checkpoint_names.py)."""
    return any(checkpoint_names.name_of(path) == "last" for path in checkpoint_names.candidates(run_dir))


def live_writer(reader: RunReader) -> Optional[dict[str, Any]]:
    try:
        info = reader.info()
    except StoreError:
        info = {}
    return runlock.writer(reader.run_dir, info)


# -- status ------------------------------------------------------------------------------------
def status(path: str) -> dict[str, Any]:
    """The run's state as one record: live or not, step, epoch, settings, last loss, ETA."""
    reader = open_run(path)
    try:
        return _status(reader)
    except StoreError as e:
        raise CtlError(limits.one_line(e)) from None
    finally:
        reader.close()


def _status(reader: RunReader) -> dict[str, Any]:
    info = reader.info()
    writer = runlock.writer(reader.run_dir, info)
    tail = reader.last_metrics(ETA_ROWS)
    last = tail[-1] if tail else {}
    events = reader.events(kinds=("settings_applied", "paused", "resumed", "run_finished", "run_failed",
                                  "run_started"))
    paused = False
    reason = None
    since = None  # when the run's current segment started (a run continued with --resume has several)
    for e in events:  # stored input: the data of any shape, read through engine/store/stored.py
        if e["kind"] in ("paused", "resumed"):
            paused = e["kind"] == "paused"
        elif e["kind"] in ("run_finished", "run_failed"):
            data = stored.event_data(e)
            reason = stored.text(data.get("reason")) or stored.text(data.get("error")) or stored.text(e.get("message"))
        elif e["kind"] == "run_started":  # a new segment: an earlier one's pause or ending is not this one's
            paused, reason, since = False, None, finite_or_none(e.get("time"))
    state = stored.text(info.get("status")) or "unknown"
    settings = summary.live_settings(info, events, last)  # epochs and max steps too: the run's length now
    if writer is not None:
        state = "paused" if paused else "running"
    elif state == "running":
        state = "interrupted"  # run.db says running, and nobody writes it: the process died
    return {
        "kind": "status", "run_dir": reader.run_dir, "live": writer is not None, "writer": writer,
        "state": state, "status": stored.text(info.get("status")), "reason": reason, "task": info.get("task"),
        "step": last.get("step"), "epoch": last.get("epoch"), "loss": last.get("loss"),
        "settings": settings, "eta_s": _eta(info, reader, tail, since, settings) if writer else None,
        "started": info.get("started"), "finished": info.get("finished"),
        "checkpoint": has_last_checkpoint(reader.run_dir),
    }


def _eta(info: dict[str, Any], reader: RunReader, tail: list[dict[str, Any]],
         since: Optional[float] = None, settings: Optional[dict[str, Any]] = None) -> Optional[float]:
    """Seconds left, from the recent steps' pace and the steps left: max steps, or the epochs
    left at the steps an epoch took so far (the run's length now: `settings`, a change made
    while it trains included). The pace is that of the current segment's rows (those
    since its run_started at `since`: a continued run's rows before it, and the hours between, are
    not its pace), past the segment's first WARMUP_STEPS; None until MIN_PACED steps say it (as
    the app's status bar, app/model/epoch_progress.py), or when the steps left cannot be told."""
    timed = [(r, finite_or_none(r.get("time"))) for r in tail]
    rows = [(r, t) for r, t in timed if t is not None and (since is None or t >= since)]
    if len(rows) < len(tail) or len(tail) < ETA_ROWS:  # the segment's first rows are among these
        rows = rows[WARMUP_STEPS:]
    if len(rows) < MIN_PACED + 1:
        return None
    t0, t1 = rows[0][1], rows[-1][1]
    if t1 <= t0:
        return None
    per_step = (t1 - t0) / (len(rows) - 1)
    step = stored.whole(rows[-1][0].get("step"))
    config = {**stored.mapping(info.get("config")), **(settings or {})}  # a length changed while it trained
    left: list[float] = []
    max_steps, epochs_planned = stored.number(config.get("max_steps"), None), stored.number(config.get("epochs"), None)
    if max_steps is not None:
        left.append(max(0.0, max_steps - step))
    epochs = reader.epochs()
    done_step = stored.number(epochs[-1].get("step"), None) if epochs else None
    if epochs_planned is not None and done_step:
        per_epoch = done_step / max(1.0, stored.number(epochs[-1].get("epoch")) or 1.0)
        left.append(max(0.0, epochs_planned * per_epoch - step))
    eta = min(left) * per_step if left else None
    return eta if eta is not None and math.isfinite(eta) else None


# -- commands ----------------------------------------------------------------------------------
def parse_changes(pairs: list[str], at: str) -> list[Command]:
    """KEY=VALUE words as validated commands (the engine's ranges and choices); CtlError
    naming the first that is not one."""
    if not pairs:
        raise CtlError(f"set: give at least one KEY=VALUE ({', '.join(SETTABLE)})")
    out: list[Command] = []
    for pair in pairs:
        key, sep, text = pair.partition("=")
        name = key.strip().replace("-", "_")
        if not sep or not name:
            raise CtlError(f"set: expected KEY=VALUE, got {limits.quote(pair)}")
        if name not in SETTABLE:
            raise CtlError(f"set: {limits.quote(key)} is not a setting a run changes while it trains "
                           f"(one of {', '.join(SETTABLE)})")
        try:
            value = SETTINGS_BY_NAME[name].reader(text.strip())
            out.append(SetPrecision(value, at=at) if name == "precision" else command_for(name, value, at))
        except ConfigError as e:
            raise CtlError(f"set {name}: {limits.one_line(e)}") from None
    return out


def send(path: str, commands: list[Command], wait: bool = False,
         timeout: Optional[float] = None) -> Iterator[dict[str, Any]]:
    """Queue `commands` for the live engine of the run folder, yielding a `command` record for
    each; with `wait`, again as the engine answers each (applied at a step, or refused with the
    reason). CtlError(EXIT_NOT_LIVE) when no process writes the run, or it ended unanswered."""
    reader = open_run(path)
    try:
        writer = live_writer(reader)
        if writer is None:
            state = reader.info().get("status") or "not started"
            raise CtlError(f"no live run: nothing is writing {reader.run_dir} (run.db says {state})", EXIT_NOT_LIVE)
        sent: dict[int, Command] = {}
        for cmd in commands:
            try:
                sent[send_command(reader.run_dir, cmd)] = cmd
            except StoreError as e:
                raise CtlError(limits.one_line(e), EXIT_NOT_LIVE) from None
        for row_id, cmd in sent.items():
            yield _command_record(row_id, cmd, None)
        if wait:
            yield from _wait(reader, sent, timeout)
    finally:
        reader.close()


def _command_record(row_id: int, cmd: Command, row: Optional[dict[str, Any]]) -> dict[str, Any]:
    """`applied_step`: the step the engine applied the command at (a stop: the run's last step; a
    pause: the step it paused after). `from_step`: the first step a changed setting holds for,
    the one after; None for a stop, pause or unpause, which change no setting (a stop has no
    step after it: "applied from step 2802" for a run that ended at 2801)."""
    from dataclasses import asdict
    row = row or {}
    applied = row.get("applied_step")
    status = row.get("status") or "pending"
    changes = isinstance(cmd, SettingCommand)
    return {"kind": "command", "id": row_id, "command": cmd.kind, "payload": asdict(cmd), "status": status,
            "applied_step": applied, "from_step": applied + 1 if changes and status == "applied"
            and isinstance(applied, int) and not isinstance(applied, bool) else None, "note": row.get("note") or ""}


def _wait(reader: RunReader, sent: dict[int, Command], timeout: Optional[float]) -> Iterator[dict[str, Any]]:
    """The engine's answer to each command: a setting is marked applied or refused in run.db; a
    pause or unpause is done when the engine says paused or resumed; a stop when the run ends."""
    deadline = None if timeout is None else time.monotonic() + timeout
    events_from = max((e["id"] for e in reader.events()), default=0)
    waiting = dict(sent)
    while waiting:
        alive = live_writer(reader) is not None  # before reading: a run that ended has written its answers
        for row_id, cmd in list(waiting.items()):
            row = _answer(reader, row_id, cmd, events_from, alive)
            if row is not None:
                del waiting[row_id]
                yield _command_record(row_id, cmd, _what_held(reader, row_id, cmd, row))
        if not waiting:
            return
        if not alive:
            kinds = ", ".join(sorted({c.kind for c in waiting.values()}))
            raise CtlError(f"the run ended before it answered {kinds}", EXIT_NOT_LIVE)
        if deadline is not None and time.monotonic() > deadline:
            raise CtlError(f"no answer within {timeout:g} s (the command stays queued)", EXIT_NOT_LIVE)
        time.sleep(WAIT_POLL_S)


def _what_held(reader: RunReader, row_id: int, cmd: Command, row: dict[str, Any]) -> dict[str, Any]:
    """An applied setting as the run holds it: the engine applies the commands due at one
    boundary oldest first, so of those that set the same setting at the same step the last one
    holds; an earlier one with another value is `superseded` (the note says by what). Rows of
    commands sent after this one and due at the same boundary are marked with it, a moment apart:
    they are read again until none of them is still only received."""
    if not isinstance(cmd, SettingCommand) or row.get("status") != "applied":
        return row
    step = row.get("applied_step")
    deadline = time.monotonic() + SAME_BOUNDARY_S
    while True:
        later = [r for r in reader.commands() if stored.whole(r.get("id"), 0) > row_id and r.get("kind") == cmd.kind]
        if not any(r.get("status") in ("pending", "received") for r in later) or time.monotonic() > deadline:
            break
        time.sleep(WAIT_POLL_S)
    same = [r for r in later if r.get("status") == "applied" and r.get("applied_step") == step]
    if not same:
        return row
    last = same[-1]
    held = stored.mapping(stored.decoded(last.get("payload"))).get(cmd.setting)
    if held == cmd.value:
        return row
    where = f" from step {step + 1}" if isinstance(step, int) else ""
    return dict(row, status="superseded", note=f"{cmd.setting}={held} (sent after it, applied at the same step) "
                                               f"holds{where}")


def _answer(reader: RunReader, row_id: int, cmd: Command, events_from: int,
            alive: bool) -> Optional[dict[str, Any]]:
    row = reader.command(row_id) or {}
    if row.get("status") in ANSWERED:
        return row
    if isinstance(cmd, (Pause, Unpause)):
        want = "paused" if isinstance(cmd, Pause) else "resumed"
        done = reader.events(after_id=events_from, kinds=(want,))
        if done:
            return dict(row, status="applied", applied_step=done[0]["step"])
    if isinstance(cmd, Stop) and not alive:
        ended = reader.events(after_id=events_from, kinds=("run_finished", "run_failed"))
        step = ended[-1]["step"] if ended else None
        note = "" if has_last_checkpoint(reader.run_dir) else "no checkpoint"
        return dict(row, status="applied", applied_step=step, note=note)
    return None


def action(name: str) -> Command:
    return ACTIONS[name]()


# -- runs --------------------------------------------------------------------------------------
def runs(root: str = "") -> Iterator[dict[str, Any]]:
    """A `run` record for each run folder under `root` (default: this machine's runs root),
    newest first."""
    folder = run_path(root) if root else default_runs_root()
    if not os.path.isdir(folder):
        if root:
            raise CtlError(f"{root}: no such folder")
        return
    names = sorted((n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n, DB_NAME))), reverse=True)
    for name in names:
        path = os.path.join(folder, name)
        try:
            found = summary.summarize(path)
        except (ConfigError, StoreError) as e:
            found, why = None, limits.one_line(e)
        else:
            why = "run.db cannot be read"
        if found is None:
            yield {"kind": "run", "path": path, "name": name, "status": "unreadable", "live": False, "note": why}
            continue
        # The summary the window's run table shows (engine/store/summary.py), with the keys
        # older clients read (step, loss) beside it.
        yield {"kind": "run", **found.to_record(), "step": found.steps, "loss": found.final_loss, "note": ""}


__all__ = ["has_last_checkpoint", "SETTABLE", "ACTIONS", "status", "parse_changes", "send", "action", "runs", "open_run", "run_path",
           "live_writer"]
