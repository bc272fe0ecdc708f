"""Drives a RunSession from Qt: this window's engine thread, torchrun launches, run folders.

The session decides where the run stands; this class starts and stops the things that
run it, hands their news to the session and publishes what changed through
SessionSignals. The window connects views to those signals and shows `error` as a dialog.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

from PySide6.QtCore import QObject, Signal

from app.core import logs
from app.core.runs import remove_if_empty, writer_of
from app.model.state import RunState
from app.session.configs import launch_config, launch_dir, start_config
from app.session.remote_source import RemoteSource, is_remote
from app.session.session import RunSession, Update
from app.session.sources import FolderSource, LiveSource
from engine.declarations.config import ConfigError, TrainConfig
from engine.store import RunReader, StoreError, runlock

from .launcher import Launch, LaunchManager
from .signals import SessionSignals
from .worker import EngineRunner

log = logging.getLogger("headroom.driver")


@dataclass
class OwnRun:
    """The run this window's engine thread trains: where, and what was there before."""
    config: TrainConfig
    run_dir: Optional[str]  # known once the engine has prepared the run (or given as --run-dir)
    existed: bool  # the folder was there before Start (given with --run-dir, or resumed): it stays


def held_message(path: str, holder: dict[str, Any]) -> str:
    """Why a folder another live process writes cannot be started or resumed here."""
    return (f"{runlock.describe(path, holder)}. A run folder has one writer: this window can follow it "
            "(File > Open run folder) and send it commands, but not train it too. Start again once that run "
            "has ended, or start a new run in another folder.")


def live_writer(path: str) -> Optional[dict[str, Any]]:
    """The live writer of a folder (runlock, else the status of a run an older engine wrote)."""
    info: Optional[dict[str, Any]] = None
    if os.path.isfile(os.path.join(path, "run.db")):
        try:
            with RunReader(path) as reader:
                info = reader.info()
        except StoreError:
            info = None
    return writer_of(path, info)


class SessionDriver(QObject):
    error = Signal(str, str)  # (title, message): something the user must read
    run_dir_known = Signal(str)  # the folder of the run shown (prepared, launched or opened)
    folder_opened = Signal(str)  # a run folder's data is in the model
    view_restored = Signal(str)  # the run shown before a Start that failed is in the model again
    run_done = Signal(dict)  # this window's engine thread has ended: the outcome

    def __init__(self, parent: Optional[QObject] = None) -> None:
        super().__init__(parent)
        self.session = RunSession()
        self.signals = SessionSignals(self)
        self.runner = EngineRunner(self)
        self.launcher = LaunchManager(self)
        self.outcome: Optional[dict[str, Any]] = None  # how the last run of this window ended
        self.own: Optional[OwnRun] = None  # the run this window's engine thread trains
        self._resume_used = False  # --resume continues that run once; Start again begins a new one
        self._before_start = ""  # the run shown when Start was pressed
        self.runner.prepared.connect(self._on_prepared)
        self.runner.bad_input.connect(self._on_bad_input)
        self.runner.failed.connect(self._on_failed)
        self.runner.finished.connect(self._on_finished)
        self.runner.stopped.connect(self._on_thread_stopped)
        self.launcher.ready.connect(self._on_launch_ready)
        self.launcher.ended.connect(self._on_launch_ended)
        self.launcher.error.connect(self._on_launch_error)

    def publish(self, u: Update) -> None:
        self.signals.publish(u, self.session)

    def tick(self) -> None:
        """Drain the source into the session (the window's ~30 Hz timer)."""
        self.publish(self.session.poll())

    # -- starting ------------------------------------------------------------------------
    def start(self, base: dict[str, Any], form: dict[str, Any]) -> bool:
        """A run in this window's engine thread: the command-line flags under the form's values."""
        try:
            config = start_config(base, form, self._resume_used)
        except ConfigError as e:
            self.error.emit("Cannot start", str(e))
            return False
        return self._start(config)

    def continue_run(self, path: str, base: dict[str, Any], form: dict[str, Any]) -> bool:
        """Continue a run folder from its last checkpoint in this window's engine thread (the
        engine's --resume), with the form's settings; the run goes on in its own folder."""
        flags = {k: v for k, v in base.items() if k not in ("resume", "run_dir", "fork", "max_steps")}
        try:
            config = start_config({**flags, "resume": path}, form, False)
        except ConfigError as e:
            self.error.emit("Cannot continue the run", str(e))
            return False
        return self._start(config)

    def _shown_folder(self) -> str:
        """The folder of the run the window shows now ('' : none, or nothing of it to show)."""
        ses = self.session
        if not len(ses.model.metrics):
            return ""
        d = (ses.source.run_dir if ses.source is not None else None) or ses.model.info.get("run_dir")
        return str(d or "")

    def _start(self, config: TrainConfig) -> bool:
        folder = config.resume or config.run_dir
        holder = live_writer(folder) if folder else None
        if holder is not None:  # never a second writer: refused before anything loads or is written
            assert folder is not None
            self.error.emit("Cannot start: the run folder is live", held_message(folder, holder))
            return False
        history: list[Any] = []
        if config.resume:
            self._resume_used = True
            history = self._history(config.resume)
        self._before_start = self._shown_folder()  # shown again if this Start fails before its first step
        self.own = OwnRun(config, config.resume or config.run_dir or None,
                          existed=bool(config.resume or (config.run_dir and os.path.isdir(config.run_dir))))
        self.outcome = None
        source = LiveSource(self.runner.buffer, self.runner.send, self.runner.stop)
        self.publish(self.session.begin(source, engine=True, history=history))
        log.info("start: %s", config.to_dict())
        self.runner.start(config)
        return True

    def _history(self, run_dir: str) -> list[Any]:
        """A resumed run: what run.db holds so far; the live steps continue it (and supersede any
        logged after the checkpoint)."""
        try:
            src = FolderSource(run_dir, lazy=False)  # every column: its own steps continue them
        except (StoreError, ConfigError) as e:
            log.warning("resume %s: cannot read its history: %s", run_dir, e)
            return []
        try:
            return src.poll(force=True)
        finally:
            src.close()

    def launch(self, base: dict[str, Any], form: dict[str, Any], n: int, run_dir: str = "") -> Optional[Launch]:
        """The form's settings under torchrun with n processes; the run is followed through its
        run.db once it exists."""
        try:
            config = launch_config(base, form)
            folder = launch_dir(config, n, run_dir)
            holder = live_writer(folder)
            if holder is not None:
                raise ConfigError(held_message(folder, holder))
            ln = self.launcher.start(config, n, folder)
        except (ConfigError, ValueError, OSError) as e:
            self.error.emit("Cannot start", str(e))
            return None
        self.outcome = None
        self.publish(self.session.begin(None))
        self.run_dir_known.emit(ln.run_dir)
        return ln

    def open(self, path: str, restore: bool = False, remote_python: str = "") -> bool:
        """Show a run folder's data (finished, or training in another process). restore: the run
        shown before a Start that failed, shown again (view_restored, not folder_opened: the
        form keeps what the user was starting)."""
        if self.runner.is_busy():
            self.error.emit("A run is going", "This window is training a run. Stop it first, or tick "
                                              "'Compare' in the run history to overlay the other run's loss.")
            return False
        try:
            # [user@]host:path: followed through headroom-ctl over ssh (app/session/remote_source.py)
            src = RemoteSource(path, remote_python) if is_remote(path) else FolderSource(path)
        except (StoreError, ConfigError) as e:
            message = str(e)
            holder = runlock.holder(path)
            if holder is not None:  # a writer still setting the run up: run.db comes with its first write
                message = (f"{runlock.describe(path, holder)}, which has not written its run.db yet; "
                           "open it again in a moment")
            self.error.emit("Cannot open the run folder", message)
            return False
        self.publish(self.session.open(src))
        self.run_dir_known.emit(path)
        (self.view_restored if restore else self.folder_opened).emit(path)
        return True

    # -- commands ------------------------------------------------------------------------
    # A command that cannot reach the run (a run folder on a read-only mount, deleted, its
    # run.db damaged) is one dialog saying why; the session has left its state as it was.
    def _command(self, u: Update, title: str) -> None:
        self.publish(u)
        if u.error:
            log.warning("%s: %s", title, u.error)
            self.error.emit(title, f"{u.error}\n\nNothing was sent: the run goes on as it was.")

    def pause(self) -> None:
        self._command(self.session.pause(), "Could not pause the run")

    def resume(self) -> None:
        self._command(self.session.resume(), "Could not resume the run")

    def stop(self) -> None:
        u = self.session.stop()
        self._command(u, "Could not stop the run")
        if self.session.state is not RunState.STOPPING or not u.state:
            return
        src = self.session.source
        if (src is None and self.launcher.starting()) or (src is not None and self.launcher.follows(src.run_dir)):
            self.launcher.stop_later()  # SIGTERM if Stop through run.db does not end it (or there is none yet)

    def apply(self, edits: dict[str, Any], at: str = "epoch") -> None:
        """at: "epoch" (the next epoch boundary) or "step" (the next optimizer step)."""
        u, _err = self.session.apply(edits, at)
        self._command(u, "Could not send the change")

    def close(self) -> None:
        """The window closes: end a launched run the clean way, let go of the run folder."""
        self.launcher.stop_for_close()
        self.session.close()

    # -- the engine thread -----------------------------------------------------------------
    def _on_prepared(self, run_dir: str) -> None:
        if self.own is not None:
            self.own.run_dir = run_dir
        src = self.session.source
        if isinstance(src, LiveSource):
            src.run_dir = run_dir
        self.run_dir_known.emit(run_dir)

    def _on_bad_input(self, message: str) -> None:
        self.tick()
        self.outcome = {"status": "bad_input", "message": message}
        self.publish(self.session.not_started())
        self.error.emit("Could not start the run", message)

    def _on_failed(self, message: str) -> None:
        self.tick()
        self.outcome = {"status": "failed", "message": message}
        self.error.emit("The run failed", f"{message}\n\nThe metrics and the last checkpoint stay in the run "
                                          f"folder. The full traceback is in {logs.log_path()}.")

    def _on_finished(self, result: dict) -> None:
        self.tick()
        self.outcome = {"status": "finished", **result}

    def _on_thread_stopped(self) -> None:
        self.publish(self.session.engine_stopped())
        if self.outcome is None:
            self.outcome = {"status": "finished", "reason": self.session.model.finish_reason}
        self._forget_empty_run()
        self._show_again()
        self.run_done.emit(dict(self.outcome))

    def _show_again(self) -> None:
        """A Start refused before its first step (a task that does not load): the run the window
        showed before comes back, plots and all, rather than an empty window under its name."""
        before, self._before_start = self._before_start, ""
        if (self.outcome or {}).get("status") != "bad_input" or len(self.session.model.metrics):
            return
        if before and os.path.isfile(os.path.join(before, "run.db")):
            self.open(before, restore=True)

    def _forget_empty_run(self) -> None:
        """A run stopped (Stop, the window closed, a signal) or refused before its first step:
        its folder holds nothing to show, so it does not stay in the run history as an empty
        run. Removed only if it holds no metrics row and no checkpoint (app/core/runs.py),
        never a resumed run's folder, never a folder that was there before Start."""
        own, self.own = self.own, None
        outcome = self.outcome or {}
        stopped = outcome.get("reason") == "stopped" or outcome.get("status") == "bad_input"
        if own is None or own.config.resume or not own.run_dir or not stopped or len(self.session.model.metrics):
            return
        if remove_if_empty(own.run_dir, keep_folder=own.existed, own_pid=os.getpid()):
            log.info("removed %s: the run stopped before its first step", own.run_dir)

    # -- torchrun launches -----------------------------------------------------------------
    def _on_launch_ready(self, ln: Launch) -> None:
        stop_asked = self.session.state is RunState.STOPPING  # Stop pressed while it was starting
        if self.open(ln.run_dir) and stop_asked and self.session.remote:
            self.stop()

    def _on_launch_ended(self, ln: Launch, code: int) -> None:
        if not ln.attached:
            if self.session.source is None:  # still waiting for it (not moved on to another run)
                self.publish(self.session.not_started())
            if not ln.terminated:
                self.error.emit("The run on N GPUs did not start",
                                f"torchrun exited with code {code} before the run began. Its output is in "
                                f"{ln.log_path} (Run > Open launch log).")
        else:
            src = self.session.source
            if src is not None and self.launcher.follows(src.run_dir):
                self.publish(self.session.poll(force=True, flush=True))  # what the processes wrote last
        if self.outcome is None:
            self.outcome = {"status": "finished" if code == 0 else "failed",
                            "reason": self.session.model.finish_reason, "exit_code": int(code)}
        self.publish(Update(state=True))  # the launch log, Start and Run on N GPUs follow

    def _on_launch_error(self, ln: Launch, message: str) -> None:
        self.publish(self.session.not_started())
        self.error.emit("Could not start torchrun", message)
