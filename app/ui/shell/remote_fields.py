"""What the remote dialogs (Open remote run, Start on server) share: the python that has Headroom
on the host (remembered per host) and the ssh command. The ssh command is a preference, read
when HEADROOM_SSH_COMMAND is not set (the variable wins, as for headroom-ctl and as git's
GIT_SSH_COMMAND does): `ssh -F ~/work/ssh_config`, say. Nothing secret is stored here: ssh
keeps keys and known hosts itself."""
from __future__ import annotations

import os

from PySide6.QtWidgets import QFormLayout, QLineEdit

from app.core.preferences import Preferences
from engine.ctl import client

# The last remote run opened, each host's python, and the ssh command (preference keys).
REMOTE_LAST, REMOTE_PYTHONS, SSH_COMMAND = "remote_last", "remote_python", "ssh_command"


def host_of(target: str) -> str:
    return target.strip().partition(":")[0]


def remembered_python(prefs: Preferences, host: str) -> str:
    """The python remembered for host ('' if none: headroom-ctl's default)."""
    saved = prefs.get_json(REMOTE_PYTHONS, {})
    return str(saved.get(host) or "") if isinstance(saved, dict) else ""


def remember_python(prefs: Preferences, host: str, python: str) -> None:
    saved = prefs.get_json(REMOTE_PYTHONS, {})
    saved = saved if isinstance(saved, dict) else {}
    saved[host] = python
    prefs.set_json(REMOTE_PYTHONS, saved)


def ssh_preference(prefs: Preferences) -> str:
    return str(prefs.get_json(SSH_COMMAND, "") or "")


def use_ssh_preference(prefs: Preferences) -> None:
    """Hand the preference to headroom-ctl's client (engine/ctl/client), below the variable."""
    client.set_ssh_fallback(ssh_preference(prefs))


def set_ssh_preference(prefs: Preferences, text: str) -> None:
    prefs.set_json(SSH_COMMAND, text.strip())
    use_ssh_preference(prefs)


class RemoteFields:
    """The python and ssh command rows of a remote dialog's form."""

    def __init__(self, prefs: Preferences, form: QFormLayout) -> None:
        self.prefs = prefs
        self.python = QLineEdit()
        self.python.setObjectName("remote_python")
        self.python.setToolTip("The python that has Headroom on that machine (remembered for each host), e.g. "
                               f"~/headroom/.venv/bin/python; ${client.PYTHON_ENV} is the default")
        self.ssh = QLineEdit()
        self.ssh.setObjectName("ssh_command")
        self.ssh.setPlaceholderText("ssh")
        env = os.environ.get(client.SSH_ENV, "").strip()
        if env:  # the variable wins: shown, not editable here
            self.ssh.setText(env)
            self.ssh.setEnabled(False)
            self.ssh.setToolTip(f"Set by {client.SSH_ENV} (it wins over the preference)")
        else:
            self.ssh.setText(ssh_preference(prefs))
            self.ssh.setToolTip("The ssh client's command, kept as a preference (e.g. ssh -F ~/work/ssh_config); "
                                f"{client.SSH_ENV} wins when set. Keys, the agent and known_hosts are ssh's own")
        form.addRow("Python there", self.python)
        form.addRow("ssh command", self.ssh)

    def host_changed(self, host: str) -> None:
        """The python remembered for that host (else the default)."""
        self.python.setText(remembered_python(self.prefs, host) or client.default_python())

    def save(self, host: str) -> None:
        remember_python(self.prefs, host, self.python.text().strip())
        if self.ssh.isEnabled():
            set_ssh_preference(self.prefs, self.ssh.text())
