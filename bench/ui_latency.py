"""UI latency of the Headroom window, each figure measured side by side in one run.

  1. GUI event-loop latency: lateness of a 10 ms QTimer, p50/p99, with the engine training
     `mlp` on the CPU in the worker thread, against the same window idle. Target p99 <= 30 ms.
     Also: training speed inside the window against the same Trainer in a bare thread.
  2. Repaint with 1e6 points per curve (all plots, GPU memory curves included): one frame =
     append new steps + refresh + paint. Target <= 16 ms. Against pyqtgraph fed the full
     arrays each frame (its own auto peak downsampling and clip-to-view).
  3. Process start to window shown (first frame of the plots painted), torch not imported.
     Target <= 1.0 s. Against `import torch` alone.
  4. Engine event to plotted point: from the trainer handing a step to the EventBuffer to
     the first paint that shows it, during a real run. Target <= 100 ms.

Run:  QT_QPA_PLATFORM=offscreen .venv/bin/python bench/ui_latency.py [--seconds 8] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
_TMP = tempfile.mkdtemp(prefix="headroom-bench-")
os.environ["HEADROOM_SETTINGS"] = os.path.join(_TMP, "settings.ini")  # never the user's settings
os.environ["HEADROOM_RUNS"] = os.path.join(_TMP, "runs")
os.environ["HEADROOM_LOG"] = os.path.join(_TMP, "headroom.log")

import numpy as np  # noqa: E402 - after the sys.path set-up above


def pct(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, float), q)) if len(values) else float("nan")


def fmt_ms(v: float) -> str:
    return f"{v * 1e3:.1f} ms"


# -- 3. start-up (subprocesses first, while nothing else runs in this process) --------------------
def bench_startup(repeats: int) -> dict:
    env = {**os.environ, "HEADROOM_STARTUP_PROBE": "1"}
    shown, inproc, torch_loaded, plots = [], [], [], []
    for _ in range(repeats):
        t0 = time.time()
        out = subprocess.run([sys.executable, "-m", "app"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=60)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("shown ")), None)
        if line is None:
            raise RuntimeError(f"no startup probe line: {out.stderr[-2000:]}")
        parts = line.split()
        shown.append(float(parts[1]) - t0)
        inproc.append(float(parts[3]))
        torch_loaded.append(int(parts[5]))
        plots.append(float(parts[7]) - t0)
    torch_s = []
    for _ in range(max(2, repeats // 2)):
        t0 = time.time()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, timeout=60)
        torch_s.append(time.time() - t0)
    return {"start_to_shown_s_median": statistics.median(shown), "start_to_shown_s_min": min(shown),
            "start_to_shown_s_max": max(shown), "in_process_s_median": statistics.median(inproc),
            "start_to_plots_s_median": statistics.median(plots),
            "torch_imported_before_shown": any(torch_loaded), "import_torch_alone_s_median": statistics.median(torch_s)}


# -- the window -----------------------------------------------------------------------------------
def make_window():
    from PySide6.QtWidgets import QApplication
    app = QApplication.instance() or QApplication([])
    from app.main_window import MainWindow
    w = MainWindow(restore_settings=False)
    w.resize(1440, 900)
    w.show()
    w.default_layout()
    for _ in range(5):
        app.processEvents()
    return app, w


def pump(app, seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        app.processEvents()
        time.sleep(0.001)


class Lateness:
    """A 10 ms PreciseTimer; lateness = time between fires - 10 ms."""

    def __init__(self, interval_ms: int = 10) -> None:
        from PySide6.QtCore import Qt, QTimer
        self.interval = interval_ms / 1000
        self.samples: list[float] = []
        self.last = None
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._fire)
        self.recording = False

    def _fire(self) -> None:
        now = time.perf_counter()
        if self.last is not None and self.recording:
            self.samples.append(max(0.0, now - self.last - self.interval))
        self.last = now

    def measure(self, app, seconds: float) -> list[float]:
        """Run the event loop for `seconds` (app.exec-like, nested loop) and return the lateness samples."""
        from PySide6.QtCore import QEventLoop, QTimer
        self.samples, self.last, self.recording = [], None, True
        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        self.timer.start()
        loop.exec()
        self.timer.stop()
        self.recording = False
        return list(self.samples)


def bench_loop_latency_and_plot_latency(seconds: float) -> dict:
    from PySide6.QtCore import QEventLoop, QTimer

    from engine.declarations.events import StepMetrics
    app, w = make_window()
    lat = Lateness()
    idle = lat.measure(app, seconds)

    # Training: a real mlp run in the worker thread. Every StepMetrics put into the buffer is
    # timestamped; every paint of the plots records which steps it shows.
    put_time: dict[int, float] = {}
    buf = w.runner.buffer
    real_put = buf.put

    def timed_put(event):
        if isinstance(event, StepMetrics):
            put_time[event.step] = time.perf_counter()
        real_put(event)

    buf.put = timed_put
    plotted: dict[int, float] = {}
    state = {"shown": 0}

    def on_paint(when: float) -> None:
        x, _y = w.plots.curve_data("loss")
        if len(x):
            last = int(x[-1])
            for s in range(state["shown"] + 1, last + 1):
                plotted.setdefault(s, when)
            state["shown"] = max(state["shown"], last)

    w.plots.canvas.paint_listeners.append(on_paint)
    w.controls.set_values({"task": "mlp", "micro_batch": 16, "accum": 4, "epochs": 1000, "device": "cpu"})
    w.base_config["run_dir"] = os.path.join(_TMP, "runs", "latency")
    t_start = time.perf_counter()
    assert w.start_run(), w.last_error
    # Wait for training proper (torch loads in the worker first), then measure.
    start_lat = Lateness()
    during_start = []
    loop_deadline = time.perf_counter() + 120
    while w.model.step < 5:
        during_start += start_lat.measure(app, 0.25)
        if time.perf_counter() > loop_deadline:
            raise RuntimeError("the run never started")
    t_first_step = time.perf_counter() - t_start
    step0 = w.model.step
    t0 = time.perf_counter()
    training = lat.measure(app, seconds)
    in_app_steps = w.model.step - step0
    in_app_rate = in_app_steps / (time.perf_counter() - t0)
    w.stop_run()
    loop = QEventLoop()
    w.run_done_callbacks.append(lambda _o: loop.quit())
    QTimer.singleShot(15000, loop.quit)
    if w.runner.is_busy():
        loop.exec()
    latencies = [plotted[s] - put_time[s] for s in plotted if s in put_time and s > step0]
    w.close()
    return {"idle": idle, "training": training, "during_start": during_start, "time_to_first_step_s": t_first_step,
            "event_to_plot": latencies, "in_app_steps_per_s": in_app_rate, "app": app}


def bench_headless_rate(seconds: float) -> float:
    """The same Trainer (mlp, same settings) in a bare thread, no window: optimizer steps per second."""
    from engine.declarations.config import TrainConfig
    from engine.declarations.events import EventBuffer
    from engine.trainer.trainer import Trainer
    buf = EventBuffer()
    cfg = TrainConfig(task="mlp", micro_batch=16, accum=4, epochs=1000, device="cpu",
                      run_dir=os.path.join(_TMP, "runs", "headless"))
    trainer = Trainer(cfg, sink=buf.put)
    th = threading.Thread(target=trainer.run)
    th.start()
    while trainer.step < 5:
        time.sleep(0.01)
        buf.drain()
    s0, t0 = trainer.step, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        time.sleep(0.033)  # drain at the GUI's rate, without a GUI
        buf.drain()
    rate = (trainer.step - s0) / (time.perf_counter() - t0)
    trainer.request_stop()
    th.join(30)
    return rate


# -- 2. repaint at 1e6 points -----------------------------------------------------------------------
def synthetic_columns(n: int, start: int = 1) -> dict:
    rng = np.random.default_rng(start)
    steps = np.arange(start, start + n, dtype=float)
    loss = 2.0 / np.sqrt(steps) + 0.05 * np.abs(rng.standard_normal(n))
    norm = 1.0 + 0.3 * np.abs(rng.standard_normal(n))
    gib = 2.0 ** 30
    return {
        "step": steps, "epoch": np.floor(steps / 10_000) + 1, "loss": loss, "grad_norm": norm,
        "lr": np.full(n, 1e-3), "accum": np.full(n, 4.0), "clip": np.full(n, 1.2), "micro_batch": np.full(n, 16.0),
        "samples": np.full(n, 64.0), "tokens": np.full(n, 64.0), "clipped": (norm > 1.2).astype(float),
        "nonfinite": np.zeros(n), "throughput": 6000 + 500 * rng.standard_normal(n), "step_time": np.full(n, 0.01),
        "mem_allocated": np.full(n, 3 * gib), "mem_reserved": 4 * gib + 0.2 * gib * rng.random(n),
        "mem_peak": np.full(n, 5 * gib), "mem_used": 6 * gib + 0.5 * gib * rng.random(n),
        "mem_total": np.full(n, 24 * gib), "time": np.zeros(n),
    }


def bench_repaint(n_points: int, frames: int, app) -> dict:
    import pyqtgraph as pg

    from app.main_window import MainWindow
    from app.model.runmodel import RunModel
    w = MainWindow(restore_settings=False)
    w.resize(1440, 900)
    w.show()
    w.default_layout()
    model = RunModel()
    model.info = {"device": "cuda:0"}
    t0 = time.perf_counter()
    model.metrics.extend_columns(synthetic_columns(n_points))
    load_s = time.perf_counter() - t0
    w.model = model
    t0 = time.perf_counter()
    w.plots.set_model(model)
    first_refresh_s = time.perf_counter() - t0
    vp = w.plots.canvas.viewport()
    for _ in range(5):
        app.processEvents()
    assert w.plots.gpu_mode() == "gpu"
    nxt = n_points + 1
    ours = []
    for _ in range(frames):
        cols = synthetic_columns(3, nxt)  # ~3 steps per 33 ms frame: a fast run
        nxt += 3
        t0 = time.perf_counter()
        model.metrics.extend_columns(cols)
        w.plots.refresh()
        vp.repaint()
        ours.append(time.perf_counter() - t0)
    shown = sum(len(s.item.getData()[0]) for s in w.plots.parts.series + w.plots.parts.memory.series)
    curves = len(w.plots.parts.series) + len(w.plots.parts.memory.series)
    w.close()

    # Side by side: pyqtgraph alone, the same 11 curves on the same layout, full arrays set each frame.
    glw = pg.GraphicsLayoutWidget()
    glw.resize(1100, 700)
    plots = [glw.addPlot(row=r, col=c) for r, c in ((0, 0), (1, 0), (1, 1), (2, 0), (2, 1))]
    for p in plots:
        p.setDownsampling(auto=True, mode="peak")
        p.setClipToView(True)
    cols = synthetic_columns(n_points)
    names = [(0, "loss"), (0, "loss"), (1, "grad_norm"), (1, "clip"), (2, "lr"), (4, "throughput"),
             (3, "mem_total"), (3, "mem_used"), (3, "mem_reserved"), (3, "mem_peak"), (1, "grad_norm")]
    items = [(plots[i].plot(), col) for i, col in names]
    glw.show()
    for _ in range(5):
        app.processEvents()
    naive = []
    nn = n_points
    big = {k: np.concatenate([v, synthetic_columns(3 * frames, n_points + 1)[k]]) for k, v in cols.items()}
    for _ in range(max(3, frames // 4)):
        nn += 3
        t0 = time.perf_counter()
        for item, col in items:
            item.setData(big["step"][:nn], big[col][:nn])
        glw.viewport().repaint()
        naive.append(time.perf_counter() - t0)
    glw.close()
    return {"points_per_curve": n_points, "curves": curves, "points_drawn_total": shown, "load_s": load_s,
            "first_refresh_s": first_refresh_s, "frame": ours, "naive_frame": naive}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds per latency phase (default 8)")
    ap.add_argument("--startup-repeats", type=int, default=5)
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average at start {load[0]:.2f}")
    startup = bench_startup(args.startup_repeats)
    lat = bench_loop_latency_and_plot_latency(args.seconds)
    app = lat.pop("app")
    rate_headless = bench_headless_rate(args.seconds)
    rep = bench_repaint(args.points, args.frames, app)

    idle, train = lat["idle"], lat["training"]
    e2p = lat["event_to_plot"]
    res = {
        "loop_lateness_idle_p50_ms": pct(idle, 50) * 1e3, "loop_lateness_idle_p99_ms": pct(idle, 99) * 1e3,
        "loop_lateness_training_p50_ms": pct(train, 50) * 1e3,
        "loop_lateness_training_p99_ms": pct(train, 99) * 1e3,
        "loop_lateness_training_max_ms": max(train) * 1e3 if train else float("nan"),
        "loop_lateness_torch_loading_p99_ms": pct(lat["during_start"], 99) * 1e3,
        "loop_lateness_samples": [len(idle), len(train)],
        "time_to_first_step_s": lat["time_to_first_step_s"],
        "steps_per_s_in_window": lat["in_app_steps_per_s"], "steps_per_s_headless": rate_headless,
        "repaint_frame_p50_ms": pct(rep["frame"], 50) * 1e3, "repaint_frame_p99_ms": pct(rep["frame"], 99) * 1e3,
        "repaint_naive_frame_p50_ms": pct(rep["naive_frame"], 50) * 1e3,
        "repaint_points_per_curve": rep["points_per_curve"], "repaint_curves": rep["curves"],
        "repaint_points_drawn_total": rep["points_drawn_total"], "repaint_first_refresh_s": rep["first_refresh_s"],
        "event_to_plot_p50_ms": pct(e2p, 50) * 1e3, "event_to_plot_p99_ms": pct(e2p, 99) * 1e3,
        "event_to_plot_max_ms": max(e2p) * 1e3 if e2p else float("nan"), "event_to_plot_samples": len(e2p),
        **startup,
        "load_average_start": load[0], "load_average_end": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    r = res
    print()
    print("1. GUI event loop, lateness of a 10 ms QTimer (target p99 <= 30 ms)")
    print(f"   idle window      p50 {r['loop_lateness_idle_p50_ms']:6.2f} ms   p99 {r['loop_lateness_idle_p99_ms']:6.2f} ms")
    print(f"   training mlp     p50 {r['loop_lateness_training_p50_ms']:6.2f} ms   p99 {r['loop_lateness_training_p99_ms']:6.2f} ms"
          f"   max {r['loop_lateness_training_max_ms']:.1f} ms")
    print(f"   ratio training/idle p99: {r['loop_lateness_training_p99_ms'] / max(r['loop_lateness_idle_p99_ms'], 1e-3):.2f}x"
          f"   (while torch loads in the worker: p99 {r['loop_lateness_torch_loading_p99_ms']:.1f} ms;"
          f" first step {r['time_to_first_step_s']:.1f} s after Start)")
    print(f"   training speed in the window {r['steps_per_s_in_window']:.1f} steps/s vs headless "
          f"{r['steps_per_s_headless']:.1f} steps/s: ratio {r['steps_per_s_in_window'] / r['steps_per_s_headless']:.2f}")
    print(f"2. Repaint, {rep['curves']} curves x {rep['points_per_curve']:,} points (target <= 16 ms a frame)")
    print(f"   frame (append + refresh + paint) p50 {r['repaint_frame_p50_ms']:.1f} ms   p99 {r['repaint_frame_p99_ms']:.1f} ms"
          f"   ({rep['points_drawn_total']:,} points reach pyqtgraph)")
    print(f"   pyqtgraph fed the full arrays: p50 {r['repaint_naive_frame_p50_ms']:.1f} ms a frame:"
          f" ratio {r['repaint_naive_frame_p50_ms'] / r['repaint_frame_p50_ms']:.1f}x")
    print(f"   first draw after opening a 1e6-step run: {r['repaint_first_refresh_s'] * 1e3:.0f} ms")
    print("3. Process start to window shown (target <= 1.0 s)")
    print(f"   median {r['start_to_shown_s_median']:.2f} s (min {r['start_to_shown_s_min']:.2f}, max "
          f"{r['start_to_shown_s_max']:.2f}; {r['in_process_s_median']:.2f} s inside Python); torch imported before "
          f"shown: {'yes' if r['torch_imported_before_shown'] else 'no'}; plots drawn (pyqtgraph loaded after the "
          f"window shows) at {r['start_to_plots_s_median']:.2f} s")
    print(f"   `import torch` alone: {r['import_torch_alone_s_median']:.2f} s: ratio "
          f"{r['start_to_shown_s_median'] / r['import_torch_alone_s_median']:.2f}")
    print("4. Engine event to plotted point (target <= 100 ms)")
    print(f"   p50 {r['event_to_plot_p50_ms']:.1f} ms   p99 {r['event_to_plot_p99_ms']:.1f} ms   max "
          f"{r['event_to_plot_max_ms']:.1f} ms over {r['event_to_plot_samples']} steps "
          f"(drain timer {33} ms: ratio p99/tick {r['event_to_plot_p99_ms'] / 33:.2f})")
    print(f"load average at end {res['load_average_end']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    app.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
