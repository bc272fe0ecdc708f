"""Another machine's runs for the run history, and another machine's run as a Compare overlay,
both through headroom-ctl over ssh: `runs HOST:` lists them (the runs root there, and the folder
beside the run opened when that is elsewhere), and an overlay reads its rows through the same
follow the view uses (RemoteSource), until it has caught up. Qt-free; both block (the window
calls them off the GUI thread)."""
from __future__ import annotations

import posixpath
from typing import Any, Optional

from engine.ctl.protocol import PROTOCOL
from engine.ctl.remote import RemoteCommand

from app.core.runs import RunSummary
from app.model.metrics import MetricsBuffer, StepColumns
from .remote_source import OPEN_TIMEOUT_S, RemoteSource


def _number(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def summary(host: str, record: dict[str, Any]) -> RunSummary:
    """A `run` record of `headroom-ctl runs` as the history's row; its path is host:path."""
    steps = record.get("step")
    return RunSummary(path=f"{host}:{record.get('path')}", name=str(record.get("name") or "?"),
                      task=str(record.get("task") or "?"), status=str(record.get("status") or "unknown"),
                      started=_number(record.get("started")), steps=steps if isinstance(steps, int) else None,
                      finished=_number(record.get("finished")), final_loss=_number(record.get("loss")))


def list_runs(host: str, remote_python: str, beside: str = "") -> list[RunSummary]:
    """The runs under host's runs root, and those in the folder of `beside` (the run folder
    opened there, which may be elsewhere); newest first. Raises CtlError."""
    found: dict[str, RunSummary] = {}
    wheres = [""] + ([posixpath.dirname(beside.rstrip("/")) or "."] if beside else [])
    for where in wheres:
        args = ["runs", "--json", "--protocol", str(PROTOCOL)] + (["--", where] if where else [])
        for record in RemoteCommand(host, remote_python, args).records():
            if record.get("kind") == "run":
                s = summary(host, record)
                found.setdefault(s.path, s)
    return sorted(found.values(), key=lambda s: s.started or 0.0, reverse=True)


def read_metrics(target: str, remote_python: str, timeout: float = OPEN_TIMEOUT_S) -> MetricsBuffer:
    """Every step of a run on another machine, through its follow (a live run: what it holds
    now). Raises StoreError."""
    src = RemoteSource(target, remote_python, timeout)
    try:
        items = src.poll()
    finally:
        src.close()
    steps = [i for i in items if isinstance(i, StepColumns)]
    buf = MetricsBuffer(max(16, sum(len(s) for s in steps)))
    for s in steps:
        buf.extend_columns(s)
    return buf
