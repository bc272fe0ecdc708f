"""Lightning -> a Headroom run folder: one line in an existing script.

    from engine.integrations.lightning import HeadroomCallback
    trainer = L.Trainer(max_epochs=3, accumulate_grad_batches=4, callbacks=[HeadroomCallback()])

Needs the `lightning` extra (`lightning.pytorch`). Per optimizer step the callback
writes one `metrics` row through the shared writer (engine.integrations.loop.HeadroomRun):

- loss: the window's token-weighted loss, sum over micro-batches of loss x count / the
  window's count. The count of a micro-batch is `training_step`'s `"count"` when it
  returns a dict with one (tokens, say), else its batch size. Lightning's own window
  loss is the mean of the micro-batch means (each divided by accumulate_grad_batches,
  a short last window too); when the two differ a `loss_weighting` event gives both.
- grad_norm: the total norm before clipping, measured once, after every
  on_before_optimizer_step hook (the callbacks' and the LightningModule's, so a module
  that rescales its gradients there is measured after it) and before Lightning clips.
- lr: the lr the optimizer stepped with; accum (micro-batches in the window),
  micro_batch, samples, tokens, step_time, throughput; GPU memory from MemoryProbe.
- skipped work: an fp16 overflow the GradScaler skipped (`scaler_skipped`, a
  `scaler_skip` event); micro-batches whose training_step returned None (a
  `step_skipped` event); a non-finite loss or norm (a `nonfinite` event).

The rows of the steps since the last write go to run.db every `poll_interval` (50 ms)
in one batch, with one read of the host for their losses and counts (the norm is read
once per step, where it is measured).

Epochs: an `epochs` row at each training epoch end, with the validation loss logged as
`val_key` ("val_loss") when validation ran in that epoch. Commands: a setting sent "at
the next epoch" applies at on_train_epoch_start, one sent "at the next step" after the
next optimizer step, accumulation always at the next epoch start: see the table in
engine/integrations/__init__.py.

loss_reduction="sum" is for a training_step that returns its micro-batch's loss *sum*
(and its "count") and, in the module's on_before_optimizer_step, multiplies the
gradients by accumulate_grad_batches / the window's count (README: exact accumulation
with Lightning): the row's loss is then the sum of the sums / the window's count.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

try:
    import lightning
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler
    from lightning.pytorch.plugins.precision import Precision
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError("engine.integrations.lightning needs Lightning: pip install 'headroom[lightning]'") from e

import torch

from engine.accumulation.grads import clip_params_by_host_norm_
from engine.declarations.commands import Command, SetAccum, SetClip, SetLr
from engine.declarations.events import ScalerSkip

from ._exactness import WindowCheck, check_window, same
from ._lightning_logger import HeadroomLogger
from ._loop_rows import read_to_host
from ._step_record import StepRecord
from .loop import HeadroomRun, IntegrationError, StepSkipped, batch_size, clean, end_reason, set_lr

__all__ = ["HeadroomCallback", "HeadroomLogger"]

MAX_PENDING = 256  # steps kept at most before their rows are written, whatever the interval
REFUSED = {
    "set_micro_batch": "the DataLoader is built when training starts; its batch size cannot change mid-run",
    "set_lr_scaling": "lr scaling follows the engine's own accumulation changes; send set_lr instead",
}


@dataclass
class _Stepped:
    """The optimizer step, measured after every on_before_optimizer_step hook."""
    norm: Optional[float]  # before clipping
    lr: float
    clip: float  # 0: not clipping by norm
    bad_params: tuple[str, ...]  # parameters with a non-finite gradient
    scale: Optional[float]  # fp16: the GradScaler's scale before the step (lower after it: skipped)


@dataclass
class _Measured:
    """The norm just measured, for Lightning's clip that follows (so it is computed once)."""
    optimizer: Any
    params: list[Any]
    norm: Any  # the tensor
    norm_host: Optional[float]  # the same, read to the host


@dataclass
class _Window:
    """The micro-batches of the window being trained. Losses and counts stay tensors until
    the rows are written (one read of the host for a batch of steps)."""
    losses: list[Any] = field(default_factory=list)  # Lightning's detached copies, already divided by accum
    counts: list[Any] = field(default_factory=list)  # training_step's count, else the batch size
    sizes: list[int] = field(default_factory=list)
    none_micro: int = 0  # micro-batches whose training_step returned None
    stepped: Optional[_Stepped] = None  # once the optimizer stepped


@dataclass
class _Step:
    """A step whose row is not written yet."""
    step: int
    epoch: int
    seconds: float
    scaler_skipped: bool
    accum: int  # what Lightning divided each micro-batch's loss by (accumulate_grad_batches)
    window: _Window


def _config(trainer: "pl.Trainer", pl_module: "pl.LightningModule", extra: Mapping[str, Any]) -> dict:
    """The run table's settings: what the Trainer says, `extra` over it."""
    opt = trainer.optimizers[0] if trainer.optimizers else None
    prec = str(trainer.precision)
    precision = "bf16" if "bf16" in prec else "fp16" if prec.startswith("16") else "fp32"
    dl = getattr(trainer, "train_dataloader", None)
    cfg = dict(micro_batch=getattr(dl, "batch_size", None), accum=trainer.accumulate_grad_batches,
               lr=float(opt.param_groups[0]["lr"]) if opt is not None else None,
               clip=float(trainer.gradient_clip_val or 0.0),
               epochs=trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None,
               max_steps=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None,
               optimizer=type(opt).__name__.lower() if opt is not None else None, precision=precision,
               device=str(pl_module.device), seed=None, framework="lightning",
               framework_version=lightning.__version__,
               clip_algorithm=clean(trainer.gradient_clip_algorithm) if trainer.gradient_clip_algorithm else "norm")
    cfg.update(extra)
    return cfg


LIGHTNING_FIX = ("return the micro-batch's loss sum and its count from training_step, divide the gradients by "
                 "the window's count in on_before_optimizer_step, and pass HeadroomCallback(loss_reduction='sum') "
                 "(README: exact accumulation with Lightning)")


def _check(counts: list[float], accum: int) -> WindowCheck:
    """A window of mean losses against the exact step. Lightning backpropagates each micro-batch's
    mean over its count n_i divided by accumulate_grad_batches k, so micro-batch i's weight
    relative to the exact 1/N is N / (k n_i): one factor m/k for a short window of m equal
    micro-batches, unequal weights for unequal counts."""
    total = sum(counts)
    m = len(counts)
    check = check_window([total / (accum * n) for n in counts if n > 0])
    if not check.off:
        return check
    if m < accum and all(same(n, counts[0]) for n in counts):
        check.cause = (f"Lightning divides each micro-batch's loss by accumulate_grad_batches = {accum}, also in this "
                       f"short window of {m}: the update is {m}/{accum} of the exact one")
    else:
        check.cause = (f"Lightning divides each micro-batch's mean loss by accumulate_grad_batches = {accum} "
                       "(a mean of means): micro-batches with a smaller count weigh more")
    check.fix = LIGHTNING_FIX
    return check


class HeadroomCallback(Callback):
    """Write this Lightning run to a Headroom run folder, and take the app's commands.

    run_dir: the run folder (new; must not hold a run); None = a new folder under the runs
        root, named like the engine's. One fit() per run_dir given.
    task: the name the runs list shows (default "lightning-<LightningModule class>").
    config: extra settings for the run table (merged over what the Trainer says).
    val_key: the logged metric that is the validation loss. count_key: the key of a
        training_step dict holding the micro-batch's count (tokens). loss_reduction:
        "mean" (training_step returns a mean over its count, Lightning's usual) or "sum".
    checkpoint_dir: where a stop from the app saves its checkpoint (default: the
        ModelCheckpoint's folder, else <default_root_dir>/checkpoints).
    commit_interval: seconds between run.db commits of metrics rows (the engine's 1.0).
    poll_interval: the app's commands are read at most this often (0 = at every step).
    """

    # Lightning calls every hook of every callback, each under a profiler context (a few us a
    # call, six calls a micro-batch), and skips a hook that is not callable
    # (lightning/pytorch/trainer/call.py's _call_callback_hooks checks `callable(fn)`). The per-batch hooks this
    # callback has no use for are None, so it costs no more than Lightning's own loop there.
    on_train_batch_start = None  # type: ignore[assignment]  # None: Lightning skips a hook that is not callable
    on_before_backward = None  # type: ignore[assignment]  # None: Lightning skips a hook that is not callable
    on_after_backward = None  # type: ignore[assignment]  # None: Lightning skips a hook that is not callable
    on_before_optimizer_step = None  # type: ignore[assignment]  # measured in the module's hook instead (_wrap)
    on_before_zero_grad = None  # type: ignore[assignment]  # None: Lightning skips a hook that is not callable
    on_validation_batch_start = None  # type: ignore[assignment]  # None: Lightning skips a hook that is not callable
    on_validation_batch_end = None  # type: ignore[assignment]  # None: Lightning skips a hook that is not callable

    def __init__(self, run_dir: Optional[str] = None, *, task: Optional[str] = None,
                 config: Optional[Mapping[str, Any]] = None, val_key: str = "val_loss", count_key: str = "count",
                 loss_reduction: str = "mean", checkpoint_dir: Optional[str] = None,
                 commit_interval: float = 1.0, poll_interval: float = 0.05) -> None:
        HeadroomRun(run_dir, task=task or "lightning", config=config, commit_interval=commit_interval,
                    poll_interval=poll_interval)  # checks the arguments
        for name, v in (("val_key", val_key), ("count_key", count_key)):
            if not isinstance(v, str) or not v:
                raise TypeError(f"{name} must be a non-empty string, got {v!r}")
        if loss_reduction not in ("mean", "sum"):
            raise IntegrationError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        if checkpoint_dir is not None and not isinstance(checkpoint_dir, (str, os.PathLike)):
            raise TypeError(f"checkpoint_dir must be a folder path or None, got {type(checkpoint_dir).__name__}")
        self.run_dir_arg = run_dir
        self.task = task
        self.extra_config = dict(config or {})
        self.val_key, self.count_key, self.loss_reduction = val_key, count_key, loss_reduction
        self.checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        self.commit_interval = commit_interval
        self.poll_interval = poll_interval
        self.run: Optional[HeadroomRun] = None
        self.run_dir: Optional[str] = None
        self.stop_checkpoint: Optional[str] = None
        self._module: Any = None
        self._stopping = False
        self._val: Optional[float] = None
        self._scaler: Any = None
        self._steps: list[_Step] = []  # steps not written yet (written every poll_interval)
        self._plugin: Any = None
        self._measured: Optional[_Measured] = None
        self._logged: Optional[dict] = {}  # scalar -> (step, value) written; None: a HeadroomLogger writes them
        self._reset_window()

    # -- set-up --------------------------------------------------------------------------------------
    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.run is not None and not self.run.finished:
            self.run.fail("fit() ended without on_train_end")
        self._unwrap()
        self.run, self._stopping, self._val, self.stop_checkpoint = None, False, None, None
        self._steps = []
        self._reset_window()
        if not trainer.is_global_zero:
            return
        world = int(trainer.world_size or 1)
        steering = "" if world == 1 else (f"this run trains in {world} processes: a setting applied on process 0 "
                                          "alone would make them diverge")
        run = HeadroomRun(self.run_dir_arg, task=self.task or f"lightning-{type(pl_module).__name__}",
                          config=_config(trainer, pl_module, self.extra_config), device=pl_module.device,
                          world_size=world,
                          steering=steering, integration="lightning", commit_interval=self.commit_interval,
                          poll_interval=self.poll_interval, refusal=lambda cmd: self._refusal(cmd, trainer, pl_module))
        run.start(step=int(trainer.global_step), epoch=int(trainer.current_epoch) + 1)
        run.set_info(checkpoint_dir=self._checkpoint_folder(trainer))  # where Lightning keeps them (the app says so)
        self.run, self.run_dir = run, run.run_dir
        loggers = [lg for lg in trainer.loggers if isinstance(lg, HeadroomLogger)]
        for lg in loggers:
            lg.attach(run)  # one run folder: the logger's scalars beside this callback's rows
        self._logged = None if loggers else {}  # None: the logger writes the scalars
        self._scaler = getattr(trainer.precision_plugin, "scaler", None)  # fp16's GradScaler, if any
        self._wrap(trainer, pl_module)

    def _wrap(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Measure after the module's own on_before_optimizer_step (Lightning calls the
        callbacks' hook first, then the module's, then clips). When Lightning's plain
        clip-by-norm follows (the base precision plugin's, the module's default
        configure_gradient_clipping), it clips with the norm just measured instead of
        computing it again: torch's clip_grad_norm_ is get_total_norm followed by
        clip_grads_with_norm_, so the result is the same and the norm is computed once (and
        read to the host once; the clip coefficient is then host arithmetic, the same bits)."""
        hook = pl_module.on_before_optimizer_step
        cb = self

        def on_before_optimizer_step(optimizer: Any, *a: Any, **kw: Any) -> Any:
            out = hook(optimizer, *a, **kw)
            cb._before_step(trainer, pl_module, optimizer)
            return out

        object.__setattr__(pl_module, "on_before_optimizer_step", on_before_optimizer_step)
        self._module = pl_module
        plugin = trainer.precision_plugin
        plain = (type(plugin).clip_grad_by_norm is Precision.clip_grad_by_norm
                 and type(pl_module).configure_gradient_clipping is pl.LightningModule.configure_gradient_clipping
                 and hasattr(torch.nn.utils, "clip_grads_with_norm_"))
        if plain:
            clip_fn = plugin.clip_grad_by_norm

            def clip_grad_by_norm(optimizer: Any, clip_val: Any) -> None:
                measured, cb._measured = cb._measured, None
                if measured is None or measured.optimizer is not optimizer:
                    return clip_fn(optimizer, clip_val)
                # torch's clip_grads_with_norm_ bit for bit, its coefficient from the host norm
                assert measured.norm_host is not None  # measured only with gradients, so with a norm
                clip_params_by_host_norm_(measured.params, float(clip_val), measured.norm, measured.norm_host)

            plugin.clip_grad_by_norm = clip_grad_by_norm  # type: ignore[method-assign]  # this run's plugin only
            self._plugin = plugin

    def _unwrap(self) -> None:
        m, self._module = self._module, None
        if m is not None:
            m.__dict__.pop("on_before_optimizer_step", None)
        p, self._plugin = self._plugin, None
        if p is not None:
            p.__dict__.pop("clip_grad_by_norm", None)
        self._measured = None

    # -- one window ----------------------------------------------------------------------------------
    def _reset_window(self) -> None:
        self._window = _Window()

    def _before_step(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", optimizer: Any) -> None:
        """After every on_before_optimizer_step hook, before Lightning clips: the norm (the
        step's one read of the host) and the lr."""
        if self.run is None or self.run.finished:
            return
        params = [p for g in optimizer.param_groups for p in g["params"]]  # what Lightning clips
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else None
        norm_f = float(norm) if norm is not None else None
        self._measured = (_Measured(optimizer=optimizer, params=params, norm=norm, norm_host=norm_f)
                          if self._plugin is not None and grads else None)
        bad: tuple[str, ...] = ()
        if norm_f is not None and not math.isfinite(norm_f):  # named before clipping spreads the NaN
            bad = tuple(n for n, p in pl_module.named_parameters()
                        if p.grad is not None and not bool(torch.isfinite(p.grad).all()))
        scaler = self._scaler
        self._window.stepped = _Stepped(
            norm=norm_f, lr=float(optimizer.param_groups[0]["lr"]),
            clip=float(trainer.gradient_clip_val or 0.0) if self._clip_by_norm(trainer) else 0.0, bad_params=bad,
            scale=float(scaler.get_scale()) if scaler is not None else None)

    @staticmethod
    def _clip_by_norm(trainer: "pl.Trainer") -> bool:
        algo = trainer.gradient_clip_algorithm
        return algo is None or clean(algo) == "norm"

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        run = self.run
        if run is None or run.finished:
            return
        if type(outputs) is dict or isinstance(outputs, Mapping):
            loss = outputs.get("loss")
            c = outputs.get(self.count_key)
        else:
            loss, c = outputs, None
        w = self._window
        if isinstance(loss, torch.Tensor):
            w.losses.append(loss)  # Lightning's detached copy, already divided by accum
            size = batch_size(batch)
            w.sizes.append(size)
            w.counts.append(c if c is not None else size)
        else:
            w.none_micro += 1
        stepped = w.stepped
        if stepped is None:
            return
        skipped = False
        if self._scaler is not None and stepped.scale is not None:  # fp16: the GradScaler lowered its scale
            skipped = float(self._scaler.get_scale()) < stepped.scale
        accum = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
        self._steps.append(_Step(step=int(trainer.global_step), epoch=run.epoch, seconds=run.lap(),
                                 scaler_skipped=skipped, accum=accum, window=w))
        self._reset_window()
        if run.due() or len(self._steps) >= MAX_PENDING:
            self._commands(trainer, pl_module)

    def _write_rows(self) -> None:
        """Write the steps kept since the last write: one read of the host for all their
        losses and counts, then one metrics row per step."""
        steps, self._steps = self._steps, []
        run = self.run
        if not steps or run is None or run.finished:
            return
        windows = [s.window for s in steps]
        tensors = [x.reshape(()) if x.dim() else x for w in windows for x in w.losses]
        tensors += [c.sum() for w in windows for c in w.counts if isinstance(c, torch.Tensor)]
        values = iter(read_to_host(tensors))
        outs_of = [[next(values) for _ in w.losses] for w in windows]
        counts_of = [[next(values) if isinstance(c, torch.Tensor) else float(c) for c in w.counts] for w in windows]
        world = run.world_size
        for s, outs, counts in zip(steps, outs_of, counts_of):
            w = s.window
            stepped = w.stepped
            assert stepped is not None
            norm, clip = stepped.norm, stepped.clip
            total = sum(counts)
            check: Optional[WindowCheck] = None
            if self.loss_reduction == "sum":  # outputs are the returned loss sums / accum (Lightning's division)
                weighted = sum(outs) * s.accum / total if total else float("nan")
                framework = None
            else:
                weighted = sum(o * c for o, c in zip(outs, counts)) * s.accum / total if total else float("nan")
                framework = sum(outs)
                if total:
                    check = _check(counts, s.accum)
            if s.scaler_skipped:
                run.record(ScalerSkip(s.step, s.epoch, scale=float(self._scaler.get_scale())))
            run.record_step(StepRecord(
                step=s.step, epoch=s.epoch, loss=weighted, grad_norm=norm, lr=stepped.lr,
                accum=len(outs) + w.none_micro, clip=clip, micro_batch=max(w.sizes) if w.sizes else None,
                samples=sum(w.sizes) * world, tokens=int(round(total)) * world, step_time=s.seconds,
                scaler_skipped=s.scaler_skipped, framework_loss=framework, bad_params=stepped.bad_params,
                nonfinite_action="not skipped (Lightning stepped)"), check)
            if w.none_micro:
                run.record(StepSkipped(s.step, s.epoch, micro_batches=w.none_micro,
                                       reason="training_step returned None: Lightning skipped their backward"))

    # -- commands ------------------------------------------------------------------------------------
    def _commands(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", epoch_start: bool = False) -> None:
        run = self.run
        assert run is not None
        self._write_rows()  # the rows before what the commands do
        for cmd in run.poll():
            self._apply(cmd, trainer, pl_module, epoch_start)
        if run.stop_requested and not self._stopping:
            self._stopping = True
            self._save_and_stop(trainer)

    def _schedulers(self, trainer: "pl.Trainer", opt: Any) -> list[Any]:
        out = []
        for c in getattr(trainer, "lr_scheduler_configs", None) or []:
            s = c.scheduler
            if getattr(s, "optimizer", None) is opt or getattr(s, "optimizer", None) is None:
                out.append(s)
        return out

    def _refusal(self, cmd: Command, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> str:
        """Why this run can never take `cmd` ('' if it can): refused as it arrives."""
        if isinstance(cmd, SetLr):
            return "" if trainer.optimizers else "the LightningModule configured no optimizer"
        if isinstance(cmd, SetClip):
            if not pl_module.automatic_optimization:
                return "manual optimization: Lightning does not clip gradients for this module"
            if not self._clip_by_norm(trainer):
                return (f"this run clips gradients by {clean(trainer.gradient_clip_algorithm)} "
                        "(gradient_clip_algorithm), not by norm")
            return ""
        if isinstance(cmd, SetAccum):
            if not pl_module.automatic_optimization:
                return "manual optimization: the LightningModule accumulates gradients itself"
            if any(isinstance(c, GradientAccumulationScheduler) for c in trainer.callbacks):  # type: ignore[attr-defined]  # set by Lightning's callback connector
                return "a GradientAccumulationScheduler sets the accumulation of this run"
            if "deepspeed" in type(trainer.strategy).__name__.lower():
                return "DeepSpeed fixes the accumulation when training starts"
            return ""
        return REFUSED.get(cmd.kind, f"{cmd.kind} is not supported with Lightning")

    def _apply(self, cmd: Command, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
               epoch_start: bool) -> None:
        run = self.run
        assert run is not None
        why = self._refusal(cmd, trainer, pl_module)
        if why:
            run.refuse(cmd, why)
        elif isinstance(cmd, SetLr):
            opt = trainer.optimizers[0]
            run.apply(cmd, lr=set_lr(opt, cmd.lr, self._schedulers(trainer, opt)))
        elif isinstance(cmd, SetClip):
            old = float(trainer.gradient_clip_val or 0.0)
            trainer.gradient_clip_val = float(cmd.clip) if cmd.clip > 0 else None
            run.apply(cmd, clip=(old, float(cmd.clip)))
        elif isinstance(cmd, SetAccum):
            if not epoch_start:
                run.defer(cmd, target_epoch=run.epoch + 1)  # as GradientAccumulationScheduler: at epoch starts
                return
            old, accum = int(trainer.accumulate_grad_batches), int(cmd.accum)
            trainer.accumulate_grad_batches = accum
            run.apply(cmd, accum=(old, accum))

    def _save_and_stop(self, trainer: "pl.Trainer") -> None:
        run = self.run
        assert run is not None
        folder = self._checkpoint_folder(trainer)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"headroom-stop-step={run.step}.ckpt")
        tmp = path + ".part"
        trainer.save_checkpoint(tmp)  # Lightning's own checkpoint (weights, optimizer, loops, callbacks)
        os.replace(tmp, path)  # never a half-written checkpoint under the real name
        self.stop_checkpoint = path
        run.checkpoint_saved(path)
        trainer.should_stop = True

    def _checkpoint_folder(self, trainer: "pl.Trainer") -> str:
        """checkpoint_dir, else the ModelCheckpoint's folder, else <default_root_dir>/checkpoints."""
        ckpt_cb = getattr(trainer, "checkpoint_callback", None)
        if self.checkpoint_dir is not None:
            return self.checkpoint_dir
        if ckpt_cb is not None and getattr(ckpt_cb, "dirpath", None):
            return str(ckpt_cb.dirpath)
        return os.path.join(trainer.default_root_dir, "checkpoints")

    # -- epochs and the end --------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        run = self.run
        if run is None or run.finished:
            return
        run.epoch = int(trainer.current_epoch) + 1
        self._commands(trainer, pl_module, epoch_start=True)  # settings sent for this epoch apply now
        run.reset_timer()

    def on_validation_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.run is None or trainer.sanity_checking:
            return
        v = trainer.callback_metrics.get(self.val_key)
        try:  # a logged value is data: one that is no number is no validation loss, never an error
            self._val = float(v) if v is not None else None
        except (TypeError, ValueError, RuntimeError):
            self._val = None
        self._scalars(trainer)
        self.run.reset_timer()

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        run = self.run
        if run is None or run.finished:
            return
        self._write_rows()
        self._scalars(trainer)
        run.log_epoch(val_loss=self._val, epoch=int(trainer.current_epoch) + 1)
        self._val = None

    def _scalars(self, trainer: "pl.Trainer") -> None:
        """What the module logged (`trainer.callback_metrics`: every `self.log` value, the last of
        each), to the `scalars` table at validation and epoch ends; a value already written at
        this step is not written again. With a HeadroomLogger, the logger writes them instead."""
        logged, run = self._logged, self.run
        if logged is None or run is None or run.finished:
            return
        step = int(trainer.global_step)
        new = {}
        for k, v in trainer.callback_metrics.items():
            x = float(v) if isinstance(v, (torch.Tensor, int, float)) and getattr(v, "numel", lambda: 1)() == 1 else None
            if x is not None and logged.get(k) != (step, x):
                logged[k] = (step, x)
                new[k] = x
        if new:
            run.log_scalars(new, step=step, epoch=int(trainer.current_epoch) + 1)

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        run = self.run
        try:
            if run is None or run.finished:
                return
            self._write_rows()
            run.finish(end_reason(self._stopping, trainer.max_steps, trainer.global_step))
        finally:
            self._unwrap()

    def on_exception(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException) -> None:
        run = self.run
        try:
            if run is not None and not run.finished:
                try:
                    self._write_rows()  # the steps done are kept
                except Exception:
                    pass
                run.fail("interrupted" if isinstance(exception, KeyboardInterrupt)
                         else f"{type(exception).__name__}: {exception}")
        finally:
            self._unwrap()
