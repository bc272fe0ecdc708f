"""Set-up: everything a run needs, built in one place, before anything is written.

`build(config, task, ctx)` checks the input (device, task, first batch, resume
checkpoint) and returns `RunParts` with every field set: device, model (under torchrun
the same on every rank), autocast, scaler, optimizer, the step variant, the window policy and the
state to resume from. A failure here is bad input (ConfigError / TaskError): the
CLI prints one `error:` line and exits 2, and no run folder holds a half-started run.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional

import torch

from engine import distributed
from engine.accumulation.accumulate import WindowContext
from engine.accumulation.feeder import Feeder, auto_workers
from engine.accumulation.oom import is_oom
from engine.accumulation.policy import FixedWindows, TokenBudgetWindows, WindowPolicy
from engine.accumulation.step import choose as choose_stepper
from engine.checkpoints import files as ckpt
from engine.checkpoints import sharded
from engine.checkpoints.run_tree import Origin, fork_origin, resume_origin
from engine.declarations.config import ConfigError, TrainConfig
from engine.declarations.outcome import first_line
from engine.declarations.paths import default_run_dir
from engine.declarations.rules import CommandRules
from engine.declarations.schedule import LrSchedule
from engine.declarations.settings import LiveSettings
from engine.distributed.choose import build as build_strategy
from engine.distributed.devices import default_optimizer, resolve_device, to_device
from engine.distributed.world import keep_effective_batch
from engine.memory.activation_checkpointing import CheckpointSwitch, find_switch, why_no_switch
from engine.memory.breakdown import WindowMemory
from engine.memory.snapshot import SnapshotRecorder
from engine.memory.telemetry import MemoryProbe
from engine.steering.lr import LrControl
from engine.store import runlock
from engine.store.runlock import RunLock
from engine.tasks.loader import load_task
from engine.tasks.task import Task, TaskError, check_last_samples, check_loss_output, check_scheduler, default_collate

from .modes import TrainModes


@dataclass
class RunParts:
    config: TrainConfig
    ctx: distributed.DistContext
    device: torch.device
    task: Task
    model: torch.nn.Module
    collate: Callable[[list], Any]
    autocast: Callable[[], ContextManager]
    optimizer: torch.optim.Optimizer
    scaler: Optional[torch.amp.GradScaler]
    window: WindowContext  # what training one window needs
    policy: WindowPolicy
    probe: MemoryProbe
    run_dir: str
    origin: Origin  # the checkpoint to continue from (resume or fork), or none
    lock: Optional[RunLock]  # this process is the run folder's one writer (rank 0), held until the end
    modes: TrainModes  # train/eval mode as the task built it (frozen parts stay in eval)
    lr: LrControl  # the one writer of the optimizer's lr (the schedule x peak, or the task's scheduler)
    feeder: Feeder  # the epoch's micro-batches, loaded (by DataLoader workers) ahead of the step
    scheduler: Any  # the task's own torch lr scheduler, or None (then lr's schedule sets the lr)
    switch: Optional[CheckpointSwitch]  # activation checkpointing on/off, if the task or model has one
    memory: WindowMemory  # params/grads/optimizer bytes at each window's end
    snapshots: SnapshotRecorder  # --memory-snapshot on-oom

    @property
    def resume_state(self) -> Optional[dict[str, Any]]:
        return self.origin.state

    @property
    def named_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]

    def fetch(self, indices: list[int]) -> Any:
        """One micro-batch, collated and on the device."""
        data = self.task.train_data
        return to_device(self.collate([data[j] for j in indices]), self.device)

    def rules(self) -> CommandRules:
        """What this run can take from a command: its data set's size, and the settings its
        window policy or a missing checkpointing switch cannot change."""
        def refusal(setting: str) -> Optional[str]:
            if setting == "checkpointing" and self.switch is None:
                return why_no_switch(self.task, self.model)
            return self.policy.refusal(setting)
        return CommandRules(len(self.task.train_data), refusal, self.policy.window_size)


def build(config: TrainConfig, task: Optional[Task], ctx: distributed.DistContext) -> RunParts:
    claimed = Claimed()
    try:
        return _build(config, task, ctx, claimed)
    except BaseException:
        claimed.undo()  # bad input: the folder is free again, and as it was
        raise


@dataclass
class Claimed:
    """What taking the run folder made (the lock, a lock file, folders): undone if the start is
    refused after all, so a refusal leaves the folder as it found it."""
    locks: list[RunLock] = field(default_factory=list)
    made: list[str] = field(default_factory=list)  # paths this start created, in order

    def undo(self) -> None:
        for path in reversed(self.made):  # the lock file first, while the lock is still held
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)  # only if empty: never anything this start did not make
                else:
                    os.unlink(path)
            except OSError:
                pass
        for lock in self.locks:
            lock.release()


def _build(config: TrainConfig, task: Optional[Task], ctx: distributed.DistContext, claimed: "Claimed") -> RunParts:
    cfg = config
    device = resolve_device(cfg.device, ctx)
    if cfg.vram_limit is not None and device.type != "cuda":
        raise ConfigError("--vram-limit needs a CUDA device: it caps this process's share of GPU memory")
    if cfg.precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("--precision bf16 is not supported on this GPU (use fp16 or fp32)")
    if task is None:
        task = load_task(cfg.task, cfg.seed, cfg.task_args)
    if cfg.token_budget is not None and task.sample_length is None:
        raise TaskError(f"task {task.name}: --token-budget needs the task's sample_length")
    check_last_samples(task)
    if cfg.micro_batch > len(task.train_data):
        raise ConfigError(f"--micro-batch {cfg.micro_batch} is larger than the data set "
                          f"({len(task.train_data)} samples)")
    check_warmup(cfg, len(task.train_data), ctx.world)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if cfg.vram_limit is not None:  # before the first allocation
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.vram_limit / total), device)
    modes = TrainModes.record(task.model)
    model = task.model.to(device)
    collate = task.collate or default_collate
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    autocast: Callable[[], ContextManager] = ((lambda: torch.autocast(device.type, dtype=amp_dtype)) if amp_dtype
                                              else contextlib.nullcontext)
    unused: list[str] = []  # parameters the first batch's backward did not reach (DDP must look for them)
    loss_checked = check_first_batch(task, model, collate, autocast, device, modes, unused)
    policy = _window_policy(cfg, task)
    # Everything step 0 needs, built before the run folder is touched: a task whose
    # optimizer factory, scheduler or checkpointing switch fails is bad input.
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _optimizer(task, cfg, device, params)
    scaler = torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None
    scheduler = _task_scheduler(task, optimizer, cfg)
    switch = find_switch(task, model)
    if cfg.checkpointing and switch is None:
        raise ConfigError(f"--activation-checkpointing on: {why_no_switch(task, model)}")
    check_checkpointable(task, model, optimizer, scheduler)
    # A fork reads another run's checkpoint: checked before its own folder is made (last of
    # all, below: every check comes first). A resume reads its own folder's checkpoints: only
    # once the folder is ours (no writer races it).
    origin = fork_origin(cfg.fork, cfg, model) if cfg.fork else Origin()
    check_continues(origin, len(task.train_data), cfg, ctx.world)
    if cfg.resume:
        run_dir, lock = _claim_folder(cfg.resume, cfg, ctx, claimed)
        origin = resume_origin(run_dir, model)
        check_continues(origin, len(task.train_data), cfg, ctx.world)
    else:
        run_dir = cfg.run_dir or default_run_dir(cfg.task)
        if ctx.is_main:
            check_new_run_dir(run_dir)

    distributed.init(ctx, device)  # the process group, once the input is known good
    val = task.val_data
    distributed.agree_on_run(cfg, {"train_data": len(task.train_data), "val_data": len(val) if val is not None else -1},
                             ctx)  # every rank the same settings and data (as the model, strategy.build), or refused
    # torchrun: rank 0's model on every rank, wrapped in DDP or sharded with FSDP2 (engine/distributed)
    strategy = build_strategy(cfg.strategy, model, ctx, device, blocks=task.blocks, precision=cfg.precision,
                              fsdp_reduce=cfg.fsdp_reduce, cpu_offload=cfg.cpu_offload, unused=frozenset(unused))
    if strategy.sharded:  # the parameters are shards now: the optimizer and scheduler are built on those
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = _optimizer(task, cfg, device, params)
        scheduler = _task_scheduler(task, optimizer, cfg)
    memory = WindowMemory(model, optimizer)
    snapshots = SnapshotRecorder()
    if cfg.memory_snapshot == "on-oom":
        snapshots.start(device)  # on CUDA: allocator history from here on; elsewhere it says why not
    stepper = choose_stepper(optimizer, scaler, ctx.enabled, torch.device("cpu") if strategy.offloaded else device,
                       os.environ.get("HEADROOM_STEP_MODE", "auto"))  # offloaded: the step runs on the CPU
    stepper.before_zero = memory.at_window_end  # the breakdown sees the gradients before they go
    stepper.set_to_none = not strategy.grads_in_buckets
    if origin.state is not None:
        _load_state(origin, model, optimizer, scaler, scheduler, strategy.sharded)
    if not cfg.resume:  # every check passed: only now is the new run's folder made
        run_dir, lock = _claim_folder(run_dir, cfg, ctx, claimed)
    schedule = LrSchedule.for_run(cfg.lr_schedule, cfg.min_lr_ratio,
                               total_samples(cfg, len(task.train_data), ctx.world),
                               warmup_samples=cfg.warmup_samples, warmup_fraction=cfg.warmup_fraction)
    probe = MemoryProbe(device)
    window = WindowContext(net=model, loss=task.loss, task_name=task.name, params=params, optimizer=optimizer,
                           scaler=scaler, autocast=autocast, device=device, ctx=ctx, stepper=stepper,
                           loss_checked=loss_checked, strategy=strategy,
                           stand_in=lambda: to_device(collate([task.train_data[0]]), device), probe=probe)
    return RunParts(config=cfg, ctx=ctx, device=device, task=task, model=model, collate=collate, autocast=autocast,
                    optimizer=optimizer, scaler=scaler, window=window, policy=policy, probe=probe,
                    run_dir=run_dir, origin=origin, lock=lock, modes=modes,
                    scheduler=scheduler, switch=switch, memory=memory, snapshots=snapshots,
                    feeder=Feeder(task.train_data, collate, device,
                                  cfg.workers if cfg.workers is not None else auto_workers(task.train_data,
                                                                                           cfg.micro_batch),
                                  seed=cfg.seed),
                    lr=LrControl(optimizer, schedule, scheduler))


def check_checkpointable(task: Task, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         scheduler: Any) -> None:
    """A run must not write checkpoints it would refuse to read back (--resume, --fork and a
    rollback load with weights_only=True): what the task's model, optimizer and scheduler put
    in one goes through that loader now, in memory, before anything is written (the first
    checkpoint is read back too, run_state.save, for what only training adds)."""
    why = ckpt.round_trip_problem({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                   "scheduler": scheduler.state_dict() if scheduler is not None else {}})
    if why:
        raise TaskError(f"task {task.name}: its checkpoints could not be loaded back (torch.load with "
                        f"weights_only=True): {why}; get_extra_state() and the optimizer's and scheduler's "
                        "state_dict() must hold tensors and plain data only")


def _optimizer(task: Task, cfg: TrainConfig, device: torch.device, params: list) -> torch.optim.Optimizer:
    make = task.optimizer or default_optimizer(cfg.optimizer, device)
    try:
        opt = make(params, cfg.lr)
    except Exception as e:
        raise TaskError(f"task {task.name}: optimizer(params, lr) failed: {type(e).__name__}: {e}") from None
    if not isinstance(opt, torch.optim.Optimizer):
        raise TaskError(f"task {task.name}: optimizer(params, lr) must return a torch.optim.Optimizer, "
                        f"got {type(opt).__name__}")
    return opt


def _task_scheduler(task: Task, optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> Any:
    if task.scheduler is None:
        return None
    if cfg.lr_schedule != "constant" or cfg.warmup_samples or cfg.warmup_fraction:
        raise ConfigError(f"task {task.name} brings its own lr scheduler: leave --lr-schedule constant and "
                          "no warmup (or drop the task's scheduler)")
    try:
        sched = task.scheduler(optimizer)
    except Exception as e:
        raise TaskError(f"task {task.name}: scheduler(optimizer) failed: {type(e).__name__}: {e}") from None
    if not (callable(getattr(sched, "step", None)) and callable(getattr(sched, "state_dict", None))):
        raise TaskError(f"task {task.name}: scheduler(optimizer) must return a torch lr scheduler, "
                        f"got {type(sched).__name__}")
    check_scheduler(task.name, sched)  # one the engine cannot step (ReduceLROnPlateau) is refused before any write
    return sched


def total_samples(cfg: TrainConfig, data_len: int, world: int) -> int:
    """The run's total samples: epochs x data set, or with --max-steps, max steps x the
    effective batch at the start (what the schedule's warmup fraction and decay span)."""
    by_epochs = cfg.epochs * data_len
    if cfg.max_steps is None:
        return by_epochs
    return min(by_epochs, cfg.max_steps * cfg.micro_batch * cfg.accum * world)


def samples_left_total(settings: LiveSettings, data_len: int, world: int, step: int, samples: int) -> int:
    """The run's total samples once its length changed while it trained: epochs x data set, or
    with max steps, the samples seen so far plus the steps left x the effective batch now."""
    by_epochs = settings.epochs * data_len
    if settings.max_steps is None:
        return by_epochs
    return min(by_epochs, samples + max(0, settings.max_steps - step) * settings.window_samples * world)


def check_warmup(cfg: TrainConfig, data_len: int, world: int) -> None:
    """A warmup in samples longer than the whole run would train every step below the peak lr
    (at 1e-9 of it, for a warmup of millions on a small run) without a word: refused."""
    total = total_samples(cfg, data_len, world)
    if cfg.warmup_samples > total:
        by = (f"{cfg.max_steps} steps x {cfg.micro_batch * cfg.accum * world} samples"
              if cfg.max_steps is not None and total < cfg.epochs * data_len
              else f"{cfg.epochs} epoch{'s' if cfg.epochs != 1 else ''} x {data_len} samples")
        raise ConfigError(f"--warmup-samples {cfg.warmup_samples} is longer than the whole run: it trains "
                          f"{total} samples ({by}), so the lr would never reach its peak; give at most {total}, "
                          "or --warmup-fraction F for a share of the run")


def check_first_batch(task: Task, model: torch.nn.Module, collate: Callable, autocast: Callable,
                      device: torch.device, modes: TrainModes, unused: Optional[list[str]] = None) -> bool:
    """What step 0 does, on two samples, before the run folder exists: a first batch, the loss,
    and its backward. A malformed task is bad input here, not a failure halfway through the
    first window. Runs in eval mode (no BatchNorm statistics or dropout draws spent) and
    leaves no gradient behind. False if it could not run (out of memory: the run's own
    recovery decides)."""
    data, name = task.train_data, task.name
    try:
        batch = to_device(collate([data[i] for i in range(min(2, len(data)))]), device)
    except Exception as e:
        raise TaskError(f"task {name}: building a first batch failed: {type(e).__name__}: {e}") from None
    model.eval()
    try:
        with autocast():
            out = task.loss(model, batch)
        loss_sum, _ = check_loss_output(name, out)
        if not loss_sum.requires_grad:
            raise TaskError(f"task {name}: loss_sum has no gradient (a .detach(), .item() or torch.no_grad() "
                            "in the loss?)")
        loss_sum.backward()
        if unused is not None:
            unused += [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    except TaskError:
        raise
    except Exception as e:
        if is_oom(e):
            return False
        raise TaskError(f"task {name}: loss(model, batch) failed on a first batch: {type(e).__name__}: {e}") from None
    finally:
        model.zero_grad(set_to_none=True)
        modes.restore_built(model)
    return True


def _window_policy(cfg: TrainConfig, task: Task) -> WindowPolicy:
    data = task.train_data
    if cfg.token_budget is None:
        return FixedWindows(len(data), cfg.seed)
    assert task.sample_length is not None
    try:
        lengths = [int(task.sample_length(data[i])) for i in range(len(data))]
    except Exception as e:
        raise TaskError(f"task {task.name}: sample_length(sample) failed: {type(e).__name__}: {e}") from None
    return TokenBudgetWindows(len(data), cfg.seed, cfg.token_budget, lengths.__getitem__, cfg.micro_tokens)


def _claim_folder(run_dir: str, cfg: TrainConfig, ctx: distributed.DistContext,
                  claimed: Claimed) -> tuple[str, Optional[RunLock]]:
    """The run folder, and (rank 0) the OS lock that makes this process its one writer; a
    killed writer's temporary files are removed once the folder is ours. What it makes is in
    `claimed` (build undoes it if the start is refused after all)."""
    if cfg.resume:
        if not os.path.isfile(os.path.join(run_dir, "run.db")):
            raise ConfigError(f"--resume {run_dir}: not a run folder (no run.db)")
    elif ctx.is_main:
        claimed.made += check_writable_dir(run_dir)
    if not ctx.is_main:
        return run_dir, None
    new_lock_file = not os.path.lexists(runlock.lock_path(run_dir))
    lock = runlock.acquire(run_dir)
    claimed.locks.append(lock)
    if new_lock_file:
        claimed.made.append(runlock.lock_path(run_dir))
    if not cfg.resume and os.path.exists(os.path.join(run_dir, "run.db")):  # another writer got in first
        raise ConfigError(f"--run-dir {run_dir}: already holds a run (use --resume {run_dir} to continue it)")
    ckpt.remove_orphans(run_dir, lock)
    return run_dir, lock


def _load_state(origin: Origin, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                scaler: Optional[torch.amp.GradScaler], scheduler: Any, model_sharded: bool = False) -> None:
    """Weights, optimizer, scaler and scheduler from the checkpoint, before anything is
    written: a checkpoint that does not fit is bad input."""
    state = origin.state
    assert state is not None
    try:
        sharded.load_weights(state, model, optimizer, model_sharded)  # a file or a sharded folder
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        if scheduler is not None and state.get("scheduler"):
            scheduler.load_state_dict(state["scheduler"])
    except ckpt.CheckpointError:
        raise  # damaged or crafted (a sharded folder's shards are read only here): said as it is
    except (RuntimeError, ValueError, KeyError, TypeError, sharded.CheckpointException) as e:
        raise ConfigError(f"checkpoint {origin.path} does not fit the task: {first_line(e, 200)}") from None


def check_continues(origin: Origin, samples: int, cfg: TrainConfig, world: int) -> None:
    """A checkpoint this run continues from, checked before anything is written: it fits the
    data (check_fits_data), and its effective batch splits over this run's ranks (what
    trainer._open applies: keep_effective_batch, refused there only after run.db was opened)."""
    check_fits_data(origin, samples, cfg)
    if origin.state is None:
        return
    state = origin.state
    settings = LiveSettings.from_config(cfg).updated(state.get("settings"))
    fixed = cfg.fork_changes if origin.parent is not None else ()
    if origin.parent is not None:
        settings = settings.with_(**{k: getattr(cfg, k) for k in ("micro_batch", "accum") if k in fixed})
    try:
        keep_effective_batch(settings, state, world, cfg.token_budget, fixed, 0, 0)
    except ConfigError as e:
        raise ConfigError(f"checkpoint {origin.path}: {e}") from None


def check_fits_data(origin: Origin, samples: int, cfg: TrainConfig) -> None:
    """Where the checkpoint is in its epoch, and its micro-batch (unless a fork sets its own),
    against this task's data set, as --micro-batch is checked: past the end is bad input."""
    if origin.state is None:
        return
    state = origin.state
    offset = state.get("epoch_offset", 0)
    micro = 1 if "micro_batch" in cfg.fork_changes else (state.get("settings") or {}).get("micro_batch", 1)
    if offset > samples:
        raise ConfigError(f"checkpoint {origin.path} refused: epoch_offset {offset} is past the end of the data "
                          f"set ({samples} samples)")
    if micro > samples:
        raise ConfigError(f"checkpoint {origin.path} refused: settings.micro_batch {micro} is larger than the "
                          f"data set ({samples} samples)")


def check_new_run_dir(path: str) -> None:
    """A new run's folder, before anything is made: not a file, not a run already. (Whether it
    can be written is probed when it is made, check_writable_dir.)"""
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise ConfigError(f"--run-dir {path}: exists and is not a folder")
        if os.path.exists(os.path.join(path, "run.db")):
            raise ConfigError(f"--run-dir {path}: already holds a run (use --resume {path} to continue it)")


def check_writable_dir(path: str) -> list[str]:
    """Refuse a run folder we could not write. Creates the folder (the run is about to
    start), and removes what it created if any part is not writable. Returns the folders it
    made (build removes them again if the start is refused after all)."""
    import tempfile
    check_new_run_dir(path)
    created: list[str] = []
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
    return created
