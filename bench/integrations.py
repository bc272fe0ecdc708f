"""The integrations' cost per optimizer step: each framework with and without HeadroomCallback.

    PYTHONPATH=. python bench/integrations.py [--frameworks hf,lightning] [--pairs N] [--steps S]
                                              [--threads T] [--aa] [--json PATH]

The seed MLP (784-128-10, engine/tasks/mlp.py's model and data) on CPU, micro-batch 16 x
accumulation 4, clip 1.0, lr 1e-3, through a real Hugging Face Trainer and a real
Lightning Trainer, in this process. For each framework, runs with the callback (B) and
without it (A) alternate, ABBA by pair, each run one epoch of the same data from the same
initial weights. A step = the interval between two consecutive optimizer steps, seen by a
tiny timing callback present in both runs (everything the framework does per step, every
callback included). Per run: the median step after the first WARMUP steps; per side: the
median of its runs; the figure is B / A (and the median of the per-pair ratios). Target:
<= 1.02 for both. --aa also runs A against A: the method's noise floor on this machine.
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
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from engine.tasks.mlp import build_task  # noqa: E402

MICRO, ACCUM, CLIP, LR, SEED, WARMUP = 16, 4, 1.0, 1e-3, 0, 5
TARGET = 1.02


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


class Clock:
    """Interval between consecutive optimizer steps."""

    def __init__(self) -> None:
        self.t: list[float] = []

    def mark(self) -> None:
        self.t.append(time.perf_counter())

    def steps(self) -> list[float]:
        return [b - a for a, b in zip(self.t, self.t[1:])][WARMUP:]


# -- Hugging Face ------------------------------------------------------------------------------------

def hf_runner(workdir: str) -> Callable[[bool, int], list[float]]:
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

    class Timer(TrainerCallback):
        def __init__(self, clock: Clock) -> None:
            self.clock = clock

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.clock.mark()

    n = [0]

    def run(with_callback: bool, steps: int) -> list[float]:
        n[0] += 1
        clock = Clock()
        args = TrainingArguments(output_dir=os.path.join(workdir, f"hf-out-{n[0]}"), per_device_train_batch_size=MICRO,
                                 gradient_accumulation_steps=ACCUM, max_steps=steps, learning_rate=LR,
                                 max_grad_norm=CLIP, lr_scheduler_type="constant", report_to="none", use_cpu=True,
                                 disable_tqdm=True, logging_strategy="no", save_strategy="no", eval_strategy="no",
                                 dataloader_num_workers=0, seed=SEED, optim="adamw_torch")
        cbs: list[Any] = [Timer(clock)]
        if with_callback:
            cbs.insert(0, HeadroomCallback(run_dir=os.path.join(workdir, f"hf-run-{n[0]}")))
        trainer = Trainer(model=MLP(), args=args, train_dataset=data, data_collator=collate, callbacks=cbs)
        trainer.train()
        return clock.steps()

    return run


# -- Lightning ---------------------------------------------------------------------------------------

def lightning_runner(workdir: str) -> Callable[[bool, int], list[float]]:
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

    class Timer(L.Callback):
        def __init__(self, clock: Clock) -> None:
            self.clock, self.seen = clock, -1

        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            if trainer.global_step != self.seen:
                self.seen = trainer.global_step
                self.clock.mark()

    n = [0]

    def run(with_callback: bool, steps: int) -> list[float]:
        n[0] += 1
        clock = Clock()
        cbs: list[Any] = [Timer(clock)]
        if with_callback:
            cbs.insert(0, HeadroomCallback(run_dir=os.path.join(workdir, f"pl-run-{n[0]}")))
        trainer = L.Trainer(max_steps=steps, accumulate_grad_batches=ACCUM, gradient_clip_val=CLIP, accelerator="cpu",
                            devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, num_sanity_val_steps=0,
                            default_root_dir=os.path.join(workdir, f"pl-root-{n[0]}"), callbacks=cbs)
        trainer.fit(MLP(), DataLoader(task.train_data, batch_size=MICRO, shuffle=False))
        return clock.steps()

    return run


# -- the comparison ----------------------------------------------------------------------------------

def compare(run: Callable[[bool, int], list[float]], pairs: int, steps: int, b_on: bool = True) -> dict:
    """ABBA pairs; returns medians per side (ms) and the ratios."""
    a_runs: list[float] = []
    b_runs: list[float] = []
    run(False, WARMUP + 3)  # imports, first-call costs
    for p in range(pairs):
        order = (False, True) if p % 2 == 0 else (True, False)
        got = {}
        for side in order:
            got[side] = median(run(b_on and side, steps))
        a_runs.append(got[False])
        b_runs.append(got[True])
    a, b = median(a_runs), median(b_runs)
    return {"a_ms": a * 1e3, "b_ms": b * 1e3, "ratio": b / a,
            "pair_ratio": median([y / x for x, y in zip(a_runs, b_runs)]),
            "a_runs_ms": [round(x * 1e3, 4) for x in a_runs], "b_runs_ms": [round(x * 1e3, 4) for x in b_runs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frameworks", default="hf,lightning")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64, help="optimizer steps per run (64 = one epoch)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--aa", action="store_true", help="also time the framework against itself (noise floor)")
    ap.add_argument("--json", default=None, help="append the result rows to this file")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    runners = {"hf": hf_runner, "lightning": lightning_runner}
    names = [f for f in a.frameworks.split(",") if f]
    bad = [f for f in names if f not in runners]
    if bad:
        print(f"error: unknown framework {bad[0]!r} (hf, lightning)", file=sys.stderr)
        return 2
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}  {platform.processor() or platform.machine()}  "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}  torch {torch.__version__}  threads {a.threads}")
    print(f"# seed MLP 784-128-10, micro {MICRO} x accum {ACCUM}, {a.steps} steps a run, {a.pairs} ABBA pairs")
    workdir = tempfile.mkdtemp(prefix="headroom-bench-integ-")
    ok = True
    try:
        for name in names:
            run = runners[name](workdir)
            r = compare(run, a.pairs, a.steps)
            row = {"framework": name, **r, "target": TARGET}
            line = (f"{name:10s} without {r['a_ms']:.3f} ms/step  with {r['b_ms']:.3f} ms/step  "
                    f"ratio {r['ratio']:.4f} (pairs {r['pair_ratio']:.4f})  target <= {TARGET}")
            if a.aa:
                aa = compare(run, a.pairs, a.steps, b_on=False)
                row["aa_ratio"], row["aa_pair_ratio"] = aa["ratio"], aa["pair_ratio"]
                line += f"  A/A {aa['ratio']:.4f} (pairs {aa['pair_ratio']:.4f})"
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
