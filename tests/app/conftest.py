"""pytest-qt fixtures for the app tests (settings/runs/log isolation: tests/conftest.py). Helpers: app_helpers.py."""
from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
from app_helpers import ROOT  # noqa: E402,F401 - sets up sys.path and app.compat first


@pytest.fixture
def make_window(qtbot: Any) -> Iterator[Callable[..., Any]]:
    """MainWindow factory; every window is closed (and its engine thread joined) and deleted at
    teardown, as qtbot.addWidget would, but skipping one app_helpers.discard deleted already
    (pytest-qt would call close() on its deleted C++ object)."""
    from shiboken6 import isValid

    from app.main_window import MainWindow
    made: list[Any] = []

    def make(base_config: dict | None = None, **kw: Any) -> Any:
        w = MainWindow(base_config=dict(base_config or {}), restore_settings=kw.pop("restore_settings", False), **kw)
        w.show()
        made.append(w)
        return w

    yield make
    for w in made:
        if not isValid(w):
            continue
        w.close()
        if w.runner.is_busy():
            w.close()
            assert w.runner.join(10.0), "engine thread did not stop"
        w.deleteLater()
