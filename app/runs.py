"""The runs folder: where it is and what runs it holds. Torch-free.

`runs_root()` mirrors `engine.trainer.default_runs_root()` (which the app must not import
at start-up: it loads torch); tests/app/test_runs.py checks that the two agree.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

from engine.store import DB_NAME, RunReader, StoreError

from .sources import pid_alive

BUILTIN_TASKS = ("mlp", "charlm", "cnn-bn")  # engine.task.BUILTINS (checked by a test)


def data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "headroom")


def runs_root() -> str:
    return os.environ.get("HEADROOM_RUNS") or os.path.join(data_dir(), "runs")


def is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, DB_NAME))


@dataclass
class RunSummary:
    path: str
    name: str
    task: str
    status: str  # running, finished, failed, interrupted, unknown
    started: Optional[float]
    steps: Optional[int]

    def label(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.started)) if self.started else "?"
        steps = f", {self.steps} steps" if self.steps else ""
        return f"{self.name}  [{self.task}, {self.status}{steps}]  {when}"


def summarize(path: str) -> Optional[RunSummary]:
    try:
        reader = RunReader(path)
    except StoreError:
        return None
    try:
        info = reader.info()
    except StoreError:
        info = {}
    finally:
        reader.close()
    status = str(info.get("status") or "unknown")
    if status == "running" and not pid_alive(info.get("pid")):
        status = "interrupted"
    started = info.get("started")
    steps = info.get("step")
    return RunSummary(path=os.path.abspath(path), name=os.path.basename(os.path.normpath(path)),
                      task=str(info.get("task") or "?"), status=status,
                      started=float(started) if isinstance(started, (int, float)) else None,
                      steps=int(steps) if isinstance(steps, int) else None)


def list_runs(root: str, extra: tuple[str, ...] = ()) -> list[RunSummary]:
    """Run folders directly under `root`, plus `extra` folders, newest first."""
    paths: list[str] = []
    try:
        with os.scandir(root) as it:
            for entry in it:
                if entry.is_dir() and is_run_dir(entry.path):
                    paths.append(entry.path)
    except OSError:
        pass
    seen = {os.path.abspath(p) for p in paths}
    for p in extra:
        if os.path.abspath(p) not in seen and is_run_dir(p):
            paths.append(p)
            seen.add(os.path.abspath(p))
    out = [s for s in (summarize(p) for p in paths) if s is not None]
    out.sort(key=lambda s: s.started or 0.0, reverse=True)
    return out
