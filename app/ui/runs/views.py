"""Keeps the views in step with the session: the session's typed signals go to the Controls
panel, the alerts, the plots and the status bar; and the one rule for the Run actions is
applied whenever the run state, the form's edits or the GPU count change."""
from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QObject

from app.model.lineage import checkpoints
from app.model.runmodel import RunModel
from app.model.state import RunState
from app.runner.session_driver import SessionDriver
from app.session.launch_command import MIN_GPUS
from app.ui.actions import AppActions, RunActions
from app.ui.alerts import AlertsPanel
from app.ui.controls.panel import ControlsPanel
from app.ui.shell.pacing import PlotPacer
from app.ui.shell.statusbar import StatusBar, state_text


def ended_detail(state: RunState, model: RunModel) -> str:
    """The line under 'Ready' once a run has ended: how, and why (app/model/ending.py)."""
    if not state.is_over:
        return ""
    end = model.ending()
    return f"Last run: {end.word.lower()} at step {model.step:,}" + (f": {end.why}." if end.why else ".")


class RunViews(QObject):
    def __init__(self, driver: SessionDriver, controls: ControlsPanel, alerts: AlertsPanel, status: StatusBar,
                 run_actions: RunActions, app_actions: AppActions, plots: Callable[[], Any]) -> None:
        """plots: the PlotPanel, or None while pyqtgraph has not loaded yet."""
        super().__init__(driver)
        self.driver, self.session = driver, driver.session
        self.controls, self.alerts, self.status = controls, alerts, status
        self.run_actions, self.app_actions = run_actions, app_actions
        self._plots = plots
        self.pacer = PlotPacer(plots, self)
        s, c = driver.signals, controls
        s.model_replaced.connect(self._on_model_replaced)
        s.state_changed.connect(lambda _state: self.sync_state())
        s.run_started.connect(c.on_run_started)
        s.micro_batch_found.connect(c.on_micro_batch_found)
        s.memory_forecast.connect(c.on_memory_forecast)
        s.engine_values.connect(c.on_engine_values)
        s.pending_changed.connect(c.on_pending_changed)
        s.alerts_added.connect(alerts.add)
        s.data_changed.connect(self.pacer.mark_due)
        c.edits_changed.connect(self.sync_actions)
        self.shown_dir = ""  # the folder of the run shown (this window's or one opened)
        driver.run_dir_known.connect(self._shown)
        driver.launcher.gpu_count_known.connect(lambda *_: self.sync_state())

    def sync_state(self) -> None:
        ses = self.session
        view = ses.view_state()
        detail = ended_detail(ses.state, ses.model) if not ses.state.is_live else ""
        self.controls.set_state("idle" if view == "viewing" else view, detail, remote=ses.remote)
        self.sync_actions()
        panel = self._plots()
        if panel is not None:
            panel.set_live(ses.state.is_live)
        self.update_status()

    def sync_actions(self) -> None:
        launcher = self.driver.launcher
        allowed = self.session.allowed(self.controls.edits_ready(), launcher.gpu_count or 0, MIN_GPUS,
                                       bool(self.continuable()))
        self.run_actions.sync(allowed)
        self.app_actions.set_launch_gate(allowed.launch, launcher.tooltip(), launcher.has_log())

    def _shown(self, path: str) -> None:
        self.shown_dir = path
        self.sync_actions()

    def continuable(self) -> str:
        """The folder Continue run continues ('' : none): the run shown, once it is over, if it
        has a checkpoint."""
        if not self.shown_dir or self.session.state.is_live or not checkpoints(self.shown_dir):
            return ""
        return self.shown_dir

    def update_status(self) -> None:
        ses = self.session
        self.status.update_from(ses.model, ses.state, state_text(ses.view_state(), ses.state, ses.model))

    def _on_model_replaced(self, model: RunModel) -> None:
        panel = self._plots()
        if panel is not None:
            panel.set_model(model)
        self.alerts.clear()
        self.controls.on_model_replaced()
