"""Another machine's runs for the run history, and another machine's run as a Compare overlay,
both through headroom-ctl over ssh: `runs HOST:` lists them (the runs root there, and the folder
beside the run opened when that is elsewhere), and an overlay reads its rows through the same
follow the view uses (RemoteSource), until it has caught up. Qt-free; both block (the window
calls them off the GUI thread)."""
from __future__ import annotations

import dataclasses
import posixpath

from app.core.runs import RunSummary
from app.model.metrics import MetricsBuffer, StepColumns
from engine.ctl import client

from .remote_source import OPEN_TIMEOUT_S, RemoteSource


def summary(host: str, run: client.RunListing) -> RunSummary:
    """A run of `headroom-ctl runs` as the history's row: the server's summary (the same reader
    as the local rows, engine/store/summary.py), its path host:path."""
    return dataclasses.replace(run.summary, path=f"{host}:{run.path}")


def list_runs(host: str, remote_python: str, beside: str = "") -> list[RunSummary]:
    """The runs under host's runs root, and those in the folder of `beside` (the run folder
    opened there, which may be elsewhere); newest first. Raises CtlError."""
    found: dict[str, RunSummary] = {}
    wheres = [""] + ([posixpath.dirname(beside.rstrip("/")) or "."] if beside else [])
    for where in wheres:
        for record in client.runs(client.RemoteRun(host, where), remote_python=remote_python):
            if isinstance(record, client.RunListing):
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
