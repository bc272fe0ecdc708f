"""Section h of bench/gpu_check.py (issue 20): both torchrun strategies in a 1-process torchrun.

  h  `torchrun --nproc-per-node 1 -m engine --task charlm` with --strategy ddp and --strategy
     fsdp (fp32), each against the same run without torchrun: every step's loss within 1e-5
     relative (on CUDA: NCCL, DDP's comm hook, FSDP2's DTensor grads, the global norm, the
     deferred step with fused AdamW on sharded parameters); then fsdp with --precision bf16
     (MixedPrecisionPolicy) and fsdp --cpu-offload (CPUOffloadPolicy) train with finite losses;
     the rows of the torchrun runs carry the (tightest) rank's GPU memory (mem_used, mem_total)
     and each strategy's run records world size and strategy. A sharded checkpoint exports to
     one file (headroom-export) that loads with weights_only=True.
"""
from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _engine(ctx: Any, run_dir: str, extra: list[str], torchrun: bool) -> tuple[int, str, list[dict], dict]:
    dev = "cuda" if ctx.gpu else "cpu"
    micro = "4" if ctx.small else "16"
    cmd = [sys.executable] + (["-m", "torch.distributed.run", "--nproc-per-node", "1"] if torchrun else []) + [
        "-m", "engine", "--task", "charlm", "--device", dev, "--epochs", "1", "--max-steps", "5",
        "--micro-batch", micro, "--accum", "4", "--run-dir", run_dir] + extra
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    rows, info = [], {}
    db = os.path.join(run_dir, "run.db")
    if os.path.exists(db):
        con = sqlite3.connect(db)
        con.row_factory = sqlite3.Row
        try:
            rows = [dict(r) for r in con.execute("SELECT * FROM metrics ORDER BY step")]
            info = {r[0]: r[1] for r in con.execute("SELECT key, value FROM run")}
        finally:
            con.close()
    return p.returncode, (p.stdout[-400:] + p.stderr[-1200:]).replace("\n", " | "), rows, info


def section_h(ctx: Any) -> None:
    from bench.common import temp_run_dir
    c = ctx.check
    with temp_run_dir() as base:
        rc, tail, plain, _ = _engine(ctx, os.path.join(base, "plain"), [], torchrun=False)
        if rc != 0 or not plain:
            c.fail("h", "plain_run", f"rc {rc}: {tail}")
            return
        for strategy in ("ddp", "fsdp"):
            rd = os.path.join(base, strategy)
            rc, tail, rows, info = _engine(ctx, rd, ["--strategy", strategy], torchrun=True)
            if rc != 0 or len(rows) != len(plain):
                c.fail("h", f"{strategy}_1proc", f"rc {rc}, {len(rows)} rows: {tail}")
                continue
            worst = max(abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-12) for a, b in zip(rows, plain))
            recorded = f"world_size {info.get('world_size')}, strategy {info.get('strategy')}"
            c.figure("h", f"{strategy}_1proc_equals_plain", worst, "every step's loss within 1e-5 relative",
                     worst <= 1e-5 and '"' + strategy + '"' in str(info.get("strategy")),
                     f"{len(rows)} steps; {recorded}; backend {info.get('backend')}")
            mem = [(r["mem_used"], r["mem_total"], r["mem_params"]) for r in rows]
            if ctx.gpu:
                c.figure("h", f"{strategy}_rows_have_gpu_memory", mem[-1], "mem_used, mem_total, mem_params set",
                         all(v is not None for m in mem for v in m))
            if strategy == "fsdp":
                out = os.path.join(base, "exported.pt")
                env = dict(os.environ, PYTHONPATH=REPO)
                p = subprocess.run([sys.executable, "-m", "engine.export", rd, out], cwd=REPO, env=env,
                                   capture_output=True, text=True, timeout=120)
                ok = p.returncode == 0
                if ok:
                    import torch
                    state = torch.load(out, weights_only=True)
                    ok = state["step"] == len(rows) and bool(state["model"])
                c.figure("h", "fsdp_export_loads_weights_only", p.returncode, "rc 0, step and model", ok,
                         p.stderr[-300:])
        for name, extra in (("fsdp_bf16", ["--precision", "bf16"]), ("fsdp_cpu_offload", ["--cpu-offload", "on"])):
            if name == "fsdp_cpu_offload" and not ctx.gpu:
                c.skip("h", name, "CPUOffloadPolicy needs a CUDA device")
                continue
            rc, tail, rows, _ = _engine(ctx, os.path.join(base, name), ["--strategy", "fsdp"] + extra, torchrun=True)
            ok = rc == 0 and len(rows) == 5 and all(math.isfinite(r["loss"]) for r in rows)
            c.figure("h", f"{name}_trains", [round(r["loss"], 4) for r in rows], "5 finite steps", ok,
                     "" if ok else tail)
