"""A hand-written PyTorch loop writes a Headroom run folder: one import and three lines.

    from engine.integrations.loop import headroom_run, set_lr

    with headroom_run(config={"lr": 1e-3, "accum": 4}) as run:      # run_dir=None: a new folder
        for epoch in range(epochs):
            for window in windows:
                ...                                                # forward, backward, clip, step
                run.log_step(loss=loss, grad_norm=norm, lr=opt.param_groups[0]["lr"],
                             accum=4, micro_batch=16, samples=64)
                for cmd in run.poll():                             # commands from the app
                    if cmd.kind == "set_lr":
                        run.apply(cmd, lr=set_lr(opt, cmd.lr, scheduler))
                    # a command neither applied nor refused is refused for you at the next poll
                if run.stop_requested:
                    break                                          # save your checkpoint, leave
            run.log_epoch(val_loss=evaluate())

`HeadroomRun` is also the one writer under the Hugging Face and Lightning callbacks
(`engine.integrations.transformers`, `engine.integrations.lightning`): the same rows,
events and commands, three adapters. Rows go through `engine.store.RunStore`, so the
columns, buffering (committed at least once a second) and WAL behaviour are the
engine's; GPU memory comes from the engine's `MemoryProbe`.

Commands: `poll()` looks at run.db at most every `poll_interval` (0.05 s), and reads the
`commands` table (through RunStore.pending_commands) only when a new row is there
(`PRAGMA data_version`, then max(id)), so it can be called every step. Pause and resume are handled inside `poll()` (it
blocks while paused); stop sets `stop_requested`. Every other command is handed to the
loop, which `apply()`s it, `refuse()`s it with a reason, or `defer()`s it to a later
boundary; one left untouched is refused at the next `poll()`.
"""
from __future__ import annotations

import atexit
import math
import os
import tempfile
import time
import weakref
from typing import Any, Callable, Literal, Mapping, Optional, Sequence

from engine.declarations.commands import Command
from engine.declarations.events import CheckpointSaved, EpochEnd, Event, RunFailed, RunFinished, RunStarted, StepMetrics
from engine.declarations.paths import default_run_dir
from engine.steering.lr import base_lrs, rescale
from engine.store import DB_NAME, RunStore, runlock
from engine.trainer.notify import ENV as NOTIFY_ENV
from engine.trainer.notify import Notifier, notify_urls
from engine.trainer.notify import checked as notify_checked

from ._loop_events import IntegrationError, LossWeighting, StepSkipped
from ._loop_rows import StepRows
from ._loop_steering import Steering
from ._step_record import STEPPED, StepRecord, logged_index, loop_step

__all__ = ["HeadroomRun", "headroom_run", "set_lr", "LossWeighting", "StepSkipped", "IntegrationError",
           "batch_size", "clean"]

# -- the lr helper the adapters share ------------------------------------------------------------------

def set_lr(optimizer: Any, lr: float, scheduler: Any = None) -> tuple[float, float]:
    """Make `lr` the learning rate of the next step, keeping the schedule's shape.

    Every param group's lr (and the keys schedulers build it from: initial_lr, max_lr,
    min_lr) and the scheduler's base_lrs / max_lrs are multiplied by one factor,
    lr / (first group's current lr), so groups keep their ratios and the schedule goes on
    from the new level (a warmup keeps warming up, a decay keeps decaying). If the
    current lr is 0 (a schedule at zero), the factor is lr / the scheduler's base lr, or
    with none, the lr is set outright. The arithmetic is the engine's own
    (engine.steering.lr.rescale). Returns (old, new) of the first group. Call it between
    optimizer steps.
    """
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise IntegrationError(f"set_lr: lr must be a positive finite number, got {lr!r}")
    groups = optimizer.param_groups
    old = float(groups[0]["lr"])
    if old > 0:
        factor: Optional[float] = lr / old
    else:
        bases = base_lrs(scheduler)
        base = bases[0] if bases else float(groups[0].get("initial_lr") or 0.0)
        factor = lr / base if base > 0 else None
    rescale(optimizer, factor, lr, scheduler)
    return old, float(groups[0]["lr"])


# -- the writer ----------------------------------------------------------------------------------------

def _device_name(device: Any) -> str:
    import torch
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform
    return platform.processor() or platform.machine() or "CPU"


def _as_device(device: Any) -> Any:
    import torch
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise IntegrationError(f"device {device!r} is not a torch device ({e})") from None
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _prepare_dir(path: str) -> None:
    """Refuse a folder that holds a run or cannot be written; create it."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise IntegrationError(f"run_dir {path}: exists and is not a folder")
        if os.path.exists(os.path.join(path, DB_NAME)):
            raise IntegrationError(f"run_dir {path}: already holds a run (leave run_dir unset for a new folder)")
    try:
        os.makedirs(path, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".probe-", dir=path)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise IntegrationError(f"run_dir {path}: not writable ({e.strerror or e})") from None


_OPEN: "weakref.WeakSet[HeadroomRun]" = weakref.WeakSet()


@atexit.register
def _close_open_runs() -> None:  # a script that exits mid-run leaves a failed run, not a "running" one
    for run in list(_OPEN):
        try:
            run.fail("the process exited before the run finished")
        except Exception:
            pass


class HeadroomRun:
    """One run folder being written by a training loop on this thread. See the module doc.

    run_dir: the folder (created; must not hold a run yet); None = a new folder under the
        runs root ($HEADROOM_RUNS, else ~/.local/share/headroom/runs), as the engine names them.
    task: the name the runs list shows. config: the run's settings, shown by the app and kept
        in run.db (JSON; "epochs" and "max_steps" also drive the app's time-left estimate).
    device: where training runs (GPU memory is read from it); None = the current CUDA device
        if there is one, else the CPU. world_size: processes training together (samples are
        per step, all processes). steering: "" = commands are handed to the loop; a reason =
        every command is refused with it. integration: who writes ("loop", "transformers", ...).
    commit_interval: seconds between commits of metrics rows (the engine's 1.0). poll_interval:
        poll() reads run.db at most this often (0 = every call); a step longer than that
        sees a command at the next boundary after it was sent. refusal: a function of a
        setting command returning why this loop can never apply it ('' if it can): such a
        command is refused as it arrives, not when its epoch comes.

    This class keeps the run folder's lifetime (the folder, its lock, the store); the rows
    of steps and epochs are built by `loop_rows.StepRows`, the commands handled by
    `loop_steering.Steering`.
    """

    def __init__(self, run_dir: Optional[str] = None, *, task: str = "loop",
                 config: Optional[Mapping[str, Any]] = None, device: Any = None, world_size: int = 1,
                 steering: str = "", integration: str = "loop", commit_interval: float = 1.0,
                 poll_interval: float = 0.05, refusal: Optional[Callable[[Command], str]] = None,
                 notify: Sequence[str] = ()) -> None:
        if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
            raise TypeError(f"run_dir must be a folder path (str or os.PathLike) or None, got {type(run_dir).__name__}")
        if not isinstance(task, str) or not task.strip():
            raise TypeError(f"task must be a non-empty string, got {task!r}")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict of settings or None, got {type(config).__name__}")
        if config is not None and not all(isinstance(k, str) for k in config):
            raise TypeError("config keys must be strings")
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise TypeError(f"world_size must be an integer >= 1, got {world_size!r}")
        if refusal is not None and not callable(refusal):
            raise TypeError("refusal must be a function of a command returning why it cannot apply ('' if it can)")
        if not isinstance(steering, str):
            raise TypeError("steering must be '' (commands handed to the loop) or a reason to refuse them")
        for name, v in (("commit_interval", commit_interval), ("poll_interval", poll_interval)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
                raise TypeError(f"{name} must be seconds >= 0, got {v!r}")
        # Apprise URLs (else HEADROOM_NOTIFY's): checked now, before anything is written
        self._notify_urls = notify_urls([notify] if isinstance(notify, str) else list(notify))
        notify_checked(self._notify_urls, "notify" if notify else NOTIFY_ENV)
        self._notifier: Optional[Notifier] = None
        self.run_dir = os.fspath(run_dir) if run_dir is not None else None
        self.task = task
        self.config = dict(config or {})
        self.device = device
        self.world_size = world_size
        self.steering = steering
        self.integration = integration
        self.commit_interval = float(commit_interval)
        self.poll_interval = float(poll_interval)
        self.refusal = refusal
        self.step = 0  # optimizer steps logged (the last row's step)
        self.epoch = 1  # the epoch being trained, 1-based
        self.stop_requested = False
        self.paused = False
        self.finished = False
        # The product of the app's lr changes applied so far (new / old of each `lr` apply()): a
        # loop that computes its lr every iteration (nanoGPT's get_lr()) multiplies it by this,
        # or the app's change would last one step.
        self.lr_scale = 1.0
        self._store: Optional[RunStore] = None
        self._lock: Any = None
        self._rows = StepRows(self)  # metrics and epochs rows, step timing, memory
        self._commands = Steering(self)  # the commands table: poll, apply, refuse, defer

    # -- lifetime -------------------------------------------------------------------------------------
    def __enter__(self) -> "HeadroomRun":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        if self.finished:
            return False
        if exc_type is None:
            self.finish("stopped" if self.stop_requested else "completed")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.fail("interrupted")
        else:
            self.fail(f"{exc_type.__name__}: {exc}")
        return False

    def close(self) -> None:
        """End the run without a `with` block (so nothing in the loop re-indents):

            run = headroom_run(config=...).start()
            ...                                   # the loop as it was, plus poll() and log_step()
            run.close()

        Finished ("stopped" if a stop was asked, else "completed"); idempotent. A script that
        dies before close() leaves the run failed, not "running" (marked at exit)."""
        if not self.finished:
            self.finish("stopped" if self.stop_requested else "completed")

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """The run as a decorator on your training function: started when it is called,
        finished when it returns, failed (and re-raised) when it raises.

            run = headroom_run(config=...)

            @run
            def train(): ...                      # uses `run` inside, as is
        """
        import functools

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)
        return wrapped

    @property
    def started(self) -> bool:
        return self._store is not None

    def start(self, step: int = 0, epoch: int = 1) -> "HeadroomRun":
        """Open the run folder and write the run table and the run_started event.
        step/epoch: where a resumed loop starts (rows continue from step + 1)."""
        if self._store is not None or self.finished:
            raise RuntimeError("this HeadroomRun was already started")
        dev = _as_device(self.device)
        self.run_dir = self.run_dir or default_run_dir(self.task)
        _prepare_dir(self.run_dir)
        self._lock = runlock.acquire(self.run_dir)  # one writer per run folder, as for the engine
        try:
            self._open_store(dev, int(step), int(epoch))
        except BaseException:
            if self._store is not None:
                self._close("failed", safe=True)
            else:
                self._lock.release()
                self._lock = None
            raise
        self._rows.start_timers()
        return self

    def _open_store(self, dev: Any, step: int, epoch: int) -> None:
        import torch
        assert self.run_dir is not None
        self.step, self.epoch = step, epoch
        self._rows.open(dev)
        store = RunStore(self.run_dir, commit_interval=self.commit_interval)
        self._store = self._rows.store = store
        if self._notify_urls:  # every event the run records, its steps' losses too, reaches the notifier
            self._notifier = Notifier(self._notify_urls, self.run_dir)
            store.listener = self._notifier.on_event
        _OPEN.add(self)
        name = _device_name(dev)
        config = {"task": self.task, **self.config}
        store.set_info(config=config, task=self.task, device=str(dev), device_name=name,
                       world_size=self.world_size, torch_version=torch.__version__, status="running",
                       pid=os.getpid(), backend="none", precision=str(config.get("precision", "fp32")),
                       integration=self.integration, started=time.time())
        store.record(RunStarted(self.step, self.epoch, run_dir=os.path.abspath(self.run_dir), task=self.task,
                                device=str(dev), device_name=name, torch_version=torch.__version__,
                                world_size=self.world_size, resumed=self.step > 0, config=config))
        store.commit()
        self._commands.open(os.path.join(self.run_dir, DB_NAME), store)

    def set_info(self, **items: Any) -> None:
        """Extra keys for run.db's `run` table (JSON values)."""
        self._need_store().set_info(**items)

    def finish(self, reason: str = "completed") -> None:
        """End the run: run_finished event, status finished. Idempotent."""
        if self.finished or self._store is None:
            self.finished = True
            return
        self._commands.end()
        self.flush_epoch_gap()
        self._store.record(RunFinished(self.step, self.epoch, reason=reason))
        self._notified()
        self._close("finished")

    def fail(self, error: str) -> None:
        """End the run as failed (an exception in the loop). Never raises."""
        if self.finished or self._store is None:
            self.finished = True
            return
        try:
            self._store.record(RunFailed(self.step, self.epoch, error=str(error)))
            self._notified()
        except Exception:
            pass
        self._close("failed", safe=True)

    def _notified(self) -> None:
        """The run's last message gets its time to go (Notifier.close); one that was not
        delivered is said as a notify_failed event before run.db closes."""
        notifier, self._notifier = self._notifier, None
        if notifier is None or self._store is None:
            return
        notifier.close()
        failed = notifier.failure(self.step, self.epoch)
        if failed is not None:
            self._store.record(failed)

    def _close(self, status: str, safe: bool = False) -> None:
        self.finished = True
        _OPEN.discard(self)
        store, self._store = self._store, None
        try:
            if store is not None:
                store.set_info(status=status, finished=time.time(), step=self.step)
                store.close()
        except Exception:
            if not safe:
                raise
        finally:
            self._commands.close()
            self._rows.close()
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _need_store(self) -> RunStore:
        if self._store is None:
            raise RuntimeError("the run is not started (use `with headroom_run(...) as run:` or run.start())"
                               if not self.finished else "the run has finished")
        return self._store

    # -- what its helpers (loop_rows, loop_steering) read of the run ----------------------------------
    @property
    def store(self) -> RunStore:
        """The open run store (raises before start() and after the end)."""
        return self._need_store()

    @property
    def last_step(self) -> Optional[StepMetrics]:
        """The last metrics row written (None before the first)."""
        return self._rows.last

    # -- writing (loop_rows.StepRows) -----------------------------------------------------------------
    def log_step(self, loss: Any, *, grad_norm: Any = None, lr: Any = None, accum: int = 1,
                 micro_batch: Optional[int] = None, samples: Optional[int] = None, tokens: Optional[int] = None,
                 clip: Any = 0.0, clipped: Optional[bool] = None, step_time: Optional[float] = None,
                 nonfinite: Optional[bool] = None, scaler_skipped: bool = False, epoch: Optional[int] = None,
                 step: Optional[int] = None, framework_loss: Optional[float] = None,
                 bad_params: tuple[str, ...] = (), nonfinite_action: str = STEPPED) -> StepMetrics:
        """One optimizer step: one `metrics` row (buffered; committed at least once a second).

        loss: the window's loss (float or 0-d tensor: read to the host here, once).
        grad_norm: total gradient norm before clipping (None if not measured). lr: the step's lr.
        accum: micro-batches in the window; micro_batch: samples per micro-batch (default
        samples // accum); samples: samples in the window, all processes (default
        micro_batch x accum x world_size); tokens: the loss's count (default samples).
        clip: the clip norm in force (0 = off); clipped: default grad_norm > clip.
        step_time: seconds (default: since the previous log_step, start or resume).
        nonfinite: default loss or grad_norm not finite; a non-finite step also writes a
        `nonfinite` event naming `bad_params` with `nonfinite_action` (say "skipped" if your
        loop skipped the step). framework_loss: what the framework reports for the window,
        when it differs from `loss` (see LossWeighting).
        """
        self._need_store()
        now = time.perf_counter()
        record = loop_step(loss, grad_norm=grad_norm, lr=lr, accum=accum, micro_batch=micro_batch, samples=samples,
                           tokens=tokens, clip=clip, clipped=clipped, step_time=step_time, nonfinite=nonfinite,
                           scaler_skipped=scaler_skipped, epoch=epoch, step=step, framework_loss=framework_loss,
                           bad_params=bad_params, nonfinite_action=nonfinite_action, last_step=self.step,
                           this_epoch=self.epoch, world_size=self.world_size, elapsed=self._rows.since_last(now))
        self._rows.restart(now)  # (only once the arguments passed: a refused call leaves the timer running)
        return self._rows.write(record)

    def record_step(self, record: StepRecord, check: Any = None) -> StepMetrics:
        """log_step without the checks and defaults: the adapters' path, which builds the record of
        plain values itself (a few steps after one host sync). check: the step against the exact
        one (engine.integrations._exactness.WindowCheck), if measured."""
        return self._rows.write(record, check)

    def flush_epoch_gap(self) -> None:
        self._rows.flush_epoch_gap()

    def log_epoch(self, val_loss: Any = None, *, train_loss: Any = None, seconds: Optional[float] = None,
                  epoch: Optional[int] = None) -> EpochEnd:
        """The end of an epoch: an `epochs` row and an epoch_end event; the next epoch begins.
        train_loss: default, the count-weighted mean of this epoch's finite step losses."""
        return self._rows.log_epoch(val_loss, train_loss, seconds, epoch)

    def log_scalars(self, values: Mapping[str, Any], *, step: Optional[int] = None,
                    epoch: Optional[int] = None) -> int:
        """What the framework logs besides the loss (accuracy, F1, eval_loss, ...): one row per
        finite number in run.db's `scalars` table, at `step` (default: the last step logged)
        and `epoch` (default: the epoch being trained); the app plots them. Tensors are read
        to the host here; anything that is not a number is left out. Returns the rows queued."""
        if not isinstance(values, Mapping):
            raise IntegrationError(f"log_scalars: values must be a dict of name -> number, got {type(values).__name__}")
        plain = {}
        for k, v in values.items():
            item = getattr(v, "item", None)
            if callable(item) and getattr(v, "numel", lambda: 1)() == 1:
                v = item()
            plain[str(k)] = v
        at_step, at_epoch = logged_index(step), logged_index(epoch)  # no index (NaN, ...): the current one
        return self._need_store().log_scalars(self.step if at_step is None else at_step,
                                              self.epoch if at_epoch is None else at_epoch, plain)

    def record(self, event: Event) -> None:
        """Write any engine event (checkpoint, scaler_skip, ...): events commit at once."""
        self._need_store().record(event)

    def checkpoint_saved(self, path: str) -> None:
        self.record(CheckpointSaved(self.step, self.epoch, path=os.path.abspath(path)))

    def lap(self) -> float:
        """Seconds since the last step ended (or the start, a resume, reset_timer()); a new
        step starts now. For adapters that time steps themselves."""
        return self._rows.lap()

    def due(self) -> bool:
        """Whether poll() would look at run.db now (adapters write their rows then)."""
        return self._commands.due()

    def reset_timer(self) -> None:
        """The next step's step_time starts now (after an evaluation, a save, a pause)."""
        self._rows.reset_timer()

    # -- commands (loop_steering.Steering) ------------------------------------------------------------
    def poll(self, block_on_pause: bool = True) -> list[Command]:
        """The app's setting commands that are due now, oldest first: call it at step boundaries.

        A setting sent with at="step" is due at once; one with at="epoch" (the app's default)
        waits for the epoch after the one being trained, and is handed out by the first
        poll() once that epoch has begun (after log_epoch(), or once an adapter has set
        `epoch`). The loop apply()s, refuse()s or defer()s each; one left untouched is refused
        at the next poll. Pause blocks here until resume or stop (block_on_pause=False: only
        `paused` is set). Stop sets `stop_requested` and is never handed out.
        """
        return self._commands.poll(block_on_pause)

    def apply(self, cmd: Command, **changes: tuple[Any, Any]) -> None:
        """The loop applied `cmd`: mark its row applied; changes like lr=(old, new) write a
        settings_applied event (the app draws a marker)."""
        self._commands.apply(cmd, changes)

    def refuse(self, cmd: Command, reason: str) -> None:
        """The loop cannot apply `cmd`: row marked refused with `reason`, command_refused event."""
        self._commands.refuse(cmd, reason)

    def defer(self, cmd: Command, target_epoch: int) -> None:
        """`cmd` waits for the start of `target_epoch`: poll() hands it out again then."""
        self._commands.defer(cmd, target_epoch)


def batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor (dict, list, tuple or tensor)."""
    if type(batch) in (tuple, list) and batch:  # the usual (x, y): the fast path
        shape = getattr(batch[0], "shape", None)
        if shape is not None and len(shape) >= 1:
            return int(shape[0])
    if isinstance(batch, Mapping):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        values = [batch]
    for v in values:
        shape = getattr(v, "shape", None)
        if shape is not None and len(shape) >= 1:
            return int(shape[0])
        if isinstance(v, (list, tuple, Mapping)) and v is not batch:
            n = batch_size(v)
            if n:
                return n
    return 1


def clean(v: Any) -> Any:
    """A setting as plain JSON: enums by value, 3.0 as 3."""
    v = getattr(v, "value", v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def headroom_run(run_dir: Optional[str] = None, *, task: str = "loop", config: Optional[Mapping[str, Any]] = None,
                 device: Any = None, **kwargs: Any) -> HeadroomRun:
    """`with headroom_run(...) as run:` a run folder for a hand-written loop (see HeadroomRun).
    Leaving the block finishes the run (run_finished, status finished); an exception fails
    it (run_failed, status failed) and propagates."""
    return HeadroomRun(run_dir, task=task, config=config, device=device, **kwargs)


def end_reason(stopping: bool, max_steps: Optional[int], step: int) -> str:
    """Why a framework's training ended, as run_finished says it: a stop asked from the app,
    the framework's own step limit, or the end of its epochs."""
    if stopping:
        return "stopped"
    if max_steps and max_steps > 0 and step >= max_steps:
        return "max_steps"
    return "completed"
