"""GPU check of issue 15, "Memory you can see": breakdown, what-fits table, checkpointing, OOM snapshot.

    PYTHONPATH=. python3 bench/gpu_memory_check.py            # on the GPU machine, ~1 minute on an H200
    PYTHONPATH=. python3 bench/gpu_memory_check.py --small    # the same logic on a tiny GPT, CPU is fine

bench/gpu_check.py can run it as one more section:
    from bench.gpu_memory_check import section_g      and    "g": section_g  in SECTIONS (+ "g" in --only)
section_g(ctx) only needs ctx.check (figure/skip/fail/write), ctx.device, ctx.small, ctx.cfg, ctx.gpu
and ctx.loss() (the simulated cap on CPU), which gpu_check's Ctx has.

The model is ANCHORS.md's 135M GPT (bench.common.make_gpt(GPT_CFG)), bf16 autocast, fused
AdamW (the engine's default), clip 1.0, the same loop as bench.common.BareLoop (loss_sum /
window samples per micro-batch), with a hook before zero_grad where the trainer counts.

  g1  breakdown (engine.memory.breakdown.count, after the optimizer step, before zero_grad) against
      the allocator at that moment: params + grads + optimizer within 2% of memory_allocated;
      after zero_grad, params + optimizer within 2%; params + grads + optimizer + activations
      = the window's peak (exact by construction: activations is the rest; INFO)
  g2  what fits (engine.memory.what_fits.levers): fit through the peaks of 4 x 2 and 8 x 2, predict 16 (16 x 4
      measured): within 10%; INFO: 32 x 2 predicted vs measured, and the fp32 extrapolation
      of 8 x 2 vs a measured fp32 8 x 2 (calibrates the precision factor)
  g3  checkpointing (engine.memory.activation_checkpointing.checkpoint_modules(model.blocks)): 16 x 4 peak with it
      on < off; INFO: the measured keep fraction vs CheckpointModel(layers=12).keep(), and
      the table's extrapolated 16 x 4 prediction vs measured. On CPU (--small): gradients
      with it on equal gradients with it off, and each block runs twice per micro-batch
  g4  --memory-snapshot on-oom (engine.memory.snapshot): 48 x 2 under a 24 GiB cap runs out of
      memory; the snapshot is written to RUN_DIR/memory/oom-step-S.pickle and loads with
      pickle, with an "oom" entry in its trace; INFO: file size, dump time, step-time cost of
      recording. On CPU the OOM is the simulated one and the writer an injected pickle.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import pickle
import sys
import tempfile
import time
from typing import Any, Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402 - after the sys.path set-up above

from bench.common import RandomTokens, engine_default_optimizer, gpt_loss, make_gpt, median  # noqa: E402 - after the sys.path set-up above
from engine.accumulation.oom import free_memory, is_oom  # noqa: E402 - after the sys.path set-up above
from engine.memory.activation_checkpointing import checkpoint_modules  # noqa: E402 - after the sys.path set-up above
from engine.memory.breakdown import activations, count  # noqa: E402 - after the sys.path set-up above
from engine.memory.snapshot import SnapshotRecorder  # noqa: E402 - after the sys.path set-up above
from engine.memory.what_fits import levers  # noqa: E402 - after the sys.path set-up above
from engine.memory.what_fits.forecast import MemoryModel  # noqa: E402 - after the sys.path set-up above

GiB = 2**30
CAP = 24 * GiB


# -- small helpers (local copies: gpu_check imports this module, so no import back) ---------------


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _clean(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def _reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def _peak(dev: torch.device) -> Optional[int]:
    return torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None


def _allocated(dev: torch.device) -> Optional[int]:
    return torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None


def _set_cap(dev: torch.device, limit: Optional[int]) -> None:
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(1.0 if limit is None else min(1.0, limit / total), dev)


class Run:
    """One model + optimizer and the bare loop's window, with a hook before zero_grad."""

    def __init__(self, ctx: Any, data: RandomTokens, precision: str, loss: Optional[Callable] = None) -> None:
        self.dev = ctx.device
        self.model = make_gpt(ctx.cfg, self.dev)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = engine_default_optimizer(self.params, self.dev, 1e-4)
        self.data = data
        self.loss = loss or gpt_loss
        amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.autocast = (lambda: torch.autocast(self.dev.type, dtype=amp)) if amp else contextlib.nullcontext
        self.k = 0

    def window(self, micro: int, accum: int, before_zero: Optional[Callable[[], None]] = None) -> Optional[int]:
        """One optimizer step of micro x accum; returns its peak (None on CPU)."""
        _reset_peak(self.dev)
        n = micro * accum
        for _ in range(accum):
            idx = [(self.k + i) % len(self.data) for i in range(micro)]
            self.k += micro
            batch = torch.stack([self.data[i] for i in idx]).to(self.dev, non_blocking=True)
            with self.autocast():
                loss_sum, _count = self.loss(self.model, batch)
            (loss_sum / n).backward()
            del batch, loss_sum, _count
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        if before_zero is not None:
            before_zero()
        self.opt.zero_grad(set_to_none=True)
        return _peak(self.dev)

    def close(self) -> None:
        del self.model, self.opt, self.params
        _clean(self.dev)


def _ratio_note(a: int, b: int) -> str:
    return f"{a / GiB:.3f} GiB vs {b / GiB:.3f} GiB ({a - b:+,d} B)"


# -- the sections ---------------------------------------------------------------------------


def _library_workspaces(dev: torch.device, precision: str) -> int:
    """What the allocator holds for no tensor of ours: cuBLAS / cuBLASLt workspaces, created by
    the first GEMMs on this stream and kept. Made here, on a throwaway layer, and measured."""
    _clean(dev)
    if dev.type != "cuda":
        return 0
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    lin = torch.nn.Linear(256, 256, device=dev)
    x = torch.randn(64, 256, device=dev, requires_grad=True)
    for cm in ([torch.autocast("cuda", dtype=amp)] if amp else []) + [contextlib.nullcontext()]:
        with cm:
            lin(x).float().sum().backward()
    del lin, x
    _clean(dev)
    _sync(dev)
    return torch.cuda.memory_allocated(dev)


def g1_breakdown(ctx: Any, data: RandomTokens, precision: str) -> None:
    c, dev = ctx.check, ctx.device
    base = _library_workspaces(dev, precision)
    run = Run(ctx, data, precision)
    seen: dict[str, Any] = {}
    try:
        run.window(16 if ctx.gpu else 4, 4 if ctx.gpu else 2)  # warm: optimizer state exists from here on

        def at_end() -> None:
            _sync(dev)
            seen["alloc"] = _allocated(dev)
            t0 = time.perf_counter()
            seen["b"] = count(run.model, run.opt)
            seen["count_s"] = time.perf_counter() - t0

        peak = run.window(16 if ctx.gpu else 4, 4 if ctx.gpu else 2, before_zero=at_end)
        _sync(dev)
        after_zero = _allocated(dev)
        b_after = count(run.model, run.opt)
    finally:
        run.close()
    b = seen["b"]
    c.figure("g", "breakdown_bytes", b.total, "INFO", None,
             f"params {b.params / GiB:.3f} GiB, grads {b.grads / GiB:.3f} GiB, optimizer {b.optimizer / GiB:.3f} "
             f"GiB; by dtype {b.by_dtype}; count() {seen['count_s'] * 1e3:.2f} ms",
             params=b.params, grads=b.grads, optimizer=b.optimizer, count_ms=round(seen["count_s"] * 1e3, 3))
    if not ctx.gpu:
        c.skip("g", "breakdown_vs_allocated", "no CUDA: no allocator figures")
        c.skip("g", "parts_add_to_peak", "no CUDA: no peak")
        return
    on_dev = b.on_device(dev)
    alloc = seen["alloc"] - base
    r = on_dev / alloc
    c.figure("g", "breakdown_vs_allocated", round(r, 4), "within 2%", abs(1 - r) <= 0.02,
             f"params+grads+optimizer on {dev} {_ratio_note(on_dev, alloc)} allocated at the window's end "
             f"(after step, before zero_grad), less {base / 2**20:.1f} MiB of cuBLAS workspaces held before the "
             f"model existed (raw ratio {on_dev / seen['alloc']:.4f})", workspaces=base)
    r2 = b_after.on_device(dev) / (after_zero - base)
    c.figure("g", "breakdown_vs_allocated_after_zero_grad", round(r2, 4), "within 2%", abs(1 - r2) <= 0.02,
             f"params+optimizer {_ratio_note(b_after.on_device(dev), after_zero - base)} allocated (less "
             f"workspaces); grads counted {b_after.grads} B (set_to_none)")
    act = activations(peak, b, dev)
    total = on_dev + act
    c.figure("g", "parts_add_to_peak", round(total / peak, 4), "= 1 (by construction)", None,
             f"params {b.params / GiB:.2f} + grads {b.grads / GiB:.2f} + optimizer {b.optimizer / GiB:.2f} + "
             f"activations {act / GiB:.2f} = {total / GiB:.2f} GiB; peak {peak / GiB:.2f} GiB (ANCHORS 16x4: 13.3)",
             activations=act, peak=peak)


def g2_table(ctx: Any, data: RandomTokens, precision: str) -> dict[str, Any]:
    """Returns what g3 reuses: the bf16 fit and the persistent bytes."""
    c, dev = ctx.check, ctx.device
    out: dict[str, Any] = {}
    if not ctx.gpu:
        c.skip("g", "table_prediction_16x4", "no CUDA: no peaks to fit")
        return out
    run = Run(ctx, data, precision)
    model = MemoryModel()
    peaks: dict[tuple[int, int], int] = {}
    seen: dict[str, Any] = {}
    try:
        run.window(4, 2)  # warm
        for micro, accum in ((4, 2), (8, 2)):
            model.add(micro, run.window(micro, accum, before_zero=lambda: seen.setdefault("b", count(run.model,
                                                                                                    run.opt))))
        for micro, accum in ((16, 4), (32, 2)):
            peaks[(micro, accum)] = run.window(micro, accum)
    finally:
        run.close()
    persistent = levers.Persistent.from_breakdown(seen["b"])
    cur = levers.Current(micro_batch=8, accum=2, precision=precision, checkpointing=False)
    table = levers.build_table({(precision, False): model}, cur, capacity=None, persistent=persistent,
                               checkpoint=levers.CheckpointModel(layers=ctx.cfg["L"]), micro_batches=[16, 32])
    fixed, per = model.fit()
    p16 = table.cell(16, precision, False).predicted_peak
    m16 = peaks[(16, 4)]
    err = p16 / m16 - 1
    c.figure("g", "table_prediction_16x4", round(err, 4), "within 10%", abs(err) <= 0.10,
             f"predicted {p16 / GiB:.2f} GiB from 4x2 and 8x2 (fixed {fixed / GiB:.2f} GiB + {per / GiB:.3f} GiB "
             f"per sample) vs measured {m16 / GiB:.2f} GiB", predicted=p16, measured=m16)
    p32, m32 = table.cell(32, precision, False).predicted_peak, peaks[(32, 2)]
    c.figure("g", "table_prediction_32x2", round(p32 / m32 - 1, 4), "INFO", None,
             f"predicted {p32 / GiB:.2f} GiB vs measured {m32 / GiB:.2f} GiB (ANCHORS 32x2: 24.3)")
    out.update(model=model, persistent=persistent, peak16=m16)

    # The precision factor, calibrated: fp32 8 x 2 measured vs extrapolated from the bf16 fit.
    if precision != "fp32":
        _clean(dev)
        run = Run(ctx, data, "fp32")
        try:
            run.window(4, 2)
            m8 = run.window(8, 2)
        finally:
            run.close()
        p8 = table_for(out, precision, cur, [8]).cell(8, "fp32", False).predicted_peak
        c.figure("g", "fp32_extrapolated_8x2", round(p8 / m8 - 1, 4), "INFO", None,
                 f"extrapolated from {precision} {p8 / GiB:.2f} GiB vs measured fp32 {m8 / GiB:.2f} GiB "
                 "(activation bytes ratio 4/2; autocast keeps some activations fp32, so this runs high)")
    return out


def table_for(fit: dict[str, Any], precision: str, cur: levers.Current, sizes: list[int],
              layers: Optional[int] = None) -> levers.LeverTable:
    return levers.build_table({(precision, False): fit["model"]}, cur, capacity=None, persistent=fit["persistent"],
                              checkpoint=levers.CheckpointModel(layers=layers), micro_batches=sizes)


def g3_checkpointing(ctx: Any, data: RandomTokens, precision: str, fit: dict[str, Any]) -> None:
    c = ctx.check
    micro, accum = (16, 4) if ctx.gpu else (4, 2)
    run = Run(ctx, data, precision)
    calls = {"n": 0}
    # A pre-hook on each block's first module: hooks on the block itself stay outside the checkpoint
    # (they run once either way), and a recomputation stops early after the last saved tensor.
    hooks = [b.ln1.register_forward_pre_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1)) for b in
             run.model.blocks]
    grads: dict[bool, list[torch.Tensor]] = {}
    peaks: dict[bool, Optional[int]] = {}
    counts: dict[bool, int] = {}
    try:
        run.window(micro, accum)  # warm
        for on in (False, True):
            checkpoint_modules(run.model.blocks, on)
            run.k = 0  # the same samples both times
            calls["n"] = 0
            state = {k: v.detach().to("cpu", copy=True) for k, v in run.model.state_dict().items()}  # off the GPU
            torch.manual_seed(0)
            peaks[on] = run.window(micro, accum, before_zero=lambda on=on: grads.__setitem__(
                on, [p.grad.detach().float().cpu() for p in run.params]))
            counts[on] = calls["n"]
            run.model.load_state_dict(state)  # the same weights for the second window: same gradients expected
            del state
    finally:
        for h in hooks:
            h.remove()
        run.close()
    L = ctx.cfg["L"]
    diff = max(((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(grads[True], grads[False], strict=True))
    exact = not ctx.gpu or precision == "fp32"
    c.figure("g", "checkpointing_same_gradients", f"{diff:.2e}", "<= 1e-5" if exact else "INFO",
             diff <= 1e-5 if exact else None, f"max relative difference of a parameter's gradient, on vs off; "
             f"ln1 pre-hooks per block: off {counts[False]}, on {counts[True]} "
             f"({micro}x{accum}, {L} blocks: expected {accum * L} and {2 * accum * L})")
    c.figure("g", "checkpointing_recomputes", counts[True], f"= {2 * accum * L}",
             counts[True] == 2 * accum * L and counts[False] == accum * L)
    if not ctx.gpu:
        c.skip("g", "checkpointing_cuts_peak_16x4", "no CUDA: no peak")
        return
    on, off = peaks[True], peaks[False]
    c.figure("g", "checkpointing_cuts_peak_16x4", round(on / off, 4), "< 1", on < off,
             f"on {on / GiB:.2f} GiB vs off {off / GiB:.2f} GiB", peak_on=on, peak_off=off)
    if fit:
        fixed, _per = fit["model"].fit()
        keep = (on - fixed) / max(1.0, off - fixed)
        model_keep = levers.CheckpointModel(layers=L).keep()
        cur = levers.Current(micro_batch=8, accum=2, precision=precision)
        pred = table_for(fit, precision, cur, [micro], layers=L).cell(micro, precision, True).predicted_peak
        c.figure("g", "checkpointing_keep_fraction", round(keep, 4), "INFO", None,
                 f"measured (peak_on - fixed) / (peak_off - fixed) = {keep:.3f} vs the table's model "
                 f"{model_keep:.3f} (inside {levers.DEFAULT_INSIDE}, layers {L}, boundary "
                 f"{levers.DEFAULT_BOUNDARY:.4f}); table's extrapolated {micro}x{accum} {pred / GiB:.2f} GiB vs "
                 f"measured {on / GiB:.2f} GiB", measured_keep=keep, model_keep=model_keep, predicted=pred)


def _pickle_writer(path: str) -> None:
    with open(path, "wb") as f:
        pickle.dump({"segments": [], "device_traces": [[{"action": "oom", "note": "injected writer (CPU)"}]]}, f)


def g4_snapshot(ctx: Any, data: RandomTokens, precision: str) -> None:
    c, dev = ctx.check, ctx.device
    rec = SnapshotRecorder()
    started = rec.start(dev, max_entries=100_000)
    if ctx.gpu and not started:
        c.fail("g", "oom_snapshot_loads", rec.reason)
        return
    path = None
    err = ""
    times: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="headroom-memcheck-") as tmp:
        run_dir = os.path.join(tmp, "run")
        try:
            loss = None if ctx.gpu else ctx.loss()  # CPU: the simulated cap above micro-batch 24
            run = Run(ctx, data, precision, loss=loss)
            try:
                if ctx.gpu:  # the cost of recording, 16 x 4 windows with and without it
                    for rec_on in (True, False, True, False):
                        if not rec_on:
                            torch.cuda.memory._record_memory_history(enabled=None)
                        else:
                            rec.start(dev)
                        run.window(16, 4)
                        _sync(dev)
                        t0 = time.perf_counter()
                        run.window(16, 4)
                        _sync(dev)
                        times[rec_on].append(time.perf_counter() - t0)
                    rec.start(dev)
                _set_cap(dev, CAP)
                try:
                    run.window(48, 2)
                    err = "48 x 2 did not run out of memory"
                except BaseException as e:  # noqa: BLE001 - an OOM is what the check wants; anything else is reported
                    if not is_oom(e):
                        raise
                    t0 = time.perf_counter()
                    path = rec.on_oom(run_dir, 3, dump=None if ctx.gpu else _pickle_writer)
                    dump_s = time.perf_counter() - t0
                run.opt.zero_grad(set_to_none=True)
            finally:
                _set_cap(dev, None)
                run.close()
                free_memory(dev)
            if path is None:
                c.fail("g", "oom_snapshot_loads", err or f"no snapshot written: {rec.reason}")
                return
            want = os.path.join(run_dir, "memory", "oom-step-3.pickle")
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                snap = pickle.load(f)
            ooms = sum(1 for t in snap.get("device_traces", []) for e in t if e.get("action") == "oom")
            ok = path == want and isinstance(snap, dict) and "segments" in snap and ooms >= 1
            c.figure("g", "oom_snapshot_loads", ooms, ">= 1 oom entry, at RUN_DIR/memory/oom-step-S.pickle", ok,
                     f"{os.path.relpath(path, run_dir)}; {size / 2**20:.1f} MiB; dump {dump_s:.2f} s; "
                     f"{len(snap.get('segments', []))} segments" + ("" if ctx.gpu else "; CPU: injected writer"))
        finally:
            rec.stop()
    if times[True] and times[False]:
        r = median(times[True]) / median(times[False])
        c.figure("g", "recording_cost_16x4", round(r, 4), "INFO", None,
                 f"16x4 step with memory history {median(times[True]) * 1e3:.1f} ms vs without "
                 f"{median(times[False]) * 1e3:.1f} ms")


def section_g(ctx: Any) -> None:
    precision = "bf16" if ctx.gpu else "fp32"
    data = RandomTokens(128, ctx.cfg["vocab"], ctx.cfg["T"])
    parts: list[tuple[str, Callable[[], Any]]] = []
    fit: dict[str, Any] = {}

    def do_g2() -> None:
        fit.update(g2_table(ctx, data, precision))
    parts = [("g1", lambda: g1_breakdown(ctx, data, precision)), ("g2", do_g2),
             ("g3", lambda: g3_checkpointing(ctx, data, precision, fit)),
             ("g4", lambda: g4_snapshot(ctx, data, precision))]
    for name, fn in parts:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - one part failing must not stop the others
            import traceback
            traceback.print_exc()
            ctx.check.fail("g", name, f"{type(e).__name__}: {e}".replace("\n", " ")[:600])
        finally:
            _set_cap(ctx.device, None)
            _clean(ctx.device)


def main() -> int:
    from bench.gpu_check import Check, Ctx, device_label  # here, not at the top: gpu_check may import us
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny GPT, simulated cap: checks the logic (CPU is fine)")
    ap.add_argument("--device", default="auto")
    ns = ap.parse_args()
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if ns.device == "auto" else ns.device)
    if dev.type == "cuda":
        dev = torch.device("cuda", dev.index or 0)
        torch.cuda.set_device(dev)
    small = ns.small or dev.type != "cuda"
    out = os.environ.get("OUT") or "/tmp/gpu_memory_check_out"
    check = Check(out, small, dev)
    check.write(dict(section="env", torch=torch.__version__, cuda=torch.version.cuda, device=device_label(dev),
                     small=small))
    section_g(Ctx(small, dev, check))
    print("\n" + check.summary(), flush=True)
    return 0 if not any(r["result"] == "FAIL" for r in check.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
