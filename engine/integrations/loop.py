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
import sqlite3
import tempfile
import time
import weakref
from dataclasses import asdict, dataclass
from typing import Any, Callable, ClassVar, Iterator, Mapping, Optional

from ..commands import Command, Pause, Resume, Stop
from ..config import ConfigError
from ..events import (CheckpointSaved, CommandReceived, CommandRefused, EpochEnd, Event, NonFinite, Paused,
                      Resumed, RunFailed, RunFinished, RunStarted, SettingsApplied, StepMetrics)
from .. import runlock
from ..paths import default_run_dir
from ..store import DB_NAME, RunStore

__all__ = ["HeadroomRun", "headroom_run", "set_lr", "LossWeighting", "StepSkipped", "IntegrationError",
           "batch_size", "clean"]

GAP_NOTE = 1e-3  # relative gap between the framework's loss and the token-weighted one worth an event
PAUSE_POLL_S = 0.05


class IntegrationError(ConfigError):
    """A bad argument to an integration (one line, like the engine's ConfigError)."""


# -- events only the integrations emit (frozen, plain numbers; kinds the app shows as notes) ----------

@dataclass(frozen=True)
class PausedAtStep(Paused):
    """The engine pauses at epoch ends; a foreign loop between optimizer steps."""

    def message(self) -> str:
        return f"paused after step {self.step}"


@dataclass(frozen=True)
class LossWeighting(Event):
    """The framework's window loss (what it backpropagated: a mean of micro-batch means)
    against the window's token-weighted loss (sum of loss sums / total count), which is
    what the `metrics` row's `loss` holds. Emitted at the first step they differ by more
    than 0.1%, and at each epoch end with that epoch's largest gap."""
    framework_loss: float
    weighted_loss: float
    gap: float  # (framework - weighted) / weighted
    steps: int  # steps of the epoch whose gap was over 0.1% (1 for the first note)
    kind: ClassVar[str] = "loss_weighting"

    def message(self) -> str:
        gap = (f"framework loss {self.framework_loss:.4g} vs token-weighted {self.weighted_loss:.4g} "
               f"({self.gap:+.1%})")
        if self.steps <= 1:
            return (f"{gap} at step {self.step}: the framework averages micro-batch means, so its gradient "
                    "weights tokens unequally (README: 'Already have a training script?')")
        return f"epoch {self.epoch}: {self.steps} steps with the two losses apart by over 0.1%; largest, step {self.step}: {gap}"


@dataclass(frozen=True)
class StepSkipped(Event):
    """The framework itself skipped work: micro-batches whose training_step returned None."""
    micro_batches: int
    reason: str
    kind: ClassVar[str] = "step_skipped"

    def message(self) -> str:
        return f"{self.micro_batches} micro-batch(es) skipped at step {self.step}: {self.reason}"


# -- the lr helper the adapters share ------------------------------------------------------------------

_GROUP_LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")


def set_lr(optimizer: Any, lr: float, scheduler: Any = None) -> tuple[float, float]:
    """Make `lr` the learning rate of the next step, keeping the schedule's shape.

    Every param group's lr (and the keys schedulers build it from: initial_lr, max_lr,
    min_lr) and the scheduler's base_lrs / max_lrs are multiplied by one factor,
    lr / (first group's current lr), so groups keep their ratios and the schedule goes on
    from the new level (a warmup keeps warming up, a decay keeps decaying). If the
    current lr is 0 (a schedule at zero), the scheduler's base lr becomes `lr` instead.
    Floors such as CosineAnnealingLR's eta_min are left as they are. Returns (old, new)
    of the first group. Call it between optimizer steps.
    """
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr <= 0:
        raise IntegrationError(f"set_lr: lr must be a positive finite number, got {lr!r}")
    groups = optimizer.param_groups
    old = float(groups[0]["lr"])
    if old > 0:
        factor = lr / old
    else:
        bases = _base_lrs(scheduler)
        base = bases[0] if bases else float(groups[0].get("initial_lr") or 0.0)
        factor = lr / base if base > 0 else None
    if factor is None:  # nothing to scale from: set it outright
        for g in groups:
            g["lr"] = float(lr)
            if "initial_lr" in g:
                g["initial_lr"] = float(lr)
        _scale_scheduler(scheduler, None, lr)
    else:
        for g in groups:
            if old > 0:
                g["lr"] = g["lr"] * factor
            for k in _GROUP_LR_KEYS[1:]:  # what schedulers compute the lr from
                if isinstance(g.get(k), (int, float)) and not isinstance(g.get(k), bool):
                    g[k] = g[k] * factor
        _scale_scheduler(scheduler, factor, lr)
    if scheduler is not None:
        for s in _schedulers(scheduler):
            if hasattr(s, "_last_lr") and getattr(s, "optimizer", None) is not None:
                s._last_lr = [g["lr"] for g in s.optimizer.param_groups]  # what get_last_lr() reports
    return old, float(groups[0]["lr"])


def _schedulers(s: Any) -> Iterator[Any]:
    """A scheduler and those inside it (SequentialLR, ChainedScheduler, accelerate's wrapper)."""
    if s is None:
        return
    seen: set[int] = set()
    stack = [s]
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
            continue
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        inner = getattr(x, "_schedulers", None)
        if isinstance(inner, (list, tuple)):
            stack.extend(inner)
        wrapped = getattr(x, "scheduler", None)
        if wrapped is not None and wrapped is not x and hasattr(wrapped, "step"):
            stack.append(wrapped)


def _base_lrs(s: Any) -> list[float]:
    for x in _schedulers(s):
        b = getattr(x, "base_lrs", None)
        if isinstance(b, (list, tuple)) and b:
            return [float(v) for v in b]
    return []


def _scale_scheduler(s: Any, factor: Optional[float], lr: float) -> None:
    for x in _schedulers(s):
        for attr in ("base_lrs", "max_lrs"):
            v = getattr(x, attr, None)
            if isinstance(v, list) and v and all(isinstance(e, (int, float)) for e in v):
                setattr(x, attr, [e * factor if factor is not None else float(lr) for e in v])


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


def _num(v: Any, what: str, allow_none: bool = True) -> Optional[float]:
    """A float from a float, int or 0-d tensor (read to the host here)."""
    if type(v) is float:  # the per-step fast path
        return v
    if v is None:
        if allow_none:
            return None
        raise IntegrationError(f"log_step: {what} is required")
    if isinstance(v, bool):
        raise IntegrationError(f"log_step: {what} must be a number, got {v!r}")
    if isinstance(v, (int, float)):
        return float(v)
    item = getattr(v, "item", None)
    if callable(item) and getattr(v, "numel", lambda: 1)() == 1:
        return float(item())
    raise IntegrationError(f"log_step: {what} must be a number or a one-element tensor, got {type(v).__name__}")


def _int(v: Any, what: str, minimum: int = 0) -> Optional[int]:
    if type(v) is int and v >= minimum:  # the per-step fast path
        return v
    if v is None:
        return None
    if not isinstance(v, bool):
        item = getattr(v, "item", None)
        if callable(item) and not isinstance(v, int):
            v = item()
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, int) and v >= minimum:
            return int(v)
    raise IntegrationError(f"{what} must be an integer >= {minimum}, got {v!r}")


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


class _NoMemory:  # the figures of a CPU run (MemoryProbe gives the same: all None)
    allocated = reserved = peak = used = total = None


_NO_MEMORY = _NoMemory()


class _Handed:
    """A setting command between run.db and the loop: waiting for its epoch, or handed out."""
    __slots__ = ("cmd", "row", "due")

    def __init__(self, cmd: Command, row: Optional[int]) -> None:
        self.cmd, self.row = cmd, row
        self.due: Optional[int] = None  # the epoch it waits for (announced), None: due at the next step


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
    """

    def __init__(self, run_dir: Optional[str] = None, *, task: str = "loop",
                 config: Optional[Mapping[str, Any]] = None, device: Any = None, world_size: int = 1,
                 steering: str = "", integration: str = "loop", commit_interval: float = 1.0,
                 poll_interval: float = 0.05, refusal: Optional[Callable[[Command], str]] = None) -> None:
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
        self._next_poll = 0.0
        self.step = 0  # optimizer steps logged (the last row's step)
        self.epoch = 1  # the epoch being trained, 1-based
        self.stop_requested = False
        self.paused = False
        self.finished = False
        self._store: Optional[RunStore] = None
        self._ro: Optional[sqlite3.Connection] = None
        self._data_version: Optional[int] = None
        self._probe: Any = None
        self._cuda = False
        self._handed: list[_Handed] = []  # handed out by the last poll(), not yet decided
        self._waiting: list[_Handed] = []  # for the start of a later epoch
        self._seen_id = 0  # the highest commands row id seen
        self._recheck = False
        self._lock: Any = None
        self._stop_rows: list[int] = []
        self._t_last = 0.0
        self._epoch_t0 = 0.0
        self._epoch_sum = 0.0
        self._epoch_count = 0.0
        self._gap_first = False
        self._gap_epoch: Optional[tuple[float, float, float, int, int]] = None  # (fw, weighted, gap, step, n)

    # -- lifetime -------------------------------------------------------------------------------------
    def __enter__(self) -> "HeadroomRun":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self.finished:
            return False
        if exc_type is None:
            self.finish("stopped" if self.stop_requested else "completed")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.fail("interrupted")
        else:
            self.fail(f"{exc_type.__name__}: {exc}")
        return False

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
        self._t_last = self._epoch_t0 = time.perf_counter()
        return self

    def _open_store(self, dev: Any, step: int, epoch: int) -> None:
        import torch
        from ..telemetry import MemoryProbe
        assert self.run_dir is not None
        self.step, self.epoch = step, epoch
        self._probe = MemoryProbe(dev)
        self._cuda = dev.type == "cuda"
        store = RunStore(self.run_dir, commit_interval=self.commit_interval)
        self._store = store
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
        path = os.path.join(self.run_dir, DB_NAME)
        self._ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5, check_same_thread=False)
        self._data_version = None  # the first poll looks

    def set_info(self, **items: Any) -> None:
        """Extra keys for run.db's `run` table (JSON values)."""
        self._need_store().set_info(**items)

    def finish(self, reason: str = "completed") -> None:
        """End the run: run_finished event, status finished. Idempotent."""
        if self.finished or self._store is None:
            self.finished = True
            return
        for h in self._handed:
            self._refuse_handed(h, "the run ended before the loop applied it")
        for h in self._waiting:
            self._refuse_handed(h, f"the run ended before epoch {h.due}")
        self._handed.clear()
        self._waiting.clear()
        for row in self._stop_rows:
            self._store.mark_command(row, "applied", self.step, "")
        self._stop_rows.clear()
        self.flush_epoch_gap()
        self._store.record(RunFinished(self.step, self.epoch, reason=reason))
        self._close("finished")

    def fail(self, error: str) -> None:
        """End the run as failed (an exception in the loop). Never raises."""
        if self.finished or self._store is None:
            self.finished = True
            return
        try:
            self._store.record(RunFailed(self.step, self.epoch, error=str(error)))
        except Exception:
            pass
        self._close("failed", safe=True)

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
            if self._ro is not None:
                self._ro.close()
                self._ro = None
            if self._probe is not None:
                self._probe.close()
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _need_store(self) -> RunStore:
        if self._store is None:
            raise RuntimeError("the run is not started (use `with headroom_run(...) as run:` or run.start())"
                               if not self.finished else "the run has finished")
        return self._store

    # -- writing --------------------------------------------------------------------------------------
    def log_step(self, loss: Any, *, grad_norm: Any = None, lr: Any = None, accum: int = 1,
                 micro_batch: Optional[int] = None, samples: Optional[int] = None, tokens: Optional[int] = None,
                 clip: Any = 0.0, clipped: Optional[bool] = None, step_time: Optional[float] = None,
                 nonfinite: Optional[bool] = None, scaler_skipped: bool = False, epoch: Optional[int] = None,
                 step: Optional[int] = None, framework_loss: Optional[float] = None,
                 bad_params: tuple[str, ...] = (), nonfinite_action: str = "not skipped (the optimizer stepped)"
                 ) -> StepMetrics:
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
        store = self._store
        if store is None:
            store = self._need_store()
        now = time.perf_counter()
        loss_f = loss if type(loss) is float else _num(loss, "loss", allow_none=False)
        norm = grad_norm if grad_norm is None or type(grad_norm) is float else _num(grad_norm, "grad_norm")
        lr_f = lr if lr is None or type(lr) is float else _num(lr, "lr")
        clip_f = clip if type(clip) is float else (_num(clip, "clip") or 0.0)
        accum_i = accum if type(accum) is int and accum >= 1 else _int(accum, "accum", 1)
        samples_i = samples if samples is None or type(samples) is int else _int(samples, "samples")
        micro_i = micro_batch if micro_batch is None or type(micro_batch) is int else _int(micro_batch, "micro_batch", 1)
        world = self.world_size
        if micro_i is None and samples_i is not None:
            micro_i = max(1, samples_i // max(1, accum_i * world))
        if samples_i is None and micro_i is not None:
            samples_i = micro_i * accum_i * world
        tokens_i = tokens if tokens is None or type(tokens) is int else _int(tokens, "tokens")
        if tokens_i is None:
            tokens_i = samples_i
        if step_time is None:
            step_time = now - self._t_last
        elif not isinstance(step_time, (int, float)) or isinstance(step_time, bool) or step_time < 0:
            raise IntegrationError(f"log_step: step_time must be seconds >= 0, got {step_time!r}")
        isfinite = math.isfinite
        norm_ok = norm is None or isfinite(norm)
        if nonfinite is None:
            nonfinite = not (isfinite(loss_f) and norm_ok) and not scaler_skipped
        if clipped is None:
            clipped = clip_f > 0 and norm is not None and norm_ok and norm > clip_f
        step_i = self.step + 1 if step is None else _int(step, "step", 1)
        epoch_i = self.epoch if epoch is None else _int(epoch, "epoch", 1)
        self._t_last = now
        return self.record_step(step_i, epoch_i, loss_f, norm, lr_f, accum_i, clip_f, micro_i, samples_i, tokens_i,
                                float(step_time), bool(clipped), bool(nonfinite), bool(scaler_skipped),
                                framework_loss, bad_params, nonfinite_action)

    def record_step(self, step: int, epoch: int, loss: float, grad_norm: Optional[float], lr: Optional[float],
                    accum: int, clip: float, micro_batch: Optional[int], samples: Optional[int],
                    tokens: Optional[int], step_time: float, clipped: bool, nonfinite: bool, scaler_skipped: bool,
                    framework_loss: Optional[float] = None, bad_params: tuple[str, ...] = (),
                    nonfinite_action: str = "not skipped (the optimizer stepped)") -> StepMetrics:
        """log_step without the checks and defaults: every value already plain (the adapters'
        path, which may record a few steps at once). step_time in seconds."""
        store = self._store
        if store is None:
            store = self._need_store()
        self.step, self.epoch = step, epoch
        if self._cuda:
            mem = self._probe.sample()
            import torch
            torch.cuda.reset_peak_memory_stats(self._probe.device)  # mem_peak: this window's peak
        else:
            mem = _NO_MEMORY
        count = tokens or 0
        event = StepMetrics(step, epoch, loss=loss, grad_norm=grad_norm, clipped=clipped, lr=lr, accum=accum,
                            clip=clip, micro_batch=micro_batch, samples=samples, tokens=tokens, step_time=step_time,
                            throughput=(count / step_time) if step_time > 0 and count else 0.0,
                            nonfinite=nonfinite, scaler_skipped=scaler_skipped, mem_allocated=mem.allocated,
                            mem_reserved=mem.reserved, mem_peak=mem.peak, mem_used=mem.used, mem_total=mem.total)
        store.record(event)
        loss_ok = math.isfinite(loss)
        if nonfinite:
            store.record(NonFinite(step, epoch, params=tuple(bad_params), loss_finite=loss_ok,
                                   action=nonfinite_action))
        elif not scaler_skipped and loss_ok:
            w = float(count) if count else 1.0
            self._epoch_sum += loss * w
            self._epoch_count += w
            if framework_loss is not None and loss != 0 and abs(framework_loss - loss) > GAP_NOTE * abs(loss):
                self._note_gap(float(framework_loss), loss)
        return event

    def _note_gap(self, fw: float, weighted: float) -> None:
        if not math.isfinite(fw):
            return
        gap = (fw - weighted) / abs(weighted)
        if abs(gap) <= GAP_NOTE:
            return
        if not self._gap_first:
            self._gap_first = True
            self.record(LossWeighting(self.step, self.epoch, framework_loss=fw, weighted_loss=weighted,
                                      gap=gap, steps=1))
        g = self._gap_epoch
        if g is None or abs(gap) > abs(g[2]):
            self._gap_epoch = (fw, weighted, gap, self.step, (g[4] if g else 0) + 1)
        else:
            self._gap_epoch = g[:4] + (g[4] + 1,)

    def flush_epoch_gap(self) -> None:
        g, self._gap_epoch = self._gap_epoch, None
        if g is not None and g[4] > 1 and self._store is not None:
            self.record(LossWeighting(g[3], self.epoch, framework_loss=g[0], weighted_loss=g[1], gap=g[2],
                                      steps=g[4]))

    def log_epoch(self, val_loss: Any = None, *, train_loss: Any = None, seconds: Optional[float] = None,
                  epoch: Optional[int] = None) -> EpochEnd:
        """The end of an epoch: an `epochs` row and an epoch_end event; the next epoch begins.
        train_loss: default, the count-weighted mean of this epoch's finite step losses."""
        store = self._need_store()
        now = time.perf_counter()
        ep = self.epoch if epoch is None else _int(epoch, "epoch", 1)
        tl = _num(train_loss, "train_loss")
        if tl is None:
            tl = self._epoch_sum / self._epoch_count if self._epoch_count else float("nan")
        vl = _num(val_loss, "val_loss")
        event = EpochEnd(self.step, ep, train_loss=tl, val_loss=vl,
                         seconds=float(now - self._epoch_t0 if seconds is None else seconds))
        self.flush_epoch_gap()
        store.record(event)
        self.epoch = ep + 1
        self._epoch_sum = self._epoch_count = 0.0
        self._epoch_t0 = self._t_last = time.perf_counter()
        return event

    def record(self, event: Event) -> None:
        """Write any engine event (checkpoint, scaler_skip, ...): events commit at once."""
        self._need_store().record(event)

    def checkpoint_saved(self, path: str) -> None:
        self.record(CheckpointSaved(self.step, self.epoch, path=os.path.abspath(path)))

    def lap(self) -> float:
        """Seconds since the last step ended (or the start, a resume, reset_timer()); a new
        step starts now. For adapters that time steps themselves."""
        now = time.perf_counter()
        dt, self._t_last = now - self._t_last, now
        return dt

    def due(self) -> bool:
        """Whether poll() would look at run.db now (adapters write their rows then)."""
        return (not self.poll_interval or time.monotonic() >= self._next_poll or bool(self._handed)
                or bool(self._waiting and min(h.due for h in self._waiting) <= self.epoch))

    def reset_timer(self) -> None:
        """The next step's step_time starts now (after an evaluation, a save, a pause)."""
        self._t_last = time.perf_counter()

    # -- commands -------------------------------------------------------------------------------------
    def poll(self, block_on_pause: bool = True) -> list[Command]:
        """The app's setting commands that are due now, oldest first: call it at step boundaries.

        A setting sent with at="step" is due at once; one with at="epoch" (the app's default)
        waits for the epoch after the one being trained, and is handed out by the first
        poll() once that epoch has begun (after log_epoch(), or once an adapter has set
        `epoch`). The loop apply()s, refuse()s or defer()s each; one left untouched is refused
        at the next poll. Pause blocks here until resume or stop (block_on_pause=False: only
        `paused` is set). Stop sets `stop_requested` and is never handed out.
        """
        if self._store is None:
            return []
        due_epoch = self._waiting and min(h.due for h in self._waiting) <= self.epoch
        if self.poll_interval and not due_epoch:
            now = time.monotonic()
            if now < self._next_poll and not self._handed:
                return []  # the per-step cost between reads: one clock call
            self._next_poll = now + self.poll_interval
        for h in self._handed:
            self._refuse_handed(h, "this training loop does not apply it")
        self._handed = []
        fresh = self._read()
        if self.paused and block_on_pause:
            fresh = self._wait_paused(fresh)
        for h in fresh:
            why = self.refusal(h.cmd) if self.refusal is not None else ""
            if why:
                self._refuse_handed(h, why)
            elif getattr(h.cmd, "at", "step") == "epoch":
                self._wait(h, self.epoch + 1)
            else:
                self._handed.append(h)
        if self._waiting:
            due = [h for h in self._waiting if h.due <= self.epoch]
            if due:
                self._waiting = [h for h in self._waiting if h.due > self.epoch]
                self._handed = due + self._handed
        return [h.cmd for h in self._handed]

    def _changed(self) -> bool:
        assert self._ro is not None
        try:
            v = self._ro.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            return True
        if v == self._data_version:
            return False
        self._data_version = v
        return True

    def _read(self) -> list[_Handed]:
        """Pending rows -> settings for the loop; pause, resume and stop are taken care of here."""
        if self._ro is None or not self._changed():
            return []
        store = self._store
        assert store is not None
        # Our own writes change data_version too: only a new row in `commands` (or rows left
        # from the last read) is worth the store's full read, which also writes what it queued.
        try:
            top = int(self._ro.execute("SELECT max(id) FROM commands").fetchone()[0] or 0)
        except (sqlite3.Error, TypeError, ValueError):
            top = self._seen_id + 1
        if top <= self._seen_id and not self._recheck:
            return []
        rows = store.pending_commands()  # validated rows; hostile or malformed ones come back as errors
        self._seen_id = max(self._seen_id, top)
        self._recheck = bool(rows)
        out: list[_Handed] = []
        for row_id, cmd, err in rows:
            if cmd is None:
                store.mark_command(row_id, "refused", self.step, err)
                store.record(CommandRefused(self.step, self.epoch, command=f"row {row_id}", reason=err))
                continue
            if self.steering:
                store.mark_command(row_id, "refused", self.step, self.steering)
                store.record(CommandRefused(self.step, self.epoch, command=cmd.kind, reason=self.steering))
                continue
            store.mark_command(row_id, "received", self.step)
            if isinstance(cmd, Stop):
                self.stop_requested = True
                self.paused = False
                self._stop_rows.append(row_id)
                self._received(cmd, "now")
            elif isinstance(cmd, Pause):
                if not self.paused:
                    self.paused = True
                    store.record(PausedAtStep(self.step, self.epoch))
                store.mark_command(row_id, "applied", self.step)
            elif isinstance(cmd, Resume):
                if self.paused:
                    self.paused = False
                    store.record(Resumed(self.step, self.epoch))
                    self.reset_timer()
                store.mark_command(row_id, "applied", self.step)
            else:
                out.append(_Handed(cmd, row_id))
        return out

    def _wait_paused(self, fresh: list[_Handed]) -> list[_Handed]:
        store = self._store
        assert store is not None
        store.commit()
        while self.paused and not self.stop_requested:
            time.sleep(PAUSE_POLL_S)
            self._data_version = None
            fresh.extend(self._read())
        self.reset_timer()
        return fresh

    def _received(self, cmd: Command, applies: str, target_epoch: Optional[int] = None) -> None:
        self.record(CommandReceived(self.step, self.epoch, command=cmd.kind, payload=asdict(cmd), applies=applies,
                                    target_epoch=target_epoch))

    def _wait(self, h: _Handed, epoch: int) -> None:
        if h.due != epoch:
            self._received(h.cmd, "epoch", epoch)  # the app shows "pending: applies at epoch N"
        h.due = epoch
        self._waiting.append(h)

    def _find(self, cmd: Command) -> _Handed:
        for h in self._handed:
            if h.cmd is cmd:
                return h
        raise IntegrationError(f"{cmd.kind}: not a command handed out by the last poll() and still open")

    def apply(self, cmd: Command, **changes: tuple[Any, Any]) -> None:
        """The loop applied `cmd`: mark its row applied; changes like lr=(old, new) write a
        settings_applied event (the app draws a marker)."""
        h = self._find(cmd)
        self._handed.remove(h)
        store = self._need_store()
        if h.due is None:
            self._received(cmd, "step")
        ch = tuple((k, _plain(o), _plain(n)) for k, (o, n) in changes.items() if o != n)
        if ch:
            store.record(SettingsApplied(self.step, self.epoch, changes=ch))
        if h.row is not None:
            store.mark_command(h.row, "applied", self.step, "")

    def refuse(self, cmd: Command, reason: str) -> None:
        """The loop cannot apply `cmd`: row marked refused with `reason`, command_refused event."""
        h = self._find(cmd)
        self._handed.remove(h)
        self._refuse_handed(h, reason)

    def defer(self, cmd: Command, target_epoch: int) -> None:
        """`cmd` waits for the start of `target_epoch`: poll() hands it out again then."""
        h = self._find(cmd)
        self._handed.remove(h)
        self._wait(h, int(target_epoch))

    def _refuse_handed(self, h: _Handed, reason: str) -> None:
        store = self._store
        if store is None:
            return
        store.record(CommandRefused(self.step, self.epoch, command=h.cmd.kind, reason=reason))
        if h.row is not None:
            store.mark_command(h.row, "refused", self.step, reason)


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


def _plain(v: Any) -> Any:
    if isinstance(v, (int, float, str)) or v is None:
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return repr(v)


def headroom_run(run_dir: Optional[str] = None, *, task: str = "loop", config: Optional[Mapping[str, Any]] = None,
                 device: Any = None, **kwargs: Any) -> HeadroomRun:
    """`with headroom_run(...) as run:` a run folder for a hand-written loop (see HeadroomRun).
    Leaving the block finishes the run (run_finished, status finished); an exception fails
    it (run_failed, status failed) and propagates."""
    return HeadroomRun(run_dir, task=task, config=config, device=device, **kwargs)
