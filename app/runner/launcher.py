"""Runs on N GPUs: torchrun as a QProcess, its log, and the way it is stopped.

The launch manager starts torchrun, polls for the run.db the processes create and says
when it is ready to follow (`ready`), when the processes are gone (`ended`) and when
torchrun itself did not start (`error`). Stopping goes through run.db like any run in
another process; if the processes are still there LAUNCH_STOP_S later they get SIGTERM
(torchrun passes it on; the engine stops at the next micro-batch with a checkpoint).
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Optional

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices

from app.core.runs import is_run_dir
from app.session import launch_command as command
from engine.declarations.commands import Stop
from engine.declarations.config import TrainConfig
from engine.store import RunReader, StoreError, send_command

log = logging.getLogger("headroom.launcher")

LAUNCH_STOP_S = 20.0  # after Stop through run.db, SIGTERM the torchrun launch if it is still going
LAUNCH_POLL_MS = 250


class Launch:
    """A run started in other processes (torchrun): the QProcess, its folder and log."""

    def __init__(self, process: QProcess, run_dir: str, log_path: str, n: int, command: list[str]) -> None:
        self.process = process
        self.run_dir = run_dir
        self.log_path = log_path
        self.n = n
        self.command = command
        self.attached = False  # its run.db is being followed
        self.exit_code: Optional[int] = None
        self.terminated = False  # it got SIGTERM from here

    def alive(self) -> bool:
        return self.process.state() != QProcess.ProcessState.NotRunning


class LaunchManager(QObject):
    ready = Signal(object)  # Launch: its run.db exists and says what it is doing
    ended = Signal(object, int)  # Launch, exit code
    error = Signal(object, str)  # Launch, why torchrun did not start
    gpu_count_known = Signal(int, str)  # from a plain thread: (CUDA devices torch sees, why none)

    def __init__(self, parent: Optional[QObject] = None) -> None:
        super().__init__(parent)
        self.current: Optional[Launch] = None  # the last launch
        self.gpu_count: Optional[int] = None  # unknown until check_gpus has an answer
        self.gpu_why = ""
        self._gpu_check_started = False
        self._poll_timer = QTimer(self)
        self._poll_timer.setInterval(LAUNCH_POLL_MS)
        self._poll_timer.timeout.connect(self._poll)
        self._stop_timer = QTimer(self)
        self._stop_timer.setSingleShot(True)
        self._stop_timer.timeout.connect(self.terminate)
        self.gpu_count_known.connect(self._on_gpu_count)  # first, so later slots see the count

    # -- the GPUs ------------------------------------------------------------------------
    def check_gpus(self) -> None:
        """How many GPUs torch sees, on a plain thread (torch loads there), once."""
        if self._gpu_check_started:
            return
        self._gpu_check_started = True

        def work() -> None:
            n, why = command.cuda_device_count()
            self.gpu_count_known.emit(n, why)

        threading.Thread(target=work, name="headroom-gpu-count", daemon=True).start()

    def _on_gpu_count(self, n: int, why: str) -> None:
        self.gpu_count, self.gpu_why = n, why

    def tooltip(self) -> str:
        if self.gpu_count is None:
            return "Checking how many GPUs torch sees..."
        return command.gate_tooltip(self.gpu_count, self.gpu_why)

    # -- starting ------------------------------------------------------------------------
    def start(self, config: TrainConfig, n: int, run_dir: str) -> Launch:
        """torchrun with n processes on `config`, output to a log in `run_dir`. Raises
        ConfigError, ValueError or OSError before anything starts."""
        cmd = command.torchrun_command(config, n, run_dir)
        os.makedirs(run_dir, exist_ok=True)
        log_path = os.path.join(run_dir, command.LOG_NAME)
        proc = QProcess(self)
        proc.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        proc.setStandardOutputFile(log_path)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONPATH", command.engine_pythonpath())
        env.insert("PYTHONUNBUFFERED", "1")
        proc.setProcessEnvironment(env)
        proc.setWorkingDirectory(run_dir)
        ln = Launch(proc, run_dir, log_path, n, cmd)
        self.current = ln
        proc.finished.connect(lambda code, _status, ln=ln: self._on_finished(ln, code))
        proc.errorOccurred.connect(lambda err, ln=ln: self._on_error(ln, err))
        log.info("launch: %s (log %s)", " ".join(cmd), log_path)
        proc.start(cmd[0], cmd[1:])
        self._poll_timer.start()
        return ln

    def starting(self) -> bool:
        """A launch whose run.db is not followed yet."""
        return self.current is not None and not self.current.attached and self.current.alive()

    def follows(self, run_dir: Optional[str]) -> bool:
        """`run_dir` is the folder of the launch being followed."""
        ln = self.current
        return (ln is not None and ln.attached and run_dir is not None
                and os.path.abspath(run_dir) == os.path.abspath(ln.run_dir))

    def _poll(self) -> None:
        ln = self.current
        if ln is None or ln.attached:
            self._poll_timer.stop()
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
        self._attach(ln)

    def _attach(self, ln: Launch) -> None:
        self._poll_timer.stop()
        ln.attached = True
        self.ready.emit(ln)

    def _on_error(self, ln: Launch, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and ln is self.current:
            self._poll_timer.stop()
            self.error.emit(ln, f"{ln.command[0]}: {ln.process.errorString()}")

    def _on_finished(self, ln: Launch, code: int) -> None:
        ln.exit_code = int(code)
        log.info("launch ended with exit code %s: %s", code, ln.run_dir)
        self._stop_timer.stop()
        if ln is not self.current:
            return
        if not ln.attached:
            if is_run_dir(ln.run_dir):
                self._attach(ln)  # it wrote a run.db: show what it did
            else:
                self._poll_timer.stop()
        self.ended.emit(ln, int(code))

    # -- stopping ------------------------------------------------------------------------
    def stop_later(self) -> None:
        """Stop was asked (through run.db, or before there was one): SIGTERM if the processes
        are still there LAUNCH_STOP_S from now."""
        self._stop_timer.start(int(LAUNCH_STOP_S * 1000))

    def terminate(self) -> None:
        ln = self.current
        if ln is not None and ln.alive():
            log.warning("launch still running after Stop: SIGTERM")
            ln.terminated = True
            ln.process.terminate()

    def stop_for_close(self) -> None:
        """Closing the window ends the run it launched the clean way: Stop through run.db,
        then SIGTERM; never left to die with the QProcess (that would be SIGKILL, no checkpoint)."""
        ln = self.current
        if ln is None or not ln.alive():
            return
        self._poll_timer.stop()
        self._stop_timer.stop()
        if is_run_dir(ln.run_dir):
            try:
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

    # -- its log -------------------------------------------------------------------------
    def has_log(self) -> bool:
        return self.current is not None and os.path.isfile(self.current.log_path)

    def open_log(self) -> bool:
        if not self.has_log():
            return False
        assert self.current is not None
        return QDesktopServices.openUrl(QUrl.fromLocalFile(self.current.log_path))
