"""`python -m engine` / `headroom-train`: the headless trainer.

Bad input prints one `error: ...` line on stderr and exits 2, before anything is
written. A run that fails after it started exits 1 with one `error:` line; its
metrics and last checkpoint stay in the run folder.

The console is never a reason to stop training: a closed, full or broken stdout or
stderr is replaced by /dev/null and the run goes on (its rows land in run.db). Every
error line goes through `error_line` (one line, whitespace collapsed, capped).
Ctrl-C / SIGTERM once: stop at the next step with a checkpoint (exit 0). Twice: end at
once, even while task code blocks (what the store holds is committed first; exit 130).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any, Optional, Sequence

from .declarations import limits
from .declarations.config import ConfigError
from .declarations.run_flags import add_run_flags, build_parser
from .run_config import config_from_args

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# The run flags and their reading live below the CLI (the app and headroom-ctl start use them too).
__all__ = ["main", "add_run_flags", "build_parser", "config_from_args", "error_line", "ensure_std_streams"]


def error_line(message: Any) -> str:
    """The one `error: ...` line: any message (an exception's, a task's, with newlines or
    megabytes of text) collapsed to single spaces and capped at limits.ERROR_LINE_CHARS."""
    return "error: " + limits.one_line(message)


# -- the console: never a reason to stop -----------------------------------------------------------
def _devnull_onto(fd: int) -> None:
    """Point `fd` at /dev/null (a closed, full or broken standard stream)."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    if null != fd:
        try:
            os.dup2(null, fd)
        except OSError:
            pass
        os.close(null)


def ensure_std_streams() -> None:
    """Standard streams that are closed (`>&-`, `2>&-`) become /dev/null, before any file
    is opened: else run.db or a checkpoint could be given fd 1 or 2 and receive whatever
    a library prints. sys.stdout / sys.stderr (None then) get a writer on /dev/null."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            _devnull_onto(fd)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is None:
            try:
                setattr(sys, name, open(fd, "w", closefd=False, errors="backslashreplace"))
            except OSError:
                setattr(sys, name, open(os.devnull, "w"))


class _Stream:
    """Writes to sys.stdout or sys.stderr that never raise. The first failure (full disk,
    closed pipe, closed or revoked terminal) silences the stream for good: its descriptor
    is pointed at /dev/null, so the buffered text left behind cannot fail again at exit."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gone = False

    def write(self, text: str, flush: bool = True) -> None:
        if self.gone:
            return
        stream = getattr(sys, self.name, None)
        try:
            if stream is None:
                raise OSError("closed")
            stream.write(text)
            if flush:
                stream.flush()
        except (OSError, ValueError):  # ValueError: I/O operation on closed file
            self.gone = True
            try:
                fd = stream.fileno() if stream is not None else None
            except Exception:
                fd = None
            if fd in (1, 2):
                _devnull_onto(fd)
            try:
                setattr(sys, self.name, open(os.devnull, "w"))
            except OSError:
                pass

    def isatty(self) -> bool:
        try:
            stream = getattr(sys, self.name, None)
            return bool(stream is not None and stream.isatty())
        except (OSError, ValueError):
            return False


_OUT, _ERR = _Stream("stdout"), _Stream("stderr")


def _say_error(message: Any) -> None:
    _ERR.write(error_line(message) + "\n")


class ConsoleSink:
    """Progress line on a terminal, or JSON lines with --json. Never raises: a stream that
    fails is silenced (see _Stream), an event it cannot format is left out."""

    def __init__(self, as_json: bool, total_epochs: int) -> None:
        self.as_json = as_json
        self.tty = _ERR.isatty()
        self.total_epochs = total_epochs
        self._last_draw = 0.0

    @property
    def stdout_gone(self) -> bool:
        return _OUT.gone

    def __call__(self, event: Any) -> None:
        try:
            self._show(event)
        except Exception:  # a formatting surprise (a None where a number was expected): skip it
            pass

    def _show(self, event: Any) -> None:
        if self.as_json:
            if not _OUT.gone:
                _OUT.write(json.dumps(event.to_dict(), default=repr) + "\n")
            return
        if event.kind == "step":
            now = time.monotonic()
            if self.tty and now - self._last_draw > 0.1:
                self._last_draw = now
                _ERR.write(f"\repoch {event.epoch}/{self.total_epochs} step {event.step} "
                           f"loss {event.loss:.4f} norm {event.grad_norm:.3g} lr {event.lr:.3g} "
                           f"{event.micro_batch}x{event.accum} {event.throughput:,.0f}/s   ")
            return
        if event.kind == "checkpoint":
            return
        if event.kind == "settings_applied":  # the run's length changed while it trains: "epoch 2/N" follows
            self.total_epochs = next((new for name, _old, new in event.changes if name == "epochs"),
                                     self.total_epochs)
        _ERR.write(("\r\033[K" if self.tty else "") + f"[{event.kind}] {limits.one_line(event.message(), 2000)}\n")


class _Interrupts:
    """SIGINT / SIGTERM during the run. The first asks the trainer to stop at the next step
    (with a checkpoint, as a normal stop). The second ends the process at once: whatever the
    store holds is committed (a few seconds at most), then exit 130.

    The signals are counted on a thread woken through signal.set_wakeup_fd, not in a Python
    handler: CPython runs handlers only on the main thread between bytecodes, and the main
    thread may be blocked in task code (a Dataset's __getitem__ waiting on a network read)
    for as long as it likes. The wakeup byte is written by the C-level handler at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.count = 0
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._previous = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
        self._previous_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="headroom-signals", daemon=True)
        self._thread.start()

    def _handler(self, signum: int, _frame: Any) -> None:
        pass  # counted by _watch, which the wakeup byte of this very signal has woken

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._r, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            for signum in data:
                if signum == 0:  # close(): the run is over
                    return
                if signum in self.SIGNALS:
                    self.count += 1
                    if self.count == 1:
                        self.trainer.request_stop()  # stop at the next micro-batch, with a checkpoint
                    else:
                        self._end_now()

    def _end_now(self) -> None:
        store = getattr(self.trainer, "store", None)
        saved = True
        if store is not None:
            try:
                store.set_info(status="interrupted", finished=time.time())
                saved = store.commit(timeout=3.0)
            except Exception:
                saved = False
        step = getattr(self.trainer, "step", "?")
        _say_error(f"interrupted twice: stopped at once at step {step}, without a checkpoint; "
                   + ("run.db holds every step so far" if saved else "run.db could not take the last rows"))
        os._exit(EXIT_INTERRUPTED)

    def close(self) -> None:
        try:
            signal.set_wakeup_fd(self._previous_fd)
        except (ValueError, OSError):
            pass
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        try:
            os.write(self._w, b"\0")
        except OSError:
            pass
        self._thread.join(timeout=5)
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    ensure_std_streams()
    _OUT.gone = _ERR.gone = False
    try:
        ns = build_parser().parse_args(argv)
        config = config_from_args(ns)
        from .trainer.trainer import Trainer, TrainingError  # torch loads here, after the flags are checked
        trainer = Trainer(config, sink=ConsoleSink(ns.json, config.epochs))  # builds the run: bad input raises here
    except ConfigError as e:
        _say_error(e)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # Ctrl-C while the task loads or builds: nothing was written
        _say_error("interrupted")
        return EXIT_INTERRUPTED

    interrupts = _Interrupts(trainer) if threading.current_thread() is threading.main_thread() else None
    try:
        result = trainer.run()
    except (TrainingError, ConfigError) as e:
        _say_error(e)
        return EXIT_FAILED
    except Exception as e:  # the task's own code failed mid-run: run.db already holds run_failed
        from .trainer.failure import failure_message  # the cause and where, as run_failed says it
        _say_error(f"run failed at step {trainer.step}: {failure_message(e, trainer.ctx, ())}")
        return EXIT_FAILED
    except KeyboardInterrupt:  # raised by the task's own code (Ctrl-C is caught as a stop request)
        _say_error(f"interrupted at step {trainer.step}; what finished is in {trainer.run_dir}")
        return EXIT_INTERRUPTED
    finally:
        if interrupts is not None:
            interrupts.close()
    if result.reason == "nonfinite":
        why = result.message if "gave up" in result.message else f"non-finite loss or gradient at step {result.steps}"
        _say_error(f"{why}; stopped with the last good weights in {result.run_dir}")
        return EXIT_FAILED
    if result.store_lost:  # trained, but not all of it reached disk: not a success
        _say_error(f"run {result.reason}: {result.steps} steps, but run.db did not take everything: "
                   f"{result.store_lost}")
        return EXIT_FAILED
    if not ns.json and trainer.ctx.is_main:
        loss = result.final_loss if result.final_loss is not None else float("nan")
        _ERR.write(f"run {result.reason}: {result.steps} steps, final loss {loss:.4f}, folder {result.run_dir}\n")
    return EXIT_OK
