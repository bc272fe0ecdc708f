"""Every GPU check of the project, in one call of a few minutes (about 3 on an H200).

    PYTHONPATH=. python3 bench/gpu_check.py            # on the GPU machine, from the repo root
    PYTHONPATH=. python3 bench/gpu_check.py --small    # the same logic on a tiny GPT, CPU is fine

Needs torch (+ numpy, nvidia-ml-py); no PySide6, no install (the engine imports no Qt).
Writes $OUT/gpu_check.jsonl (one JSON object per figure) and $OUT/summary.txt
($OUT defaults to /tmp/gpu_check_out). Sections are independent: one failing does
not stop the others. Each figure prints PASS / FAIL against its target, or INFO /
SKIP where the target does not apply (CPU, --small).

  a  step time and peak memory: the 135M GPT of ../shared/ANCHORS.md (vocab 32000,
     d 768, 12 layers, 12 heads, context 1024, bf16 autocast, fused AdamW) as an
     engine Task, engine vs the bare loop (same clip, same windows), 16 x 4,
     interleaved runs: time <= 1.01, peak <= 1.02 x bare 16 x 4, <= 0.30 x bare 64 x 1
  b  telemetry: NVML used >= torch reserved (engine.memory.telemetry.MemoryProbe), every step of a
  c  finder under a 24 GiB cap (TrainConfig(vram_limit=24 GiB, find_micro_batch=True,
     effective_batch=64)): MicroBatchFound within 10% of the true largest micro-batch in
     <= 8 probes. The true largest is measured here with the bare loop (16 x 4 data path,
     accumulation 2, clip, fused AdamW step) by bisection; ANCHORS.md's 24 only says 24
     fits and 32 does not, so both are printed
  d  OOM recovery under the cap: micro-batch 48 x 2 -> OomRecovered, then training goes on
  e  bf16 and fp16 (GradScaler) both train a few steps with finite losses
  f  `torchrun --nproc-per-node 1 -m engine --task mlp --device cuda --epochs 1`: finishes,
     run.db has run_finished
  g  where the memory goes (bench/gpu_memory_check.py)
  h  --strategy ddp and fsdp in a 1-process torchrun against a plain run; fsdp bf16 and
     --cpu-offload train; export of a sharded checkpoint (bench/gpu_strategies_check.py)
With --small (or without CUDA) the GPT is tiny, the cap is simulated by an injected
out-of-memory error above micro-batch 24, and figures without meaning there are SKIP/INFO.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import sqlite3
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402 - after the sys.path set-up above

from bench.common import (  # noqa: E402 - after the sys.path set-up above
    GPT_CFG,
    GPT_SMALL_CFG,
    BareLoop,
    RandomTokens,
    engine_default_optimizer,
    gpt_loss,
    make_gpt,
    median,
    temp_run_dir,
)
from engine.accumulation.oom import free_memory, is_oom  # noqa: E402 - after the sys.path set-up above
from engine.declarations.config import TrainConfig  # noqa: E402 - after the sys.path set-up above
from engine.declarations.events import MicroBatchFound, NonFinite, OomRecovered, StepMetrics  # noqa: E402 - after the sys.path set-up above
from engine.tasks.task import Task  # noqa: E402 - after the sys.path set-up above
from engine.trainer.trainer import Trainer  # noqa: E402 - after the sys.path set-up above

GiB = 2**30
CAP = 24 * GiB
ANCHOR_MAX_MICRO = 24  # ../shared/ANCHORS.md: 24 trains under the cap, 32 does not
SMALL_OOM_ABOVE = 24   # --small: the simulated cap


class Check:
    """Collects figures; prints each at once, writes JSON lines and the summary."""

    def __init__(self, out_dir: str, small: bool, device: torch.device) -> None:
        self.out_dir = out_dir
        os.makedirs(out_dir, exist_ok=True)
        self.jsonl = os.path.join(out_dir, "gpu_check.jsonl")
        open(self.jsonl, "w").close()
        self.small = small
        self.device = device
        self.rows: list[dict[str, Any]] = []
        self.t0 = time.time()

    def write(self, row: dict[str, Any]) -> None:
        line = json.dumps(row, default=repr)
        with open(self.jsonl, "a") as f:
            f.write(line + "\n")
        print(line, flush=True)

    def figure(self, section: str, name: str, value: Any, target: str, passed: Optional[bool],
               note: str = "", **extra: Any) -> None:
        """passed: True/False against the target; None = INFO (no target here)."""
        result = "INFO" if passed is None else ("PASS" if passed else "FAIL")
        row = dict(section=section, check=name, value=value, target=target, result=result, note=note, **extra)
        self.rows.append(row)
        self.write(row)

    def skip(self, section: str, name: str, why: str) -> None:
        row = dict(section=section, check=name, value=None, target="", result="SKIP", note=why)
        self.rows.append(row)
        self.write(row)

    def fail(self, section: str, name: str, error: str) -> None:
        row = dict(section=section, check=name, value=None, target="", result="FAIL", note=error)
        self.rows.append(row)
        self.write(row)

    def summary(self) -> str:
        lines = [f"Headroom GPU check, {time.strftime('%Y-%m-%d %H:%M:%S')}, "
                 f"{round(time.time() - self.t0)} s, device {device_label(self.device)}"
                 + (" (--small)" if self.small else ""), ""]
        w = max([len(f"{r['section']} {r['check']}") for r in self.rows] + [10])
        for r in self.rows:
            v = r["value"]
            v = f"{v:.4g}" if isinstance(v, float) else str(v)
            lines.append(f"{r['result']:4}  {r['section'] + ' ' + r['check']:{w}}  {v:>12}  {r['target']:18}  "
                         f"{r['note']}")
        counts = {k: sum(r["result"] == k for r in self.rows) for k in ("PASS", "FAIL", "INFO", "SKIP")}
        lines += ["", " ".join(f"{k} {v}" for k, v in counts.items())]
        text = "\n".join(lines) + "\n"
        with open(os.path.join(self.out_dir, "summary.txt"), "w") as f:
            f.write(text)
        return text


def device_label(dev: torch.device) -> str:
    if dev.type == "cuda":
        return f"{torch.cuda.get_device_name(dev)} (cuda)"
    return f"{platform.machine()} CPU"


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def clean(dev: torch.device) -> int:
    """Free everything unreferenced; return what is still allocated (should be ~0 between runs)."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        return torch.cuda.memory_allocated(dev)
    return 0


def peak(dev: torch.device) -> Optional[int]:
    return torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None


def reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def set_cap(dev: torch.device, limit: Optional[int]) -> None:
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(1.0 if limit is None else min(1.0, limit / total), dev)


class Ctx:
    def __init__(self, small: bool, device: torch.device, check: Check) -> None:
        self.small = small
        self.device = device
        self.check = check
        self.cfg = GPT_SMALL_CFG if small else GPT_CFG
        self.gpu = device.type == "cuda"
        self.step_mem: list[tuple[int, int, int]] = []  # (step, NVML used, torch reserved) from a
        # Only the simulated cap (--small / CPU) injects OOM; on a GPU the real cap does it.
        self.oom_above = None if self.gpu else SMALL_OOM_ABOVE

    def loss(self) -> Callable:
        if self.oom_above is None:
            return gpt_loss
        limit = self.oom_above

        def capped_loss(model, batch):
            if batch.shape[0] > limit:
                raise torch.OutOfMemoryError(f"CUDA out of memory (simulated: micro-batch {batch.shape[0]} > {limit})")
            return gpt_loss(model, batch)
        return capped_loss

    def task(self, data: RandomTokens, loss: Optional[Callable] = None) -> Task:
        return Task(model=make_gpt(self.cfg, self.device), train_data=data, loss=loss or gpt_loss,
                    name="gpt135m" if not self.small else "gpt-small")

    def config(self, run_dir: str, **kw: Any) -> TrainConfig:
        base = dict(task="gpt135m", micro_batch=16, accum=4, clip=1.0, lr=1e-4, epochs=1, precision="bf16",
                    device=str(self.device), seed=0, run_dir=run_dir)
        base.update(kw)
        return TrainConfig(**base)


def run_engine(ctx: Ctx, data: RandomTokens, loss: Optional[Callable] = None,
               on_event: Optional[Callable[[Any], None]] = None, **cfg_kw: Any):
    """One engine run in a temporary folder; returns (RunResult, every event the sink saw)."""
    events: list[Any] = []

    def sink(ev: Any) -> None:
        events.append(ev)
        if on_event is not None:
            on_event(ev)

    with temp_run_dir() as rd:
        trainer = Trainer(ctx.config(rd, **cfg_kw), task=ctx.task(data, loss), sink=sink)
        try:
            result = trainer.run()
        finally:
            del trainer
    return result, events


# -- a: step time and peak memory ------------------------------------------------------------


def section_a(ctx: Ctx) -> None:
    c, dev = ctx.check, ctx.device
    micro, accum = 16, 4
    warm, steps, pairs = (3, 12, 3) if not ctx.small else (2, 4, 2)
    data = RandomTokens(micro * accum * (warm + steps + 1), ctx.cfg["vocab"], ctx.cfg["T"])
    times: dict[str, list[float]] = {"bare": [], "engine": []}
    peaks: dict[str, list[int]] = {"bare": [], "engine": []}

    def bare(m: int, k: int, n_warm: int, n_steps: int) -> tuple[float, Optional[int], int]:
        left = clean(dev)
        task = ctx.task(data)
        opt = engine_default_optimizer([p for p in task.model.parameters()], dev, 1e-4)
        loop = BareLoop(task, dev, m, k, 1.0, opt, precision="bf16")
        reset_peak(dev)
        for _ in range(n_warm):
            loop.step()
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(n_steps):
            loop.step()
        sync(dev)
        dt = (time.perf_counter() - t0) / n_steps
        p = peak(dev)
        del loop, opt, task
        return dt, p, left

    def engine() -> tuple[float, Optional[int], int]:
        left = clean(dev)
        marks: dict[str, Any] = {}

        def on_event(ev: Any) -> None:
            if isinstance(ev, StepMetrics):
                if ev.mem_used is not None and ev.mem_reserved is not None:
                    ctx.step_mem.append((ev.step, ev.mem_used, ev.mem_reserved))
                if ev.step == warm:
                    sync(dev)
                    marks["t0"] = time.perf_counter()
                elif ev.step == warm + steps:
                    sync(dev)
                    marks["t1"] = time.perf_counter()
                    marks["peak"] = peak(dev)

        reset_peak(dev)
        result, _ = run_engine(ctx, data, on_event=on_event, micro_batch=micro, accum=accum,
                               max_steps=warm + steps)
        assert result.steps == warm + steps and "t1" in marks, result
        return (marks["t1"] - marks["t0"]) / steps, marks["peak"], left

    order: list[str] = []
    for r in range(pairs):
        order += ["bare", "engine"] if r % 2 == 0 else ["engine", "bare"]
    bare(micro, accum, warm, 1)  # untimed: first-use costs (kernels, allocator, autotuning) are paid here
    left_over = []
    for side in order:
        dt, p, left = bare(micro, accum, warm, steps) if side == "bare" else engine()
        times[side].append(dt)
        left_over.append(left)
        if p is not None:
            peaks[side].append(p)
        c.write(dict(section="a", run=side, micro=micro, accum=accum, step_s=round(dt, 5),
                     peak_gib=None if p is None else round(p / GiB, 3), allocated_before_gib=round(left / GiB, 3)))
    tb, te = median(times["bare"]), median(times["engine"])
    ratio = te / tb
    tokens = micro * accum * ctx.cfg["T"]
    c.figure("a", "step_time_ratio_16x4", round(ratio, 4), "<= 1.01", ratio <= 1.01 if ctx.gpu else None,
             f"engine {te * 1e3:.1f} ms ({tokens / te / 1e3:.0f}k tok/s) vs bare {tb * 1e3:.1f} ms; "
             f"runs {[round(t * 1e3, 1) for t in times['engine']]} vs {[round(t * 1e3, 1) for t in times['bare']]}",
             engine_ms=round(te * 1e3, 3), bare_ms=round(tb * 1e3, 3), tokens_per_s=round(tokens / te))
    if not ctx.gpu:
        c.skip("a", "peak_ratio_vs_bare_16x4", "no CUDA: no allocator peak")
        c.skip("a", "peak_ratio_vs_bare_64x1", "no CUDA: no allocator peak")
        return
    pb, pe = max(peaks["bare"]), max(peaks["engine"])
    c.figure("a", "peak_ratio_vs_bare_16x4", round(pe / pb, 4), "<= 1.02", pe / pb <= 1.02,
             f"engine {pe / GiB:.2f} GiB vs bare {pb / GiB:.2f} GiB (ANCHORS: 13.3)",
             engine_peak=pe, bare_peak=pb)
    dt64, p64, left = bare(64, 1, 1, 2 if not ctx.small else 1)
    c.write(dict(section="a", run="bare", micro=64, accum=1, step_s=round(dt64, 5), peak_gib=round(p64 / GiB, 3),
                 allocated_before_gib=round(left / GiB, 3)))
    c.figure("a", "peak_ratio_vs_bare_64x1", round(pe / p64, 4), "<= 0.30", pe / p64 <= 0.30,
             f"engine 16x4 {pe / GiB:.2f} GiB vs bare 64x1 {p64 / GiB:.2f} GiB (ANCHORS: 45.8); "
             f"64x1 step {dt64 * 1e3:.1f} ms", bare64_peak=p64)


# -- b: telemetry ------------------------------------------------------------------------------


def section_b(ctx: Ctx) -> None:
    c, dev = ctx.check, ctx.device
    if not ctx.gpu:
        c.skip("b", "nvml_used_ge_reserved", "no CUDA: MemoryProbe is off on CPU")
        return
    from engine.memory.telemetry import MemoryProbe
    probe = MemoryProbe(dev)
    try:
        if probe._handle is None:  # noqa: SLF001 - the probe's NVML handle says whether NVML answered
            c.fail("b", "nvml_available", f"NVML not used by MemoryProbe: {probe.reason}")
        x = torch.empty(2 * GiB, dtype=torch.uint8, device=dev)
        s = probe.sample()
        del x
        ok = s.used is not None and s.reserved is not None and s.used >= s.reserved
        c.figure("b", "nvml_used_ge_reserved", round((s.used or 0) / GiB, 3), ">= reserved", ok,
                 f"NVML used {(s.used or 0) / GiB:.2f} GiB, torch reserved {(s.reserved or 0) / GiB:.2f} GiB, "
                 f"allocated {(s.allocated or 0) / GiB:.2f} GiB, total {(s.total or 0) / GiB:.1f} GiB")
    finally:
        probe.close()
    if ctx.step_mem:
        bad = [(st, u, r) for st, u, r in ctx.step_mem if u < r]
        c.figure("b", "every_engine_step_used_ge_reserved", f"{len(ctx.step_mem) - len(bad)}/{len(ctx.step_mem)}",
                 "all steps", not bad, f"from section a's StepMetrics; first bad: {bad[:1]}")
    else:
        c.skip("b", "every_engine_step_used_ge_reserved", "section a recorded no step memory")


# -- c: the finder under the cap -----------------------------------------------------------------


def true_max_micro(ctx: Ctx, data: RandomTokens, lo: int, hi: int) -> tuple[int, list[tuple[int, bool]]]:
    """Largest micro-batch in [lo, hi) whose bare training step (accum 2) fits; lo fits, hi does not
    (both checked). Bisection; one model and optimizer, as in training (Adam state allocated)."""
    dev = ctx.device
    task = ctx.task(data, ctx.loss())
    opt = engine_default_optimizer(list(task.model.parameters()), dev, 1e-4)
    tried: list[tuple[int, bool]] = []

    def fits(b: int) -> bool:
        loop = BareLoop(task, dev, b, 2, 1.0, opt, precision="bf16")
        ok = True
        try:
            loop.step()
            sync(dev)
        except BaseException as e:  # noqa: BLE001 - an OOM is what bisection looks for; anything else re-raised
            if not is_oom(e):
                raise
            ok = False
        del loop
        opt.zero_grad(set_to_none=True)
        free_memory(dev)
        tried.append((b, ok))
        return ok

    try:
        if not fits(lo):
            return 0, tried
        if fits(hi):
            return hi, tried
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return lo, tried
    finally:
        task = opt = None  # the model and its optimizer state go before the next section (fits is done)
        clean(dev)


def section_c(ctx: Ctx) -> None:
    c, dev = ctx.check, ctx.device
    clean(dev)
    data = RandomTokens(64 * 4, ctx.cfg["vocab"], ctx.cfg["T"])
    cap_kw: dict[str, Any] = dict(vram_limit=CAP) if ctx.gpu else {}
    try:
        set_cap(dev, CAP)
        true_max, tried = true_max_micro(ctx, data, 24, 33)
        c.write(dict(section="c", measured="bare-loop largest micro-batch under the cap (accum 2)",
                     true_max=true_max, tried=tried))
        set_cap(dev, None)
        clean(dev)
        found: list[MicroBatchFound] = []
        oom_after: list[OomRecovered] = []
        t0 = time.perf_counter()
        result, events = run_engine(ctx, data, loss=ctx.loss(), find_micro_batch=True, effective_batch=64,
                                    max_steps=2, **cap_kw)
        dt = time.perf_counter() - t0
        found = [e for e in events if isinstance(e, MicroBatchFound)]
        oom_after = [e for e in events if isinstance(e, OomRecovered)]
    finally:
        set_cap(dev, None)
        clean(dev)
    if not found:
        c.fail("c", "micro_batch_found", "no MicroBatchFound event")
        return
    f = found[-1]
    ref = true_max or ANCHOR_MAX_MICRO
    within = abs(f.micro_batch - ref) <= 0.10 * ref
    c.figure("c", "finder_micro_batch", f.micro_batch, f"within 10% of {ref}", within,
             f"true largest (bare loop, measured) {true_max}; ANCHORS {ANCHOR_MAX_MICRO} "
             f"({'within' if abs(f.micro_batch - ANCHOR_MAX_MICRO) <= 2.4 else 'not within'} 10%); accum {f.accum}; "
             f"peak {f.peak_bytes / GiB:.2f} GiB; run with finder {dt:.1f} s",
             accum=f.accum, peak_bytes=f.peak_bytes, true_max=true_max)
    c.figure("c", "finder_probes", f.probes, "<= 8", f.probes <= 8)
    c.figure("c", "found_shape_trains", result.steps, "2 steps, no OOM after finding",
             result.steps == 2 and not oom_after, f"accum {f.accum}, oom_recovered events after: {len(oom_after)}")


# -- d: OOM recovery ------------------------------------------------------------------------------


def section_d(ctx: Ctx) -> None:
    c, dev = ctx.check, ctx.device
    clean(dev)
    data = RandomTokens(96 * 6, ctx.cfg["vocab"], ctx.cfg["T"])
    cap_kw: dict[str, Any] = dict(vram_limit=CAP) if ctx.gpu else {}
    try:
        result, events = run_engine(ctx, data, loss=ctx.loss(), micro_batch=48, accum=2, max_steps=4, **cap_kw)
    finally:
        set_cap(dev, None)
        clean(dev)
    rec = [e for e in events if isinstance(e, OomRecovered)]
    steps = [e for e in events if isinstance(e, StepMetrics)]
    finite = all(math.isfinite(s.loss) and not s.nonfinite for s in steps)
    desc = "; ".join(f"{e.old_micro_batch}x{e.old_accum} -> {e.new_micro_batch}x{e.new_accum} at step {e.step}"
                     for e in rec)
    c.figure("d", "oom_recovered", len(rec), ">= 1 event", len(rec) >= 1, desc or "none")
    c.figure("d", "training_goes_on", len(steps), "4 steps, finite loss", result.steps == 4 and len(steps) == 4
             and finite, f"losses {[round(s.loss, 3) for s in steps]}; reason {result.reason}; "
             f"micro-batch now {steps[-1].micro_batch if steps else None}")


# -- e: bf16 and fp16 ------------------------------------------------------------------------------


def section_e(ctx: Ctx) -> None:
    c, dev = ctx.check, ctx.device
    micro, accum = (8, 2) if not ctx.small else (4, 2)
    for precision, n in (("bf16", 6), ("fp16", 12)):
        clean(dev)
        try:
            data = RandomTokens(micro * accum * (n + 1), ctx.cfg["vocab"], ctx.cfg["T"])
            result, events = run_engine(ctx, data, micro_batch=micro, accum=accum, max_steps=n, precision=precision)
            steps = [e for e in events if isinstance(e, StepMetrics)]
            nonfinite = [e for e in events if isinstance(e, NonFinite)]
            applied = [s for s in steps if not s.scaler_skipped and not s.nonfinite]
            ok = (result.steps == n and not nonfinite and all(math.isfinite(s.loss) for s in steps)
                  and len(applied) >= 3)
            c.figure("e", f"{precision}_trains", len(applied), f">= 3 of {n} steps applied", ok,
                     f"losses {[round(s.loss, 3) for s in steps]}; scaler skips {result.scaler_skips}; "
                     f"nonfinite {len(nonfinite)}")
        except Exception as e:  # noqa: BLE001 - a failed item is reported and the check goes on
            c.fail("e", f"{precision}_trains", f"{type(e).__name__}: {e}")
        finally:
            clean(dev)


# -- f: torchrun ------------------------------------------------------------------------------------


def section_f(ctx: Ctx) -> None:
    c = ctx.check
    with temp_run_dir() as rd:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "-m", "engine",
               "--task", "mlp", "--device", "cuda" if ctx.gpu else "cpu", "--epochs", "1", "--run-dir", rd]
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=150)
        dt = time.perf_counter() - t0
        kinds, info = [], {}
        db = os.path.join(rd, "run.db")
        if os.path.exists(db):
            con = sqlite3.connect(db)
            try:
                kinds = [k for (k,) in con.execute("SELECT kind FROM events ORDER BY id")]
                info = {k: v for k, v in con.execute("SELECT key, value FROM run")}
                n_steps = con.execute("SELECT count(*) FROM metrics").fetchone()[0]
            finally:
                con.close()
        else:
            n_steps = 0
    tail = (p.stdout[-600:] + p.stderr[-1200:]).strip().replace("\n", " | ")
    backend = str(info.get("backend", "")).strip('"')
    want = "nccl" if ctx.gpu else "gloo"
    ok = p.returncode == 0 and "run_finished" in kinds and backend == want
    c.figure("f", "torchrun_1proc_finished", p.returncode, f"rc 0 + run_finished + backend {want}", ok,
             f"{dt:.1f} s; {n_steps} steps; backend {backend}; world_size {info.get('world_size')}; "
             f"device {info.get('device')}; "
             f"events {sorted(set(kinds))}" + ("" if ok else f"; output: {tail[-1500:]}"),
             cmd=" ".join(cmd[:1] + ["-m"] + cmd[2:]))
    c.write(dict(section="f", note="under torchrun the engine always starts a process group and wraps the "
                 "model (--strategy ddp by default), so one process exercises NCCL and DDP's reducer"))


from bench.gpu_memory_check import section_g  # noqa: E402 - issue 15: where the memory goes
from bench.gpu_strategies_check import section_h  # noqa: E402 - issue 20: ddp and fsdp under torchrun

SECTIONS = {"a": section_a, "b": section_b, "c": section_c, "d": section_d, "e": section_e, "f": section_f,
            "g": section_g, "h": section_h}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny GPT, simulated cap: checks the logic (CPU is fine)")
    ap.add_argument("--only", default="abcdefgh", help="sections to run, e.g. ab")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--budget", type=float, default=330.0,
                    help="seconds; sections not started by then are skipped (default 330)")
    ns = ap.parse_args()
    if ns.device == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        dev = torch.device(ns.device)
    small = ns.small or dev.type != "cuda"
    out = os.environ.get("OUT") or "/tmp/gpu_check_out"
    check = Check(out, small, dev)
    if dev.type == "cuda":
        dev = torch.device("cuda", dev.index or 0)
        torch.cuda.set_device(dev)
        check.device = dev
    env = dict(section="env", torch=torch.__version__, cuda=torch.version.cuda, device=device_label(dev),
               python=platform.python_version(), small=small, date=time.strftime("%Y-%m-%d %H:%M:%S"))
    if dev.type == "cuda":
        env["total_gib"] = round(torch.cuda.get_device_properties(dev).total_memory / GiB, 1)
        try:
            import pynvml
            pynvml.nvmlInit()
            drv = pynvml.nvmlSystemGetDriverVersion()
            env["driver"] = drv.decode() if isinstance(drv, bytes) else drv
            pynvml.nvmlShutdown()
        except Exception as e:  # noqa: BLE001 - a failed item is reported and the check goes on
            env["driver"] = f"NVML unavailable: {e}"
    check.write(env)
    ctx = Ctx(small, dev, check)
    for key in ns.only:
        fn = SECTIONS.get(key)
        if fn is None:
            continue
        if time.time() - check.t0 > ns.budget:
            check.skip(key, "section", f"time budget of {ns.budget:.0f} s spent before this section")
            continue
        t0 = time.perf_counter()
        try:
            fn(ctx)
        except Exception as e:  # noqa: BLE001 - one section must not stop the others
            check.fail(key, "section", f"{type(e).__name__}: {e}".replace("\n", " ")[:600])
            traceback.print_exc()
        finally:
            try:
                set_cap(dev, None)
                clean(dev)
            except Exception:  # noqa: BLE001 - clean-up: best effort
                pass
        check.write(dict(section=key, seconds=round(time.perf_counter() - t0, 1)))
    text = check.summary()
    print("\n" + text, flush=True)
    return 0 if not any(r["result"] == "FAIL" for r in check.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
