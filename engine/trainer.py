"""The training engine: exact gradient accumulation, one sync per optimizer step.

The user's knobs (accumulation, clip, lr, ...) change only at epoch boundaries,
through commands; events go out to a sink and to run.db. No Qt here.
"""
from __future__ import annotations

import contextlib
import math
import os
import queue
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from . import checkpoint as ckpt
from . import distributed as D
from . import windows as W
from .commands import (Command, Pause, Resume, SetAccum, SetClip, SetLr, SetLrScaling, SetMicroBatch, Stop,
                       command_from_json)
from .config import ConfigError, TrainConfig
from .events import (BatchNormSmallBatch, CheckpointSaved, ClipSaturation, CommandRefused, EpochEnd, Event,
                     LrHint, MemoryForecast, NonFinite, OomRecovered, Paused, Resumed, RunFailed, RunFinished, RunStarted,
                     ScalerSkip, SettingsApplied, StepMetrics, VramLow)
from .memory_model import MemoryModel
from .oom import free_memory, is_oom
from .store import RunStore
from .task import Task, TaskError, check_loss_output, default_collate, load_task
from .telemetry import MemoryProbe

BN_SMALL_BATCH = 16
CLIP_SATURATION_WINDOW = 50
CLIP_SATURATION_FRACTION = 0.9


class TrainingError(RuntimeError):
    """The run failed after it started; the message is for the user."""


class NonFiniteStop(TrainingError):
    pass


class OutOfMemoryStop(TrainingError):
    pass


@dataclass
class Settings:
    """What the user may change between epochs. Mutated only on the training thread."""
    micro_batch: int
    accum: int
    lr: float
    clip: float
    lr_scaling: str

    @property
    def window_samples(self) -> int:  # per rank
        return self.micro_batch * self.accum


@dataclass
class RunResult:
    run_dir: str
    steps: int
    epochs_done: int
    reason: str
    final_loss: Optional[float]
    nonfinite_steps: int = 0
    scaler_skips: int = 0
    losses: list[float] = field(default_factory=list)


@dataclass
class _Launched:
    """An optimizer step whose numbers may still be on their way to the host."""
    step: int
    epoch: int
    window_len: int
    micro_batch: int
    lr: float
    clip: float
    started: float
    mem: Any
    host: Any  # list of floats, or a pinned tensor filled when `ready` fires
    ready: Any  # torch.cuda.Event or None


def resolve_device(name: str, ctx: D.DistContext = D.DistContext()) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine (use --device cpu)")
    dev = torch.device(name)
    index = dev.index if dev.index is not None else (ctx.local_rank if ctx.enabled else 0)
    if index >= torch.cuda.device_count():
        raise ConfigError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) present")
    return torch.device("cuda", index)


class Trainer:
    def __init__(self, config: TrainConfig, task: Optional[Task] = None,
                 sink: Optional[Callable[[Event], None]] = None,
                 commands: Optional["queue.Queue[Command]"] = None,
                 dist_ctx: Optional[D.DistContext] = None) -> None:
        self.config = config.validate()
        self.task = task
        self.sink = sink
        self.commands: "queue.Queue[Command]" = commands if commands is not None else queue.Queue()
        self.ctx = dist_ctx if dist_ctx is not None else D.from_env()
        self._stop = threading.Event()
        self._pending: list[tuple[Command, Optional[int]]] = []  # (command, run.db row id)
        self.store: Optional[RunStore] = None
        self.step = 0
        self.epoch = 1  # the epoch being trained (1-based)
        self.window_in_epoch = 0
        self._epoch_sums = (0.0, 0.0)  # this epoch's sum of loss x count and count so far (for resume)
        self.run_dir = ""
        self.nonfinite_steps = 0
        self.scaler_skips = 0
        self._clipped_recent: deque[bool] = deque(maxlen=CLIP_SATURATION_WINDOW)
        self._last_saturation_step = -CLIP_SATURATION_WINDOW
        self._vram_low = False
        self._loss_checked = False
        self._last_command_poll = 0.0
        self.memory_model = MemoryModel()
        self._forecast_key: Optional[tuple] = None
        self._stop_agreed = False  # under DDP: a stop every rank knows about (see _train_window)
        self._in_flight: Optional[_Launched] = None  # deferred mode: the step whose numbers are in flight
        self._pinned: dict[int, list[torch.Tensor]] = {}
        self._losses: list[float] = []  # the loss of every applied step, for RunResult

    # -- control from other threads -------------------------------------------------------
    def send(self, command: Command) -> None:
        """Thread-safe. Settings and pause apply at the next epoch boundary, stop at the next step."""
        self.commands.put(command)
        if isinstance(command, Stop):
            self._stop.set()

    def request_stop(self) -> None:
        """Thread-safe and signal-safe: stop after the current micro-batch, with a checkpoint."""
        self._stop.set()

    # -- set-up ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Everything that can fail on bad input, before anything is written."""
        cfg = self.config
        self.device = resolve_device(cfg.device, self.ctx)
        if cfg.vram_limit is not None and self.device.type != "cuda":
            raise ConfigError("--vram-limit needs a CUDA device: it caps this process's share of GPU memory")
        if cfg.precision == "bf16" and self.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("--precision bf16 is not supported on this GPU (use fp16 or fp32)")
        if self.task is None:
            self.task = load_task(cfg.task, cfg.seed)
        if cfg.token_budget is not None and self.task.sample_length is None:
            raise TaskError(f"task {self.task.name}: --token-budget needs the task's sample_length")
        if cfg.micro_batch > len(self.task.train_data):
            raise ConfigError(f"--micro-batch {cfg.micro_batch} is larger than the data set "
                              f"({len(self.task.train_data)} samples)")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            if cfg.vram_limit is not None:  # before the first allocation
                total = torch.cuda.get_device_properties(self.device).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.vram_limit / total), self.device)
        self.model = self.task.model.to(self.device)
        self.collate = self.task.collate or default_collate
        amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
        self.autocast = ((lambda: torch.autocast(self.device.type, dtype=amp_dtype)) if amp_dtype
                         else contextlib.nullcontext)
        self._check_loss()
        self.resume_state: Optional[dict[str, Any]] = None
        if cfg.resume:
            self.run_dir = cfg.resume
            if not os.path.isfile(os.path.join(cfg.resume, "run.db")):
                raise ConfigError(f"--resume {cfg.resume}: not a run folder (no run.db)")
            path = ckpt.last_path(cfg.resume)
            if os.path.exists(path):
                self.resume_state = ckpt.load(path)
        else:
            self.run_dir = cfg.run_dir or default_run_dir(cfg.task)
            if self.ctx.is_main:  # rank 0 alone writes the run folder
                check_writable_dir(self.run_dir)

    @torch.no_grad()
    def _check_loss(self) -> None:
        """One forward of the loss on two samples: a malformed task is bad input, found
        before the run folder exists, not a failure halfway through the first window."""
        task = self.task
        data = task.train_data
        name = task.name
        try:
            batch = to_device(self.collate([data[i] for i in range(min(2, len(data)))]), self.device)
        except Exception as e:
            raise TaskError(f"task {name}: building a first batch failed: {type(e).__name__}: {e}") from None
        was_training = self.model.training
        self.model.eval()  # no BatchNorm statistics or dropout draws spent on a check
        try:
            with self.autocast():
                out = task.loss(self.model, batch)
        except Exception as e:
            if is_oom(e):
                return  # the run's own out-of-memory handling decides
            raise TaskError(f"task {name}: loss(model, batch) failed on a first batch: {type(e).__name__}: {e}") from None
        finally:
            self.model.train(was_training)
        check_loss_output(name, out)
        self._loss_checked = True

    def _setup(self) -> None:
        cfg, task = self.config, self.task
        assert task is not None
        D.init(self.ctx, self.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.named_params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.settings = Settings(cfg.micro_batch, cfg.accum, cfg.lr, cfg.clip, cfg.lr_scaling)
        self.net: torch.nn.Module = self.model
        if self.ctx.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.net = DDP(self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        make_opt = task.optimizer or _default_optimizer(cfg.optimizer, self.device)
        self.optimizer = make_opt(self.params, cfg.lr)
        self.scaler = torch.amp.GradScaler(self.device.type) if cfg.precision == "fp16" else None
        # On CUDA with a fused optimizer the step needs no host sync at all: a bad window is
        # skipped on the device and the step's numbers are read one step later.
        # HEADROOM_STEP_MODE=sync|deferred forces a mode (benchmarks; tests run deferred on CPU).
        mode = os.environ.get("HEADROOM_STEP_MODE", "auto")
        fused = bool(getattr(self.optimizer, "_step_supports_amp_scaling", False))
        self._deferred = fused and (mode == "deferred" or (mode == "auto" and self.device.type == "cuda"))
        self.probe = MemoryProbe(self.device)
        if self.ctx.is_main:
            os.makedirs(os.path.join(self.run_dir, ckpt.CKPT_DIR), exist_ok=True)
            self.store = RunStore(self.run_dir)
        if self.resume_state is not None:
            self._restore(self.resume_state)
        elif cfg.resume and self.store is not None:
            self.store.truncate_after(0)  # killed before its first checkpoint: start over
        self._lengths: Optional[list[int]] = None
        if cfg.token_budget is not None:
            assert task.sample_length is not None
            self._lengths = [int(task.sample_length(task.train_data[i])) for i in range(len(task.train_data))]

    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step = int(state["step"])
        self.epoch = int(state["epoch"])
        self.window_in_epoch = int(state.get("window", 0))
        self._epoch_sums = tuple(state.get("epoch_sums", (0.0, 0.0)))
        s = state.get("settings") or {}
        for k in ("micro_batch", "accum", "lr", "clip", "lr_scaling"):
            if k in s:
                setattr(self.settings, k, s[k])
        # Flags given with --resume that differ from the run's saved config are the user's
        # new settings: queue them as commands (they apply at the next epoch boundary).
        saved = state.get("config") or {}
        asked = {"accum": SetAccum(self.config.accum), "micro_batch": SetMicroBatch(self.config.micro_batch),
                 "lr": SetLr(self.config.lr), "clip": SetClip(self.config.clip),
                 "lr_scaling": SetLrScaling(self.config.lr_scaling)}
        for k, cmd in asked.items():
            if k in saved and saved[k] != getattr(self.config, k) and getattr(self.settings, k) != getattr(self.config, k):
                self.commands.put(cmd)
        self._set_lr(self.settings.lr)
        rng = state.get("rng") or {}
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.device)
        self.nonfinite_steps = int(state.get("nonfinite_steps", 0))
        self.scaler_skips = int(state.get("scaler_skips", 0))
        if self.store is not None:
            self.store.truncate_after(self.step)

    # -- the run --------------------------------------------------------------------------
    def run(self) -> RunResult:
        if not hasattr(self, "device"):
            self.prepare()
        reason = "completed"
        try:
            self._setup()
            self._emit(RunStarted(self.step, self.epoch, run_dir=os.path.abspath(self.run_dir),
                                  task=self.task.name, device=str(self.device), device_name=device_name(self.device),
                                  torch_version=torch.__version__, world_size=self.ctx.world,
                                  resumed=self.resume_state is not None, config=self.config.to_dict()))
            if self.store is not None:
                self.store.set_info(config=self.config.to_dict(), task=self.task.name, device=str(self.device),
                                    device_name=device_name(self.device), world_size=self.ctx.world,
                                    torch_version=torch.__version__, status="running", pid=os.getpid(),
                                    backend=(torch.distributed.get_backend() if self.ctx.enabled else "none"),
                                    precision=self.config.precision,
                                    started=time.time())
                self.store.commit()
            if self.config.find_micro_batch and self.resume_state is None:
                self._find_micro_batch()
            self._warn_batchnorm()
            reason = self._train_epochs()
        except NonFiniteStop:
            reason = "nonfinite"
            self._save_checkpoint()
        except BaseException as e:
            msg = e.args[0] if isinstance(e, (TrainingError, ConfigError)) and e.args else f"{type(e).__name__}: {e}"
            if self.ctx.enabled and isinstance(e, RuntimeError) and _is_peer_failure(e):
                first = str(e).strip().splitlines()[0][:200]
                msg = f"another rank of this {self.ctx.world}-process job died or stopped answering ({first})"
            if isinstance(e, KeyboardInterrupt):
                msg = "interrupted"
            try:
                if self.step > 0:
                    self._save_checkpoint()
            except Exception as save_error:  # the disk may be the problem: say so, keep the old checkpoint
                msg += f" (checkpoint not written: {save_error})"
            self._emit(RunFailed(self.step, self.epoch, error=msg), safe=True)
            self._finish("failed", safe=True)
            raise
        self._emit(RunFinished(self.step, self.epoch, reason=reason))
        self._finish("finished")
        losses = self._losses
        return RunResult(self.run_dir, self.step, self.epoch - 1, reason, losses[-1] if losses else None,
                         self.nonfinite_steps, self.scaler_skips, losses)

    def _finish(self, status: str, safe: bool = False) -> None:
        try:
            if self.store is not None:
                self.store.set_info(status=status, finished=time.time(), step=self.step)
                self.store.close()
                self.store = None
        except Exception:
            if not safe:
                raise
        finally:
            if hasattr(self, "probe"):
                self.probe.close()
            D.shutdown(self.ctx, clean=status == "finished")

    def _train_epochs(self) -> str:
        cfg = self.config
        data = self.task.train_data
        if cfg.max_steps is not None and self.step >= cfg.max_steps:  # resumed at or past the limit
            return "max_steps"
        while self.epoch <= cfg.epochs:
            if self.window_in_epoch == 0:
                self._epoch_boundary()
            if self._stop.is_set():
                self._save_checkpoint()
                return "stopped"
            epoch_start = time.perf_counter()
            plan = W.plan_epoch(len(data), cfg.seed, self.epoch, self.settings.window_samples * self.ctx.world,
                                cfg.token_budget, self._lengths.__getitem__ if self._lengths else None)
            # A run resumed mid-epoch continues the epoch's train loss where the checkpoint left it.
            if not self.window_in_epoch:
                self._epoch_sums = (0.0, 0.0)
            for window in plan[self.window_in_epoch:]:
                if not self._step(window):  # stopped mid-window: the partial window is dropped
                    self._save_checkpoint()
                    return "stopped"
                self.window_in_epoch += 1
                if cfg.max_steps is not None and self.step >= cfg.max_steps:
                    self._save_checkpoint()
                    return "max_steps"
                self._poll_commands()
                if self._should_stop():
                    self._save_checkpoint()
                    return "stopped"
            self._flush_pending()
            val = self._validate()
            epoch_loss, epoch_count = self._epoch_sums
            train_loss = epoch_loss / epoch_count if epoch_count else float("nan")
            done = EpochEnd(self.step, self.epoch, train_loss=train_loss, val_loss=val,
                            seconds=time.perf_counter() - epoch_start)
            self.epoch += 1
            self.window_in_epoch = 0
            self._save_checkpoint(epoch_done=self.epoch - 1)  # before the event: seen = saved
            self._emit(done)
        return "completed"

    def _should_stop(self) -> bool:
        return self._stop_agreed if self.ctx.enabled else self._stop.is_set()

    # -- one optimizer step -----------------------------------------------------------------
    def _step(self, window: list[int]) -> bool:
        """Train one window (False if a stop interrupted it). On out-of-memory, halve the
        micro-batch and redo the window from its first sample."""
        t0 = time.perf_counter()
        share = W.rank_share(window, self.ctx.rank, self.ctx.world)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)  # so mem_peak is this window's peak
        while True:
            s = self.settings
            oom = False
            try:
                snapshot = self._train_window(W.micro_batches(share, s.micro_batch), len(window))
                break
            except _StopRequested:
                self._drop_window_grads()
                self._flush_pending()
                return False
            except BaseException as e:
                if not is_oom(e):
                    raise
                oom = True  # recover below, once the exception (and the frames it holds) is gone
            assert oom
            self._drop_window_grads()
            free_memory(self.device)
            if not self.config.oom_recovery:
                raise OutOfMemoryStop(f"out of memory at micro-batch {s.micro_batch} "
                                      "(--oom-recovery off); try a smaller --micro-batch")
            if s.micro_batch == 1:
                raise OutOfMemoryStop("out of memory even at micro-batch 1: the model does not fit on this device")
            old = (s.micro_batch, s.accum)
            s.micro_batch = max(1, s.micro_batch // 2)
            s.accum = math.ceil(old[0] * old[1] / s.micro_batch)
            self._emit(OomRecovered(self.step, self.epoch, old[0], old[1], s.micro_batch, s.accum))
        self.step += 1
        s = self.settings
        launched = _Launched(step=self.step, epoch=self.epoch, window_len=len(window), micro_batch=s.micro_batch,
                             lr=s.lr, clip=s.clip, started=t0, mem=self.probe.sample(), **snapshot)
        if self._deferred:
            # Read the previous step now: its numbers reached pinned memory long ago while
            # this window's work was queued behind them, so this wait is usually free.
            previous, self._in_flight = self._in_flight, launched
            if previous is not None:
                self._resolve(previous)
        else:
            self._resolve(launched)
        return True

    def _train_window(self, micro: list[list[int]], window_samples: int) -> dict[str, Any]:
        """Forward and backward every micro-batch of this rank's share, normalise, clip and step.

        Each micro-batch backpropagates loss_sum / (samples in the whole window), a host
        number known to every rank; after the last one the gradients are multiplied
        once by samples / count, so they equal the gradient of
        (sum of the window's loss_sums) / (window's total count) for any mix of lengths
        and a short last window. Nothing but the gradients and two device scalars
        survives from one micro-batch to the next.
        """
        data, dev, world = self.task.train_data, self.device, self.ctx.world
        host_scale = 1.0 / window_samples  # keeps gradients O(1) before the exact division (fp16-friendly)
        totals = torch.zeros(2, device=dev, dtype=torch.float64)  # the window's loss sum and count
        # Hot path: add_ into views of totals (one op, not the three of `totals[i] += x`), and
        # add int counts up on the host, exactly, flushed before any tensor count and after the loop.
        loss_acc, count_acc = totals[0], totals[1]
        host_count = 0
        for i, idx in enumerate(micro):
            if self._stop.is_set() and not self.ctx.enabled:
                raise _StopRequested()
            batch = to_device(self.collate([data[j] for j in idx]), dev)
            # DDP: only the last micro-batch's backward all-reduces the gradients.
            is_last = i == len(micro) - 1
            sync_ctx = self.net.no_sync() if (self.ctx.enabled and not is_last) else contextlib.nullcontext()
            with sync_ctx:
                with self.autocast():
                    out = self.task.loss(self.net, batch)
                if not self._loss_checked:
                    check_loss_output(self.task.name, out)
                    self._loss_checked = True
                loss_sum, count = out
                scaled = loss_sum * host_scale
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                scaled.backward()
            loss_acc.add_(loss_sum.detach())
            if isinstance(count, int):
                host_count += count
            else:
                if host_count:
                    count_acc.add_(host_count)
                    host_count = 0
                count_acc.add_(count)
            del batch, out, loss_sum, scaled  # this micro-batch's graph and activations go now
        if host_count:
            count_acc.add_(host_count)
        parts = [totals]
        if self.ctx.enabled:
            # Two tiny all-reduces, read with the step's numbers: the window's loss sum and
            # count over all ranks, and (max) whether any rank was asked to stop and the
            # smallest micro-batch any rank fell back to after an out-of-memory error.
            D.all_reduce_sum(totals, self.ctx)
            agree = torch.tensor([1.0 if self._stop.is_set() else 0.0, -float(self.settings.micro_batch)],
                                 device=dev, dtype=torch.float64)
            parts.append(D.all_reduce_max(agree, self.ctx))
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # once per window, before the norm and the clip
        grads = self._grads()
        # DDP averaged over ranks (/world) and every rank scaled by 1/window_samples:
        # undo both and divide by the window's global count. One fused multiply per dtype.
        _scale_grads(grads, (window_samples * world) / totals[1])
        # Per-parameter norms (kept, to name non-finite parameters without another sync)
        # and the total norm before clipping, as clip_grad_norm_ computes it.
        per_param = _per_param_norms(grads, dev)
        norm = torch.linalg.vector_norm(per_param)
        bad = ~(torch.isfinite(norm) & torch.isfinite(totals[0]) & (totals[1] > 0))
        if self.settings.clip > 0:
            # A NaN norm would smear NaN over every gradient; such a window is skipped anyway.
            torch.nn.utils.clip_grads_with_norm_(self.params, self.settings.clip, torch.nan_to_num(norm, nan=0.0),
                                                 foreach=True)
        snapshot = torch.cat(parts + [norm.double().reshape(1), per_param.double()])
        if self._deferred:
            # No host sync: the fused optimizer skips a bad window on the device (found_inf),
            # leaving weights and optimizer state bit-identical, and the step's numbers go to
            # pinned memory, read one step later.
            self.optimizer.found_inf = bad.float()  # 0-dim, as GradScaler passes it
            self.optimizer.grad_scale = None
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf, self.optimizer.grad_scale
            if self.scaler is not None:
                self.scaler.update()  # backs off on the overflow unscale_ found; no sync
            self.optimizer.zero_grad(set_to_none=True)
            if dev.type != "cuda":
                return dict(host=snapshot, ready=None)  # CPU (tests): nothing is in flight
            buf = self._pinned_buffer(snapshot.numel())
            buf.copy_(snapshot, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
            return dict(host=buf, ready=ready)
        # The one CPU-GPU sync point of the step: loss, count, norms to the host, then decide.
        values = snapshot.tolist()
        self._step_or_skip(values)
        return dict(host=values, ready=None)

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.params if p.grad is not None]

    def _pinned_buffer(self, n: int) -> torch.Tensor:
        """Two pinned buffers used in turn: one may still be unread when the next is filled."""
        pool = self._pinned.setdefault(n, [torch.empty(n, dtype=torch.float64, pin_memory=True) for _ in range(2)])
        pool.reverse()
        return pool[0]

    def _step_or_skip(self, values: list[float]) -> None:
        """Host decision (CPU, or an optimizer without device-side skipping)."""
        loss_sum, count, norm = values[0], values[1], values[self._norm_index]
        finite = math.isfinite(loss_sum) and math.isfinite(norm) and count > 0
        if finite:
            self.optimizer.step()
            if self.scaler is not None:
                self.scaler.update()
        elif self.scaler is not None:
            if math.isfinite(loss_sum):
                self.scaler.update()  # fp16 overflow: lower the scale
            else:
                self.scaler.update(self.scaler.get_scale())  # a NaN loss is not an overflow: keep the scale
        # Skipped windows leave weights and optimizer state untouched: the gradients just go.
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def _norm_index(self) -> int:
        return 4 if self.ctx.enabled else 2

    def _flush_pending(self) -> None:
        if self._in_flight is not None:
            pending, self._in_flight = self._in_flight, None
            self._resolve(pending)

    def _resolve(self, p: "_Launched") -> None:
        """Turn a finished step's numbers into events: metrics, alerts, agreement, stop."""
        if p.ready is not None:
            p.ready.synchronize()  # the step's one wait, usually already over
        values = p.host.tolist() if isinstance(p.host, torch.Tensor) else p.host
        loss_sum, count = values[0], values[1]
        i = self._norm_index
        norm, per_param = values[i], values[i + 1:]
        if self.ctx.enabled:
            self._agree(stop=values[2] > 0, micro_batch=int(-values[3]))
        loss = loss_sum / count if count else float("nan")
        finite = math.isfinite(loss) and math.isfinite(norm) and count > 0
        clipped = p.clip > 0 and finite and norm > p.clip
        nonfinite = scaler_skipped = False
        if not finite:
            if self.scaler is not None and math.isfinite(loss) and count > 0:
                scaler_skipped = True  # fp16 overflow: the scaler's business, not a NaN in the model
                self.scaler_skips += 1
                self._emit(ScalerSkip(p.step, p.epoch, scale=float(self.scaler.get_scale())))
            else:
                nonfinite = True
                self.nonfinite_steps += 1
                bad = tuple(n for (n, _), v in zip(self._named_with_grad(per_param), per_param)
                            if not math.isfinite(v))
                self._emit(NonFinite(p.step, p.epoch, params=bad, loss_finite=math.isfinite(loss),
                                     action="stopped" if self.config.nonfinite == "stop" else "skipped"))
        step_time = time.perf_counter() - p.started
        mem = p.mem
        metrics = StepMetrics(
            p.step, p.epoch, loss=loss, grad_norm=norm, clipped=clipped, lr=p.lr,
            accum=math.ceil(p.window_len / max(1, self.ctx.world) / p.micro_batch), clip=p.clip,
            micro_batch=p.micro_batch, samples=p.window_len, tokens=int(count), step_time=step_time,
            throughput=count / step_time if step_time > 0 else 0.0, nonfinite=nonfinite,
            scaler_skipped=scaler_skipped, mem_allocated=mem.allocated, mem_reserved=mem.reserved,
            mem_peak=mem.peak, mem_used=mem.used, mem_total=mem.total)
        self._emit(metrics)
        if finite:
            self._losses.append(loss)
            epoch_loss, epoch_count = self._epoch_sums
            self._epoch_sums = (epoch_loss + loss * count, epoch_count + count)
        self._watch(metrics)
        if mem.peak:
            self._forecast(p.micro_batch, mem.peak, mem.used, mem.total, mem.reserved)
        if nonfinite and self.config.nonfinite == "stop":
            self._flush_pending()
            raise NonFiniteStop(f"non-finite loss or gradient at step {p.step}: stopped with the last good "
                                "weights saved (--nonfinite stop)")

    def _named_with_grad(self, per_param: list[float]) -> list[tuple[str, Any]]:
        """Parameter names in the order _grads() and _per_param_norms() list them."""
        named = [(n, p) for n, p in self.named_params if p.grad is not None]
        if len(named) != len(per_param):  # gradients were dropped since: name all parameters
            named = list(self.named_params)
        order = _dtype_order([p for _, p in named])
        return [named[k] for k in order]

    def _agree(self, stop: bool, micro_batch: int) -> None:
        """DDP: every rank takes the same stop decision and the same (smallest) micro-batch."""
        if stop:
            self._stop_agreed = True
        s = self.settings
        if micro_batch < s.micro_batch:  # another rank ran out of memory and fell back
            old = (s.micro_batch, s.accum)
            s.micro_batch = micro_batch
            s.accum = math.ceil(old[0] * old[1] / micro_batch)
            self._emit(OomRecovered(self.step, self.epoch, old[0], old[1], s.micro_batch, s.accum))

    def _drop_window_grads(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:  # forget any inf checks recorded for the abandoned window
            self.scaler._per_optimizer_states.clear()  # noqa: SLF001 - no public reset exists

    def _watch(self, m: StepMetrics) -> None:
        """Alerts that follow from the step's numbers."""
        if m.clip > 0 and not m.nonfinite:
            self._clipped_recent.append(m.clipped)
            full = len(self._clipped_recent) == CLIP_SATURATION_WINDOW
            if (full and self.step - self._last_saturation_step >= CLIP_SATURATION_WINDOW
                    and sum(self._clipped_recent) >= CLIP_SATURATION_FRACTION * CLIP_SATURATION_WINDOW):
                self._last_saturation_step = self.step
                self._emit(ClipSaturation(self.step, self.epoch, fraction=sum(self._clipped_recent) /
                                          CLIP_SATURATION_WINDOW, window=CLIP_SATURATION_WINDOW, clip=m.clip))
        if m.mem_total and m.mem_used is not None:
            headroom = (m.mem_total - m.mem_used) / m.mem_total
            low = headroom < self.config.vram_low_fraction
            if low and not self._vram_low:
                self._emit(VramLow(self.step, self.epoch, used=m.mem_used, total=m.mem_total, headroom=headroom))
            self._vram_low = low

    def _forecast(self, micro: int, peak: int, used: Optional[int], total: Optional[int],
                  reserved: Optional[int]) -> None:
        """'What fits': refit when a new micro-batch size was measured, emit if the answer moved."""
        known = micro in self.memory_model.points
        self.memory_model.add(micro, peak)
        if known and self._forecast_key is not None:
            return
        fit = self.memory_model.fit()
        if fit is None or total is None:
            return
        others = max(0, (used or 0) - (reserved or 0))  # other processes and the CUDA context
        capacity = int(min(self.config.vram_limit or total, total - others))
        best = self.memory_model.largest_fitting(capacity, self.config.memory_margin) or 0
        s = self.settings
        eff = s.micro_batch * s.accum * self.ctx.world
        accum = math.ceil(eff / max(1, best * self.ctx.world)) if best else 0
        key = (best, accum)
        if key != self._forecast_key:
            self._forecast_key = key
            self._emit(MemoryForecast(self.step, self.epoch, micro_batch_max=best, accum_for_effective=accum,
                                      effective_batch=eff, capacity=capacity, fixed_bytes=int(fit[0]),
                                      per_sample_bytes=int(fit[1]), precision=self.config.precision))

    # -- validation -----------------------------------------------------------------------
    @torch.no_grad()
    def _validate(self) -> Optional[float]:
        val = self.task.val_data
        if val is None or len(val) == 0:
            return None
        self.model.eval()
        try:
            size = max(1, self.settings.micro_batch)
            shard = W.rank_share(list(range(len(val))), self.ctx.rank, self.ctx.world)
            total = torch.zeros(2, device=self.device, dtype=torch.float64 if self.device.type == "cpu"
                                else torch.float32)
            for idx in W.micro_batches(shard, size):
                batch = to_device(self.collate([val[j] for j in idx]), self.device)
                with self.autocast():
                    loss_sum, count = self.task.loss(self.model, batch)
                total[0] += loss_sum.detach()
                total[1] += count
            D.all_reduce_sum(total, self.ctx)
            loss, count = total.tolist()
            return loss / count if count else None
        finally:
            self.model.train()

    # -- commands at boundaries -----------------------------------------------------------------
    def _poll_commands(self, force: bool = False) -> None:
        """Take new commands off the queue (every step) and run.db (once a second). Stop acts now."""
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                break
            self._pending.append((cmd, None))
        now = time.monotonic()
        if self.store is not None and (force or now - self._last_command_poll >= 1.0):
            self._last_command_poll = now
            for row_id, cmd, err in self.store.pending_commands():
                if cmd is None:
                    self.store.mark_command(row_id, "refused", self.step, err)
                    self._emit(CommandRefused(self.step, self.epoch, command=f"row {row_id}", reason=err))
                    continue
                self.store.mark_command(row_id, "received", self.step)
                self._pending.append((cmd, row_id))
        if self.ctx.enabled and force:
            self._share_commands()
        if any(isinstance(c, Stop) for c, _ in self._pending):
            self._stop.set()

    def _share_commands(self) -> None:
        """Rank 0's commands, broadcast as JSON, so every rank applies the same ones."""
        rows = [(c.kind, c.to_json()) for c, _ in self._pending] if self.ctx.is_main else None
        rows = D.broadcast_object(rows, self.ctx)
        if not self.ctx.is_main:
            self._pending = [(command_from_json(k, p), None) for k, p in rows]
        stop = D.any_rank(self._stop.is_set(), self.ctx, self.device)
        if stop:
            self._stop.set()

    def _epoch_boundary(self) -> None:
        """Apply pending settings; wait here while paused."""
        paused = False
        while True:
            self._poll_commands(force=True)
            batch, self._pending = self._pending, []
            for cmd, _ in batch:
                if isinstance(cmd, Pause):
                    paused = True
                    self._emit(Paused(self.step, self.epoch - 1))
                elif isinstance(cmd, Resume):
                    if paused:
                        self._emit(Resumed(self.step, self.epoch))
                    paused = False
            self._apply_settings([(c, r) for c, r in batch if not isinstance(c, (Pause, Resume, Stop))])
            if not paused or self._stop.is_set():
                return
            time.sleep(0.05)

    def _apply_settings(self, batch: list[tuple[Command, Optional[int]]]) -> None:
        if not batch:
            return
        s = self.settings
        before = dict(micro_batch=s.micro_batch, accum=s.accum, lr=s.lr, clip=s.clip, lr_scaling=s.lr_scaling)
        explicit_lr = any(isinstance(c, SetLr) for c, _ in batch)
        data_len = len(self.task.train_data)
        for cmd, row_id in batch:
            note = ""
            if isinstance(cmd, SetAccum):
                s.accum = cmd.steps
            elif isinstance(cmd, SetMicroBatch):
                if cmd.size > data_len:
                    note = f"micro-batch {cmd.size} is larger than the data set ({data_len} samples)"
                else:
                    s.micro_batch = cmd.size
            elif isinstance(cmd, SetClip):
                s.clip = cmd.norm
            elif isinstance(cmd, SetLr):
                s.lr = cmd.lr
            elif isinstance(cmd, SetLrScaling):
                s.lr_scaling = cmd.rule
            if note:
                self._emit(CommandRefused(self.step, self.epoch, command=cmd.kind, reason=note))
            if self.store is not None and row_id is not None:
                self.store.mark_command(row_id, "refused" if note else "applied", self.step, note)
        old_eff = before["micro_batch"] * before["accum"]
        new_eff = s.micro_batch * s.accum
        if new_eff != old_eff and not explicit_lr:
            ratio = new_eff / old_eff
            if s.lr_scaling == "linear":
                s.lr = s.lr * ratio
            elif s.lr_scaling == "sqrt":
                s.lr = s.lr * math.sqrt(ratio)
            else:
                self._emit(LrHint(self.step, self.epoch, accum_old=before["accum"], accum_new=s.accum,
                                  suggested_lr=s.lr * ratio))
        self._set_lr(s.lr)
        after = dict(micro_batch=s.micro_batch, accum=s.accum, lr=s.lr, clip=s.clip, lr_scaling=s.lr_scaling)
        changes = tuple((k, before[k], after[k]) for k in before if before[k] != after[k])
        if changes:
            self._emit(SettingsApplied(self.step, self.epoch, changes=changes))
            if "micro_batch" in {c[0] for c in changes}:
                self._warn_batchnorm()
        if self.store is not None:
            self.store.commit()

    def _set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def _warn_batchnorm(self) -> None:
        bn = (torch.nn.modules.batchnorm._BatchNorm,)
        if self.settings.micro_batch < BN_SMALL_BATCH and any(isinstance(m, bn) and m.training
                                                              for m in self.model.modules()):
            self._emit(BatchNormSmallBatch(self.step, self.epoch, micro_batch=self.settings.micro_batch))

    def _find_micro_batch(self) -> None:
        from .finder import find_micro_batch
        find_micro_batch(self)

    # -- checkpoints ----------------------------------------------------------------------
    def _save_checkpoint(self, epoch_done: Optional[int] = None) -> None:
        if not self.ctx.is_main or self.step == 0:
            return
        assert self.store is not None
        self._flush_pending()
        self.store.commit()  # metrics first: run.db never lags behind a checkpoint
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else {},
            "step": self.step,
            "epoch": self.epoch,
            "window": self.window_in_epoch,
            "epoch_sums": list(self._epoch_sums),
            "settings": dict(micro_batch=self.settings.micro_batch, accum=self.settings.accum,
                             lr=self.settings.lr, clip=self.settings.clip, lr_scaling=self.settings.lr_scaling),
            "rng": {"torch": torch.get_rng_state(),
                    **({"cuda": torch.cuda.get_rng_state(self.device)} if self.device.type == "cuda" else {})},
            "nonfinite_steps": self.nonfinite_steps,
            "scaler_skips": self.scaler_skips,
            "config": {k: v for k, v in self.config.to_dict().items()},
        }
        path = ckpt.last_path(self.run_dir)
        try:
            if epoch_done is not None:
                path = ckpt.epoch_path(self.run_dir, epoch_done)
                ckpt.save_atomic(state, path)
                path = ckpt.last_path(self.run_dir)
            ckpt.save_atomic(state, path)
        except OSError as e:
            raise TrainingError(f"could not write checkpoint {path}: {e.strerror or e}; the previous checkpoint "
                                "is kept") from None
        self._emit(CheckpointSaved(self.step, self.epoch, path=ckpt.last_path(self.run_dir)))

    # -- events ---------------------------------------------------------------------------
    def _emit(self, event: Event, safe: bool = False) -> None:
        try:
            if self.store is not None:
                self.store.record(event)
        except Exception:
            if not safe:
                raise
        if self.sink is not None and self.ctx.is_main:
            self.sink(event)


class _StopRequested(Exception):
    pass


def _is_peer_failure(e: BaseException) -> bool:
    text = str(e).lower()
    return any(k in text for k in ("connection closed by peer", "connection reset", "broken pipe", "nccl",
                                   "timed out", "socket", "gloo"))


def _dtype_order(tensors: list[torch.Tensor]) -> list[int]:
    """Indices of `tensors` grouped by dtype (first-seen order), as the foreach calls see them."""
    groups: dict[torch.dtype, list[int]] = {}
    for k, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(k)
    return [k for ks in groups.values() for k in ks]


def _per_param_norms(grads: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The 2-norm of every gradient, in _dtype_order, as one tensor (one foreach call per dtype)."""
    if not grads:
        return torch.zeros(1, device=device)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    wide = torch.float64 if torch.float64 in by_dtype else torch.float32
    return torch.cat([torch.stack(torch._foreach_norm(group)).to(wide) for group in by_dtype.values()])


def _scale_grads(grads: list[torch.Tensor], factor: torch.Tensor) -> None:
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for dtype, group in by_dtype.items():
        torch._foreach_mul_(group, factor.to(dtype))


def _default_optimizer(name: str, device: torch.device) -> Callable[[Any, float], torch.optim.Optimizer]:
    if name == "sgd":
        return lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9)
    fused = device.type == "cuda" or os.environ.get("HEADROOM_STEP_MODE") == "deferred"
    return lambda params, lr: torch.optim.AdamW(params, lr=lr, fused=fused or None)


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform
    return platform.processor() or platform.machine() or "CPU"


def default_runs_root() -> str:
    root = os.environ.get("HEADROOM_RUNS")
    if root:
        return root
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "headroom", "runs")


def default_run_dir(task: str) -> str:
    stem = os.path.splitext(os.path.basename(task.replace(":", "-")))[0] or "run"
    base = os.path.join(default_runs_root(), time.strftime("%Y%m%d-%H%M%S") + f"-{stem}")
    path, n = base, 1
    while os.path.exists(path):
        n += 1
        path = f"{base}-{n}"
    return path


def check_writable_dir(path: str) -> None:
    """Refuse a run folder we could not write. Creates the folder (the run is about to
    start), and removes what it created if any part is not writable."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ConfigError(f"--run-dir {path}: exists and is not a folder")
        if os.path.exists(os.path.join(path, "run.db")):
            raise ConfigError(f"--run-dir {path}: already holds a run (use --resume {path} to continue it)")
    created = []
    probe = os.path.join(path, ckpt.CKPT_DIR)
    try:
        missing, p = [], os.path.abspath(probe)
        while not os.path.exists(p):
            missing.append(p)
            p = os.path.dirname(p)
        for d in reversed(missing):
            os.mkdir(d)
            created.append(d)
        fd, tmp = tempfile.mkstemp(prefix=".probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        for d in reversed(created):
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise ConfigError(f"--run-dir {path}: not writable ({e.strerror or e})") from None
