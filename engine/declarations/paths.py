"""Where runs live and what the built-in tasks are called. Torch-free: the app uses these
before torch loads, so they are declared here once for both packages."""
from __future__ import annotations

import os
import time

BUILTIN_TASKS = ("mlp", "charlm", "cnn-bn")


def data_dir() -> str:
    """Headroom's per-user data folder ($XDG_DATA_HOME/headroom, else ~/.local/share/headroom)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "headroom")


def default_runs_root() -> str:
    """$HEADROOM_RUNS, else <data dir>/runs."""
    return os.environ.get("HEADROOM_RUNS") or os.path.join(data_dir(), "runs")


def default_run_dir(task: str, suffix: str = "", root: str = "") -> str:
    """A new, unused folder name under the runs root: <time>-<task stem><suffix>."""
    stem = os.path.splitext(os.path.basename(task.replace(":", "-")))[0] or "run"
    base = os.path.join(root or default_runs_root(), time.strftime("%Y%m%d-%H%M%S") + f"-{stem}{suffix}")
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def resolve_task_spec(spec: str) -> str:
    """A task file given by a relative path, made absolute, so the run can be resumed (and
    opened in the app) from any folder. Built-in names and module:attr specs are kept."""
    if (spec.endswith(".py") or os.sep in spec or "/" in spec) and os.path.isfile(spec):
        return os.path.abspath(spec)
    return spec
