"""Which run's settings the Controls panel holds, and a line above the form that says so.

- A run folder opened (finished, or followed while another process trains it): the form
  takes the settings that run started with (its run table's config), with its live settings
  as the run has them now (its rows and settings_applied events: a change headroom-ctl or
  another window made shows), and the line says whose they are and that Start trains a new
  run with them. "My settings" puts the form
  back as it was before; "Reset to defaults" gives the engine's defaults.
- This window's own run, once it has ended: the live fields go back to what Start sent, with
  the changes the user applied on top. A change the engine made by itself (a rollback's
  lower lr, a smaller micro-batch after an out-of-memory error) belonged to that run, not to
  the next one.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.model.fields import same, words
from app.model.pending import ChangeStatus
from app.runner.session_driver import SessionDriver
from app.ui.controls.panel import ControlsPanel
from engine.declarations.config import TrainConfig
from engine.declarations.settings import LIVE_NAMES

NOT_FORM = ("run_dir", "resume", "fork", "max_steps", "seed")  # run flags the form has no field for


def defaults() -> dict[str, Any]:
    """The engine's default settings, as the form's fields."""
    return {k: v for k, v in TrainConfig().to_dict().items() if k not in NOT_FORM}


class FormBanner(QWidget):
    def __init__(self, parent: Optional[QWidget] = None) -> None:
        super().__init__(parent)
        self.setObjectName("form_banner")
        self.label = QLabel("")
        self.label.setObjectName("hint")
        self.label.setWordWrap(True)
        self.mine = QPushButton("My settings")
        self.mine.setToolTip("Put back the settings the form held before this run's were shown")
        self.reset = QPushButton("Reset to defaults")
        self.reset.setToolTip("Fill the form with the engine's default settings")
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.mine)
        row.addWidget(self.reset)
        row.addStretch(1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(2)
        lay.addWidget(self.label)
        lay.addLayout(row)
        self.show_run("")

    def show_run(self, text: str) -> None:
        self.label.setText(text)
        self.label.setVisible(bool(text))


class FormFollowsRun(QObject):
    def __init__(self, driver: SessionDriver, controls: ControlsPanel) -> None:
        super().__init__(driver)
        self.driver, self.controls = driver, controls
        self.banner = FormBanner()
        lay = controls.layout()
        assert isinstance(lay, QVBoxLayout)  # the panel's column
        lay.insertWidget(2, self.banner)  # under the Run buttons and where the run stands
        self.user_form: Optional[dict[str, Any]] = None  # the form before a run's settings replaced it
        self.shown_run = ""  # the folder whose settings the form holds ('' : the user's own)
        self.started: dict[str, Any] = {}  # what this window's Start sent (its live fields)
        self.user_changes: dict[str, Any] = {}  # live changes the user applied to this window's run
        self.banner.mine.clicked.connect(self.restore_user_form)
        self.banner.reset.clicked.connect(self.reset_to_defaults)
        self._before: Optional[dict[str, Any]] = None  # the form as a new run model came in
        driver.signals.model_replaced.connect(lambda _m: self._remember_form())
        driver.folder_opened.connect(self.show_run_settings)
        driver.run_done.connect(lambda _outcome: self.own_run_ended())
        driver.signals.micro_batch_found.connect(self.finder_chose)
        self._sync_mine()

    # -- a run folder shown ------------------------------------------------------------------
    def show_run_settings(self, path: str) -> None:
        """The run's settings: those it was started with, and its live settings as it has them
        now (what its own rows and settings_applied events say, session.pending.engine), never the
        started-with values of a setting it has changed since."""
        session = self.driver.session
        cfg = session.model.config
        if session.state.is_live and not session.remote:
            return
        if not cfg:
            return
        if not self.shown_run:
            self.user_form = self._before
        self.shown_run = path
        self.controls.set_values({k: v for k, v in cfg.items() if k not in NOT_FORM})
        now = {n: v for n, v in session.pending.engine.items() if n in LIVE_NAMES}
        self.controls.show_run_values(now)
        name = os.path.basename(os.path.normpath(path))
        changed = [n for n in LIVE_NAMES if n in now and n in cfg and not same(cfg[n], now[n])]
        live = ("training in another process: the live settings follow it" if session.remote else
                "the live settings as it ended" if changed else "")
        since = f"; changed since its start: {', '.join(words(n) for n in changed)}" if changed else ""
        head = f"{name}'s settings ({live}{since})" if live else f"The settings {name} started with"
        self.banner.show_run(f"{head}. Start trains a new run with them; edit them first to change it.")
        self._sync_mine()

    def _remember_form(self) -> None:
        """Before the new run's values reach the live fields: the form as the user left it."""
        if not self.shown_run:
            self._before, _err = self.controls.values()

    def restore_user_form(self) -> None:
        if self.user_form:
            self.controls.set_values(self.user_form)
        self._forget_shown()

    def reset_to_defaults(self) -> None:
        self.controls.set_values(defaults())
        self._forget_shown()

    def _forget_shown(self) -> None:
        self.shown_run, self.user_form = "", None
        self.banner.show_run("")
        self._sync_mine()

    def _sync_mine(self) -> None:
        self.banner.mine.setVisible(self.user_form is not None)

    # -- this window's own run ----------------------------------------------------------------
    def started_run(self, values: dict[str, Any]) -> None:
        """Start sent these (the form's values)."""
        self._forget_shown()
        self.started = {n: values[n] for n in LIVE_NAMES if n in values}
        self.user_changes = {}

    def finder_chose(self, micro_batch: int, accum: int, _probes: int = 0, _peak: int = 0) -> None:
        """--find-micro-batch: the run started with what the finder chose, not what Start sent."""
        if self.started:
            self.started.update(micro_batch=micro_batch, accum=accum)

    def applied_by_user(self, edits: dict[str, Any]) -> None:
        self.user_changes.update(edits)

    def own_run_ended(self) -> None:
        if not self.started:
            return
        pending = self.driver.session.pending
        back = dict(self.started)
        for name, value in self.user_changes.items():
            change = pending.get(name)
            if change is not None and change.status is ChangeStatus.APPLIED and not change.by_rule:
                back[name] = value
        self.controls.live.set_values(back)
        self.controls.live.update_effective()
        self.started, self.user_changes = {}, {}
