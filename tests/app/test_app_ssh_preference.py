"""The ssh command as an app preference: typed into the Open remote run dialog, kept in the
settings, read by the next window, and used by every ssh the app runs when HEADROOM_SSH_COMMAND
is not set; when it is set, the variable wins and the dialog shows it, not editable."""
from __future__ import annotations

import pytest
from app_helpers import ROOT  # noqa: F401 - sys.path and app.compat first


@pytest.fixture
def clean_fallback(monkeypatch):
    from engine.ctl import remote
    monkeypatch.delenv("HEADROOM_SSH_COMMAND", raising=False)
    yield remote
    remote.set_ssh_fallback("")  # process-wide: no other test inherits this one's


@pytest.mark.slow
def test_the_ssh_command_preference_round_trips_and_is_used(qtbot, make_window, clean_fallback, monkeypatch):
    from app.core.preferences import Preferences
    from app.ui.shell.dialogs import RemoteRunDialog
    from app.ui.shell.remote_fields import SSH_COMMAND
    remote = clean_fallback
    d = RemoteRunDialog(None, Preferences())
    qtbot.addWidget(d)
    assert d.fields.ssh.isEnabled() and d.fields.ssh.text() == ""
    d.target.setText("me@gpu-box:runs/exp1")
    d.fields.python.setText("~/hr/.venv/bin/python")
    d.fields.ssh.setText("ssh -F '/home/me/work dir/ssh_config'")
    assert d.chosen() == "me@gpu-box:runs/exp1"
    assert Preferences().get_json(SSH_COMMAND, "") == "ssh -F '/home/me/work dir/ssh_config'"

    remote.set_ssh_fallback("")  # as a fresh app: the next window reads the preference
    make_window()
    argv = remote.ssh_argv("me@gpu-box", "python3", ["runs"])
    assert argv[:3] == ["ssh", "-F", "/home/me/work dir/ssh_config"] and "BatchMode=yes" in argv
    again = RemoteRunDialog(None, Preferences())  # the dialog shows what was kept, and the host's python
    qtbot.addWidget(again)
    assert again.fields.ssh.text() == "ssh -F '/home/me/work dir/ssh_config'"
    assert again.target.text() == "me@gpu-box:runs/exp1" and again.fields.python.text() == "~/hr/.venv/bin/python"

    monkeypatch.setenv("HEADROOM_SSH_COMMAND", "ssh -F /etc/other_config")  # the variable wins
    assert remote.ssh_argv("h", "python3", ["runs"])[:3] == ["ssh", "-F", "/etc/other_config"]
    shown = RemoteRunDialog(None, Preferences())
    qtbot.addWidget(shown)
    assert not shown.fields.ssh.isEnabled() and shown.fields.ssh.text() == "ssh -F /etc/other_config"


def test_a_malformed_ssh_preference_is_named(clean_fallback):
    from engine.ctl.protocol import CtlError
    clean_fallback.set_ssh_fallback("ssh -F 'unclosed")
    with pytest.raises(CtlError, match="ssh command preference"):
        clean_fallback.ssh_argv("h", "python3", ["runs"])
