"""Run > Start on server... through a real sshd on 127.0.0.1 (tests/ctl/sshkit.py): the dialog
starts the form's settings on the "server" with `headroom-ctl start` (detached there, in tmux),
the window follows the run; closing the window leaves it training, and another window opening
it follows it and stops it, row for row as its run.db holds it. The ssh command comes from the
app's preference (HEADROOM_SSH_COMMAND unset), typed into the dialog."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from app_helpers import FAST, ROOT, discard
from PySide6.QtWidgets import QDialogButtonBox

sys.path.insert(0, os.path.join(ROOT, "tests", "ctl"))
import sshkit  # noqa: E402 - after the sys.path set-up above
from ctlkit import db_rows  # noqa: E402 - after the sys.path set-up above

sshd = sshkit.sshd  # the shared server fixture (tests/ctl/sshkit.py)

pytestmark = pytest.mark.slow


@pytest.fixture
def server(sshd, monkeypatch, tmp_path):
    monkeypatch.delenv("HEADROOM_SSH_COMMAND", raising=False)  # the preference, typed into the dialog
    runs, tmux_dir = tmp_path / "server-runs", tmp_path / "tmux"
    tmux_dir.mkdir()
    yield sshd, runs, sshd.python_with(HEADROOM_RUNS=str(runs), TMUX_TMPDIR=str(tmux_dir))
    subprocess.run(["tmux", "kill-server"], env=dict(os.environ, TMUX_TMPDIR=str(tmux_dir)), capture_output=True)


def shown_steps(w) -> list[int]:
    return [int(s) for s in w.model.metrics.view("step")]


def test_start_on_server_from_the_dialog_trains_on_after_the_window_closes(qtbot, make_window, server):
    from app.core.preferences import Preferences
    from app.ui.controls.server_dialog import SERVER_TASKS
    from app.ui.shell.remote_fields import REMOTE_PYTHONS, SSH_COMMAND
    sshd, runs, python = server
    w = make_window({"seed": 3})
    w.controls.set_values({**FAST, "micro_batch": 8, "epochs": 200})  # until it is stopped
    d = w.start_on_server_dialog()
    d.host.setText(sshkit.HOST)
    d.host.editingFinished.emit()
    assert d.task.text() == "mlp"  # the form's built-in task (a task file would be asked for)
    d.fields.python.setText(python)
    d.fields.ssh.setText(sshd.env["HEADROOM_SSH_COMMAND"])
    assert "--epochs 200" in d.command_text.toPlainText() and "--micro-batch 8" in d.command_text.toPlainText()
    d.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    qtbot.waitUntil(lambda: bool(w.server.started) or bool(w.dialogs), timeout=180_000)
    assert not w.dialogs, w.last_error
    target = w.server.started[0]
    run_dir = target.partition(":")[2]
    assert target.startswith(f"{sshkit.HOST}:") and os.path.dirname(run_dir) == str(runs)
    qtbot.waitUntil(lambda: w.session.remote and len(shown_steps(w)) >= 3, timeout=120_000)
    discard(w)  # the laptop closes: the run was started detached, it trains on
    closed = time.time()

    prefs = Preferences()  # remembered: the python and the task for that server, the ssh command
    assert prefs.get_json(REMOTE_PYTHONS, {})[sshkit.HOST] == python
    assert prefs.get_json(SERVER_TASKS, {})[sshkit.HOST] == "mlp"
    assert prefs.get_json(SSH_COMMAND, "") == sshd.env["HEADROOM_SSH_COMMAND"]
    qtbot.waitUntil(lambda: any(m["time"] > closed + 1 for m in db_rows(run_dir)), timeout=120_000)
    again = make_window()  # reads the ssh command preference
    assert again.open_run(target)
    assert again.session.state.is_live
    again.stop_run()  # through headroom-ctl stop over ssh
    qtbot.waitUntil(lambda: again.session.state.value == "finished", timeout=180_000)
    assert shown_steps(again) == [m["step"] for m in db_rows(run_dir)]  # to its end, row for row
    assert os.path.exists(os.path.join(run_dir, "checkpoints", "last.pt"))
