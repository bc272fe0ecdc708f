"""The engine's own cost per optimizer step, against the bare seed loop, on CPU.

    PYTHONPATH=. python bench/overhead.py [--tasks mlp,charlm] [--repeats N] [--threads T]

Both loops run in this process, interleaved (bare, engine, engine, bare, ...), on
the same model init, the same windows (engine.windows.plan_epoch), the same collate,
micro-batch x accumulation (16 x 4), clip (clip_grad_norm_, 1.0) and optimizer
(the engine's default AdamW, lr 1e-3). The step time is the wall-clock interval
between consecutive optimizer steps, taken where the engine emits its StepMetrics
event (the engine's sink also feeds an EventBuffer, as the app does, and the
engine writes run.db as it always does). The first steps of every run are dropped;
the figure is the median step over all runs of a side, and the ratio is
engine / bare. Targets: mlp <= 1.10, charlm <= 1.05.

--profile TASK runs cProfile over the engine alone and prints where its time goes.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.common import BareLoop, engine_default_optimizer, median, temp_run_dir  # noqa: E402
from engine.config import TrainConfig  # noqa: E402
from engine.events import EventBuffer, StepMetrics  # noqa: E402
from engine.task import load_task  # noqa: E402
from engine.trainer import Trainer  # noqa: E402

TARGETS = {"mlp": 1.10, "charlm": 1.05}
MICRO, ACCUM, CLIP, LR, SEED = 16, 4, 1.0, 1e-3, 0
DEV = torch.device("cpu")


class Lockstep:
    """The engine's sink: at every StepMetrics, one bare step runs, timed on its own.

    Engine step = from leaving the sink to entering it again (everything the engine
    does per step, the sink's EventBuffer.put included); bare step = one BareLoop.step().
    The two alternate step by step, so both see the same machine (load, caches, clock).
    """

    def __init__(self, bare: BareLoop) -> None:
        self.bare = bare
        self.buf = EventBuffer()  # what the app's sink does with every event
        self.engine_s: list[float] = []
        self.bare_s: list[float] = []
        self._t_out: float | None = None

    def __call__(self, event) -> None:
        self.buf.put(event)
        if not isinstance(event, StepMetrics):
            return
        t_in = time.perf_counter()
        if self._t_out is not None:
            self.engine_s.append(t_in - self._t_out)
        t0 = time.perf_counter()
        self.bare.step()
        self.bare_s.append(time.perf_counter() - t0)
        self._t_out = time.perf_counter()


def run_pair(task_name: str, steps: int) -> Lockstep:
    engine_task = load_task(task_name, SEED)
    bare_task = load_task(task_name, SEED)  # same seed: the same initial weights
    opt = engine_default_optimizer([p for p in bare_task.model.parameters() if p.requires_grad], DEV, LR)
    lock = Lockstep(BareLoop(bare_task, DEV, MICRO, ACCUM, CLIP, opt, seed=SEED))
    with temp_run_dir() as run_dir:
        cfg = TrainConfig(task=task_name, micro_batch=MICRO, accum=ACCUM, clip=CLIP, lr=LR, epochs=1,
                          max_steps=steps, device="cpu", seed=SEED, run_dir=run_dir)
        result = Trainer(cfg, task=engine_task, sink=lock).run()
    assert result.steps == steps, result
    # Same init, same windows, same optimizer: with equal counts per sample the two models
    # must still agree (charlm weights tokens in the engine, samples in the bare loop).
    for a, b in (zip(engine_task.model.parameters(), bare_task.model.parameters()) if task_name == "mlp" else ()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    return lock


def measure(task_name: str, repeats: int, steps: int, warm: int) -> dict:
    eng: list[float] = []
    bare: list[float] = []
    for _ in range(repeats):
        lock = run_pair(task_name, steps)
        eng += lock.engine_s[warm:]
        bare += lock.bare_s[warm:]
    e, b = median(eng), median(bare)
    step_ratios = sorted(x / y for x, y in zip(eng, bare))
    ratio = e / b
    target = TARGETS.get(task_name, float("inf"))
    return dict(task=task_name, micro=MICRO, accum=ACCUM, clip=CLIP, threads=torch.get_num_threads(),
                repeats=repeats, steps_per_run=steps, warm_steps_dropped=warm, steps_timed=len(eng),
                bare_step_ms=round(b * 1e3, 4), engine_step_ms=round(e * 1e3, 4),
                engine_overhead_us=round((e - b) * 1e6, 1), ratio=round(ratio, 4),
                median_step_ratio=round(median(step_ratios), 4),
                step_ratio_p25_p75=[round(step_ratios[len(step_ratios) // 4], 4),
                                    round(step_ratios[3 * len(step_ratios) // 4], 4)],
                target=target, passed=ratio <= target)


def run_engine_alone(task_name: str, steps: int) -> None:
    with temp_run_dir() as run_dir:
        cfg = TrainConfig(task=task_name, micro_batch=MICRO, accum=ACCUM, clip=CLIP, lr=LR, epochs=1,
                          max_steps=steps, device="cpu", seed=SEED, run_dir=run_dir)
        Trainer(cfg, task=load_task(task_name, SEED), sink=EventBuffer()).run()


def profile(task_name: str, steps: int, top: int) -> None:
    run_engine_alone(task_name, 8)  # warm
    prof = cProfile.Profile()
    prof.enable()
    run_engine_alone(task_name, steps)
    prof.disable()
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    print(s.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="mlp,charlm")
    ap.add_argument("--repeats", type=int, default=0, help="engine runs, each with its bare loop in lockstep (default: 10 mlp, 4 charlm)")
    ap.add_argument("--steps", type=int, default=0, help="optimizer steps per run (default: 60 mlp, 40 charlm)")
    ap.add_argument("--warm", type=int, default=5, help="steps dropped at the start of each run")
    ap.add_argument("--threads", type=int, default=0, help="torch threads for both loops (default: all cores)")
    ap.add_argument("--json", default="", help="also append the result rows to this JSONL file")
    ap.add_argument("--profile", default="", help="cProfile the engine on this task instead")
    ns = ap.parse_args()
    torch.set_num_threads(ns.threads or os.cpu_count() or 1)
    if ns.profile:
        profile(ns.profile, ns.steps or 50, 40)
        return 0
    env = dict(section="env", torch=torch.__version__, python=platform.python_version(),
               machine=platform.machine(), cpus=os.cpu_count(), threads=torch.get_num_threads(),
               date=time.strftime("%Y-%m-%d"))
    print(json.dumps(env), flush=True)
    rows = []
    ok = True
    for name in [t for t in ns.tasks.split(",") if t]:
        repeats = ns.repeats or (10 if name == "mlp" else 4)
        steps = ns.steps or (60 if name == "mlp" else 40)
        row = dict(section="overhead", **measure(name, repeats, steps, ns.warm))
        rows.append(row)
        ok &= row["passed"]
        print(json.dumps(row), flush=True)
        if ns.json:
            with open(ns.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    print()
    print(f"{'task':8} {'bare ms/step':>13} {'engine ms/step':>15} {'ratio':>7} {'target':>7}  result")
    for r in rows:
        print(f"{r['task']:8} {r['bare_step_ms']:13.3f} {r['engine_step_ms']:15.3f} {r['ratio']:7.3f} "
              f"{r['target'] or float('nan'):7.2f}  {'PASS' if r['passed'] else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
