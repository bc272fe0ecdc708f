"""What an agent may do to runs, as plain functions over the client API (engine/ctl/client):
list runs, read one (its status, recent rows, the loss's range and trend, its alerts), set live
settings, pause, unpause, stop, fork. Each returns JSON-ready data or raises CtlError with the
reason; the changes go through the validation `headroom-ctl set` uses (local.parse_changes here,
the server's engine.ctl there), so a value it refuses is refused before anything is sent.
Torch-free and free of the MCP SDK: the server (server.py) only wires these to tools."""
from __future__ import annotations

import math
from typing import Any, Literal, Optional, Union

from engine.declarations.settings import BY_NAME as SETTINGS_BY_NAME

from .. import client, local
from ..protocol import EXIT_REFUSED, CtlError

Value = Union[str, int, float, bool]
At = Literal["step", "epoch"]
SENDER = "agent"  # what the command rows say sent them (engine/declarations/commands.py Command.sent_by)
MAX_ROWS = 500  # the most recent rows one read returns
WAIT_S = 120.0  # how long a set, pause or unpause waits for the engine's answer by default
# The engine's events an agent is told about as alerts (the window's alerts panel shows these).
ALERTS = ("nonfinite", "clip_saturation", "vram_low", "batchnorm_small_batch", "lr_hint", "oom_recovered",
          "command_refused", "scaler_skip", "run_failed", "micro_batch_found", "rolled_back", "loss_weighting",
          "step_skipped", "store_problem")
ROW_KEYS = ("step", "epoch", "loss", "lr", "grad_norm", "accum", "micro_batch", "clip", "time")


def _word(name: str, value: Value) -> str:
    if isinstance(value, bool):
        return f"{name}={'on' if value else 'off'}"
    return f"{name}={value!r}" if isinstance(value, float) else f"{name}={value}"


def change_words(changes: dict[str, Value]) -> list[str]:
    """{setting: value} as `set`'s KEY=VALUE words (CtlError for none)."""
    if not changes:
        raise CtlError(f"give at least one change (settings: {', '.join(local.SETTABLE)})")
    return [_word(name, value) for name, value in changes.items()]


def list_runs(where: str = "") -> list[dict[str, Any]]:
    """The runs under a runs folder here or on a host (`host:` or `host:DIR`), newest first."""
    out = []
    for r in client.runs(where):
        if isinstance(r, client.RunListing):
            out.append({"path": r.path, "name": r.name, "status": r.status, "live": r.live, "step": r.step,
                        "loss": r.loss, "task": r.task, "started": r.started, "finished": r.finished,
                        "note": r.note})
    return out


def _status(run: str) -> client.Status:
    for r in client.status(run):
        if isinstance(r, client.Status):
            return r
    raise CtlError(f"{run}: no status came back")


def _finite(x: Any) -> Optional[float]:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def loss_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """min, max, first and last of the rows' finite losses, and the trend: the change from the
    mean of the first half to that of the second, relative to the first (negative: falling)."""
    losses = [v for v in (_finite(r.get("loss")) for r in rows) if v is not None]
    if not losses:
        return {"count": 0, "min": None, "max": None, "first": None, "last": None, "trend": None,
                "non_finite": len(rows)}
    half = len(losses) // 2
    trend = None
    if half:
        before, after = sum(losses[:half]) / half, sum(losses[half:]) / (len(losses) - half)
        trend = (after - before) / abs(before) if before else None
    return {"count": len(losses), "min": min(losses), "max": max(losses), "first": losses[0], "last": losses[-1],
            "trend": trend, "non_finite": len(rows) - len(losses)}


def recent(run: str, rows: int = 50, events: int = 20) -> dict[str, Any]:
    """The run's status, its last `rows` metrics rows, the loss over them, its alerts and its
    last `events` events: one follow from the step `rows` back, read until it has caught up."""
    rows = max(1, min(int(rows), MAX_ROWS))
    status = _status(run)
    start = max(0, (status.step or 0) - rows + 1)
    got: list[dict[str, Any]] = []
    seen: list[dict[str, Any]] = []
    following = client.Following(run, start)
    try:
        for r in following.records():
            if isinstance(r, client.Rows):
                got.extend(_rows(r.raw))
            elif isinstance(r, client.Rewind):
                got = [x for x in got if isinstance(x.get("step"), int) and x["step"] <= r.to_step]
            elif isinstance(r, client.Event):
                seen.append(r.event)
            elif isinstance(r, (client.CaughtUp, client.End)):
                break
    finally:
        following.close()
    got = got[-rows:]
    alerts = [_event(e) for e in seen if e.get("kind") in ALERTS]
    return {"status": status_of(status), "rows": [{k: x.get(k) for k in ROW_KEYS if k in x} for x in got],
            "loss": loss_summary(got), "alerts": alerts, "events": [_event(e) for e in seen[-max(0, events):]]}


def _rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A `rows` record's rows as {column: value}. Not Rows.dicts(): a follow on this machine
    hands its rows over as tuples, which that (and Rows.rows) passes over as not a JSON list."""
    columns, rows = record.get("columns"), record.get("rows")
    if not isinstance(columns, (list, tuple)) or not isinstance(rows, (list, tuple)):
        return []
    return [dict(zip(map(str, columns), row)) for row in rows if isinstance(row, (list, tuple))]


def _event(e: dict[str, Any]) -> dict[str, Any]:
    return {k: e.get(k) for k in ("id", "step", "epoch", "kind", "message")}


def status_of(s: client.Status) -> dict[str, Any]:
    return {"run_dir": s.run_dir, "live": s.live, "state": s.state, "reason": s.reason, "task": s.task,
            "step": s.step, "epoch": s.epoch, "loss": s.loss, "settings": s.settings, "eta_s": s.eta_s,
            "checkpoint": s.checkpoint}


def steer(run: str, request: client.SteerRequest, wait: bool, timeout_s: Optional[float]) -> list[dict[str, Any]]:
    """Send the request as `headroom-ctl set|pause|unpause|stop` does; with `wait`, the engine's
    answers. CtlError (exit 3) when the engine refused one, with its reason."""
    answers: dict[Optional[int], client.CommandAnswer] = {}
    for r in client.steer(run, request, wait=wait, timeout=timeout_s if wait else None):
        if isinstance(r, client.CommandAnswer):
            answers[r.id] = r
    refused = [a for a in answers.values() if a.status == "refused"]
    if refused:
        raise CtlError("; ".join(f"{a.command} refused: {a.note}" for a in refused), EXIT_REFUSED)
    return [{"id": a.id, "command": a.command, "payload": a.payload, "status": a.status,
             "applied_step": a.applied_step, "from_step": a.from_step, "note": a.note} for a in answers.values()]


def set_settings(run: str, changes: dict[str, Value], at: At = "epoch", wait: bool = True,
                 timeout_s: float = WAIT_S) -> list[dict[str, Any]]:
    request = client.SteerRequest("set", tuple(change_words(changes)), at, client=SENDER)
    return steer(run, request, wait, timeout_s)


def act(run: str, action: Literal["pause", "unpause", "stop"], wait: bool = True,
        timeout_s: float = WAIT_S) -> list[dict[str, Any]]:
    return steer(run, client.SteerRequest(action, client=SENDER), wait, timeout_s)


def fork_flags(run: str, checkpoint: str, changes: dict[str, Value]) -> list[str]:
    """The engine's flags of a fork of `run`'s folder (its path on the machine that holds it)
    from `checkpoint` (last, epoch-N, step-S) with `changes`, validated as `set` validates them."""
    remote = client.parse_target(run)
    path = remote.path if remote is not None else run
    flags = ["--fork", f"{path}@{checkpoint}" if checkpoint else path]
    if changes:
        local.parse_changes(change_words(changes), "epoch")  # CtlError naming the first value refused
        for name, value in changes.items():
            key = name.strip().replace("-", "_")
            word = _word(key, value).partition("=")[2]
            flags += ["--precision" if key == "precision" else SETTINGS_BY_NAME[key].option, word]
    return flags


def fork(run: str, checkpoint: str = "last", changes: Optional[dict[str, Value]] = None,
         run_dir: str = "") -> dict[str, Any]:
    """Start a fork of the run (detached, as `headroom-ctl start` does) on the machine that holds
    it; `run_dir` its folder there (default a new one under that machine's runs root)."""
    remote = client.parse_target(run)
    where = f"{remote.host}:{run_dir}" if remote is not None else run_dir
    for r in client.start(fork_flags(run, checkpoint, changes or {}), where):
        if isinstance(r, client.Started):
            return {"run_dir": r.target or r.run_dir, "started": r.started, "pid": r.pid,
                    "command": list(r.command), "console": r.console}
    raise CtlError("the fork's start said nothing about the run it started")
