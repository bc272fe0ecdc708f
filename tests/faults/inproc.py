"""The engine's command line run in this process (engine.cli.main), for the fault tests whose
subject is what the engine does, not the process it runs in: no interpreter, torch import or
task load to pay again (about 6 s of CPU a run on the CI machine).

`engine(*args)` answers what `testkit.run_engine` answers (returncode, stdout, stderr), with the
state a run leaves in this process put back: environment (the fault switches of fault_task.py
and blocking_task.py are read from it), sys.path (the task loader puts the task's folder first),
the working folder, the global random number generators, torch's thread count and the signal
handlers. Tests about signals, SIGKILL, closed descriptors, rlimits or a second process keep
real subprocesses (testkit.run_engine).
"""
from __future__ import annotations

import contextlib
import io
import os
import random
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import pytest

from testkit import FAULT_PREFIX, ROOT

Watcher = Callable[[Any], None]

# One intra-op thread, in this process during a run (engine()) and, through this environment, in
# the engine processes the fault tests start: the same thread count on both sides where a test
# compares their numbers bit for bit. The tests' models are tiny; a second thread only adds
# synchronisation, which on a loaded 2-core machine (CI's 2 workers) cost up to 15 times the
# step itself (0.29 s against 0.018 s a step measured, for fault_task.py).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@dataclass
class Ran:
    """What `subprocess.run(..., capture_output=True, text=True)` would have answered."""
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _kept_process_state() -> Iterator[None]:
    """Put back what a run changes in this process: RNGs, thread count (one during the run:
    ONE_THREAD), sys.path, signal handlers."""
    import numpy as np
    import torch
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    threads = torch.get_num_threads()
    path = list(sys.path)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}
    try:
        torch.set_num_threads(1)  # see ONE_THREAD
        yield
    finally:
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        np.random.set_state(rng[2])
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        sys.path[:] = path
        for s, handler in handlers.items():
            if handler is not None and signal.getsignal(s) is not handler:
                signal.signal(s, handler)


@contextlib.contextmanager
def _watched(watch: Optional[Watcher]) -> Iterator[None]:
    """Every event the console would show goes to `watch` first, on the training thread, at the
    moment the engine emits it (where a subprocess test would read its --json line a little later)."""
    if watch is None:
        yield
        return
    import engine.cli as cli

    class WatchedSink(cli.ConsoleSink):
        def __call__(self, event: Any) -> None:
            watch(event)
            super().__call__(event)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "ConsoleSink", WatchedSink)
        yield


def engine(*args: Any, env: Optional[Mapping[str, str]] = None, watch: Optional[Watcher] = None) -> Ran:
    """`python -m engine args...` as engine.cli.main in this process, its output captured.
    `env` is set for the run only and no other HEADROOM_FAULT_ switch is (as testkit's
    subprocess_env); `watch(event)` sees each event as it is emitted (see _watched)."""
    from engine.cli import main
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, _kept_process_state(), _watched(watch):
        for key in [k for k in os.environ if k.startswith(FAULT_PREFIX)]:
            mp.delenv(key)
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        mp.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    return Ran(code, out.getvalue(), err.getvalue())


def copy_run(template: Path, dest: Path) -> Path:
    """A copy of a finished run folder that a module's tests share (made once, read-only), for a
    test that changes or resumes it."""
    shutil.copytree(template, dest, ignore=shutil.ignore_patterns("*.writer.lock"))
    return dest


def isolation(folder: Path) -> dict[str, str]:
    """The environment conftest's `isolated` gives a test, under `folder`: for a run a
    module-scoped fixture makes, before any test's own isolation exists."""
    return {"HEADROOM_SETTINGS": str(folder / "settings.ini"), "HEADROOM_RUNS": str(folder / "runs"),
            "HEADROOM_LOG": str(folder / "headroom.log"), "XDG_DATA_HOME": str(folder / "data"),
            "HF_HOME": str(folder / "hf"), "HF_HUB_OFFLINE": "1"}
