"""pytest-qt fixtures for the app tests (settings/runs/log isolation: tests/conftest.py). Helpers: app_helpers.py."""
from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
from app_helpers import ROOT  # noqa: E402,F401 - sets up sys.path and app.compat first


@pytest.fixture
def make_window(qtbot: Any, request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """MainWindow factory; every window is closed (and its engine thread joined) and deleted at
    teardown, as qtbot.addWidget would, but skipping one app_helpers.discard deleted already
    (pytest-qt would call close() on its deleted C++ object)."""
    from shiboken6 import isValid

    from app.main_window import MainWindow
    made: list[Any] = []
    request.node.windows_made = made  # for pytest_runtest_call below

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


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Right after the test's body, before pytest-qt processes its last events: delete the idle
    windows whose plots were never built. A window builds them just after it first paints, and a
    test that ran no event loop (one about the form, the menus or a dialog) had them built then,
    where nothing looked at them: 1 to 2 s of a 2 s test. (A trylast wrapper runs inside
    pytest-qt's tryfirst one, whose processEvents comes after it.)"""
    try:
        return (yield)
    finally:
        _delete_unbuilt(getattr(item, "windows_made", ()))


def _delete_unbuilt(windows: Any) -> None:
    """Close and delete, now, the windows of `windows` still alive, idle and without plots."""
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication
    from shiboken6 import isValid
    unbuilt = [w for w in windows if isValid(w) and w._plots is None and not w.runner.is_busy()]
    for w in unbuilt:
        w.close()
        w.deleteLater()
    if unbuilt:
        QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
