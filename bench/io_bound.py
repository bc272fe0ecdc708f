"""I/O-bound data: the engine against a plain loop with DataLoader, side by side in one process.

The task: the seed's 784-128-10 MLP, micro-batch 16 x accumulation 4, whose samples cost
0.5 ms each to load (a file read plus a decode, simulated by a sleep that releases the
GIL as real I/O does). At W workers (2 and 4) the plain loop is `DataLoader(batch_size=16,
num_workers=W, persistent_workers=True)` over the same epoch order, forward/backward per
micro-batch, clip_grad_norm_, AdamW step; the engine is `Trainer(..., workers=W)`.
Runs alternate (plain, engine, plain, engine ...) so both see the same machine; the figure
is each side's median step time over all runs after dropping the first steps, and the
ratio engine / plain. Target: <= 1.10 at 2 and at 4 workers. On CUDA, --device cuda runs
both with pin_memory.

    PYTHONPATH=. python3 bench/io_bound.py [--workers 2,4] [--repeats 3] [--steps 30]
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402 - after the sys.path set-up above
import torch.nn.functional as F  # noqa: E402 - after the sys.path set-up above

from bench.common import emit_json, median, temp_run_dir  # noqa: E402 - after the sys.path set-up above
from engine.accumulation import sampling  # noqa: E402 - after the sys.path set-up above
from engine.declarations.config import TrainConfig  # noqa: E402 - after the sys.path set-up above
from engine.distributed.devices import to_device  # noqa: E402 - after the sys.path set-up above
from engine.tasks.task import Task  # noqa: E402 - after the sys.path set-up above
from engine.trainer.trainer import Trainer  # noqa: E402 - after the sys.path set-up above

MICRO, ACCUM, LOAD_S, N, SEED, WARM = 16, 4, 0.5e-3, 4096, 0, 3


class SlowDigits(torch.utils.data.Dataset):
    """784 features and a label per sample; each read waits LOAD_S seconds, as a disk would."""

    def __init__(self, n: int = N) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 784, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(LOAD_S)
        return self.x[i].clone(), self.y[i]


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="sum"), len(y)


def make_task() -> Task:
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    return Task(model=model, train_data=SlowDigits(), loss=loss, name="io-bound")


def plain_loop(workers: int, steps: int, device: torch.device) -> list[float]:
    task = make_task()
    model = task.model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    order = sampling.epoch_order(len(task.train_data), SEED, 1)
    loader = torch.utils.data.DataLoader(task.train_data, batch_sampler=[order[i:i + MICRO] for i in
                                                                         range(0, MICRO * ACCUM * (steps + 1), MICRO)],
                                         num_workers=workers, persistent_workers=workers > 0,
                                         pin_memory=device.type == "cuda")
    it = iter(loader)
    marks = [time.perf_counter()]
    for _ in range(steps):
        for _ in range(ACCUM):
            batch = to_device(next(it), device)
            loss_sum, _ = task.loss(model, batch)
            (loss_sum / (MICRO * ACCUM)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        marks.append(time.perf_counter())
    del it, loader
    return [b - a for a, b in zip(marks, marks[1:])][WARM:]


def engine_loop(workers: int, steps: int, device: torch.device) -> list[float]:
    marks: list[float] = []

    def sink(e) -> None:
        if e.kind in ("run_started", "step"):
            marks.append(time.perf_counter())

    with temp_run_dir() as run_dir:
        cfg = TrainConfig(micro_batch=MICRO, accum=ACCUM, epochs=1, max_steps=steps, device=device.type, seed=SEED,
                          workers=workers, run_dir=run_dir, lr=1e-3, clip=1.0)
        Trainer(cfg, task=make_task(), sink=sink).run()
    return [b - a for a, b in zip(marks[1:], marks[2:])][WARM:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    device = torch.device(a.device)
    emit_json(a.json, dict(section="env", torch=torch.__version__, machine=platform.machine(), cpus=os.cpu_count(),
                           device=str(device), date=time.strftime("%Y-%m-%d")))
    rows = []
    for w in (int(x) for x in a.workers.split(",")):
        plain: list[float] = []
        eng: list[float] = []
        for _ in range(a.repeats):
            plain += plain_loop(w, a.steps, device)
            eng += engine_loop(w, a.steps, device)
        row = dict(section="io_bound", workers=w, micro=MICRO, accum=ACCUM, load_ms=LOAD_S * 1e3,
                   plain_ms=round(median(plain) * 1e3, 2), engine_ms=round(median(eng) * 1e3, 2),
                   ratio=round(median(eng) / median(plain), 3), steps_timed=len(eng), target=1.10)
        row["passed"] = row["ratio"] <= 1.10
        emit_json(a.json, row)
        rows.append(row)
    print("\nworkers  plain ms/step  engine ms/step  ratio  target  result")
    for r in rows:
        print(f"{r['workers']:>7}  {r['plain_ms']:>13.2f}  {r['engine_ms']:>14.2f}  {r['ratio']:>5.3f}  "
              f"{r['target']:>6.2f}  {'PASS' if r['passed'] else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
