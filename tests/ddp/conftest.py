"""Every test in this folder starts several processes (torchrun, gloo) or tests their parts: `ddp`."""
from __future__ import annotations

import pathlib

import pytest

_HERE = pathlib.Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.ddp)
