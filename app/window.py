"""The main window: controls, live plots, alerts, run history, status bar.

One ~30 Hz QTimer drains the current source (the engine's EventBuffer, or a run
folder's run.db) into the RunModel and updates only what changed. No training logic
lives here: the window sends commands and draws events. torch is never imported here.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Optional

from PySide6.QtCore import QByteArray, QProcess, QProcessEnvironment, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QAction, QCloseEvent, QDesktopServices, QKeySequence
from PySide6.QtWidgets import (QApplication, QDockWidget, QFileDialog, QInputDialog, QLabel, QMainWindow, QMessageBox,
                               QScrollArea, QVBoxLayout, QWidget)

from engine.commands import Pause, Resume, Stop
from engine.config import ConfigError, TrainConfig
from engine.store import RunReader, StoreError

from . import assets, compat, export, launch, logs  # noqa: F401 - compat: see app/compat.py
from .alerts import AlertsPanel
from .controls import FITS_IDLE, FITS_MEASURING, FITS_NO_GPU, LIVE_FIELDS, ControlsPanel, make_command
from .history import HistoryPanel
from .metrics import MetricsBuffer
from .runmodel import Delta, RunModel
from .runs import is_run_dir, runs_root
from .settings import Settings
from .shortcuts import SHORTCUTS
from .sources import FolderSource, LiveSource
from .statusbar import StatusBar
from .theme import THEMES, apply_stylesheet, system_theme
from .worker import EngineRunner

log = logging.getLogger("headroom.window")


class _LoadingPlots(QWidget):
    """Stands where the plots go while pyqtgraph loads, just after the window first shows."""

    def __init__(self) -> None:
        super().__init__()
        self.paint_listeners: list[Callable[[float], None]] = []
        lay = QVBoxLayout(self)
        label = QLabel("Loading plots...")
        label.setObjectName("hint")
        label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(label)

    def paintEvent(self, ev) -> None:  # noqa: N802 - Qt name
        super().paintEvent(ev)
        listeners, self.paint_listeners = self.paint_listeners, []
        for fn in listeners:
            fn(time.perf_counter())
TICK_MS = 33  # ~30 Hz: drain events, repaint what changed
PLOT_BUDGET = 0.5  # at most this share of the GUI thread's time goes to redrawing plots...
PLOT_MAX_INTERVAL = 0.066  # ...but a new step is on screen within ~15 frames a second whatever the cost
STATUS_EVERY = 8  # status bar every 8th tick (~4 Hz)
JOIN_S = 2.0
LAUNCH_STOP_S = 20.0  # after Stop through run.db, SIGTERM the torchrun launch if it is still going
LAUNCH_POLL_MS = 250


class Launch:
    """A run this window started in other processes (torchrun): the QProcess, its folder and log."""

    def __init__(self, process: QProcess, run_dir: str, log_path: str, n: int, command: list[str]) -> None:
        self.process = process
        self.run_dir = run_dir
        self.log_path = log_path
        self.n = n
        self.command = command
        self.attached = False
        self.exit_code: Optional[int] = None
        self.terminated = False

    def alive(self) -> bool:
        return self.process.state() != QProcess.ProcessState.NotRunning


class MainWindow(QMainWindow):
    closed = Signal()  # closed for good (also after a hidden wait for the engine thread): quit the app
    gpu_count_known = Signal(int, str)  # from a plain thread: (CUDA devices torch sees, why none)
    def __init__(self, base_config: Optional[dict[str, Any]] = None, theme: Optional[str] = None,
                 settings: Optional[Settings] = None, restore_settings: bool = True) -> None:
        """base_config: run flags given on the command line (TrainConfig fields); they fill
        the form and the fields the form has no widget for (max_steps, seed, run_dir...)."""
        super().__init__()
        logs.setup()
        self.settings = settings or Settings()
        self.base_config = dict(base_config or {})
        self.theme = theme if theme in THEMES else (self.settings.theme() or system_theme())
        self.runner = EngineRunner(self)
        self.model = RunModel()
        self.source: Any = None
        self.run_outcome: Optional[dict[str, Any]] = None  # how the last run of this window ended
        self.last_error: Optional[tuple[str, str]] = None  # (title, message) of the last error dialog
        self.dialogs: list[QMessageBox] = []
        self.run_done_callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._pause_sent = False
        self._stop_sent = False
        self._close_when_done = False
        self._really_closing = False
        self._resume_used = False
        self._tick_n = 0
        self._tick_failed = False
        self._plots_due = False
        self._next_plot = 0.0
        self._plot_timer = QTimer(self)
        self._plot_timer.setSingleShot(True)
        self._plot_timer.setTimerType(Qt.TimerType.PreciseTimer)
        self._plot_timer.timeout.connect(self._refresh_plots)
        self._last_seen_epoch = 0
        self.launch: Optional[Launch] = None  # the last torchrun launch of this window
        self.gpu_count: Optional[int] = None  # unknown until the Run menu first opens
        self._gpu_check_started = False
        self._launch_timer = QTimer(self)
        self._launch_timer.setInterval(LAUNCH_POLL_MS)
        self._launch_timer.timeout.connect(self._poll_launch)
        self._launch_stop_timer = QTimer(self)
        self._launch_stop_timer.setSingleShot(True)
        self._launch_stop_timer.timeout.connect(self._terminate_launch)
        self.gpu_count_known.connect(self._on_gpu_count)

        self.setWindowTitle("Headroom")
        self.setWindowIcon(assets.app_icon())
        self.setObjectName("MainWindow")
        apply_stylesheet(self.theme)

        # The plots (pyqtgraph) are built just after the window first paints: pyqtgraph's import is
        # the largest part of start-up, and the controls are usable before it is done.
        self._plots: Any = None
        self.plot_listeners: list[Callable[[Any], None]] = []  # called once the plots exist
        self._placeholder = _LoadingPlots()
        self._placeholder.paint_listeners.append(lambda _t: QTimer.singleShot(0, self._build_plots))
        self.setCentralWidget(self._placeholder)
        QTimer.singleShot(250, self._build_plots)  # in case the window is never painted (hidden)
        self.controls = ControlsPanel()
        self.alerts = AlertsPanel()
        self.history = HistoryPanel(runs_root())
        self.status = StatusBar(self)
        self.setStatusBar(self.status)

        scroll = QScrollArea()
        scroll.setWidget(self.controls)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(self.controls.sizeHint().width() + 24)
        self.setCorner(Qt.Corner.BottomLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.controls_dock = self._dock("Controls", "controls", scroll, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.alerts_dock = self._dock("Alerts", "alerts", self.alerts, Qt.DockWidgetArea.BottomDockWidgetArea)
        self.history_dock = self._dock("Run history", "history", self.history, Qt.DockWidgetArea.BottomDockWidgetArea)
        self.tabifyDockWidget(self.alerts_dock, self.history_dock)
        self.alerts_dock.raise_()
        self._build_actions()

        self.controls.start_clicked.connect(self.start_run)
        self.controls.pause_clicked.connect(self.pause_run)
        self.controls.resume_clicked.connect(self.resume_run)
        self.controls.stop_clicked.connect(self.stop_run)
        self.controls.apply_clicked.connect(self.apply_changes)
        self.controls.task_file_wanted.connect(self.choose_task_file)
        self.alerts.count_changed.connect(self._alerts_count)
        self.alerts.step_clicked.connect(self._zoom_to_step)
        self.history.open_requested.connect(self.open_run)
        self.history.browse_requested.connect(self.choose_run_folder)
        self.history.overlay_toggled.connect(self.set_overlay)

        self.runner.prepared.connect(self._on_prepared)
        self.runner.bad_input.connect(self._on_bad_input)
        self.runner.failed.connect(self._on_failed)
        self.runner.finished.connect(self._on_finished)
        self.runner.stopped.connect(self._on_thread_stopped)

        self.timer = QTimer(self)
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(self.tick)
        self.timer.start()

        for t in self.settings.recent("recent_tasks"):
            if os.path.isfile(t):
                self.controls.set_task(t)
        restored = self._restore_settings() if restore_settings else False
        self.controls.set_values(self.base_config)
        self.controls.set_task(str(self.base_config.get("task") or self.controls.task_spec()))
        self._needs_layout = not restored
        if not restored:
            self.resize(1440, 900)
            self.default_layout()
        QTimer.singleShot(0, self.history.refresh)  # after the window shows
        self._update_state()

    # -- construction ----------------------------------------------------------------------
    def _dock(self, title: str, name: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        d = QDockWidget(title, self)
        d.setObjectName(f"dock_{name}")
        d.setWidget(widget)
        d.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                      | QDockWidget.DockWidgetFeature.DockWidgetFloatable
                      | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.addDockWidget(area, d)
        return d

    def _action(self, text: str, key: str, slot: Callable, icon: str = "", tip: str = "") -> QAction:
        a = QAction(assets.icon(icon) if icon else assets.icon("none"), text, self)
        if key in SHORTCUTS:
            a.setShortcut(QKeySequence(SHORTCUTS[key]))
            a.setShortcutContext(Qt.ShortcutContext.ApplicationShortcut)
        a.setToolTip(f"{tip or text} ({SHORTCUTS[key]})" if key in SHORTCUTS else (tip or text))
        a.triggered.connect(lambda *_: slot())
        self.addAction(a)
        return a

    def _build_actions(self) -> None:
        self.start_action = self._action("Start", "start", self.start_run, "start", "Start a run")
        self.pause_action = self._action("Pause", "pause", self.pause_run, "pause", "Pause after this epoch")
        self.resume_action = self._action("Resume", "resume", self.resume_run, "resume", "Resume")
        self.stop_action = self._action("Stop", "stop", self.stop_run, "stop", "Stop at the next step")
        self.apply_action = self._action("Apply changes", "apply", self.apply_changes, "apply",
                                         "Send the edited settings to the run")
        self.open_run_action = self._action("Open run folder...", "open_run", self.choose_run_folder, "open")
        self.open_task_action = self._action("Open task file...", "open_task", self.choose_task_file, "open")
        self.csv_action = self._action("Export metrics (CSV)...", "export_csv", self.export_csv_dialog,
                                       "export-csv")
        self.png_action = self._action("Export plots (PNG)...", "export_png", self.export_png_dialog,
                                       "export-png")
        self.log_action = self._action("Log scale (loss)", "log_scale", lambda: None)
        self.log_action.setCheckable(True)
        self.log_action.toggled.connect(lambda on: self._plots.set_log_scale(on) if self._plots else None)
        self.theme_action = self._action("Dark theme", "theme", lambda: None, "theme", "Switch light/dark")
        self.theme_action.setCheckable(True)
        self.theme_action.setChecked(self.theme == "dark")
        self.theme_action.toggled.connect(lambda on: self.set_theme("dark" if on else "light"))
        self.quit_action = self._action("Quit", "quit", self.close)
        self.fit_action = self._action("Fit all", "", lambda: self.plots.fit())

        tb = self.addToolBar("Run")
        tb.setObjectName("toolbar_run")
        tb.setMovable(False)
        tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        for a in (self.start_action, self.pause_action, self.resume_action, self.stop_action):
            tb.addAction(a)
        tb.addSeparator()
        for a in (self.open_run_action, self.open_task_action):
            tb.addAction(a)
        tb.addSeparator()
        for a in (self.csv_action, self.png_action):
            tb.addAction(a)
        tb.addSeparator()
        tb.addAction(self.theme_action)

        mb = self.menuBar()
        m = mb.addMenu("&File")
        for a in (self.open_run_action, self.open_task_action, None, self.csv_action, self.png_action, None,
                  self.quit_action):
            m.addSeparator() if a is None else m.addAction(a)
        self.torchrun_action = self._action("Run on N GPUs...", "", self.run_on_gpus_dialog, "start")
        self.torchrun_action.setEnabled(False)
        self.torchrun_action.setToolTip("Checking how many GPUs torch sees...")
        self.open_log_action = self._action("Open launch log", "", self.open_launch_log, "open",
                                            "Open the torchrun output of the last run started on N GPUs")
        self.open_log_action.setEnabled(False)
        m = mb.addMenu("&Run")
        for a in (self.start_action, self.pause_action, self.resume_action, self.stop_action, None,
                  self.apply_action, None, self.torchrun_action, self.open_log_action):
            m.addSeparator() if a is None else m.addAction(a)
        m.setToolTipsVisible(True)  # the disabled "Run on N GPUs..." says why
        m.aboutToShow.connect(self.check_gpus)
        self.run_menu = m
        m = mb.addMenu("&View")
        for a in (self.log_action, self.fit_action, self.theme_action, None):
            m.addSeparator() if a is None else m.addAction(a)
        for d in (self.controls_dock, self.alerts_dock, self.history_dock):
            m.addAction(d.toggleViewAction())
        self.about_action = self._action("About Headroom", "", self.show_about, "info",
                                         "Versions of Headroom, torch, CUDA, Qt and the NVIDIA driver")
        self.about_action.setMenuRole(QAction.MenuRole.AboutRole)
        m = mb.addMenu("&Help")
        m.addAction(self.about_action)

    # -- the plots -----------------------------------------------------------------------
    @property
    def plots(self) -> Any:
        """The PlotPanel, built now if the event loop has not built it yet."""
        if self._plots is None:
            self._build_plots()
        return self._plots

    def _build_plots(self) -> None:
        if self._plots is not None:
            return
        from .plots import PlotPanel  # pyqtgraph loads here
        panel = PlotPanel(self.theme)
        self._plots = panel
        panel.log_scale_changed.connect(self.log_action.setChecked)
        if self.log_action.isChecked():
            panel.set_log_scale(True)
        old = self.centralWidget()
        self.setCentralWidget(panel)
        if old is not None:
            old.deleteLater()
        panel.set_model(self.model)
        if self._needs_layout:  # dock sizes again, once the plots are in the layout
            self._needs_layout = False
            self.default_layout()
            QTimer.singleShot(0, self.default_layout)
        for fn in list(self.plot_listeners):
            fn(panel)

    # -- settings ------------------------------------------------------------------------
    def default_layout(self) -> None:
        self.resizeDocks([self.alerts_dock], [170], Qt.Orientation.Vertical)
        self.resizeDocks([self.controls_dock], [340], Qt.Orientation.Horizontal)

    def _restore_settings(self) -> bool:
        """Window layout and last settings. True if a saved layout was restored."""
        restored = False
        geo = self.settings.get_bytes("geometry")
        if isinstance(geo, (QByteArray, bytes)):
            restored = bool(self.restoreGeometry(geo))
        st = self.settings.get_bytes("window_state")
        if isinstance(st, (QByteArray, bytes)):
            restored = bool(self.restoreState(st)) and restored
        last = self.settings.get_json("last_config", {})
        if isinstance(last, dict) and not self.base_config:
            self.controls.set_values(last)
        if self.settings.get_json("log_scale", False):
            self.log_action.setChecked(True)
        return restored

    def save_settings(self) -> None:
        self.settings.set_bytes("geometry", self.saveGeometry())
        self.settings.set_bytes("window_state", self.saveState())
        values, _err = self.controls.values()
        if values:
            self.settings.set_json("last_config", values)
        self.settings.set_theme(self.theme)
        self.settings.set_json("log_scale", self.log_action.isChecked())
        self.settings.sync()

    def set_theme(self, theme: str) -> None:
        if theme == self.theme:
            return
        self.theme = theme
        apply_stylesheet(theme)
        if self._plots is not None:
            self._plots.set_theme(theme)
        if self.theme_action.isChecked() != (theme == "dark"):
            self.theme_action.setChecked(theme == "dark")

    # -- running -------------------------------------------------------------------------
    def is_running(self) -> bool:
        """A run of this window's own engine is going (its thread is alive)."""
        return self.runner.is_busy()

    def _controlling_remote(self) -> bool:
        return isinstance(self.source, FolderSource) and self.source.running

    def _startable_values(self) -> Optional[dict]:
        """The form's run settings, or None (with a dialog if they are invalid) when no run can start."""
        if self._run_is_live():
            return None
        values, err = self.controls.values()
        if values is None:
            self.show_error("Cannot start", err)
        return values

    def start_run(self) -> bool:
        values = self._startable_values()
        if values is None:
            return False
        cfg = dict(self.base_config)
        if self._resume_used:
            cfg.pop("resume", None)  # --resume continues that run once; Start again begins a new one
        if cfg.get("run_dir") and is_run_dir(str(cfg["run_dir"])):
            cfg.pop("run_dir")  # --run-dir already holds the earlier run: a new folder under the runs folder
        if cfg.get("resume"):
            cfg.pop("run_dir", None)
        cfg.update(values)
        try:
            config = TrainConfig.from_dict(cfg).validate()
        except ConfigError as e:
            self.show_error("Cannot start", str(e))
            return False
        self.settings.set_json("last_config", values)
        self._reset_view()
        if config.resume:
            self._resume_used = True
            self._load_history(config.resume)
            self.controls.engine = {}  # the resumed engine says what it has (run_started, first step)
            self._last_seen_epoch = 0
        self.model.state = "starting"
        self.source = LiveSource(self.runner.buffer, self.runner.send)
        self.controls.remote = False
        self._pause_sent = self._stop_sent = False
        self.run_outcome = None
        log.info("start: %s", config.to_dict())
        self.runner.start(config)
        self._update_state()
        return True

    def _load_history(self, run_dir: str) -> None:
        """A resumed run: show what run.db holds so far; the live steps continue (and supersede
        any logged after the checkpoint)."""
        try:
            src = FolderSource(run_dir)
        except (StoreError, ConfigError) as e:
            log.warning("resume %s: cannot read its history: %s", run_dir, e)
            return
        try:
            delta = self.model.ingest(src.poll(force=True), src.step_get)
        finally:
            src.close()
        self._apply_delta(delta)

    def _reset_view(self) -> None:
        if self.source is not None:
            self.source.close()
        self.source = None
        self.model = RunModel()
        self.alerts.clear()
        if self._plots is not None:
            self._plots.set_model(self.model)
        self.controls.engine = {}
        self.controls.pending.clear()
        self.controls.set_fits_text(FITS_IDLE)
        self._last_seen_epoch = 0

    # -- Run on N GPUs (torchrun) -----------------------------------------------------------
    def check_gpus(self) -> None:
        """How many GPUs torch sees, on a plain thread (torch loads there): once, when the Run menu
        first opens. The answer enables "Run on N GPUs..." (2 or more) or says why not."""
        if self._gpu_check_started:
            return
        self._gpu_check_started = True
        import threading

        def work() -> None:
            n, why = launch.cuda_device_count()
            self.gpu_count_known.emit(n, why)

        threading.Thread(target=work, name="headroom-gpu-count", daemon=True).start()

    def _on_gpu_count(self, n: int, why: str) -> None:
        self.gpu_count = n
        self.torchrun_action.setToolTip(launch.gate_tooltip(n, why))
        self.torchrun_action.setStatusTip(self.torchrun_action.toolTip())
        self._update_state()

    def run_on_gpus_dialog(self) -> None:
        count = self.gpu_count or 0
        if count < launch.MIN_GPUS:
            return
        n, ok = QInputDialog.getInt(self, "Run on N GPUs", f"Processes (one per GPU, {count} here):", count,
                                    launch.MIN_GPUS, count)
        if ok:
            self.launch_torchrun(n)

    def launch_torchrun(self, n: int, run_dir: Optional[str] = None) -> bool:
        """Start the form's settings under torchrun with n processes, output to a log in the run
        folder, and follow the run through its run.db once it exists."""
        values = self._startable_values()
        if values is None:
            return False
        cfg = {k: v for k, v in self.base_config.items() if k not in ("resume", "run_dir")}
        cfg.update(values)
        try:
            config = TrainConfig.from_dict(cfg).validate()
            run_dir = os.path.abspath(run_dir or launch.new_run_dir(config.task, n))
            if is_run_dir(run_dir):
                raise ConfigError(f"{run_dir} already holds a run")
            cmd = launch.torchrun_command(config, n, run_dir)
            os.makedirs(run_dir, exist_ok=True)
        except (ConfigError, ValueError, OSError) as e:
            self.show_error("Cannot start", str(e))
            return False
        self.settings.set_json("last_config", values)
        log_path = os.path.join(run_dir, launch.LOG_NAME)
        proc = QProcess(self)
        proc.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        proc.setStandardOutputFile(log_path)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONPATH", launch.engine_pythonpath())
        env.insert("PYTHONUNBUFFERED", "1")
        proc.setProcessEnvironment(env)
        proc.setWorkingDirectory(run_dir)
        self._reset_view()
        self.launch = Launch(proc, run_dir, log_path, n, cmd)
        proc.finished.connect(lambda code, _status, ln=self.launch: self._on_launch_finished(ln, code))
        proc.errorOccurred.connect(lambda err, ln=self.launch: self._on_launch_error(ln, err))
        log.info("launch: %s (log %s)", " ".join(cmd), log_path)
        self.model.state = "starting"
        self._pause_sent = self._stop_sent = False
        self.run_outcome = None
        self.open_log_action.setEnabled(True)
        self.setWindowTitle(f"Headroom - {os.path.basename(run_dir)}")
        proc.start(cmd[0], cmd[1:])
        self._launch_timer.start()
        self._update_state()
        return True

    def _poll_launch(self) -> None:
        ln = self.launch
        if ln is None or ln.attached:
            self._launch_timer.stop()
            return
        if not is_run_dir(ln.run_dir):
            return
        try:
            reader = RunReader(ln.run_dir)
            try:
                status = reader.info().get("status")
            finally:
                reader.close()
        except StoreError:
            return
        if status is None and ln.alive():
            return  # run.db is being set up
        self._attach_launch(ln)

    def _attach_launch(self, ln: Launch) -> None:
        self._launch_timer.stop()
        ln.attached = True
        stop_sent = self._stop_sent
        if self.open_run(ln.run_dir):
            self.history.refresh()
            if stop_sent and self._controlling_remote():  # Stop pressed while it was starting
                self.stop_run()
        self._update_state()

    def _on_launch_error(self, ln: Launch, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and ln is self.launch:
            self._launch_timer.stop()
            self.model.state = "idle"
            self._update_state()
            self.show_error("Could not start torchrun", f"{ln.command[0]}: {ln.process.errorString()}")

    def _on_launch_finished(self, ln: Launch, code: int) -> None:
        ln.exit_code = int(code)
        log.info("launch ended with exit code %s: %s", code, ln.run_dir)
        self._launch_stop_timer.stop()
        if ln is not self.launch:
            return
        if not ln.attached:
            if is_run_dir(ln.run_dir):
                self._attach_launch(ln)
            else:
                self._launch_timer.stop()
                self.model.state = "idle"
                self._stop_sent = False
                self._update_state()
                if not ln.terminated:
                    self.show_error("The run on N GPUs did not start",
                                    f"torchrun exited with code {code} before the run began. Its output is in "
                                    f"{ln.log_path} (Run > Open launch log).")
        else:
            self.tick()
            if self._following_launch() and isinstance(self.source, FolderSource):
                self.source._next_poll = 0.0  # read what the processes wrote last, now
                self.tick()
        if self.run_outcome is None:
            self.run_outcome = {"status": "finished" if code == 0 else "failed",
                                "reason": self.model.finish_reason, "exit_code": int(code)}
        self._stop_sent = False
        self._update_state()

    def _terminate_launch(self) -> None:
        """Stop went through run.db but the processes are still there: SIGTERM torchrun (it passes
        it on; the engine stops at the next micro-batch with a checkpoint)."""
        ln = self.launch
        if ln is not None and ln.alive():
            log.warning("launch still running %.0fs after Stop: SIGTERM", LAUNCH_STOP_S)
            ln.terminated = True
            ln.process.terminate()

    def stop_launch_now(self) -> None:
        """Stop a launch that never attached (no run.db to command): SIGTERM."""
        ln = self.launch
        if ln is not None and ln.alive():
            ln.terminated = True
            ln.process.terminate()

    def _stop_launch_for_close(self) -> None:
        """Closing the window ends the run it launched on N GPUs the clean way: Stop through run.db,
        then SIGTERM; never left to die with the QProcess (that would be SIGKILL, no checkpoint)."""
        ln = self.launch
        if ln is None or not ln.alive():
            return
        self._launch_timer.stop()
        self._launch_stop_timer.stop()
        if is_run_dir(ln.run_dir):
            try:
                from engine.store import send_command
                send_command(ln.run_dir, Stop())
            except Exception as e:  # noqa: BLE001 - a run.db we cannot write: SIGTERM below
                log.warning("launch: could not send Stop through run.db: %s", e)
            if ln.process.waitForFinished(int(LAUNCH_STOP_S * 1000)):
                return
        ln.terminated = True
        ln.process.terminate()
        if not ln.process.waitForFinished(10_000):
            log.warning("launch did not end after SIGTERM: killing it")
            ln.process.kill()
            ln.process.waitForFinished(5_000)

    def open_launch_log(self) -> bool:
        if self.launch is None or not os.path.isfile(self.launch.log_path):
            return False
        return QDesktopServices.openUrl(QUrl.fromLocalFile(self.launch.log_path))

    def pause_run(self) -> None:
        if self.source is None or not self._run_is_live() or self._pause_sent:
            return
        self.source.send(Pause())
        self._pause_sent = True
        self._update_state()

    def resume_run(self) -> None:
        if self.source is None or not self._run_is_live():
            return
        self.source.send(Resume())
        self._pause_sent = False
        self._update_state()

    def stop_run(self) -> None:
        if self._launch_starting():  # no run.db yet to send Stop through
            self._stop_sent = True
            self._launch_stop_timer.start(int(LAUNCH_STOP_S * 1000))
            self._update_state()
            return
        if self.source is None or not self._run_is_live():
            return
        self._stop_sent = True
        if isinstance(self.source, LiveSource):
            self.runner.stop()
        else:
            self.source.send(Stop())
            if self._following_launch():
                self._launch_stop_timer.start(int(LAUNCH_STOP_S * 1000))
        self._update_state()

    def _following_launch(self) -> bool:
        return (self.launch is not None and self.launch.attached and isinstance(self.source, FolderSource)
                and os.path.abspath(self.source.run_dir) == os.path.abspath(self.launch.run_dir))

    def _run_is_live(self) -> bool:
        return self.is_running() or self._controlling_remote() or self._launch_starting()

    def _launch_starting(self) -> bool:
        """A torchrun launch whose run.db the window is not following yet."""
        return self.launch is not None and not self.launch.attached and self.launch.alive()

    def _target_epoch(self) -> int:
        """The epoch a change sent now will first apply to (the engine reads commands at boundaries)."""
        m = self.model
        if not m.step:
            return 1
        if m.state == "paused" or self._pause_sent:
            return m.epoch + 1  # the engine waits at that boundary and applies changes there
        if m.epochs and m.epochs[-1][0] == m.epoch:
            return m.epoch + 2  # epoch E ended: the engine is already past boundary E+1
        return m.epoch + 1

    def apply_changes(self) -> None:
        if self.source is None or not self._run_is_live() or self._stop_sent:
            return
        changed = self.controls.changed_fields()
        if not changed:
            return
        target = self._target_epoch()
        for name in LIVE_FIELDS:  # a fixed order: micro-batch and accum before lr
            if name not in changed:
                continue
            value = changed[name]
            try:
                cmd = make_command(name, value)
            except ConfigError as e:
                self.controls.on_refused({"micro_batch": "set_micro_batch", "accum": "set_accum", "lr": "set_lr",
                                          "clip": "set_clip", "lr_scaling": "set_lr_scaling"}[name], str(e))
                continue
            try:
                self.source.send(cmd)
            except (ConfigError, OSError) as e:
                self.show_error("Could not send the change", str(e))
                return
            self.controls.mark_pending(name, value, target)

    # -- engine thread signals -------------------------------------------------------------
    def _on_prepared(self, run_dir: str) -> None:
        if isinstance(self.source, LiveSource):
            self.source.run_dir = run_dir
        self.history.add_extra(run_dir)
        self.settings.add_recent("recent_runs", run_dir)
        self.setWindowTitle(f"Headroom - {os.path.basename(os.path.normpath(run_dir))}")

    def _on_bad_input(self, message: str) -> None:
        self.tick()
        self.run_outcome = {"status": "bad_input", "message": message}
        self.model.state = "idle"
        self.show_error("Could not start the run", message)

    def _on_failed(self, message: str) -> None:
        self.tick()
        self.run_outcome = {"status": "failed", "message": message}
        self.show_error("The run failed", f"{message}\n\nThe metrics and the last checkpoint stay in the run "
                                          f"folder. The full traceback is in {logs.log_path()}.")

    def _on_finished(self, result: dict) -> None:
        self.tick()
        self.run_outcome = {"status": "finished", **result}

    def _on_thread_stopped(self) -> None:
        self.tick()
        self._refresh_plots(force=True)  # the last steps, whatever the pacing
        if self.run_outcome is None:
            self.run_outcome = {"status": "finished", "reason": self.model.finish_reason}
        self._pause_sent = self._stop_sent = False
        if self.model.state in ("starting", "training", "paused") and not self.model.step:
            self.model.state = "idle"
        self._update_state()
        self.history.refresh()
        outcome = dict(self.run_outcome)
        for fn in list(self.run_done_callbacks):
            fn(outcome)
        if self._close_when_done:
            self._really_closing = True
            self.close()

    # -- the timer -----------------------------------------------------------------------
    def tick(self) -> None:
        """Drain the source, feed the model, update what changed. ~30 times a second."""
        try:
            self._tick()
        except Exception as e:  # never a traceback per tick: log it, say it once
            log.exception("updating the window failed")
            if not self._tick_failed:
                self._tick_failed = True
                self.show_error("Display error", f"{type(e).__name__}: {e}\n\nThe run goes on; details are in "
                                                 f"{logs.log_path()}.")

    def _tick(self) -> None:
        self._tick_n += 1
        if self._plots is not None and self._plots.stale:
            self._plots_due = True  # a small plot skipped its turn in the last frame
        self._refresh_plots()  # a redraw held back by the pacing
        src = self.source
        if src is not None:
            items = src.poll()
            if items:
                delta = self.model.ingest(items, src.step_get)
                self._apply_delta(delta)
            if isinstance(src, FolderSource) and not src.running and self.model.is_live:
                # the other process is gone without writing run_finished: say so
                self.model.state = "interrupted"
                self._update_state()
        if self._tick_n % STATUS_EVERY == 0:
            self._update_status()

    def _apply_delta(self, delta: Delta) -> None:
        m = self.model
        for note in delta.notes:
            k, d = note.kind, note.data
            if k == "run_started":
                cfg = d.get("config") or {}
                self.controls.world_size = int(d.get("world_size") or 1)
                self.controls.set_engine_values({n: cfg.get(n) for n in LIVE_FIELDS})
                gpu = str(d.get("device") or "").startswith("cuda")
                self.controls.set_fits_text(FITS_MEASURING if gpu else FITS_NO_GPU)
            elif k == "micro_batch_found":
                self.controls.on_micro_batch_found(int(d.get("micro_batch") or 1), int(d.get("accum") or 1),
                                                   int(d.get("probes") or 0), int(d.get("peak_bytes") or 0))
            elif k == "memory_forecast":
                self.controls.on_memory_forecast(d)
            elif k == "settings_applied":
                # the engine stamps it with the epoch about to start: the first one with the new values
                self.controls.on_settings_applied(tuple(tuple(c) for c in d.get("changes") or ()), note.step,
                                                  note.epoch)
            elif k == "oom_recovered":
                self.controls.set_engine_values({"micro_batch": d.get("new_micro_batch"),
                                                 "accum": d.get("new_accum")})
            elif k == "command_refused":
                self.controls.on_refused(str(d.get("command")), str(d.get("reason")))
            elif k == "paused":
                self._pause_sent = False
        if delta.steps:
            buf = m.metrics
            if not self.controls.engine or self._last_seen_epoch == 0:
                # The first steps of a run (a resumed one restores its settings from the checkpoint).
                first = len(buf) - delta.steps
                self.controls.set_engine_values({"lr": float(buf.view("lr")[first]),
                                                 "clip": float(buf.view("clip")[first]),
                                                 "micro_batch": int(buf.view("micro_batch")[first]),
                                                 "accum": int(buf.view("accum")[first])})
            if m.epoch != self._last_seen_epoch:
                self._last_seen_epoch = m.epoch
                self.controls.on_boundary_passed(m.epoch)
        if delta.alerts:
            self.alerts.add(delta.alerts)
        if delta.state or delta.info or delta.notes:
            self._update_state()
        self._plots_due = True
        self._refresh_plots()

    def _refresh_plots(self, force: bool = False) -> None:
        """Redraw the plots at ~30 Hz, slower when a frame costs more than PLOT_BUDGET of the
        time (a slow or busy machine): the event loop stays responsive and training keeps its
        CPU, and points still reach the screen within a few frames."""
        now = time.perf_counter()
        if self._plots is None or (not force and not self._plots_due):
            return
        if not force and now < self._next_plot:
            if not self._plot_timer.isActive():  # redraw as soon as the pacing allows, not a tick later
                self._plot_timer.start(max(1, int((self._next_plot - now) * 1000)))
            return
        self._plot_timer.stop()
        self._plots_due = False
        self.plots.refresh(force=force)
        self._next_plot = now + min(PLOT_MAX_INTERVAL,
                                    max(TICK_MS / 1000 * 0.9, self.plots.frame_cost() / PLOT_BUDGET))

    # -- state ---------------------------------------------------------------------------
    def ui_state(self) -> str:
        live = self._run_is_live()
        if not live:
            return "viewing" if len(self.model.metrics) and not isinstance(self.source, LiveSource) else "idle"
        if self._stop_sent:
            return "stopping"
        if self.model.state == "paused":
            return "paused"
        if self._pause_sent:
            return "pausing"
        if self.model.state == "starting" or (not self.model.info and not self.model.step):
            return "starting"
        return "training"

    def _state_text(self) -> str:
        st = self.ui_state()
        m = self.model
        if st == "idle" and m.state in ("finished", "failed", "interrupted"):
            st = m.state
        return {"idle": "Ready", "starting": "Starting", "training": "Training", "pausing": "Pausing",
                "paused": f"Paused after epoch {m.epoch}", "stopping": "Stopping",
                "viewing": f"Viewing ({m.state})" if m.state not in ("idle",) else "Viewing",
                "finished": f"Finished ({m.finish_reason})", "failed": "Failed",
                "interrupted": "Interrupted"}.get(st, st)

    def _update_state(self) -> None:
        st = self.ui_state()
        controls_state = "idle" if st == "viewing" else st
        self.controls.remote = self._controlling_remote()
        m = self.model
        detail = ""
        if controls_state == "idle" and m.state in ("finished", "failed", "interrupted"):
            detail = {"finished": f"Last run finished ({m.finish_reason}) at step {m.step:,}.",
                      "failed": f"Last run failed at step {m.step:,}: {m.finish_reason}",
                      "interrupted": f"This run stopped at step {m.step:,} without finishing (its process ended)."
                      }[m.state]
        self.controls.set_state(controls_state, detail)
        live = self._run_is_live()
        self.start_action.setEnabled(not live)
        self.stop_action.setEnabled(live and st != "stopping")
        self.pause_action.setEnabled(st == "training")
        self.resume_action.setEnabled(st in ("pausing", "paused"))
        self.apply_action.setEnabled(live)
        self.torchrun_action.setEnabled(not live and (self.gpu_count or 0) >= launch.MIN_GPUS)
        self.open_log_action.setEnabled(self.launch is not None and os.path.isfile(self.launch.log_path))
        self._update_status()

    def _update_status(self) -> None:
        self.status.update_from(self.model, self._state_text())

    def _alerts_count(self, n: int) -> None:
        self.alerts_dock.setWindowTitle(f"Alerts ({n})" if n else "Alerts")
        if n:
            self.alerts_dock.raise_()

    def _zoom_to_step(self, step: int) -> None:
        half = max(10, len(self.model.metrics) // 50)
        self.plots.loss_plot.setXRange(step - half, step + half)

    # -- dialogs -------------------------------------------------------------------------
    def show_error(self, title: str, message: str) -> QMessageBox:
        """A non-blocking dialog: the window (and any run) keeps going behind it."""
        self.last_error = (title, message)
        log.warning("%s: %s", title, message)
        box = QMessageBox(QMessageBox.Icon.Critical, title, message, QMessageBox.StandardButton.Ok, self)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.finished.connect(lambda *_: self.dialogs.remove(box) if box in self.dialogs else None)
        self.dialogs.append(box)
        box.open()
        return box

    def show_about(self) -> Any:
        """Help > About Headroom (non-blocking). torch loads here, not at start-up."""
        from .about import AboutDialog
        QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
        try:
            dlg = AboutDialog(self)
        finally:
            QApplication.restoreOverrideCursor()
        dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.about_dialog = dlg
        dlg.open()
        return dlg

    def choose_task_file(self) -> None:
        start = os.path.dirname(self.settings.recent("recent_tasks")[0]) if self.settings.recent("recent_tasks") \
            else assets.RESOURCES
        path, _ = QFileDialog.getOpenFileName(self, "Open a task file", start, "Python files (*.py)")
        if path:
            self.controls.set_task(path)
            self.settings.add_recent("recent_tasks", path)

    def choose_run_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open a run folder", self.history.root)
        if path:
            self.open_run(path)

    # -- run folders ---------------------------------------------------------------------
    def open_run(self, path: str) -> bool:
        """Show a run folder's plots (finished, or training in another process)."""
        if self.is_running():
            self.show_error("A run is going", "This window is training a run. Stop it first, or tick "
                                              "'Compare' in the run history to overlay the other run's loss.")
            return False
        try:
            src = FolderSource(path)
        except (StoreError, ConfigError) as e:
            self.show_error("Cannot open the run folder", str(e))
            return False
        self._reset_view()
        self.source = src
        self.history.add_extra(path)
        self.settings.add_recent("recent_runs", path)
        items = src.poll(force=True) + src.problems()
        delta = self.model.ingest(items, src.step_get)
        if src.interrupted():
            self.model.state = "interrupted"
        if not self.model.info:
            self.model.info = dict(src.info)
        self._apply_delta(delta)
        self.plots.fit()
        self.plots.refresh(force=True)
        self.setWindowTitle(f"Headroom - {os.path.basename(os.path.normpath(path))}")
        self._update_state()
        return True

    def set_overlay(self, path: str, on: bool) -> None:
        name = os.path.basename(os.path.normpath(path))
        if not on:
            self.plots.remove_overlay(name)
            return
        try:
            reader = RunReader(path)
            try:
                rows = reader.metrics()
            finally:
                reader.close()
        except StoreError as e:
            self.show_error("Cannot overlay the run", str(e))
            return
        buf = MetricsBuffer(max(16, len(rows)))
        buf.extend_records(rows, dict.get)
        self.plots.add_overlay(name, buf)

    # -- export --------------------------------------------------------------------------
    def export_csv(self, path: str) -> int:
        return export.write_csv(self.model, path)

    def export_png(self, path: str, whole_window: bool = False) -> bool:
        self.plots.refresh(force=True)
        QApplication.processEvents()
        return export.write_png(self if whole_window else self.plots, path)

    def export_csv_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export metrics", export.default_name(self.model, ".csv"),
                                              "CSV (*.csv)")
        if path:
            try:
                n = self.export_csv(path)
                self.statusBar().showMessage(f"Wrote {n} rows to {path}", 5000)
            except OSError as e:
                self.show_error("Export failed", str(e))

    def export_png_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export plots", export.default_name(self.model, ".png"),
                                              "PNG (*.png)")
        if path and not self.export_png(path):
            self.show_error("Export failed", f"could not write {path}")

    def screenshot(self, path: str) -> bool:
        """PNG of the whole window as it is now (--screenshot)."""
        self.tick()
        self._update_status()
        self.plots.refresh(force=True)
        QApplication.processEvents()
        return export.write_png(self, path)

    # -- closing -------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt name
        if self.runner.is_busy() and not self._really_closing:
            self.runner.stop()  # at the next micro-batch, with a checkpoint
            t0 = time.perf_counter()
            if not self.runner.join(JOIN_S):
                # Still inside something it cannot leave yet (torch loading, a long micro-batch):
                # never terminate() it; hide and close once it has stopped.
                log.warning("engine thread still busy after %.1fs; closing when it stops", JOIN_S)
                self._close_when_done = True
                self.save_settings()
                self.hide()
                event.ignore()
                return
            log.info("engine thread joined in %.2fs", time.perf_counter() - t0)
            self.tick()
        self.timer.stop()
        self._stop_launch_for_close()
        self.save_settings()
        if self.source is not None:
            self.source.close()
        for box in list(self.dialogs):
            box.close()
        event.accept()
        super().closeEvent(event)
        self.closed.emit()


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
