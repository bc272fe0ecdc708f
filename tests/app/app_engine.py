"""The engine's command line run in this process (engine.cli.main), for the app tests that need a
run folder made by a real run and whose subject is the window, not the engine's process: no
interpreter, torch import or task load to pay again (about 6 s of CPU a run on the CI machine).

`engine(*args)` answers what `testkit.run_engine` answers (returncode, stdout, stderr), with the
state a run leaves in this process put back: the working folder and environment, sys.path and the
modules imported from the folders the task loader put on it, the global random number generators,
torch's thread count and the signal handlers (SIGCHLD included: a module fixture runs before
conftest's sigchld_kept looks). Tests about the real command line's exit code or output, signals
or a second process keep real subprocesses (testkit.run_engine).

(Named apart from tests/engine/engine_in_process.py and tests/faults/inproc.py: helper modules of
different folders share one sys.modules in an xdist worker.)
"""
from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

import pytest

from testkit import FAULT_PREFIX, ROOT


@contextlib.contextmanager
def kept_process_state() -> Iterator[None]:
    """Put back what a run changes in this process: RNGs, thread count, sys.path and what was
    imported from the folders added to it, the signal handlers."""
    import numpy as np
    import torch
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    threads = torch.get_num_threads()
    path, modules = list(sys.path), set(sys.modules)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}
    try:
        yield
    finally:
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        np.random.set_state(rng[2])
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        added = [os.path.abspath(p) + os.sep for p in set(sys.path) - set(path) if p]
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            where = getattr(sys.modules.get(name), "__file__", None) or ""
            if name.startswith("headroom_task_") or any(where.startswith(folder) for folder in added):
                sys.modules.pop(name, None)
        for s, handler in handlers.items():
            if handler is not None and signal.getsignal(s) is not handler:
                signal.signal(s, handler)


def engine(*args: Any, cwd: Any = ROOT, env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """`python -m engine args...` as engine.cli.main in this process, run in `cwd`, its output
    captured. `env` is set for the run only, and no HEADROOM_FAULT_ switch (as testkit's
    subprocess_env)."""
    from engine.cli import main
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, kept_process_state():
        for key in [k for k in os.environ if k.startswith(FAULT_PREFIX)]:
            mp.delenv(key)
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        mp.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    return subprocess.CompletedProcess([sys.executable, "-m", "engine", *argv], code, out.getvalue(), err.getvalue())


def isolated_env(folder: Path) -> dict[str, str]:
    """What conftest's `isolated` sets for a test, under `folder`: for a module fixture's run,
    made before any test's `isolated` applies."""
    return {"HEADROOM_SETTINGS": str(folder / "settings.ini"), "HEADROOM_RUNS": str(folder / "runs"),
            "HEADROOM_LOG": str(folder / "headroom.log"), "XDG_DATA_HOME": str(folder / "data"),
            "HF_HOME": str(folder / "hf"), "HF_HUB_OFFLINE": "1"}


def trained(folder: Path, *args: Any) -> None:
    """engine(*args) with its settings, log and data under `folder` (isolated_env), which must
    succeed (its stderr's end is the failure message)."""
    r = engine(*args, env=isolated_env(folder))
    assert r.returncode == 0, r.stderr[-2000:]
