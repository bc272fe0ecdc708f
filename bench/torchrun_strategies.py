"""The torchrun strategies side by side, through the engine (`python -m engine`), on charlm:

1. step time: --strategy ddp and the engine's former gradient sum after the window (issue 12,
   bench/grad_sum.py) on 2 processes against one process doing the same global window
   (micro-batch 16, accumulation 2 x k), for 16 x 4 and 16 x 1 per rank;
2. memory per rank: mem_params + mem_grads + mem_optimizer of a --strategy fsdp row (rank 0's
   own shards) against one process's, at 2 and 4 ranks (goal <= 0.55 and <= 0.30).

    PYTHONPATH=. python bench/torchrun_strategies.py [--repeats 3] [--device cpu|cuda] [--skip-time]

Every configuration runs in turns (one of each, then again), each a fresh process group;
a configuration's figure is the median over its runs of the median step time of steps 3 on
(the first two pay for warm-up). OMP_NUM_THREADS=1 per process. Prints the ratios.
"""
from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args: list[str], nproc: int, run_dir: str, device: str, grad_sum: bool = False) -> list[dict]:
    base = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
                               if nproc else [])
    base += [os.path.join(ROOT, "bench", "grad_sum.py")] if grad_sum else ["-m", "engine"]
    cmd = base + ["--task", "charlm", "--epochs", "1", "--device", device, "--run-dir", run_dir,
                  "--clip", "1.0"] + args
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    db = sqlite3.connect(os.path.join(run_dir, "run.db"))
    db.row_factory = sqlite3.Row
    rows = [dict(r) for r in db.execute("SELECT * FROM metrics ORDER BY step")]
    db.close()
    return rows


def step_times(repeats: int, device: str, tmp: str) -> None:
    print("step time, charlm, 2 processes vs one process on the same global window")
    print("| per rank | one process ms | ddp ms | sum ms | ddp / one | sum / one | ddp / sum |")
    print("|---|---|---|---|---|---|---|")
    for accum, steps in ((4, 7), (1, 14)):
        configs = {"one": (0, ["--micro-batch", "16", "--accum", str(2 * accum)]),
                   "ddp": (2, ["--micro-batch", "16", "--accum", str(accum), "--strategy", "ddp"]),
                   "sum": (2, ["--micro-batch", "16", "--accum", str(accum)])}
        got: dict[str, list[float]] = {k: [] for k in configs}
        for r in range(repeats):
            for name, (nproc, args) in configs.items():
                rows = run(args + ["--max-steps", str(steps)], nproc, os.path.join(tmp, f"t-{accum}-{name}-{r}"),
                           device, grad_sum=name == "sum")
                got[name].append(statistics.median(x["step_time"] for x in rows[2:]) * 1000)
        one, ddp, gsum = (statistics.median(got[k]) for k in ("one", "ddp", "sum"))
        print(f"| 16 x {accum} | {one:.0f} | {ddp:.0f} | {gsum:.0f} | {ddp / one:.3f} | {gsum / one:.3f} | "
              f"{ddp / gsum:.3f} |", flush=True)
        print(f"<!-- runs ms: one {[round(x) for x in got['one']]} ddp {[round(x) for x in got['ddp']]} "
              f"sum {[round(x) for x in got['sum']]} -->", flush=True)


def memory(device: str, tmp: str) -> None:
    print("\nbytes per rank (mem_params + mem_grads + mem_optimizer), charlm AdamW, --strategy fsdp vs one process")
    print("| ranks | one process bytes | fsdp rank 0 bytes | ratio | goal |")
    print("|---|---|---|---|---|")
    one = run(["--micro-batch", "16", "--accum", "1", "--max-steps", "2"], 0, os.path.join(tmp, "m-one"), device)[-1]
    total_one = one["mem_params"] + one["mem_grads"] + one["mem_optimizer"]
    for nproc, goal in ((2, 0.55), (4, 0.30)):
        row = run(["--micro-batch", "4", "--accum", "1", "--max-steps", "2", "--strategy", "fsdp"], nproc,
                  os.path.join(tmp, f"m-fsdp-{nproc}"), device)[-1]
        total = row["mem_params"] + row["mem_grads"] + row["mem_optimizer"]
        ratio = total / total_one
        print(f"| {nproc} | {total_one} | {total} (params {row['mem_params']}, grads {row['mem_grads']}, "
              f"optimizer {row['mem_optimizer']}) | {ratio:.3f} | <= {goal} {'PASS' if ratio <= goal else 'FAIL'} |",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--skip-time", action="store_true")
    args = ap.parse_args()
    import torch
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="headroom-bench-") as tmp:
        if not args.skip_time:
            step_times(args.repeats, args.device, tmp)
        memory(args.device, tmp)


if __name__ == "__main__":
    main()
