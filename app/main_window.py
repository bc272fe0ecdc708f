"""The main window: layout and wiring.

It lays out the Controls panel, the plots, alerts, run history and the status bar, builds
the actions, and connects them: actions and panels to the session driver
(app/runner/session_driver.py), the session's typed signals to the views. Where a run stands
is the session's to decide; training is the engine's. torch is never imported here.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QApplication, QMainWindow, QMessageBox

from engine.declarations.paths import default_runs_root

from .core import assets, logs
from .core.preferences import Preferences
from .model.runmodel import RunModel
from .model.title import window_title
from .runner.launcher import Launch
from .runner.session_driver import SessionDriver
from .ui import actions, export
from .ui.alerts import AlertsPanel
from .ui.controls.panel import ControlsPanel
from .ui.controls.run_starter import RunStarter
from .ui.controls.server_dialog import ServerStarter
from .ui.runs.form_sync import FormFollowsRun
from .ui.runs.history import HistoryPanel
from .ui.runs.tree_views import RunTreeViews
from .ui.runs.views import RunViews
from .ui.runs.what_fits import LeversPanel
from .ui.shell import dialogs, keys, layout, wheel, window_prefs
from .ui.shell.close_question import CloseQuestion, stop_engine
from .ui.shell.desktop_notices import DesktopNotices
from .ui.shell.field_notices import FieldNotices
from .ui.shell.loading import PlotsArea
from .ui.shell.pacing import TICK_MS
from .ui.shell.remote_fields import use_ssh_preference
from .ui.shell.statusbar import StatusBar
from .ui.shell.view_prefs import ViewPrefs
from .ui.theme import THEMES, apply_stylesheet, system_theme

log = logging.getLogger("headroom.window")

STATUS_EVERY = 8  # status bar every 8th tick (~4 Hz)
JOIN_S = 2.0  # closing waits this long for the engine thread, then hides and closes when it ends


class MainWindow(QMainWindow):
    closed = Signal()  # closed for good (also after a hidden wait for the engine thread): quit the app

    def __init__(self, base_config: Optional[dict[str, Any]] = None, theme: Optional[str] = None,
                 preferences: Optional[Preferences] = None, restore_settings: bool = True) -> None:
        """base_config: run flags given on the command line (TrainConfig fields); they fill
        the form and the fields the form has no widget for (max_steps, seed, run_dir...)."""
        super().__init__()
        logs.setup()
        logs.report_uncaught(self.slot_failed)  # an exception in any slot: logged, and an alert row
        self.preferences = preferences or Preferences()
        use_ssh_preference(self.preferences)  # the ssh command for remote runs, when HEADROOM_SSH_COMMAND is unset
        self.base_config = dict(base_config or {})
        self.theme = theme if theme in THEMES else (self.preferences.theme() or system_theme())
        self.driver = SessionDriver(self)
        self.session = self.driver.session
        self.runner = self.driver.runner
        self.launcher = self.driver.launcher
        self.errors = dialogs.ErrorDialogs(self)
        self.run_done_callbacks: list[Callable[[dict[str, Any]], None]] = []
        self.about_dialog: Any = None
        self.shortcuts_dialog: Any = None
        self._close_when_done = False  # hidden while the engine thread ends: close once it has
        self._really_closing = False  # close without stopping the engine first (it has ended)
        self._tick_n = 0
        self._tick_failed = False
        self.setWindowTitle("Headroom")
        self.setWindowIcon(assets.app_icon())
        self.setObjectName("MainWindow")
        apply_stylesheet(self.theme)
        app = QApplication.instance()
        assert isinstance(app, QApplication)  # a window needs one
        wheel.install(app)  # the wheel changes no setting it passes over
        keys.install(app, self)  # its shortcuts work while a field has the focus

        self.plot_listeners: list[Callable[[Any], None]] = []  # called once the plots exist
        self.central = PlotsArea(self._make_plots, self._plots_built)  # "Loading plots...", then the plots
        self.setCentralWidget(self.central)

        self.run_actions = actions.RunActions(self)
        self.app_actions = actions.AppActions(self)
        self.controls = ControlsPanel(self.run_actions, self.session.pending)
        self.alerts = AlertsPanel()
        self.history = HistoryPanel(default_runs_root())
        self.levers = LeversPanel()
        self.status = StatusBar(self)
        self.setStatusBar(self.status)
        self.live_label = self.status.live  # "live: pid N on HOST" while the run shown is going
        self.setCorner(Qt.Corner.BottomLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.controls_dock = layout.make_dock(self, "Controls", "controls", self.controls,
                                              Qt.DockWidgetArea.LeftDockWidgetArea,  # Apply pinned in view
                                              footer=(self.controls.apply_button, self.controls.apply_hint))
        self.alerts_dock = layout.make_dock(self, "Alerts", "alerts", self.alerts, Qt.DockWidgetArea.BottomDockWidgetArea)
        self.history_dock = layout.make_dock(self, "Run history", "history", self.history, Qt.DockWidgetArea.BottomDockWidgetArea)
        self.levers_dock = layout.make_dock(self, "What fits", "levers", self.levers, Qt.DockWidgetArea.BottomDockWidgetArea)
        self.tabifyDockWidget(self.alerts_dock, self.history_dock)
        self.tabifyDockWidget(self.history_dock, self.levers_dock)
        self.alerts_dock.raise_()
        self.dock_layout = layout.DockLayout(self, self.controls_dock, self.alerts_dock)
        docks = (self.controls_dock, self.alerts_dock, self.history_dock, self.levers_dock)
        self.run_toolbar, self.run_menu = actions.install(self, self.run_actions, self.app_actions,
                                                          [d.toggleViewAction() for d in docks])
        ra, aa = self.run_actions, self.app_actions
        self.start_action, self.pause_action, self.resume_action = ra.start, ra.pause, ra.resume
        self.stop_action, self.apply_action, self.continue_action = ra.stop, ra.apply, ra.cont
        self.log_action, self.theme_action, self.about_action = aa.log_scale, aa.theme, aa.about
        self.torchrun_action, self.open_log_action = aa.torchrun, aa.open_log
        self.theme_action.setChecked(self.theme == "dark")
        self.views = RunViews(self.driver, self.controls, self.alerts, self.status, ra, aa, lambda: self._plots)
        self.pacer = self.views.pacer
        self.starter = RunStarter(self, self.driver, self.controls, self.preferences, self.base_config,
                                  self.show_error)
        self.server = ServerStarter(self, self.preferences, self.open_run, self.show_error, self.status.say)
        self.tree = RunTreeViews(self.driver, self.history, self.levers, lambda: self.plots, self.start_fork,
                                 self.show_error, self, self.continue_run)
        self.plot_listeners.append(self.tree.plots_built)
        self.form_sync = FormFollowsRun(self.driver, self.controls)  # whose settings the form holds
        self.view_prefs = ViewPrefs(self.preferences, restore_settings)
        self.close_question = CloseQuestion(self, self.preferences, aa.ask_close, restore_settings)
        self.field_notices = FieldNotices(self.controls)  # a field says what it refused
        self.desktop_notices = DesktopNotices(self, self.driver.signals)  # when the window is not in front
        self.view_prefs.bind_controls(self.controls)
        self.view_prefs.bind_log_action(self.log_action)
        self.view_prefs.bind_history(self.history)
        self._wire()

        self.timer = QTimer(self)
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(self.tick)
        self.timer.start()

        for t in self.preferences.recent("recent_tasks"):
            if os.path.isfile(t):
                self.controls.set_task(t)
        restored, state = (window_prefs.restore(self, self.preferences, self.controls, self.base_config)
                           if restore_settings else (False, None))
        if not restored:
            self.resize(1440, 900)
        self.dock_layout.restore(state)  # checked once the plots are in (app/ui/shell/layout.py)
        self.controls.set_values(self.base_config)
        self.controls.set_task(str(self.base_config.get("task") or self.controls.task_spec()))
        QTimer.singleShot(0, self.history, self.history.refresh)  # after the window shows
        self.views.sync_state()

    # -- construction ----------------------------------------------------------------------
    def _wire(self) -> None:
        ra, aa, drv = self.run_actions, self.app_actions, self.driver
        for action, slot in ((ra.start, self.start_run), (ra.pause, self.pause_run), (ra.resume, self.resume_run),
                             (ra.stop, self.stop_run), (ra.apply, self.apply_changes), (ra.cont, self.continue_run),
                             (aa.open_run, self.choose_run_folder), (aa.open_task, self.choose_task_file),
                             (aa.open_remote, lambda: self.open_run(dialogs.ask_remote_run(self) or "")),
                             (aa.csv, lambda: export.csv_dialog(self, self.model, self.show_error, self.preferences)),
                             (aa.png, lambda: export.png_dialog(self, self.model, self.plots, self.show_error,
                                                                self.views.shown_dir, self.preferences)),
                             (aa.quit, self.close), (aa.fit, lambda: self.plots.fit()),
                             (aa.torchrun, self.run_on_gpus_dialog), (aa.open_log, self.launcher.open_log),
                             (aa.start_server, self.start_on_server_dialog),
                             (aa.about, self.show_about), (aa.shortcuts, self.show_shortcuts)):
            action.triggered.connect(lambda *_, slot=slot: slot())
        aa.log_scale.toggled.connect(lambda on: self._plots.set_log_scale(on) if self._plots else None)
        aa.theme.toggled.connect(lambda on: self.set_theme("dark" if on else "light"))
        self.run_menu.aboutToShow.connect(self.launcher.check_gpus)  # enables Run on N GPUs, or says why not
        self.controls.task_file_wanted.connect(self.choose_task_file)
        self.controls.live.what_fits.clicked.connect(self._show_levers)
        self.alerts.count_changed.connect(lambda n: self.alerts_dock.setWindowTitle(f"Alerts ({n})" if n else "Alerts"))
        # The Alerts tab comes forward for news during a run, not for a run folder's past (a run
        # viewed from Run history keeps that tab in front).
        self.alerts.serious_added.connect(lambda: self.alerts_dock.raise_() if self.session.state.is_live else None)
        self.alerts.step_clicked.connect(lambda step: self.plots.zoom_to_step(step))
        self.history.open_requested.connect(self.open_run)
        drv.error.connect(self.show_error)
        drv.signals.state_changed.connect(lambda *_: self._sync_live())
        drv.signals.model_replaced.connect(lambda *_: self._sync_live())
        drv.run_dir_known.connect(self._on_run_dir)
        drv.signals.run_started.connect(lambda *_: self.update_title())  # world size and strategy known
        drv.folder_opened.connect(self._on_folder_opened)
        drv.view_restored.connect(self._on_folder_opened)
        drv.run_done.connect(self._on_run_done)

    # -- the plots -----------------------------------------------------------------------
    @property
    def plots(self) -> Any:
        """The PlotPanel, built now if the event loop has not built it yet."""
        return self.central.build()

    @property
    def _plots(self) -> Any:
        """The PlotPanel, or None while it is not built yet."""
        return self.central.panel

    def _make_plots(self) -> Any:
        from .ui.plots.panel import PlotPanel  # pyqtgraph loads here
        return PlotPanel(self.theme)

    def _plots_built(self, panel: Any) -> None:
        panel.log_scale_changed.connect(self.log_action.setChecked)
        if self.log_action.isChecked():
            panel.set_log_scale(True)
        panel.set_model(self.model)
        panel.set_live(self.session.state.is_live)
        self.view_prefs.bind_plots(panel, self.history)
        self.dock_layout.plots_in()  # the docks around the plots: the saved layout, or the default
        for fn in list(self.plot_listeners):
            fn(panel)

    @property
    def model(self) -> RunModel:
        return self.session.model

    @model.setter
    def model(self, model: RunModel) -> None:
        self.session.model = model

    # -- layout and preferences ------------------------------------------------------------
    def use_default_layout(self) -> None:
        """Lay the docks out the default way once the plots are in, whatever was saved."""
        self.dock_layout.forget_saved()
        if self._plots is not None:
            self.dock_layout.plots_in()

    def save_preferences(self) -> None:
        window_prefs.save(self, self.preferences, self.controls, self.theme)

    def set_theme(self, theme: str) -> None:
        if theme == self.theme:
            return
        self.theme = theme
        apply_stylesheet(theme)
        if self._plots is not None:
            self._plots.set_theme(theme)
        self.theme_action.setChecked(theme == "dark")  # Qt signals toggled only on a change

    # -- running -------------------------------------------------------------------------
    @property
    def run_outcome(self) -> Optional[dict[str, Any]]:
        return self.driver.outcome

    @property
    def launch(self) -> Optional[Launch]:
        """The last run this window started on N GPUs."""
        return self.launcher.current

    def is_running(self) -> bool:
        """A run of this window's own engine is going (its thread is alive)."""
        return self.runner.is_busy()

    def ui_state(self) -> str:
        return self.session.view_state()

    def start_run(self) -> bool:
        if not self.starter.start():
            return False
        values, _err = self.controls.values()
        self.form_sync.started_run(values or {})
        return True

    def continue_run(self, path: str = "") -> bool:
        """Continue the run shown (or `path`) from its last checkpoint, with the form's settings."""
        path = path or self.views.continuable()
        values = self.starter.form()
        if not path or values is None or not self.driver.continue_run(path, self.base_config, values):
            return False
        self.form_sync.started_run(values)
        return True

    def start_fork(self, config: dict[str, Any]) -> bool:
        """A fork's TrainConfig fields (fork="DIR@CHECKPOINT"), through the Start path."""
        return self.starter.fork(config)

    def launch_torchrun(self, n: int, run_dir: Optional[str] = None) -> bool:
        """The form's settings under torchrun with n processes."""
        return self.starter.launch(n, run_dir)

    def run_on_gpus_dialog(self) -> Any:
        """The Run on N GPUs dialog, opened (None with fewer than 2 GPUs)."""
        return self.starter.launch_dialog()

    def start_on_server_dialog(self) -> Any:
        """Run > Start on server...: the form's settings (every declared setting) on another
        machine, started there detached, then followed (None when the form cannot start)."""
        values, err = self.controls.values()
        return self.server.open_for_form(values, err, self.base_config)

    def pause_run(self) -> None:
        self.driver.pause()

    def resume_run(self) -> None:
        self.driver.resume()

    def stop_run(self) -> None:
        self.driver.stop()

    def apply_changes(self) -> None:
        edits = self.controls.edits()
        self.form_sync.applied_by_user(edits)
        self.driver.apply(edits, self.controls.apply_when())
        keys.leave_field(self.controls_dock)  # Ctrl+Return in a field: the next keys typed edit nothing

    def open_run(self, path: str) -> bool:
        """Show a run folder's plots (finished, or training in another process), here or on
        another machine ([user@]host:path, with the python remembered for that host)."""
        return bool(path) and self.driver.open(path, remote_python=dialogs.remote_python_for(path))

    def set_overlay(self, path: str, on: bool) -> None:
        self.tree.set_overlay(path, on)

    # -- the session's news ------------------------------------------------------------------
    def tick(self) -> None:
        """Drain the run's source, update what changed. ~30 times a second."""
        try:
            self._tick_n += 1
            self.pacer.catch_up()  # a redraw held back by the pacing
            self.driver.tick()
            if self._tick_n % STATUS_EVERY == 0:
                self.views.update_status()
                self._sync_live()
        except Exception as e:  # never a traceback per tick: log it, say it once
            log.exception("updating the window failed")
            if not self._tick_failed:
                self._tick_failed = True
                self.show_error("Display error", f"{type(e).__name__}: {e}\n\nThe run goes on; details are in "
                                                 f"{logs.log_path()}.")

    def _sync_live(self) -> None:
        self.live_label.show_text(self.session.live_text())
        self.central.set_banner(self.session.connection_text())  # a remote run's connection lost

    def _on_run_dir(self, path: str) -> None:
        self.history.add_extra(path)
        self.preferences.add_recent("recent_runs", path)
        self.update_title()

    def update_title(self) -> None:
        """The run shown's folder, and for a distributed run its processes and strategy."""
        self.setWindowTitle(window_title(self.views.shown_dir, self.session.model.info))

    def _on_folder_opened(self, _path: str) -> None:
        self.plots.fit()
        self.plots.refresh(force=True)
        self.history.refresh()

    def _on_run_done(self, outcome: dict[str, Any]) -> None:
        self.pacer.refresh(force=True)  # the last steps, whatever the pacing
        self.history.refresh()
        for fn in list(self.run_done_callbacks):
            fn(dict(outcome))
        if self._close_when_done:
            self.close_now()

    # -- dialogs -------------------------------------------------------------------------
    @property
    def last_error(self) -> Optional[tuple[str, str]]:
        """(title, message) of the last error dialog."""
        return self.errors.last

    @property
    def dialogs(self) -> list[QMessageBox]:
        """The error dialogs open now."""
        return self.errors.open

    def show_error(self, title: str, message: str) -> QMessageBox:
        return self.errors.show(title, message)

    def slot_failed(self, line: str) -> None:
        """An exception no slot caught (logged with its traceback): an alert row; the window goes on."""
        self.alerts.window_error(line, self.model.step, self.model.epoch)

    def show_about(self) -> Any:
        self.about_dialog = dialogs.open_about(self)
        return self.about_dialog

    def show_shortcuts(self) -> Any:
        """Help > Keyboard shortcuts."""
        self.shortcuts_dialog = dialogs.open_shortcuts(self)
        return self.shortcuts_dialog

    def choose_task_file(self) -> None:
        path = dialogs.ask_task_file(self, self.preferences)
        if path:
            self.controls.set_task(path)

    def choose_run_folder(self) -> None:
        path = dialogs.ask_run_folder(self, self.history.root)
        if path:
            self.open_run(path)

    # -- export --------------------------------------------------------------------------
    def export_csv(self, path: str) -> int:
        return export.write_csv(self.model, path)

    def export_png(self, path: str, whole_window: bool = False) -> bool:
        """The plots under a line naming the run (or the whole window)."""
        if whole_window:
            return export.window_png(self, self.plots, path)
        return export.plots_png(self.plots, self.model, path, self.views.shown_dir)

    def screenshot(self, path: str) -> bool:
        """PNG of the whole window as a person would see it (--screenshot): once the plots are
        built and the layout has stopped changing."""
        self.tick()
        self.views.update_status()
        return export.window_png(self, self.plots, path)

    # -- closing -------------------------------------------------------------------------
    def close_now(self) -> None:
        """Close without stopping the engine first: its run has ended (a scripted quit)."""
        self._really_closing = True
        self.close()

    def close_without_asking(self) -> None:
        """Close the normal way (a run stops with a checkpoint) without the question: a signal."""
        self.close_question.confirmed = True
        self.close()

    def _show_levers(self) -> None:
        self.levers_dock.show()
        self.levers_dock.raise_()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt name
        if self.runner.is_busy() and not self._really_closing and self.close_question.wanted():
            self.close_question.ask(self.close)  # Stop and quit: closes again, without asking
            event.ignore()
            return
        if self.runner.is_busy() and not self._really_closing:
            if not stop_engine(self.runner, JOIN_S):  # never terminated: hidden, closed once it stops
                self._close_when_done = True
                self.save_preferences()
                self.hide()
                event.ignore()
                return
            self.tick()
        self.timer.stop()
        logs.stop_reporting(self.slot_failed)
        self.driver.close()
        self.save_preferences()
        self.errors.close_all()
        event.accept()
        super().closeEvent(event)
        self.closed.emit()
