"""pytest-qt fixtures for the app tests: offscreen, isolated settings/runs/log, fast runs."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the real app package (not an editable-install namespace)

from app import compat  # noqa: E402,F401 - before any widget is painted (see app/compat.py)

# A run of mlp that takes about a second per epoch on a small CPU: 4096 samples, 128 per window (32 steps an epoch).
FAST = {"task": "mlp", "micro_batch": 64, "accum": 2, "lr": 1e-3, "clip": 1.0, "device": "cpu"}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Settings, runs folder, log and data dir under tmp: never the user's."""
    monkeypatch.setenv("HEADROOM_SETTINGS", str(tmp_path / "settings.ini"))
    monkeypatch.setenv("HEADROOM_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("HEADROOM_LOG", str(tmp_path / "headroom.log"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path


@pytest.fixture
def make_window(qtbot: Any) -> Callable[..., Any]:
    """MainWindow factory; every window is closed (and its engine thread joined) at teardown."""
    from app.window import MainWindow
    made: list[Any] = []

    def make(base_config: dict | None = None, **kw: Any) -> Any:
        w = MainWindow(base_config=dict(base_config or {}), restore_settings=kw.pop("restore_settings", False), **kw)
        qtbot.addWidget(w)
        w.show()
        made.append(w)
        return w

    yield make
    for w in made:
        if w.runner.is_busy():
            w.close()
            assert w.runner.join(10.0), "engine thread did not stop"


def wait_until(qtbot: Any, cond: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    """Process Qt events until cond() holds."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        qtbot.wait(20)


def run_to_end(qtbot: Any, window: Any, timeout: float = 120.0) -> dict:
    """Wait for the window's run to end (its thread cleaned up) and return the outcome."""
    wait_until(qtbot, lambda: not window.runner.is_busy() and window.run_outcome is not None, timeout,
               "the run to end")
    qtbot.wait(50)
    window.tick()
    return window.run_outcome


def start(window: Any, **config: Any) -> None:
    """Fill the form (and the flags the form has no widget for) and press Start."""
    cfg = {**FAST, **config}
    window.base_config.update({k: v for k, v in cfg.items()
                               if k in ("max_steps", "seed", "run_dir", "nonfinite", "optimizer")})
    window.controls.set_values(cfg)
    assert window.start_run(), window.last_error
