"""Fixtures for the window tests that also run under a real X server (marked `x11`: `make test`
runs them offscreen with the rest, then again under Xvfb with a window manager,
QT_QPA_PLATFORM=xcb: tests/x11/x_server.py). Settings/runs/log isolation: tests/conftest.py.

Every window here is shown as a person gets it (x11_window.show_active): exposed, active, at
the size the window manager really gave it, which the tests assert."""
from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from testkit import ROOT, isolated_env, subprocess_env, wait_until

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
from x11_window import show_active  # noqa: E402 - after the environment set-up above

from app.core import compat  # noqa: E402,F401 - before any widget is painted (see app/core/compat.py)

# The run, training for as long as a module's tests look at it (then stopped).
LIVE_ARGS = ("--task", "mlp", "--epochs", "400", "--micro-batch", "4", "--accum", "16", "--device", "cpu",
             "--workers", "0")


def engine_env(base: Path) -> dict[str, str]:
    """The engine's settings, runs folder and log under `base` (a session fixture starts it before
    tests/conftest.py's per-test isolation), and one thread: it shares the cores with the window."""
    return isolated_env(base)  # one torch thread: tests/conftest.py


def metrics_rows(run_dir: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{run_dir / 'run.db'}?mode=ro", uri=True, timeout=1)) as db:
            return int(db.execute("select count(*) from metrics").fetchone()[0])
    except sqlite3.Error:
        return 0


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A run training in another process (as `python -m engine ... --run-dir R` in a terminal),
    for a module's windows to follow: its loss, status and live settings are there about 4 s
    after it starts (as soon as a run of two epochs would have ended). Stopped (SIGTERM: a
    checkpoint) when the module is done: not a session fixture, since `make test` runs a module
    on an xdist worker that goes on with other files, and the engine would train beside them."""
    base = tmp_path_factory.mktemp("x11_live")
    run_dir = base / "run"
    log = open(base / "engine.out", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "engine", *LIVE_ARGS, "--run-dir", str(run_dir)], cwd=ROOT,
                            env=subprocess_env(engine_env(base)), stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT)
    os.setpriority(os.PRIO_PROCESS, proc.pid, 10)  # the windows first: the engine trains on what they leave
    try:
        def started() -> bool:
            assert proc.poll() is None, f"the engine exited ({proc.returncode}): {(base / 'engine.out').read_text()}"
            return metrics_rows(run_dir) > 0
        wait_until(started, 60, "the live run's first steps")
        yield str(run_dir)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def window(qtbot: Any) -> Iterator[Callable[..., Any]]:
    """MainWindow factory: make(size=(w, h), restore_settings=False) shows the window at that size
    (its client area; the last size saved when restore_settings and no size), exposed and active.
    Every window is closed (its engine thread joined) at teardown."""
    from app.main_window import MainWindow
    made: list[Any] = []

    def make(size: Optional[tuple[int, int]] = None, restore_settings: bool = False) -> Any:
        w = MainWindow(base_config={}, restore_settings=restore_settings)
        qtbot.addWidget(w)
        made.append(w)
        show_active(w, size)
        return w

    yield make
    for w in made:
        if w.runner.is_busy():
            w.close()
            assert w.runner.join(10.0), "engine thread did not stop"
