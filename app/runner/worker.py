"""The engine in a QThread: one worker QObject moved to one QThread. The only file that touches QThread.

- torch loads here, in the worker thread, when a run starts (never on the GUI's start-up path).
- Events go from the trainer straight into an `engine.declarations.events.EventBuffer` (the trainer's
  sink); the GUI drains it on its own timer. The signals below fire once per run, never
  once per step.
- Anything raised in the thread is caught there, logged with its traceback, and re-emitted
  as a one-line message.
- Stop is a flag (the trainer stops at the next micro-batch and writes its checkpoint);
  `join` waits for the thread with a timeout. Nothing here calls QThread.terminate().
"""
from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
import traceback
from typing import Any, Optional

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from engine.declarations.commands import Command
from engine.declarations.config import ConfigError, TrainConfig
from engine.declarations.events import EventBuffer

log = logging.getLogger("headroom.worker")


def leave_a_core_for_the_gui() -> int:
    """Cap torch's intra-op CPU threads at (cores - 1) unless the user chose a number.

    torch's OpenMP team spins at barriers; if the GUI thread takes one of its cores to paint,
    the team waits for it and training on a 2-core machine slows ~30x (2 vs 77 steps/s for
    mlp, measured by bench/ui_latency.py's method). One core left to the GUI costs little
    on a big machine and nothing on a GPU. Returns the thread count in use.
    """
    import torch
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("HEADROOM_TORCH_THREADS"):
        if os.environ.get("HEADROOM_TORCH_THREADS"):
            torch.set_num_threads(max(1, int(os.environ["HEADROOM_TORCH_THREADS"])))
        return torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    want = max(1, min(torch.get_num_threads(), cores - 1))
    if want != torch.get_num_threads():
        torch.set_num_threads(want)
    return want


ENGINE_NICE = 10  # the engine thread's nice value above the GUI thread's (Linux)


def yield_the_cpu_to_the_gui() -> Optional[int]:
    """Linux: raise the calling (engine) thread's nice value by ENGINE_NICE, before torch
    starts its own threads (they inherit it). HEADROOM_ENGINE_NICE=N overrides, 0 is off.

    When the CPU is busy (a small machine, other programs), the GUI thread otherwise waits
    for a core behind its own engine thread. bench/soak.py, nice alternating every 500 steps
    under the same load: the GUI thread waited on the run queue 23% of the time at +0, 13% at
    +5, 5% at +10, and a 10 ms timer's p99 lateness was 27, 23 and 15 ms, for the same steps/s.
    Under autogroup/cgroup scheduling (most Linux desktops) nice only ranks threads within
    the process's own group, so training keeps its share against other programs.
    Returns the thread's nice value, or None.
    """
    setpriority = getattr(os, "setpriority", None)
    if setpriority is None or not hasattr(threading, "get_native_id"):
        return None
    try:
        step = int(os.environ.get("HEADROOM_ENGINE_NICE", ENGINE_NICE))
        tid = threading.get_native_id()  # Linux: PRIO_PROCESS with a thread id sets that thread only
        nice = os.getpriority(os.PRIO_PROCESS, tid)
        if step > 0:
            setpriority(os.PRIO_PROCESS, tid, min(19, nice + step))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except (OSError, ValueError):
        return None


def failure_line(e: BaseException, trainer: Any = None) -> str:
    """The engine's own line for a run that failed (its run_failed message and the CLI's `error:`
    line): the cause and where in the task's code it was raised ("RuntimeError: boom (at
    task.py:12 in loss)"), so the dialog names the task file's line too."""
    try:
        from engine import distributed
        from engine.declarations.outcome import TrainingError
        from engine.trainer.failure import failure_message
        return failure_message(e, getattr(trainer, "ctx", None) or distributed.DistContext(), (TrainingError,))
    except Exception:  # noqa: BLE001 - the line is a courtesy: never a second failure
        return f"{type(e).__name__}: {e}"


class EngineWorker(QObject):
    """Runs one `engine.Trainer` on the thread it is moved to."""

    prepared = Signal(str)  # run folder, once the task has loaded and the run is about to start
    bad_input = Signal(str)  # the config or task was refused before anything ran (one line)
    failed = Signal(str)  # the run failed after it started (one line; traceback in the log)
    finished = Signal(object)  # dict: reason, steps, run_dir, final_loss
    done = Signal()  # always last, after one of the three above

    def __init__(self, config: TrainConfig, buffer: EventBuffer, commands: "queue.Queue[Command]") -> None:
        super().__init__()
        self.config = config
        self.buffer = buffer
        self.commands = commands
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._trainer: Any = None

    def request_stop(self) -> None:
        """Thread-safe: stop at the next micro-batch (or before the run starts)."""
        self._stop.set()
        with self._lock:
            trainer = self._trainer
        if trainer is not None:
            trainer.request_stop()

    @Slot()
    def run(self) -> None:
        try:
            self._run()
        finally:
            self.done.emit()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            if sys.platform.startswith("linux"):
                log.info("engine thread nice: %s", yield_the_cpu_to_the_gui())
            from engine.trainer.trainer import Trainer  # torch loads here, on this thread
            threads = leave_a_core_for_the_gui()
            log.info("torch intra-op threads: %d", threads)
            trainer = Trainer(self.config, sink=self.buffer.put, commands=self.commands)
        except ConfigError as e:  # TaskError too: a bad task file, an unknown task, a value out of range
            log.info("run refused: %s", e)
            self.bad_input.emit(str(e))
            return
        except BaseException as e:  # noqa: BLE001 - anything from the task's own code
            log.error("run could not start:\n%s", traceback.format_exc())
            self.bad_input.emit(failure_line(e))
            return
        with self._lock:
            self._trainer = trainer
        if self._stop.is_set():
            trainer.request_stop()
        log.info("run prepared in %.2fs: %s", time.perf_counter() - t0, trainer.run_dir)
        self.prepared.emit(str(trainer.run_dir))
        try:
            result = trainer.run()
        except BaseException as e:  # noqa: BLE001 - report everything, never let it kill the thread
            message = failure_line(e, trainer)
            log.error("run failed at step %s:\n%s", getattr(trainer, "step", "?"), traceback.format_exc())
            self.failed.emit(message)
            return
        finally:
            with self._lock:
                self._trainer = None
        self.finished.emit({"reason": result.reason, "steps": result.steps, "run_dir": str(result.run_dir),
                            "final_loss": result.final_loss})


class EngineRunner(QObject):
    """Owns the QThread and the worker of the current run. Lives on the GUI thread."""

    prepared = Signal(str)
    bad_input = Signal(str)
    failed = Signal(str)
    finished = Signal(object)
    stopped = Signal()  # the thread has ended (after one of the signals above)

    def __init__(self, parent: Optional[QObject] = None) -> None:
        super().__init__(parent)
        self.buffer = EventBuffer()
        self.commands: "queue.Queue[Command]" = queue.Queue()
        self._thread: Optional[QThread] = None
        self._worker: Optional[EngineWorker] = None

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.isRunning()

    def is_busy(self) -> bool:
        """A run was started and its thread has not been cleaned up yet."""
        return self._thread is not None

    @property
    def config(self) -> Optional[TrainConfig]:
        """The config of the run going, or None."""
        return self._worker.config if self._worker is not None else None

    def start(self, config: TrainConfig) -> None:
        if self._thread is not None:
            raise RuntimeError("a run is already going")
        self.buffer.drain()  # nothing from an earlier run
        self.commands = queue.Queue()
        thread = QThread()
        thread.setObjectName("headroom-engine")
        worker = EngineWorker(config, self.buffer, self.commands)
        worker.moveToThread(thread)
        thread.started.connect(worker.run)
        worker.prepared.connect(self.prepared)
        worker.bad_input.connect(self.bad_input)
        worker.failed.connect(self.failed)
        worker.finished.connect(self.finished)
        # Direct: quit from the worker thread itself, so join() (GUI thread blocked in wait) cannot deadlock.
        worker.done.connect(thread.quit, Qt.ConnectionType.DirectConnection)
        thread.finished.connect(self._on_thread_finished)
        self._thread, self._worker = thread, worker
        thread.start()

    def send(self, command: Command) -> None:
        """Thread-safe hand-off; the trainer reads the queue at its boundaries."""
        self.commands.put(command)

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.request_stop()

    def _trainer(self) -> Any:
        worker = self._worker
        if worker is None:
            return None
        with worker._lock:
            return worker._trainer

    def step(self) -> Optional[int]:
        """The step the engine has reached (None before its run started)."""
        step = getattr(self._trainer(), "step", None)
        return step if isinstance(step, int) else None

    def abandon(self, timeout: float = 3.0) -> Optional[bool]:
        """The app is about to exit with the engine thread still inside task code (it cannot
        be stopped, and is never terminated): mark the run interrupted and write what the run
        store holds. True if it is all on disk, False if not, None if there is no store yet.
        Thread-safe: the store takes writes from any thread (its flusher writes too)."""
        store = getattr(self._trainer(), "store", None)
        if store is None:
            return None
        try:
            store.set_info(status="interrupted", finished=time.time())
            return bool(store.commit(timeout=timeout))
        except Exception:  # noqa: BLE001 - exiting anyway
            log.exception("committing the run store before exiting")
            return False

    def join(self, timeout_s: float = 2.0) -> bool:
        """Wait for the engine thread to end. True if it has (or none was running)."""
        thread = self._thread
        if thread is None:
            return True
        ok = thread.wait(int(timeout_s * 1000))
        if ok:
            self._on_thread_finished()
        return ok

    @Slot()
    def _on_thread_finished(self) -> None:
        thread, worker = self._thread, self._worker
        if thread is None or thread.isRunning():
            return
        thread.wait()  # already ended: returns at once, and makes sure Qt agrees
        self._thread = self._worker = None
        if worker is not None:
            worker.deleteLater()
        thread.deleteLater()
        self.stopped.emit()
