"""Every test: the repository first on sys.path, settings/runs/log/data/Hugging Face cache under
the test's tmp_path (never the user's), and the markers' rules. Shared helpers: testkit.py."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
for _p in (_HERE, os.path.dirname(_HERE)):  # tests/ (testkit) and the repository (the real engine and app)
    if _p in sys.path:
        sys.path.remove(_p)
    sys.path.insert(0, _p)

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# One torch (OpenMP) intra-op thread in every test process and in every engine, app, headroom-ctl
# and torchrun process a test starts (they inherit this environment), set before anything here
# imports torch. The tests' models are tiny, and with a pytest worker per core a second thread's
# spin-waits cost several times the step itself (a 2-epoch mlp run in process: 29.6 s of CPU with
# 2 threads, 4.3 s with 1, on the 2-core CI machine). A value the shell sets is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from testkit import isolated_env  # noqa: E402 - after tests/ is put on sys.path above


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Settings, runs folder, log, data dir and the Hugging Face cache under tmp_path. A run that
    forgot --run-dir lands in tmp_path/runs; subprocesses inherit all of it."""
    for key, value in isolated_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    return tmp_path


@pytest.fixture(autouse=True)
def sigchld_kept() -> Any:
    """A test that runs the engine in this process's main thread leaves PyTorch's SIGCHLD handler
    installed, holding the worker pids it knew: a later test's unrelated child exiting would then
    raise "DataLoader worker ... exited unexpectedly" in whatever the main thread is doing (a
    Qt slot of the next app test). Each test starts and ends with the handler it found."""
    before = signal.getsignal(signal.SIGCHLD)
    yield
    if signal.getsignal(signal.SIGCHLD) is not before:
        signal.signal(signal.SIGCHLD, before)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests need CUDA: skipped, saying so, where torch sees none."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Any:
    """After pytest-qt has closed a test's widgets: delete them now. It closes them with
    deleteLater, which only an event loop carries out, and a test that runs none (most use
    processEvents) left every window it made alive, timers and all: each later stylesheet
    polished them again, and a worker's last window tests ran 15 to 20 times slower than alone."""
    result = yield
    qt = sys.modules.get("PySide6.QtWidgets")
    app = qt.QApplication.instance() if qt is not None else None
    if app is not None:
        from PySide6.QtCore import QEvent
        app.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    return result
