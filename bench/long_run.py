"""A long run in the window: open a run.db of a million steps, time it and weigh it.

Generates a real run folder: run.db created by the engine's own writer (engine.store.RunStore:
the schema, the run info, the events through RunStore.record), the metrics rows inserted
with executemany into its `metrics` table (one row per step, every column the engine writes,
the values a GPU run has: loss, norm and timings that vary per step, lr on a cosine
schedule, memory figures; or, with --cpu, NULL memory as on a CPU run). Then, in this same
process, the real MainWindow (offscreen):

  baseline  an empty window, plots built and painted: resident memory (VmRSS)
  open      File > Open of the run folder: from open_run() to the first paint of the plots
            with the data; resident memory after it, and the peak while opening (VmHWM,
            reset just before through /proc/self/clear_refs where the kernel allows)

Targets: open <= 5 s, resident <= 400 MB for 1,000,000 steps. Exit 0 if both are met, 1 if not.

Run:  QT_QPA_PLATFORM=offscreen .venv/bin/python bench/long_run.py [--steps 1000000] [--cpu] [--keep DIR]
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402 - after the sys.path set-up above

OPEN_TARGET_S = 5.0
RSS_TARGET_MB = 400.0
STEPS_PER_EPOCH = 5000
GIB = 2 ** 30


def status_mb(field: str) -> float:
    """A VmRSS / VmHWM figure of this process, in MB (2^20 bytes)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def generate(run_dir: str, steps: int, gpu: bool, chunk: int = 50_000) -> float:
    """A finished run of `steps` optimizer steps in run_dir. Returns the seconds it took."""
    import sqlite3

    from engine.declarations.events import EpochEnd, RunFinished, RunStarted
    from engine.store import DB_NAME, METRIC_COLUMNS, RunStore

    t0 = time.perf_counter()
    os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    micro, accum, lr, clip = 32, 4, 3e-4, 1.0
    config = {"task": "charlm", "micro_batch": micro, "accum": accum, "lr": lr, "clip": clip, "epochs": 1,
              "max_steps": steps, "lr_schedule": "cosine", "device": "cuda:0" if gpu else "cpu"}
    store = RunStore(run_dir)
    store.set_info(config=config, task="charlm", device=config["device"], device_name="bench", world_size=1,
                   torch_version="bench", status="running", pid=os.getpid(), backend="none", precision="fp32",
                   started=time.time() - steps * 0.05)
    store.record(RunStarted(0, 1, run_dir=run_dir, task="charlm", device=config["device"], device_name="bench",
                            torch_version="bench", world_size=1, resumed=False, config=config))
    store.commit()
    store.close()

    db = sqlite3.connect(os.path.join(run_dir, DB_NAME))
    cols = ",".join(METRIC_COLUMNS)
    marks = ",".join("?" * len(METRIC_COLUMNS))
    rng = np.random.default_rng(0)
    t_start = time.time() - steps * 0.05
    db.execute("BEGIN")
    for i0 in range(0, steps, chunk):
        i1 = min(steps, i0 + chunk)
        s = np.arange(i0 + 1, i1 + 1)
        k = len(s)
        frac = s / steps
        values = {
            "step": s, "epoch": (s - 1) // STEPS_PER_EPOCH + 1,
            "loss": 0.8 + 2.5 * np.exp(-4 * frac) + 0.05 * rng.standard_normal(k),
            "grad_norm": np.abs(0.6 + 0.3 * rng.standard_normal(k)),
            "lr": lr * 0.5 * (1 + np.cos(math.pi * frac)),
            "accum": np.full(k, accum), "clip": np.full(k, clip), "micro_batch": np.full(k, micro),
            "samples": np.full(k, micro * accum), "tokens": rng.integers(20_000, 32_768, k),
            "step_time": 0.05 + 0.005 * rng.random(k), "nonfinite": np.zeros(k, dtype=np.int64),
            "scaler_skipped": np.zeros(k, dtype=np.int64), "time": t_start + s * 0.05,
        }
        values["clipped"] = (values["grad_norm"] > clip).astype(np.int64)
        values["throughput"] = values["tokens"] / values["step_time"]
        for c in ("mem_allocated", "mem_reserved", "mem_peak", "mem_used", "mem_total"):
            values[c] = [None] * k
        if gpu:
            alloc = (6 * GIB + rng.integers(0, 256 * 2 ** 20, k)).astype(np.int64)
            values.update(mem_allocated=alloc, mem_reserved=np.full(k, 9 * GIB), mem_peak=alloc + 2 * GIB,
                          mem_used=alloc + 3 * GIB, mem_total=np.full(k, 80 * GIB))
        if gpu:  # the memory breakdown, where this engine records one
            values.update(mem_params=np.full(k, GIB), mem_grads=np.full(k, GIB), mem_optimizer=np.full(k, 2 * GIB),
                          mem_activations=alloc - 4 * GIB)
        nulls = [None] * k  # any column this script does not know (a newer engine): NULL, as an old run has
        rows = zip(*[(v.tolist() if isinstance(v, np.ndarray) else v)
                     for v in (values.get(c, nulls) for c in METRIC_COLUMNS)])
        db.executemany(f"INSERT INTO metrics ({cols}) VALUES ({marks})", rows)
    db.execute("COMMIT")
    db.close()

    store = RunStore(run_dir)  # the events a run of this length has, and its end
    for e in range(1, (steps - 1) // STEPS_PER_EPOCH + 2):
        step = min(steps, e * STEPS_PER_EPOCH)
        store.record(EpochEnd(step, e, train_loss=1.0, val_loss=1.1, seconds=250.0))
    store.record(RunFinished(steps, (steps - 1) // STEPS_PER_EPOCH + 1, reason="max_steps"))
    store.set_info(status="finished", finished=time.time(), step=steps)
    store.close()
    return time.perf_counter() - t0


def held_steps(run_dir: str) -> int:
    """Metrics rows a run folder holds (-1 if it holds no readable run.db): --keep reuses a whole one."""
    import sqlite3
    path = os.path.join(run_dir, "run.db")
    if not os.path.isfile(path):
        return -1
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return int(db.execute("SELECT count(*) FROM metrics").fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return -1


def held_bytes(arr) -> int:
    """Bytes of the filled part of one of the model's growable arrays."""
    v = arr.view()
    return len(v) * v.itemsize


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        load = "load average %.1f %.1f %.1f" % os.getloadavg()
    except OSError:
        load = ""
    return f"{platform.machine()}, {cores} cores, Python {platform.python_version()}, {load}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--cpu", action="store_true", help="a CPU run: the memory columns are NULL")
    ap.add_argument("--keep", metavar="DIR", help="generate into DIR (reused if it already holds a run)")
    args = ap.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    tmp = tempfile.mkdtemp(prefix="headroom-long-run-")
    os.environ["HEADROOM_SETTINGS"] = os.path.join(tmp, "settings.ini")  # never the user's settings
    os.environ["HEADROOM_RUNS"] = os.path.join(tmp, "runs")
    os.environ["HEADROOM_LOG"] = os.path.join(tmp, "headroom.log")

    run_dir = args.keep or os.path.join(tmp, "long-run")
    gen_s = 0.0
    if held_steps(run_dir) != args.steps:
        shutil.rmtree(run_dir, ignore_errors=True)
        gen_s = generate(run_dir, args.steps, gpu=not args.cpu)
    db_mb = os.path.getsize(os.path.join(run_dir, "run.db")) / 2 ** 20
    import gc
    gc.collect()

    from PySide6.QtWidgets import QApplication

    from app.core import compat  # noqa: F401 - before any widget is painted

    app = QApplication.instance() or QApplication(sys.argv[:1])
    from app.main_window import MainWindow

    win = MainWindow(restore_settings=False)
    win.resize(1440, 900)
    win.show()
    plots = win.plots
    deadline = time.monotonic() + 10
    while plots.canvas.last_paint == 0.0 and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    for _ in range(20):
        app.processEvents()
        time.sleep(0.01)
    gc.collect()
    base_rss = status_mb("VmRSS")
    peak_reset = reset_peak()

    t0 = time.perf_counter()
    ok = win.open_run(run_dir)
    t_open = time.perf_counter() - t0
    painted_after = time.perf_counter()
    deadline = time.monotonic() + 30
    while plots.canvas.last_paint < painted_after and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.002)
    t_shown = time.perf_counter() - t0
    for _ in range(20):
        app.processEvents()
        time.sleep(0.01)
    rss = status_mb("VmRSS")
    peak = status_mb("VmHWM") if peak_reset else float("nan")
    buf = win.model.metrics
    n = len(buf)
    model_mb = sum(held_bytes(a) for a in buf.cols.values()) / 2 ** 20
    pyr_mb = sum(held_bytes(lo) + held_bytes(hi) for p in buf._pyramids.values() for lo, hi in p.levels) / 2 ** 20

    print(f"machine: {machine()}")
    print(f"run.db: {args.steps:,} steps ({'CPU' if args.cpu else 'GPU'} columns), {db_mb:.0f} MB"
          + (f", generated in {gen_s:.1f} s" if gen_s else ""))
    print(f"opened: {ok}, steps in the window: {n:,}")
    print(f"open_run() {t_open:.2f} s; first paint with the data {t_shown:.2f} s (target <= {OPEN_TARGET_S:.0f} s)")
    print(f"resident: empty window {base_rss:.0f} MB; with the run {rss:.0f} MB "
          f"(+{rss - base_rss:.0f} MB, ratio {rss / base_rss:.2f}); peak while opening {peak:.0f} MB "
          f"(target <= {RSS_TARGET_MB:.0f} MB)")
    print(f"metrics model: {model_mb:.0f} MB in columns ({model_mb * 2 ** 20 / max(1, n) :.0f} bytes/step), "
          f"{pyr_mb:.0f} MB in min/max pyramids")
    passed = bool(ok) and n == args.steps and t_shown <= OPEN_TARGET_S and rss <= RSS_TARGET_MB \
        and (math.isnan(peak) or peak <= RSS_TARGET_MB)
    print("result:", "PASS" if passed else "FAIL")
    win.close_now()
    app.processEvents()
    shutil.rmtree(tmp, ignore_errors=True)  # a --keep folder stays
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
