"""The engine's command line run in this process (engine.cli.main), for the engine tests whose
subject is what a run does (forks, rollbacks, resume, task files), not the process it runs in:
no interpreter, torch import or task load to pay again (about 6 s of CPU a run on the CI machine).

`engine(*args)` answers what `testkit.run_engine` answers (returncode, stdout, stderr), with the
state a run leaves in this process put back: the working folder and environment, sys.path and the
modules imported from the folders the task loader put on it (so a later run imports a task's
neighbours afresh, as a new process would), the global random number generators, torch's thread
count and the signal handlers. Tests about signals, exit codes or output of the real process, or
a second process, keep real subprocesses (testkit.run_engine).

(Named apart from tests/faults/inproc.py: helper modules of different folders share one
sys.modules in an xdist worker.)
"""
from __future__ import annotations

import contextlib
import io
import os
import random
import shutil
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
    imported from the folders added to it, the signal handlers (SIGCHLD: see conftest's
    sigchld_kept, which a module fixture runs before)."""
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


def copy_run(template: Path, dest: Path) -> Path:
    """A copy of a finished run folder that a module's tests share (made once, read-only), for a
    test that changes or resumes it."""
    shutil.copytree(template, dest, ignore=shutil.ignore_patterns("*.writer.lock"))
    return dest
