"""A run on another machine whose connection drops: a banner over the plots says so ("connection
lost: reconnecting, last row at step N") and the status is not "Training" meanwhile; both go once
the follow is back. The ssh client is tests/app/fake_ssh.py (the remote command runs here)."""
from __future__ import annotations

import os
import shlex
import signal
import sys

import pytest
from app_helpers import ROOT, wait_until
from live_folder import LiveFolder

pytestmark = pytest.mark.slow


@pytest.fixture
def live_run(tmp_path):
    run = LiveFolder(tmp_path / "server run")
    yield run
    run.end()


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    down = tmp_path / "network-down"
    monkeypatch.setenv("HEADROOM_SSH_COMMAND", shlex.join([sys.executable, os.path.join(ROOT, "tests", "app",
                                                                                        "fake_ssh.py")]))
    monkeypatch.setenv("HEADROOM_REMOTE_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # headroom-ctl "there" is this checkout's
    monkeypatch.setenv("FAKE_SSH_DOWN", str(down))
    return down


def test_a_lost_connection_is_a_banner_over_the_plots_and_not_training(qtbot, make_window, live_run, fake_ssh):
    w = make_window()
    assert w.open_run(f"server:{live_run.run_dir}")  # 20 steps so far
    src = w.session.source
    wait_until(qtbot, lambda: w.model.step == 20 and src.connection == "connected", 30, "the run followed")
    w.views.update_status()
    assert w.status.state.text() == "Training" and w.ui_state() == "training"
    assert not w.central.banner.isVisible()

    fake_ssh.touch()  # the network goes
    os.kill(src._following.ssh_pid, signal.SIGKILL)  # and the follow with it
    wait_until(qtbot, lambda: w.central.banner.isVisible(), 30, "the banner")
    assert w.central.banner.text() == "connection lost: reconnecting, last row at step 20"
    w.views.update_status()
    assert w.status.state.text() == "Connection lost: reconnecting" and w.ui_state() == "reconnecting"
    assert "Connection lost" in w.controls.run_state.text()
    assert w.controls.is_running()  # the form still steers the run it shows

    live_run.add(5)
    fake_ssh.unlink()  # the network is back
    wait_until(qtbot, lambda: w.model.step == 25 and not w.central.banner.isVisible(), 30, "the follow back")
    w.views.update_status()
    assert w.status.state.text() == "Training" and w.ui_state() == "training"
