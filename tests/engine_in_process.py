"""The engine's command line run in this process (engine.cli.main), for the tests whose subject is
what a run does or leaves on disk (forks, rollbacks, resume, faults the engine handles, a run folder
the window reads), not the process it runs in: no interpreter, torch import or task load to pay
again (about 6 s of CPU a run on the CI machine). Tests about signals, SIGKILL, exit codes or
output of the real command line, rlimits or a second process keep real subprocesses
(testkit.run_engine).

`engine(*args)` answers what `testkit.run_engine` answers (returncode, stdout, stderr), with the
state a run leaves in this process put back (kept_process_state). Imported by name
(`from engine_in_process import engine`), as testkit is: tests/conftest.py puts tests/ on sys.path.
"""
from __future__ import annotations

import contextlib
import gc
import io
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import pytest

from testkit import FAULT_PREFIX, ROOT, isolated_env

Watcher = Callable[[Any], None]


@contextlib.contextmanager
def kept_process_state() -> Iterator[None]:
    """Put back what a run changes in this process: the global random number generators, torch's
    thread count, sys.path and the modules imported from the folders the task loader put on it (a
    later run imports a task's neighbours afresh, as a new process would), the signal handlers
    (SIGCHLD included: a module fixture runs before conftest's sigchld_kept looks)."""
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


def engine(*args: Any, cwd: Any = ROOT, env: Optional[Mapping[str, str]] = None,
           watch: Optional[Watcher] = None) -> subprocess.CompletedProcess:
    """`python -m engine args...` as engine.cli.main in this process, run in `cwd`, its output
    captured. `env` is set for the run only, and no other HEADROOM_FAULT_ switch is (as testkit's
    subprocess_env); `watch(event)` sees each event as it is emitted (see _watched)."""
    from engine.cli import main
    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, kept_process_state(), _watched(watch):
        for key in [k for k in os.environ if k.startswith(FAULT_PREFIX)]:
            mp.delenv(key)
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        mp.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    return subprocess.CompletedProcess([sys.executable, "-m", "engine", *argv], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """The engine's free_memory() runs a full gc.collect() after each out-of-memory error (and
    between the micro-batch finder's probes). In a real engine process that walks the run's own
    objects; in pytest's it walks the whole session's heap too: ~0.3 s of CPU a call, a few dozen
    calls in an out-of-memory test. gc.freeze() moves what exists now out of the collector's reach
    until gc.unfreeze(): the run's own objects are still collected, as in its own process."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def trained(folder: Path, *args: Any) -> None:
    """engine(*args) with its settings, log and data under `folder` (testkit.isolated_env), which
    must succeed (its stderr's end is the failure message): a module fixture's run."""
    r = engine(*args, env=isolated_env(folder))
    assert r.returncode == 0, r.stderr[-2000:]


def copy_run(template: Path, dest: Path) -> Path:
    """A copy of a finished run folder that a module's tests share (made once, read-only), for a
    test that changes or resumes it."""
    shutil.copytree(template, dest, ignore=shutil.ignore_patterns("*.writer.lock"))
    return dest
