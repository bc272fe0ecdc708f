"""The runs folder: what run folders it holds, and whether the process writing one is alive.
Torch-free. Where the folder is and what the built-in tasks are called come from
`engine.paths`, which both packages share.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from engine.store import DB_NAME, RunReader, StoreError


def is_run_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, DB_NAME))


def pid_alive(pid: Any) -> bool:
    """Whether a process with this id exists (a run.db's writer, say)."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        return False
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists, not ours
    return True


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
