"""Run > Start on server...: the form's settings started on another machine by `headroom-ctl
start` over ssh (app/session/server_start.py), detached there (tmux, else setsid), then opened
as any remote run. The dialog asks for the host, the python there (remembered per host, as Open
remote run does), the task file on the server (remembered per host) and, if wanted, the run
folder there; the command it will run shows below as it is built. Closing the app later leaves
the run training: it was started detached from the connection."""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLineEdit, QWidget

from app.core.preferences import Preferences
from app.session.configs import launch_config
from app.session.server_start import ServerRun, command_line, server_flags, start
from app.ui.shell.background import Background
from app.ui.shell.remote_fields import RemoteFields
from engine.declarations.config import ConfigError
from engine.declarations.paths import BUILTIN_TASKS

from .gpu_dialog import command_and_start

log = logging.getLogger("headroom.server")

# The last server started on, and each server's task file (preference keys).
SERVER_LAST, SERVER_TASKS = "server_last", "server_task"
MIN_WIDTH = 560


class ServerStartDialog(QDialog):
    def __init__(self, parent: Optional[QWidget], prefs: Preferences, flags_for: Callable[[str], list[str]],
                 form_task: str = "") -> None:
        """flags_for: the engine's flags for the form's settings with this task (raises ConfigError);
        form_task: the form's task, offered when it is a built-in name (a file here is not there)."""
        super().__init__(parent)
        self.setWindowTitle("Start on server")
        self.setObjectName("server_start_dialog")
        self.setMinimumWidth(MIN_WIDTH)
        self.prefs, self._flags_for = prefs, flags_for
        self.flags: list[str] = []
        self._form_task = form_task if form_task in BUILTIN_TASKS else ""
        self.host = QLineEdit(str(prefs.get_json(SERVER_LAST, "") or ""))
        self.host.setObjectName("server_host")
        self.host.setPlaceholderText("[user@]host")
        self.host.setToolTip("The machine to train on, reached with your ssh and its config (a Host of ~/.ssh/config too)")
        self.task = QLineEdit()
        self.task.setObjectName("server_task")
        self.task.setPlaceholderText("path/to/task.py on the server, or mlp, charlm, cnn-bn")
        self.task.setToolTip("The task file already on the server (a relative path starts in the remote home), or "
                             "a built-in task")
        self.run_dir = QLineEdit()
        self.run_dir.setObjectName("server_run_dir")
        self.run_dir.setPlaceholderText("a new folder under the server's runs root")
        form = QFormLayout()
        form.addRow("Server", self.host)
        self.fields = RemoteFields(prefs, form)
        form.addRow("Task file there", self.task)
        form.addRow("Run folder there", self.run_dir)
        self.command_text, self.buttons = command_and_start(self, form)
        self._host_changed()
        self.host.editingFinished.connect(self._host_changed)
        for edit in (self.host, self.fields.python, self.task, self.run_dir):
            edit.textChanged.connect(lambda *_: self.preview())
        self.preview()

    def _host_changed(self) -> None:
        host = self.host.text().strip()
        self.fields.host_changed(host)
        saved = self.prefs.get_json(SERVER_TASKS, {})
        task = saved.get(host) if isinstance(saved, dict) else None
        self.task.setText(str(task or self._form_task))

    def run(self) -> ServerRun:
        """What the dialog says to start (raises ConfigError)."""
        return ServerRun(self.host.text(), self.fields.python.text(), self.task.text(), self.run_dir.text()).check()

    def preview(self) -> bool:
        """The command the Start button runs, or why it cannot start; Start is enabled with a command."""
        try:
            run = self.run()
            self.flags = self._flags_for(run.task)
            text, ok = command_line(run, self.flags), True
        except ConfigError as e:
            text, ok = f"Cannot start: {e}", False
        self.command_text.setPlainText(text)
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(ok)
        return ok

    def save(self, run: ServerRun) -> None:
        """Remembered for next time: the server, its python and task file, the ssh command."""
        self.fields.save(run.host)
        self.prefs.set_json(SERVER_LAST, run.host)
        saved = self.prefs.get_json(SERVER_TASKS, {})
        saved = saved if isinstance(saved, dict) else {}
        saved[run.host] = run.task
        self.prefs.set_json(SERVER_TASKS, saved)


class ServerStarter(QObject):
    """Starts the dialog's run off the GUI thread (the engine loads torch and the task before it
    holds its folder), then opens it as a remote run."""

    def __init__(self, parent: QWidget, prefs: Preferences, open_run: Callable[[str], bool],
                 error: Callable[[str, str], Any], say: Callable[[str], None]) -> None:
        super().__init__(parent)
        self.parent_widget, self.prefs, self.open_run, self.error, self.say = parent, prefs, open_run, error, say
        self.dialog: Optional[ServerStartDialog] = None
        self.starting: Optional[ServerRun] = None  # the run being started now
        self.started: list[str] = []  # host:run folder of each run started
        self.background = Background(self)

    def open(self, flags_for: Callable[[str], list[str]], form_task: str) -> ServerStartDialog:
        d = ServerStartDialog(self.parent_widget, self.prefs, flags_for, form_task)
        d.accepted.connect(lambda: self._accepted(d))
        d.finished.connect(d.deleteLater)
        self.dialog = d
        d.open()
        return d

    def open_for_form(self, values: Optional[dict[str, Any]], form_error: str,
                      base_config: dict[str, Any]) -> Optional[ServerStartDialog]:
        """The dialog for the form's settings (every declared setting, over the command line's
        base config), or the form's refusal said (None)."""
        try:
            if values is None:
                raise ConfigError(form_error)
            config = launch_config(base_config, values)
        except ConfigError as e:
            self.error("Cannot start on a server", str(e))
            return None
        return self.open(lambda task: server_flags(config, task), str(values.get("task") or ""))

    def _accepted(self, d: ServerStartDialog) -> None:
        if not d.preview():
            return
        run = d.run()
        d.save(run)
        self.start(run, list(d.flags))

    def start(self, run: ServerRun, flags: list[str]) -> bool:
        if self.starting is not None:
            self.error("Cannot start on the server", f"A run is still starting on {self.starting.host}: "
                                                     "wait for it to open.")
            return False
        self.starting = run
        self.say(f"Starting a run on {run.host}...")
        self.background.run(lambda: start(run, flags), self._done, "server-start")
        return True

    def _done(self, result: Any) -> None:
        run, self.starting = self.starting, None
        if isinstance(result, Exception):
            self.say("")
            self.error("Could not start on the server", f"{run.host if run else 'the server'}: {result}")
            return
        self.started.append(result)
        self.say(f"Started {result}; it trains on there whether or not this window follows it")
        self.open_run(result)
