"""Fixtures for the engine tests; the helpers live in engine_helpers.py (imported by name:
tests/engine has no __init__.py, so that a package called `engine` never shadows the real one)."""
from __future__ import annotations

import pytest

import engine_helpers  # noqa: F401  - puts the repository root on sys.path first


@pytest.fixture(autouse=True)
def _isolated_runs_root(tmp_path, monkeypatch):
    """A run that forgot --run-dir lands in the test's folder, never in the user's home."""
    monkeypatch.setenv("HEADROOM_RUNS", str(tmp_path / "default-runs"))
