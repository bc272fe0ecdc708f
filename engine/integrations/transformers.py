"""Hugging Face Trainer -> a Headroom run folder: one line in an existing script.

    from engine.integrations.transformers import HeadroomCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[HeadroomCallback()])

Needs the `hf` extra (transformers, accelerate). Per optimizer step the callback writes
one `metrics` row through the shared writer (engine.integrations.loop.HeadroomRun):

- loss: the window's token-weighted loss, sum of micro-batch loss sums / the window's
  count, both measured here from the logits and labels the model saw (labels != -100,
  shifted by one for a causal LM, judged from the model, not the Trainer's flag), so
  neither the Trainer's count nor its scaling can put it off; tokens: that count.
- exactness: each micro-batch's weight in the update, what the Trainer backpropagated
  (captured at Accelerate's backward) over its true loss sum, relative to the exact 1/N;
  on the windows `grad_check` names the gradients are compared too (GradProbe). A step
  off the exact one by over 0.1% raises `loss_weighting` with the size, the cause and the
  fix (engine.integrations._exactness, ._hf_loss). The fixes: `exact_loss` as
  `compute_loss_func` for a plain-mean loss (BERT's classification heads), and
  `model.loss_type = "ForCausalLM"` for a causal LM the Trainer counts unshifted (GPT-2
  from a config).
- grad_norm: the Trainer's own total norm before clipping (the value
  `accelerator.clip_grad_norm_` returns; nothing is computed twice).
- lr: the lr the optimizer stepped with; accum, micro_batch, samples, tokens from the
  window's batches; step_time, throughput; GPU memory from the engine's MemoryProbe.
- skipped steps: an fp16 overflow the optimizer skipped (accelerate's
  `optimizer_step_was_skipped`) is `scaler_skipped` plus a `scaler_skip` event; a
  non-finite loss or norm the Trainer stepped through anyway is a `nonfinite` event.

The rows of the steps since the last write go to run.db every `poll_interval` (50 ms)
in one batch, with one read of the host for their losses and counts (the norm is read
once per step); RunStore commits them at least once a second, as the engine's.

Epochs: an `epochs` row at each epoch end, with `eval_loss` when the Trainer evaluates
at epoch ends (eval_strategy="epoch"). Commands: a setting sent "at the next epoch"
applies at on_epoch_begin, one sent "at the next step" after the next optimizer step;
see the table in engine/integrations/__init__.py (lr, clip, pause, resume, stop with
the Trainer's checkpoint; accumulation and micro-batch are refused as they arrive).

To see inside a step the callback needs the Trainer, which the callback API does not
pass (its hooks get args, state, control, the model, optimizer, lr_scheduler and
dataloaders): each micro-batch's loss and count come from training_step, the norm before
clipping from accelerator.clip_grad_norm_ (no hook runs between the last backward and the
clip), and a failing training_step is seen nowhere else. So the Trainer is handed over:
`attach(trainer)` (which also adds the callback, if it is not among the Trainer's
callbacks yet). At on_train_begin four attributes are wrapped for the run (training_step,
compute_loss, asked for the outputs too; Accelerate's backward and clip_grad_norm_), and
restored at on_train_end; nothing else of the Trainer is changed, and what the Trainer
computes is not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

try:
    from transformers import Trainer, TrainerCallback
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError("engine.integrations.transformers needs Hugging Face transformers: "
                      "pip install 'headroom[hf]' (transformers and accelerate)") from e

import torch

from engine.declarations.commands import Command, SetClip, SetLr
from engine.declarations.events import ScalerSkip

from . import _hf_wrap
from ._exactness import WindowCheck
from ._hf_loss import exact_loss
from ._hf_meter import GRAD_CHECKS, Meter
from ._loop_rows import read_to_host
from ._step_record import StepRecord
from .loop import HeadroomRun, IntegrationError, end_reason, set_lr

__all__ = ["HeadroomCallback", "exact_loss"]

MAX_PENDING = 256  # steps kept at most before their rows are written, whatever the interval
REFUSED = {
    "set_accum": ("the Trainer sizes its epochs and its lr schedule from gradient_accumulation_steps when "
                  "training starts; it cannot change mid-run"),
    "set_micro_batch": "the Trainer's DataLoader is built when training starts; its batch size cannot change mid-run",
    "set_lr_scaling": "lr scaling follows the engine's own accumulation changes; send set_lr instead",
}


@dataclass
class _Micro:
    """One micro-batch as the callback measured it, independently of the Trainer."""
    loss: Any  # as training_step returned it: what the Trainer backpropagated (v_i)
    inputs: Any
    true_sum: Any  # the loss sum from the logits and labels the model saw (S_i), or None
    true_count: Any  # the labels the loss counts (shifted for a causal LM), or None
    unshifted: Any  # labels != -100 before any shift, or None


@dataclass
class _Window:
    """One optimizer step's numbers as on_pre_optimizer_step saw them. The losses and counts
    stay tensors until the rows are written (one read of the host for a batch of steps)."""
    losses: list[Any]  # each micro-batch's loss, as training_step returned it
    counts: list[Any]  # each micro-batch's count: labels != -100 (an int or a 0-d tensor)
    sizes: list[int]  # samples in each micro-batch
    num_items: Any  # num_items_in_batch the Trainer passed (the window's count), or None
    norm: Optional[float]  # before clipping
    lr: Optional[float]
    bad_params: tuple[str, ...]  # parameters with a non-finite gradient
    clip: float
    scaled: bool  # each loss was divided by the window's count (num_items_in_batch), not by accum
    accum: int  # what an unscaled loss was divided by (current_gradient_accumulation_steps)
    sums: list[Any]  # S_i per micro-batch (tensors), or [] when not measured
    unshifted: list[Any]  # labels != -100 before any shift, per micro-batch, or []
    probe: Any  # the GradProbe's [error, scale] tensor, or None


@dataclass
class _Step:
    """A step whose row is not written yet."""
    step: int
    epoch: int
    seconds: float
    scaler_skipped: bool
    window: _Window


class HeadroomCallback(TrainerCallback):
    """Write a Trainer's run to a Headroom run folder, and take the app's commands. The
    Trainer is handed over with attach(trainer) (see the module doc).

    run_dir: the run folder (new; must not hold a run); None = a new folder under the runs
        root, named like the engine's. One train() call per run_dir given.
    task: the name the app's runs list shows (default "hf-<model class>").
    config: extra settings to keep in the run table (merged over the Trainer's).
    commit_interval: seconds between run.db commits of metrics rows (the engine's 1.0).
    poll_interval: the app's commands are read at most this often (0 = at every step).
    grad_check: which windows' gradients are compared with the exact ones (module doc,
        "Exactness"): "epoch" (the first window of each epoch), "every", "off".
    """

    def __init__(self, run_dir: Optional[str] = None, *, task: Optional[str] = None,
                 config: Optional[Mapping[str, Any]] = None, commit_interval: float = 1.0,
                 poll_interval: float = 0.05, grad_check: str = "epoch") -> None:
        HeadroomRun(run_dir, task=task or "hf", config=config, commit_interval=commit_interval,
                    poll_interval=poll_interval)  # checks the arguments
        if grad_check not in GRAD_CHECKS:
            raise IntegrationError(f"grad_check must be one of {', '.join(GRAD_CHECKS)}, got {grad_check!r}")
        self.grad_check = grad_check
        self._meter = Meter(grad_check)  # exactness: the true loss, the weights, the gradient probe
        self.run_dir_arg = run_dir
        self.task = task
        self.extra_config = dict(config or {})
        self.commit_interval = commit_interval
        self.poll_interval = poll_interval
        self.run: Optional[HeadroomRun] = None
        self.run_dir: Optional[str] = None  # the folder of the current (or last) run
        self._trainer: Optional[Trainer] = None  # handed over by attach()
        self._wrapped = False
        self._scaled = False
        self._cgas = 1
        self._steps: list[_Step] = []  # steps not written yet (written every poll_interval)
        self._reset_window()
        self._epoch_pending: Optional[int] = None
        self._stopping = False

    def attach(self, trainer: Trainer) -> "HeadroomCallback":
        """The Trainer this callback writes the run of: added to its callbacks if it is not
        there yet. Call it once, before train(). Returns the callback."""
        if not isinstance(trainer, Trainer):
            raise IntegrationError(f"HeadroomCallback.attach: expected a transformers.Trainer, got "
                                   f"{type(trainer).__name__}")
        if self._trainer is not None and self._trainer is not trainer:
            raise IntegrationError("HeadroomCallback.attach: this callback already writes another Trainer's runs")
        self._trainer = trainer
        if not any(cb is self for cb in trainer.callback_handler.callbacks):
            trainer.add_callback(self)
        self._take(trainer)
        return self

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Trainer(..., callbacks=[HeadroomCallback()]): its Trainer is found here, at the end of
        its __init__, so that train() itself can be guarded (below) before it is ever called."""
        if self._trainer is None:
            self._trainer = _hf_wrap.training_trainer(state)
        if self._trainer is not None:
            self._take(self._trainer)

    def _take(self, trainer: Trainer) -> None:
        """One HeadroomCallback per Trainer, and its train() guarded: whatever raises in it
        (the collator, an evaluation, compute_metrics, not only training_step) ends the run
        as failed, with every step done written and the run folder's writer lock released, at
        once - not when the process ends (a notebook's kernel lives on)."""
        others = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, HeadroomCallback) and cb is not self]
        if others:
            raise IntegrationError("two HeadroomCallbacks in one Trainer: each would write a run of the same "
                                   "training and neither would be whole; keep one")
        _hf_wrap.guard_train(trainer, self, lambda e: self._failed(e, final=True))

    # -- set-up --------------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.run is not None and not self.run.finished:  # a previous train() that never reached on_train_end
            self.run.fail("train() ended without on_train_end (an exception?)")
            self._unwrap()
        self.run = None
        self._stopping = False
        self._epoch_pending = None
        self._steps = []
        self._reset_window()
        if self._trainer is None:  # Trainer(..., callbacks=[HeadroomCallback()]): the documented one-liner
            self._trainer = _hf_wrap.training_trainer(state)
        trainer = self._trainer
        if trainer is None:
            raise IntegrationError("HeadroomCallback needs the Trainer it reads, which the callback API does not "
                                   "pass: call HeadroomCallback(...).attach(trainer) before trainer.train()")
        if state is not trainer.state:
            raise IntegrationError("HeadroomCallback: called by a Trainer other than the one it was attached to")
        if not state.is_world_process_zero:
            return
        world = int(getattr(args, "world_size", 1) or 1)
        steering = "" if world == 1 else (f"this run trains in {world} processes: a setting applied on process 0 "
                                          "alone would make them diverge")
        task = self.task or f"hf-{type(model if model is not None else trainer.model).__name__}"
        run = HeadroomRun(self.run_dir_arg, task=task, config=_hf_wrap.run_config(args, state, self.extra_config), device=args.device,
                          world_size=world, steering=steering, integration="transformers",
                          commit_interval=self.commit_interval, poll_interval=self.poll_interval,
                          refusal=lambda cmd: self._refusal(cmd, args))
        run.start(step=int(state.global_step), epoch=int(math.floor((state.epoch or 0) + 1e-9)) + 1)
        run.set_info(checkpoint_dir=args.output_dir)
        self.run, self.run_dir = run, run.run_dir
        self._meter.begin(_hf_wrap.unwrapped_model(trainer), args)
        self._wrap(trainer)

    def _wrap(self, trainer: Trainer) -> None:
        _hf_wrap.unwrap(trainer)  # left by a train() that raised
        step_fn = trainer.training_step
        cb = self

        def training_step(model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
            if not cb._mb:
                cb._window_start(a[0] if a else kw.get("num_items_in_batch"), model)
            meter = cb._meter
            meter.in_step, meter.measured = True, None
            try:
                loss = step_fn(model, inputs, *a, **kw)
            except BaseException as e:
                cb._failed(e)
                raise
            finally:
                meter.in_step = False
            m = meter.measured
            cb._mb.append(_Micro(loss, inputs, *(m if m is not None else (None, None, None))))
            return loss

        training_step._headroom = True  # type: ignore[attr-defined]  # a marker on the function object
        trainer.training_step = training_step  # type: ignore[method-assign]  # an instance attribute: the class's method is untouched
        acc = trainer.accelerator
        kind = getattr(acc.distributed_type, "value", acc.distributed_type)
        plain = kind not in ("FSDP", "DEEPSPEED", "XLA") and hasattr(torch.nn.utils, "get_total_norm")
        self._meter.wrap(trainer, plain and acc.num_processes == 1)
        acc.clip_grad_norm_ = _hf_wrap.host_norm_clip(
            acc, plain, before=lambda: cb._meter.finish_probe([m.true_count for m in cb._mb]),
            seen=self._norm_seen)
        setattr(trainer, _hf_wrap.MARK, (trainer, acc))
        self._wrapped = True

    def _norm_seen(self, norm: Any, norm_f: Optional[float]) -> None:
        self._norm, self._norm_f = norm, norm_f  # before clipping; norm_f: already on the host

    def _unwrap(self) -> None:
        if self._trainer is not None and self._wrapped:
            _hf_wrap.unwrap(self._trainer)
        self._wrapped = False

    def _failed(self, e: BaseException, final: bool = False) -> None:
        """final: the exception left train() (no retry of the Trainer's will follow)."""
        run = self.run
        if run is None or run.finished:
            return
        t = self._trainer
        if not final and t is not None and getattr(t.args, "auto_find_batch_size", False) \
                and "out of memory" in str(e).lower():
            return  # the Trainer retries with a smaller batch: a new on_train_begin ends this run
        try:
            self._write_rows()  # the steps done are kept
        except Exception:
            pass
        run.fail("interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}")
        self._unwrap()

    # -- one window ----------------------------------------------------------------------------------
    def _reset_window(self) -> None:
        self._mb: list[_Micro] = []  # the micro-batches of the window
        self._meter.reset()
        self._nib: Any = None
        self._norm = None
        self._norm_f = None  # the norm on the host, when the clip read it
        self._cur: Optional[_Window] = None  # the window's numbers, from on_pre_optimizer_step

    def _window_start(self, nib: Any, model: Any) -> None:
        """At the window's first micro-batch: how the Trainer scales this window's loss, and
        whether its gradients are compared with the exact ones (GradProbe)."""
        t = self._trainer
        self._nib = nib
        if self.run is not None:
            self._meter.window_start(self.run.epoch, model)
        scaled = getattr(t, "loss_is_scaled_for_ga", None)
        if scaled is None:
            scaled = (bool(getattr(t, "model_accepts_loss_kwargs", False)) and nib is not None) or \
                getattr(t, "compute_loss_func", None) is not None
        self._scaled = bool(scaled)
        assert t is not None  # attach() or the training loop's frames gave it
        self._cgas = int(getattr(t, "current_gradient_accumulation_steps", 0) or t.args.gradient_accumulation_steps)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._reset_window()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After backward and clipping, before optimizer.step(): the norm and the lr of the
        step (the step's one read of the host is the norm); losses and counts stay tensors
        until the rows are written."""
        run, t = self.run, self._trainer
        if run is None or t is None or not self._wrapped or not self._mb:
            return
        self._meter.finish_probe([m.true_count for m in self._mb])  # no clip this step: still as accumulated
        norm, norm_f = self._norm, self._norm_f
        if norm is None:  # no clip_grad_norm_ call seen (an older Trainer without clipping): measure it
            assert t.model is not None  # a Trainer that trains has its model
            grads = [p.grad for p in t.model.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads) if grads else None
        count = self._meter.count
        losses, sizes, counts, sums, unshifted = [], [], [], [], []
        measured = all(m.true_sum is not None for m in self._mb if isinstance(m.loss, torch.Tensor))
        for m in self._mb:
            if isinstance(m.loss, torch.Tensor):
                losses.append(m.loss)
                size, c = count(m.inputs)
                sizes.append(size)
                if measured:
                    c = m.true_count
                    sums.append(m.true_sum)
                    unshifted.append(m.unshifted if m.unshifted is not None else m.true_count)
                counts.append(c)
        if norm_f is None:
            norm_f = float(norm) if norm is not None else None
        bad: tuple[str, ...] = ()
        if norm_f is not None and not math.isfinite(norm_f):  # a NaN loss shows here too, through backward
            assert t.model is not None  # a Trainer that trains has its model
            bad = tuple(n for n, p in t.model.named_parameters()
                        if p.grad is not None and not bool(torch.isfinite(p.grad).all()))
        lr = float(t.optimizer.param_groups[0]["lr"]) if t.optimizer is not None else None
        self._cur = _Window(losses=losses, counts=counts, sizes=sizes, num_items=self._nib, norm=norm_f, lr=lr,
                            bad_params=bad, clip=float(args.max_grad_norm or 0.0), scaled=self._scaled,
                            accum=self._cgas, sums=sums if measured else [], unshifted=unshifted if measured else [],
                            probe=self._meter.probed)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run, t = self.run, self._trainer
        if run is None or t is None or run.finished:
            return
        cur = self._cur
        if cur is not None:
            self._cur = None
            skipped = bool(getattr(t.accelerator, "optimizer_step_was_skipped", False))
            self._steps.append(_Step(step=int(state.global_step), epoch=run.epoch, seconds=run.lap(),
                                     scaler_skipped=skipped, window=cur))
        if run.due() or len(self._steps) >= MAX_PENDING:
            self._commands(args, state, control, t)

    def _write_rows(self) -> None:
        """Write the steps kept since the last write: one read of the host for all their
        losses and counts, then one metrics row per step."""
        steps, self._steps = self._steps, []
        run, t = self.run, self._trainer
        if not steps or run is None or run.finished:
            return
        windows = [s.window for s in steps]
        tensors = [x for w in windows for x in w.losses]
        tensors += [c for w in windows for c in w.counts if isinstance(c, torch.Tensor)]
        tensors += [w.num_items.sum() for w in windows if isinstance(w.num_items, torch.Tensor)]
        tensors += [x for w in windows for x in w.sums + w.unshifted]
        tensors += [x.float() for w in windows if w.probe is not None for x in w.probe]
        values = iter(read_to_host(tensors))
        losses_of = [[next(values) for _ in w.losses] for w in windows]
        counts_of = [[next(values) if isinstance(c, torch.Tensor) else float(c) for c in w.counts] for w in windows]
        items_of = [next(values) if isinstance(w.num_items, torch.Tensor) else w.num_items for w in windows]
        sums_of = [([next(values) for _ in w.sums], [next(values) for _ in w.unshifted]) for w in windows]
        probes_of = [(next(values), next(values)) if w.probe is not None else None for w in windows]
        world = run.world_size
        scaler = getattr(t.accelerator, "scaler", None) if t is not None else None
        for s, losses, counts, num_items, (sums, unshifted), probed in zip(steps, losses_of, counts_of, items_of,
                                                                            sums_of, probes_of):
            w = s.window
            framework = sum(losses)
            total = sum(counts)
            check: Optional[WindowCheck] = None
            if sums and total > 0:  # measured: the true loss and the update against the exact one
                # a non-finite loss the Trainer backpropagated makes the window's loss non-finite, whatever
                # the logits say
                weighted = sum(sums) / total if math.isfinite(framework) else framework
                tokens = int(round(total))
                check = self._meter.check(losses, sums, counts, num_items, w.scaled, sum(unshifted), probed)
            elif w.scaled:
                weighted = framework  # each micro-batch backpropagated loss_sum / the window's count
                tokens = int(round(num_items)) if num_items is not None else int(total)
            else:
                weighted = (sum(l * c for l, c in zip(losses, counts)) * w.accum / total) if total else framework
                tokens = int(total)
            if s.scaler_skipped:
                run.record(ScalerSkip(s.step, s.epoch, scale=float(scaler.get_scale()) if scaler is not None
                                      else float("nan")))
            run.record_step(StepRecord(
                step=s.step, epoch=s.epoch, loss=weighted, grad_norm=w.norm, lr=w.lr, accum=len(losses), clip=w.clip,
                micro_batch=max(w.sizes) if w.sizes else None, samples=sum(w.sizes) * world, tokens=tokens * world,
                step_time=s.seconds, scaler_skipped=s.scaler_skipped, framework_loss=framework,
                bad_params=w.bad_params, nonfinite_action="not skipped (the Trainer stepped)"), check)

    # -- commands ------------------------------------------------------------------------------------
    def _commands(self, args: Any, state: Any, control: Any, t: Trainer, step_end: bool = True) -> None:
        run = self.run
        assert run is not None
        self._write_rows()  # the rows before what the commands do
        for cmd in run.poll():
            self._apply(cmd, args, t)
        if step_end and run.stop_requested and not self._stopping:  # the flags hold from a step's end
            self._stopping = True
            control.should_save = True  # the Trainer's own checkpoint, output_dir/checkpoint-<step>
            control.should_training_stop = True

    @staticmethod
    def _refusal(cmd: Command, args: Any) -> str:
        """Why the Trainer can never take `cmd` ('' if it can): refused as it arrives."""
        if isinstance(cmd, SetLr):
            return ""
        if isinstance(cmd, SetClip):
            return "DeepSpeed clips gradients itself (its config's gradient_clipping)" if getattr(
                args, "deepspeed", None) else ""
        return REFUSED.get(cmd.kind, f"{cmd.kind} is not supported with the Hugging Face Trainer")

    def _apply(self, cmd: Command, args: Any, t: Trainer) -> None:
        run = self.run
        assert run is not None
        if isinstance(cmd, SetLr) and t.optimizer is not None:
            run.apply(cmd, lr=set_lr(t.optimizer, cmd.lr, t.lr_scheduler))
        elif isinstance(cmd, SetClip) and not self._refusal(cmd, args):
            old = float(args.max_grad_norm or 0.0)
            args.max_grad_norm = float(cmd.clip)
            run.apply(cmd, clip=(old, float(cmd.clip)))
        else:
            run.refuse(cmd, self._refusal(cmd, args) or "the Trainer has no optimizer yet")

    # -- epochs, saves, the end ----------------------------------------------------------------------
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self.run
        if run is None or run.finished:
            return
        self._flush_epoch(None)
        run.epoch = int(math.floor((state.epoch or 0) + 1e-9)) + 1
        if self._trainer is not None:
            self._commands(args, state, control, self._trainer, step_end=False)  # settings sent for this epoch
        run.reset_timer()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None and not self.run.finished:
            self._epoch_pending = self.run.epoch  # written at the evaluation that follows, or the next epoch

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kwargs: Any) -> None:
        """Everything the Trainer logs (its loss and lr, compute_metrics' results, eval_* at any
        eval_strategy, the run's totals) goes to the `scalars` table at the Trainer's step."""
        run = self.run
        if run is not None and not run.finished and logs:
            run.log_scalars({k: v for k, v in logs.items() if k != "epoch"}, step=int(state.global_step))

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Optional[dict] = None, **kwargs: Any) -> None:
        run = self.run
        if run is None or run.finished:
            return
        if self._epoch_pending is not None:
            val = (metrics or {}).get("eval_loss")
            self._flush_epoch(float(val) if isinstance(val, (int, float)) else None)
        run.reset_timer()

    def _flush_epoch(self, val_loss: Optional[float]) -> None:
        self._write_rows()
        if self._epoch_pending is not None and self.run is not None:
            self.run.log_epoch(val_loss=val_loss, epoch=self._epoch_pending)
            self._epoch_pending = None

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self.run
        if run is None or run.finished:
            return
        import os

        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
        path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        self._write_rows()  # run.db never lags behind a checkpoint
        if os.path.isdir(path):
            run.checkpoint_saved(path)
        run.reset_timer()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        run = self.run
        try:
            if run is None or run.finished:
                return
            self._flush_epoch(None)
            run.finish(end_reason(self._stopping, args.max_steps, state.global_step))
        finally:
            self._unwrap()
