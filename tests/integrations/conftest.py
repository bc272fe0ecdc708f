"""Fixtures for tests/integrations; helpers in integ_helpers.py."""
from __future__ import annotations

import pytest

import integ_helpers  # noqa: F401 - offline Hugging Face, the repository first on sys.path


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Runs, app settings and the Hugging Face cache in the test's folder, never the user's."""
    monkeypatch.setenv("HEADROOM_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("HEADROOM_SETTINGS", str(tmp_path / "settings.ini"))
    monkeypatch.setenv("HEADROOM_LOG", str(tmp_path / "headroom.log"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path
