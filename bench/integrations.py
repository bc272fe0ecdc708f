"""The integrations' cost per optimizer step: each framework with and without HeadroomCallback.

    PYTHONPATH=. python bench/integrations.py [--frameworks hf,lightning] [--repeats N] [--steps S]
                                              [--threads T] [--aa] [--json PATH]

The seed MLP (784-128-10: engine/tasks/builtin/mlp.py's model and data) on CPU, micro-batch 16 x
accumulation 4, clip 1.0, AdamW lr 1e-3, through a real Hugging Face Trainer and a real
Lightning Trainer. Two trainers of the same framework, from the same initial weights on
the same data, one with HeadroomCallback (B) and one without (A), train in this process
in lockstep, one optimizer step each in turn (two threads, only one running at a time):
adjacent steps of A and B see the same machine (load from other processes, caches, clock
speed), which whole runs one after the other do not on a shared machine; the process is
pinned to one CPU (--cpu), so neither trainer's thread gets a quieter core. A step is timed
from the moment its trainer is given the turn to its next on_step_end / stepping
on_train_batch_end (data loading, forward, backward, clipping, the step and every
callback, the callback's run.db writes included; B's run.db flusher thread runs when it
runs). The first WARMUP steps of each run are dropped. Each repeat builds both trainers
anew, and which one steps first alternates. Figures: the median step of each side over
all repeats, B / A, and the median of the per-step ratios B_i / A_i. Target: <= 1.02.
--aa also runs A against A (both without the callback): the method's noise floor here;
--empty an empty callback of the framework against none: what the framework charges for
any callback (its per-hook dispatch), which HeadroomCallback pays too.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402 - after the sys.path set-up above
import torch.nn.functional as F  # noqa: E402 - after the sys.path set-up above

from engine.tasks.builtin.mlp import build_task  # noqa: E402 - after the sys.path set-up above

MICRO, ACCUM, CLIP, LR, SEED, WARMUP = 16, 4, 1.0, 1e-3, 0, 5
TARGET = 1.02


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


class Lockstep:
    """Two trainers, one step each in turn. `side` 0 or 1 calls begin() once it starts
    training, step() at each optimizer step's end, end() when it is done. clock "wall": the
    step as the user waits for it; "cpu": the training thread's CPU time (time spent waiting
    for a core while other programs run is not counted; the store's flusher thread is not
    either: it wakes ten times a second and writes once a second)."""

    def __init__(self, first: int, clock: str = "wall") -> None:
        self.now = CLOCKS[clock]
        self.turn = [threading.Semaphore(0), threading.Semaphore(0)]
        self.first = first
        self.done = [False, False]
        self.resumed = [0.0, 0.0]
        self.steps: list[list[float]] = [[], []]
        self.started = threading.Barrier(2)

    def begin(self, side: int) -> None:
        self.started.wait()  # both built and past their set-up
        if side != self.first:
            self.turn[side].acquire()
        self.resumed[side] = self.now()

    def step(self, side: int) -> None:
        self.steps[side].append(self.now() - self.resumed[side])
        other = 1 - side
        if not self.done[other]:
            self.turn[other].release()
            self.turn[side].acquire()
        self.resumed[side] = self.now()

    def end(self, side: int) -> None:
        self.done[side] = True
        self.turn[1 - side].release()


def race(make: Callable[[Any, "Lockstep", int, int], Callable[[], None]], with_b: Any, steps: int,
         first: int, clock: str = "wall") -> tuple[list[float], list[float]]:
    """Side 0: without the callback; side 1: with it (or without, for A/A)."""
    lock = Lockstep(first, clock)
    runs = [make(False, lock, 0, steps), make(with_b, lock, 1, steps)]
    errors: list[BaseException] = []

    def go(side: int) -> None:
        try:
            runs[side]()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            lock.done[side] = True
            lock.turn[1 - side].release()
            lock.started.abort()

    threads = [threading.Thread(target=go, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return lock.steps[0][WARMUP:], lock.steps[1][WARMUP:]


# -- Hugging Face ------------------------------------------------------------------------------------

def hf_maker(workdir: str) -> Callable[[bool, Lockstep, int, int], Callable[[], None]]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from engine.integrations.transformers import HeadroomCallback
    task = build_task(SEED)
    data = [{"x": x, "labels": torch.as_tensor(y)} for x, y in (task.train_data[i] for i in range(len(task.train_data)))]
    init = copy.deepcopy(task.model.state_dict())

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = copy.deepcopy(task.model)
            self.net.load_state_dict(init)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
            return {"loss": F.cross_entropy(self.net(x), labels)}

    def collate(b: list[dict]) -> dict:
        return {"x": torch.stack([s["x"] for s in b]), "labels": torch.stack([s["labels"] for s in b])}

    class Turns(TrainerCallback):
        def __init__(self, lock: Lockstep, side: int) -> None:
            self.lock, self.side = lock, side

        def on_train_begin(self, *a: Any, **kw: Any) -> None:
            self.lock.begin(self.side)

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            self.lock.step(self.side)

        def on_train_end(self, *a: Any, **kw: Any) -> None:
            self.lock.end(self.side)

    n = [0]

    def make(with_callback: bool, lock: Lockstep, side: int, steps: int) -> Callable[[], None]:
        n[0] += 1
        args = TrainingArguments(output_dir=os.path.join(workdir, f"hf-out-{n[0]}"), per_device_train_batch_size=MICRO,
                                 gradient_accumulation_steps=ACCUM, max_steps=steps, learning_rate=LR,
                                 max_grad_norm=CLIP, lr_scheduler_type="constant", report_to="none", use_cpu=True,
                                 disable_tqdm=True, logging_strategy="no", save_strategy="no", eval_strategy="no",
                                 dataloader_num_workers=0, seed=SEED, optim="adamw_torch")
        cbs: list[Any] = []
        headroom = None
        if with_callback == "empty":
            cbs.append(TrainerCallback())  # the Trainer's own cost of one more callback
        elif with_callback:
            headroom = HeadroomCallback(run_dir=os.path.join(workdir, f"hf-run-{n[0]}"))
            cbs.append(headroom)
        cbs.append(Turns(lock, side))  # last: its on_step_end ends the step, the callback's work included
        trainer = Trainer(model=MLP(), args=args, train_dataset=data, data_collator=collate, callbacks=cbs)
        if headroom is not None:
            headroom.attach(trainer)  # already among the callbacks: the Trainer handed over
        return trainer.train

    return make


# -- Lightning ---------------------------------------------------------------------------------------

def lightning_maker(workdir: str) -> Callable[[bool, Lockstep, int, int], Callable[[], None]]:
    import logging

    import lightning.pytorch as L
    from torch.utils.data import DataLoader

    from engine.integrations.lightning import HeadroomCallback
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    task = build_task(SEED)
    init = copy.deepcopy(task.model.state_dict())

    class MLP(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = copy.deepcopy(task.model)
            self.net.load_state_dict(init)

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=LR)

    class Turns(L.Callback):
        def __init__(self, lock: Lockstep, side: int) -> None:
            self.lock, self.side, self.seen = lock, side, 0

        def on_train_start(self, *a: Any) -> None:
            self.lock.begin(self.side)

        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            if trainer.global_step != self.seen:  # this batch ended an optimizer step
                self.seen = trainer.global_step
                self.lock.step(self.side)

        def on_train_end(self, *a: Any) -> None:
            self.lock.end(self.side)

    n = [0]

    def make(with_callback: bool, lock: Lockstep, side: int, steps: int) -> Callable[[], None]:
        n[0] += 1
        cbs: list[Any] = []
        if with_callback == "empty":
            cbs.append(L.Callback())  # Lightning's own cost of one more callback
        elif with_callback:
            cbs.append(HeadroomCallback(run_dir=os.path.join(workdir, f"pl-run-{n[0]}")))
        cbs.append(Turns(lock, side))
        trainer = L.Trainer(max_steps=steps, accumulate_grad_batches=ACCUM, gradient_clip_val=CLIP, accelerator="cpu",
                            devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0,
                            default_root_dir=os.path.join(workdir, f"pl-root-{n[0]}"), callbacks=cbs)
        loader = DataLoader(task.train_data, batch_size=MICRO, shuffle=False)
        return lambda: trainer.fit(MLP(), loader)

    return make


# -- the comparison ----------------------------------------------------------------------------------

def compare(make: Callable[..., Callable[[], None]], repeats: int, steps: int, with_b: Any = True,
            clock: str = "wall") -> dict:
    a_all: list[float] = []
    b_all: list[float] = []
    ratios: list[float] = []
    race(make, with_b, WARMUP + 3, 0)  # imports, first calls
    for r in range(repeats):
        a, b = race(make, with_b, steps, first=r % 2, clock=clock)
        a_all += a
        b_all += b
        ratios += [y / x for x, y in zip(a, b)]
    ma, mb = median(a_all), median(b_all)
    return {"a_ms": ma * 1e3, "b_ms": mb * 1e3, "ratio": mb / ma, "step_ratio": median(ratios),
            "steps_timed": len(ratios)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frameworks", default="hf,lightning")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--steps", type=int, default=64, help="optimizer steps per run (64 = one epoch)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="see Lockstep")
    ap.add_argument("--cpu", type=int, default=None,
                    help="pin the process to this CPU (default: the last one), so both trainers share a core "
                         "and its caches; -1: no pinning")
    ap.add_argument("--aa", action="store_true", help="also time the framework against itself (noise floor)")
    ap.add_argument("--empty", action="store_true",
                    help="also time an empty callback of the framework against none: what any callback costs")
    ap.add_argument("--json", default=None, help="append the result rows to this file")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    pinned = "no"
    if a.cpu != -1 and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        cpu = cpus[-1] if a.cpu is None else a.cpu
        os.sched_setaffinity(0, {cpu})  # A and B (and B's flusher) on one core: neither gets a quieter one
        pinned = str(cpu)
    makers = {"hf": hf_maker, "lightning": lightning_maker}
    names = [f for f in a.frameworks.split(",") if f]
    bad = [f for f in names if f not in makers]
    if bad:
        print(f"error: unknown framework {bad[0]!r} (hf, lightning)", file=sys.stderr)
        return 2
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  {platform.processor() or platform.machine()}  "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}  torch {torch.__version__}  threads {a.threads}  "
          f"pinned to CPU {pinned}")
    print(f"# seed MLP 784-128-10, micro {MICRO} x accum {ACCUM}, {a.steps} steps a run, {a.repeats} repeats, lockstep, {a.clock} clock")
    workdir = tempfile.mkdtemp(prefix="headroom-bench-integ-")
    ok = True
    try:
        for name in names:
            make = makers[name](workdir)
            r = compare(make, a.repeats, a.steps, clock=a.clock)
            row = {"framework": name, "clock": a.clock, **r, "target": TARGET}
            line = (f"{name:10s} without {r['a_ms']:.3f} ms/step  with {r['b_ms']:.3f} ms/step  "
                    f"(+{(r['b_ms'] - r['a_ms']) * 1e3:.0f} us)  ratio {r['ratio']:.4f} "
                    f"(per step {r['step_ratio']:.4f}, {r['steps_timed']} steps)  target <= {TARGET}")
            if a.aa:
                aa = compare(make, a.repeats, a.steps, with_b=False, clock=a.clock)
                row["aa_ratio"], row["aa_step_ratio"] = aa["ratio"], aa["step_ratio"]
                line += f"  A/A {aa['ratio']:.4f} (per step {aa['step_ratio']:.4f})"
            if a.empty:
                em = compare(make, a.repeats, a.steps, with_b="empty", clock=a.clock)
                row["empty_ratio"], row["empty_step_ratio"] = em["ratio"], em["step_ratio"]
                line += f"  empty callback {em['ratio']:.4f} (per step {em['step_ratio']:.4f})"
            print(line, flush=True)
            ok = ok and r["ratio"] <= TARGET
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
