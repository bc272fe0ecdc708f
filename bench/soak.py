"""Soak: the app training `charlm` for 20,000 optimizer steps, offscreen, in one process.

The window is built as app/main.py builds it (the engine's run flags + --autostart: the
Start the user presses), the engine trains in its worker thread, and this process (the
GUI process, engine thread included) measures:

  1. Memory: RSS (/proc/self/statm) after step 1,000 and at the end. Target: growth
     < 50 MB. Also the peak, the slope over the run (MB per 1,000 steps), and Python
     objects (gc), QObjects under the window, notes and alert rows at both points.
  2. UI latency: lateness of a 10 ms QTimer, p50/p99, while training against the same
     window idle (before Start, and after the run with 20k points in the plots), side by
     side in this process. Target: p99 while training <= 30 ms, the idle target of
     bench/ui_latency.py (issue 3). Also per stretch of the run (no slowdown over time),
     where the GUI thread's time goes (its CPU, waiting on a run queue, blocked on the
     GIL: /proc schedstat) and every Python GC pause.
  3. Plots at the end (~20k points per curve, peak downsampling on): repaint, and a full
     frame (every curve decimated again + setData + repaint). Target <= 16 ms a frame,
     judged on p50 as bench/ui_latency.py does (p99 and CPU time shown). Also the live
     frames (refresh, paint) during the run.
  4. run.db (engine.store.RunReader): metrics rows == steps trained == 20,000, steps
     1..N with no gap or duplicate.
  5. Wall time of the whole soak. Target < 15 minutes.

Micro-batch 2, accumulation 1 (one micro-batch a step, ~10 ms on one core), so 20,000
steps fit; --epochs is set to cover them and --max-steps stops the run at exactly N.

Run:  QT_QPA_PLATFORM=offscreen .venv/bin/python bench/soak.py [--steps 20000] [--json out.json]
      HEADROOM_ENGINE_NICE=0 ... : the same with the engine thread not reniced (app/runner/worker.py)
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Optional

T_PROCESS = time.perf_counter()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
_TMP = tempfile.mkdtemp(prefix="headroom-soak-")
os.environ["HEADROOM_SETTINGS"] = os.path.join(_TMP, "settings.ini")  # never the user's settings
os.environ["HEADROOM_RUNS"] = os.path.join(_TMP, "runs")
os.environ["HEADROOM_LOG"] = os.path.join(_TMP, "headroom.log")

import numpy as np  # noqa: E402 - after the sys.path set-up above

PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1e6
CHARLM_TRAIN_SAMPLES = 3072  # engine/tasks/builtin/charlm.py: samples[:3072]

# Targets
RSS_GROWTH_MB = 50.0
LATENCY_P99_MS = 30.0  # bench/ui_latency.py / issue 3: the idle target
FRAME_MS = 16.0
WALL_S = 15 * 60


def sched(tid: str = "thread-self") -> tuple[float, float]:
    """(CPU seconds, seconds waiting on a run queue) of a thread, from /proc schedstat. The
    calling thread's CPU time comes from its clock (schedstat's lags the running thread)."""
    path = "/proc/thread-self/schedstat" if tid == "thread-self" else f"/proc/self/task/{tid}/schedstat"
    try:
        with open(path) as f:
            cpu, wait, _ = f.read().split()
        if tid == "thread-self":
            return time.thread_time(), int(wait) / 1e9
        return int(cpu) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return math.nan, math.nan


class Rows:
    """Samples as typed columns (8 bytes a value), so the probe's own memory stays small in
    the RSS it measures (a list of tuples would add ~150 bytes a sample)."""

    def __init__(self, n: int) -> None:
        self.cols = [array("d") for _ in range(n)]

    def append(self, *values: float) -> None:
        for col, v in zip(self.cols, values):
            col.append(v)

    def __len__(self) -> int:
        return len(self.cols[0])

    def __iter__(self):
        return zip(*self.cols)

    def __getitem__(self, i: int) -> tuple:
        return tuple(col[i] for col in self.cols)


PHASES = ("setup", "idle_before", "starting", "training", "finished", "idle_after", "frames")


def engine_tid() -> Optional[str]:
    """The engine QThread's kernel thread id (Qt names the OS thread after its objectName)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "headroom-engine"[:15]:
                    return tid
        except OSError:
            pass
    return None


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def pct(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, float), q)) if len(values) else float("nan")


class Probe:
    """A 10 ms PreciseTimer running all the time; each lateness sample is tagged with the
    phase and the step it was taken at. Plus a 250 ms sampler of RSS and step."""

    def __init__(self, win, interval_ms: int = 10) -> None:
        from PySide6.QtCore import Qt, QTimer
        self.win = win
        self.interval = interval_ms / 1000
        self.phase, self.phase_i = "setup", 0
        self.samples = Rows(4)  # (phase index, step, lateness s, time)
        self.rss = Rows(4)  # (time, step, rss bytes, load average) while training
        self.last = None
        self.timer = QTimer()
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.setInterval(interval_ms)
        self.timer.timeout.connect(self._fire)
        self.sampler = QTimer()
        self.sampler.setInterval(250)
        self.sampler.timeout.connect(self._sample)
        self.rss_at: dict[str, dict] = {}
        self.engine_tid: Optional[str] = None
        self.engine_first = self.engine_last = None  # (time, CPU s, run-queue s) of the engine thread
        self.phase_sched: dict[str, list] = {}  # phase: [wall, GUI cpu, GUI run-queue wait] at its start
        # --ab-nice: the engine thread's nice (above the GUI's) alternates by blocks of steps
        self.ab: list[int] = []
        self.ab_block = 500
        self.ab_cur: Optional[int] = None
        self.ab_rows = Rows(6)  # (time, step, nice from now on, GUI CPU s, GUI run-queue s, engine CPU s)

    def start(self) -> None:
        self.timer.start()
        self.sampler.start()

    def set_phase(self, phase: str) -> None:
        now = time.perf_counter()
        cpu, wait = sched()  # the GUI thread (set_phase runs on it)
        self.phase_sched[phase] = [now, cpu, wait]
        self.phase, self.phase_i = phase, PHASES.index(phase)
        self.last = None  # the gap across a phase change is not a sample

    def phase_share(self, phase: str, nxt: str) -> tuple[float, float]:
        """GUI thread's CPU share and run-queue-wait share of the wall time of a phase."""
        a, b = self.phase_sched.get(phase), self.phase_sched.get(nxt)
        if not a or not b:
            return math.nan, math.nan
        wall = b[0] - a[0]
        return (b[1] - a[1]) / wall, (b[2] - a[2]) / wall

    def _fire(self) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.samples.append(self.phase_i, self.win.model.step, max(0.0, now - self.last - self.interval), now)
        self.last = now

    def _sample(self) -> None:
        step = self.win.model.step
        if self.phase == "training":
            self.rss.append(time.perf_counter(), step, rss_bytes(), os.getloadavg()[0])
            if self.engine_tid:
                cpu, wait = sched(self.engine_tid)
                if not math.isnan(cpu):
                    self.engine_last = (time.perf_counter(), cpu, wait)
            if self.ab and self.engine_tid:
                want = self.ab[(step // self.ab_block) % len(self.ab)]
                if want != self.ab_cur:
                    os.setpriority(os.PRIO_PROCESS, int(self.engine_tid), os.getpriority(os.PRIO_PROCESS, 0) + want)
                    self.ab_cur = want
                g_cpu, g_wait = sched()
                e_cpu, _ = sched(self.engine_tid)
                self.ab_rows.append(time.perf_counter(), step, want, g_cpu, g_wait, e_cpu)
            if step >= 1000 and "step_1000" not in self.rss_at:
                self.rss_at["step_1000"] = snapshot(self.win, step)
                self.last = None  # the snapshot's own pause is not a lateness sample

    def lateness(self, phase: str, lo: int = -1, hi: int = 1 << 60) -> list[float]:
        code = PHASES.index(phase)
        return [v for p, s, v, _t in self.samples if p == code and lo <= s < hi]


_IN_SNAPSHOT = [False]  # the GC pause of snapshot()'s own gc.collect() is the bench's, not the app's


def snapshot(win, step: int) -> dict:
    """RSS plus what could grow per step on the GUI side. Blocks the GUI thread ~0.2 s (a full
    collection over ~340k objects): the probe drops the lateness sample it would make."""
    from PySide6.QtCore import QObject
    _IN_SNAPSHOT[0] = True
    try:
        gc.collect()
    finally:
        _IN_SNAPSHOT[0] = False
    return {"step": step, "rss": rss_bytes(), "gc_objects": len(gc.get_objects()),
            "qobjects": len(win.findChildren(QObject)), "notes": len(win.model.notes),
            "alert_rows": win.alerts.table.rowCount(), "metrics_capacity": win.model.metrics.cols["step"].capacity,
            "time": time.perf_counter()}


class GcPauses:
    """Python's cyclic GC stops every thread (it holds the GIL): time each collection."""

    def __init__(self) -> None:
        self.pauses: list[tuple[float, int, float, bool]] = []  # (t0, generation, seconds, bench's own)
        self._t0 = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((self._t0, info["generation"], time.perf_counter() - self._t0, _IN_SNAPSHOT[0]))

    def stop(self) -> None:
        gc.callbacks.remove(self._cb)


def wrap_timing(cls, name: str, store: list) -> None:
    """Time every call of cls.name (a Python method Qt or the window calls) into store as
    (t0, wall s, this thread's CPU s, s waiting on a run queue): wall - CPU - run queue is
    time spent blocked, i.e. waiting for the GIL."""
    fn = getattr(cls, name)

    def timed(self, *a, **k):
        c0, w0 = sched()
        t0 = time.perf_counter()
        try:
            return fn(self, *a, **k)
        finally:
            t1 = time.perf_counter()
            c1, w1 = sched()
            store.append(t0, t1 - t0, c1 - c0, w1 - w0)

    timed.__name__ = fn.__name__
    setattr(cls, name, timed)


def run_loop(app, seconds: float = None, until=None, timeout: float = 3600) -> bool:
    """Run the event loop (a nested loop, as app.exec() would) for `seconds`, or until
    `until()` is true (checked every 50 ms). Returns False on timeout."""
    from PySide6.QtCore import QEventLoop, QTimer
    loop = QEventLoop()
    state = {"ok": True}
    t_end = time.perf_counter() + (seconds if seconds is not None else timeout)
    check = QTimer()
    check.setInterval(50)

    def tick():
        if until is not None and until():
            loop.quit()
        elif time.perf_counter() >= t_end:
            state["ok"] = until is None
            loop.quit()

    check.timeout.connect(tick)
    check.start()
    loop.exec()
    check.stop()
    return state["ok"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--idle-seconds", type=float, default=15.0, help="idle window before Start and after the run")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--ab-nice", metavar="N,M,...",
                    help="experiment: alternate the engine thread's nice (above the GUI's) over these values in "
                         "blocks of --ab-block steps, and compare latency under the same load (needs the right "
                         "to lower a nice value again, e.g. root)")
    ap.add_argument("--ab-block", type=int, default=500)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()

    load0 = os.getloadavg()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average at start {load0[0]:.2f}", flush=True)

    # -- the window, as app/main.py builds it ---------------------------------------------------
    from app.main import install_message_filter, parse_args
    run_dir = os.path.join(_TMP, "runs", "soak")
    per_epoch = CHARLM_TRAIN_SAMPLES // (args.micro_batch * args.accum)
    epochs = math.ceil(args.steps / per_epoch) + 1
    argv = ["--task", "charlm", "--micro-batch", str(args.micro_batch), "--accum", str(args.accum),
            "--epochs", str(epochs), "--max-steps", str(args.steps), "--device", "cpu", "--run-dir", run_dir,
            "--autostart"]
    ns, base = parse_args(argv)
    from app.core import logs
    logs.setup()
    from PySide6.QtCore import QTimer, qInstallMessageHandler
    from PySide6.QtWidgets import QApplication
    install_message_filter(qInstallMessageHandler)
    from app.core import assets, compat  # noqa: F401 - imported for their set-up before the window, as app/main.py does
    from app.main_window import MainWindow

    # Per-call timings of the GUI thread's work (class-level wraps, before the window exists).
    ticks, refreshes, paints, alert_adds = Rows(4), Rows(4), Rows(4), Rows(4)
    from app.ui.alerts import AlertsPanel
    from app.ui.plots.panel import PlotCanvas, PlotPanel
    wrap_timing(AlertsPanel, "add", alert_adds)
    wrap_timing(MainWindow, "tick", ticks)
    wrap_timing(PlotPanel, "refresh", refreshes)
    wrap_timing(PlotCanvas, "paintEvent", paints)

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Headroom")
    app.setOrganizationName("Headroom")
    win = MainWindow(base_config=base, theme=ns.theme)
    win.resize(1440, 900)
    win.show()
    done: dict = {}
    win.run_done_callbacks.append(lambda outcome: done.setdefault("outcome", outcome))
    probe = Probe(win)
    if args.ab_nice:
        probe.ab = [int(v) for v in args.ab_nice.split(",")]
        probe.ab_block = args.ab_block
    probe.start()
    gcp = GcPauses()
    print(f"flags: {' '.join(argv)}", flush=True)

    # -- 2a. idle, before Start (plots built and painted) -----------------------------------------
    run_loop(app, until=lambda: win._plots is not None and win.plots.canvas.last_paint > 0, timeout=30)
    run_loop(app, 1.0)
    probe.set_phase("idle_before")
    run_loop(app, args.idle_seconds)

    # -- the run: autostart as app/main.py does ----------------------------------------------------
    probe.set_phase("starting")
    t_start = time.perf_counter()
    QTimer.singleShot(0, lambda: done.setdefault("start_ok", win.start_run()))
    run_loop(app, until=lambda: win.model.step >= 1 or "outcome" in done, timeout=300)
    if "outcome" in done or not done.get("start_ok"):
        print(f"error: the run did not start: {done} {win.last_error}", file=sys.stderr)
        return 1
    t_first = time.perf_counter()
    probe.set_phase("training")
    tid = engine_tid()
    probe.engine_tid = tid
    probe.engine_first = (t_first, *sched(tid)) if tid else None
    try:  # app/runner/worker.py renices its thread (HEADROOM_ENGINE_NICE=0: not)
        engine_nice = os.getpriority(os.PRIO_PROCESS, int(tid)) - os.getpriority(os.PRIO_PROCESS, 0) if tid else None
    except OSError:
        engine_nice = None
    last_report = [t_first]

    def progress() -> bool:
        now = time.perf_counter()
        if now - last_report[0] >= 30:
            last_report[0] = now
            r = probe.rss[-1][2] / MB if probe.rss else float("nan")
            print(f"  {now - t_first:6.0f} s  step {win.model.step:6d}  rss {r:7.1f} MB  "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
        return "outcome" in done

    run_loop(app, until=progress, timeout=3 * 3600)
    t_end_train = time.perf_counter()
    probe.set_phase("finished")
    outcome = done["outcome"]
    steps_trained = win.model.step
    rss_last_training = probe.rss[-1] if probe.rss else (0, 0, 0, 0)
    snap_end_run = snapshot(win, steps_trained)
    print(f"run ended: {outcome.get('status')} ({outcome.get('reason')}) at step {steps_trained:,} in "
          f"{t_end_train - t_start:.0f} s ({t_end_train - t_first:.0f} s after the first step)", flush=True)

    # -- 2b. idle, after the run (the same window, 20k points in the plots) -------------------------
    run_loop(app, 1.0)
    probe.set_phase("idle_after")
    run_loop(app, args.idle_seconds)
    probe.set_phase("frames")

    # -- 3. the plots at the end --------------------------------------------------------------------
    panel = win.plots
    vp = panel.canvas.viewport()
    items = [s.item for s in panel.parts.series + panel.parts.memory.series]
    downsampling = all(it.opts.get("autoDownsample") and it.opts.get("downsampleMethod") == "peak"
                       and it.opts.get("clipToView") for it in items)
    points_per_curve = len(win.model.metrics)
    repaint, full, full_cpu = [], [], []
    for _ in range(args.frames):
        t0 = time.perf_counter()
        vp.repaint()
        repaint.append(time.perf_counter() - t0)
    for _ in range(args.frames):
        for s in panel.parts.series + panel.parts.memory.series:
            s.key = ()  # every curve decimated again and handed to pyqtgraph
        c0, t0 = time.thread_time(), time.perf_counter()
        panel.refresh(force=True)
        vp.repaint()
        full.append(time.perf_counter() - t0)
        full_cpu.append(time.thread_time() - c0)
    drawn = {s.column: len(s.item.getData()[0] if s.item.getData()[0] is not None else []) for s in panel.parts.series}
    snap_end = snapshot(win, win.model.step)

    # -- 4. run.db -----------------------------------------------------------------------------------
    from engine.store import RunReader
    reader = RunReader(run_dir)
    rows = reader.metrics()
    info = reader.info()
    reader.close()
    db_steps = np.array([r["step"] for r in rows], dtype=np.int64)
    db_contiguous = bool(len(db_steps) and db_steps[0] == 1 and np.all(np.diff(db_steps) == 1))

    gcp.stop()
    win._really_closing = True
    win.close()
    app.processEvents()
    wall = time.perf_counter() - T_PROCESS

    # -- figures ---------------------------------------------------------------------------------------
    idle_b, idle_a = probe.lateness("idle_before"), probe.lateness("idle_after")
    train = probe.lateness("training")
    train_after_1000 = probe.lateness("training", lo=1000)
    starting = probe.lateness("starting")
    s1000 = probe.rss_at.get("step_1000") or snap_end_run
    rss_end = max(rss_last_training[2], snap_end["rss"])
    growth = (rss_end - s1000["rss"]) / MB
    rr = [(s, r) for _t, s, r, _l in probe.rss if s >= 1000]
    slope = float(np.polyfit([s for s, _ in rr], [r / MB for _, r in rr], 1)[0] * 1000) if len(rr) > 2 else math.nan
    peak_after_1000 = max((r for _, r in rr), default=0) / MB

    # per stretch of the run: latency, training rate, GUI work
    stretch = max(1000, args.steps // 10)
    per = []
    for lo in range(0, steps_trained, stretch):
        hi = lo + stretch
        lat = probe.lateness("training", lo, hi)
        pts = [(t, s) for t, s, _r, _l in probe.rss if lo <= s < hi]
        loads = [ld for _t, s, _r, ld in probe.rss if lo <= s < hi]
        rate = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) if len(pts) > 1 and pts[-1][0] > pts[0][0] \
            else math.nan
        t_lo = pts[0][0] if pts else math.inf
        t_hi = pts[-1][0] if pts else -math.inf
        fr = [d for t, d, _c, _w in refreshes if t_lo <= t <= t_hi]
        pa = [d for t, d, _c, _w in paints if t_lo <= t <= t_hi]
        pa_cpu = [c for t, _d, c, _w in paints if t_lo <= t <= t_hi]
        tk = [d for t, d, _c, _w in ticks if t_lo <= t <= t_hi]
        al = [d for t, d, _c, _w in alert_adds if t_lo <= t <= t_hi]
        per.append({"steps": f"{lo + 1}-{min(hi, steps_trained)}", "lat_p50_ms": pct(lat, 50) * 1e3,
                    "lat_p99_ms": pct(lat, 99) * 1e3, "steps_per_s": rate, "refresh_p50_ms": pct(fr, 50) * 1e3,
                    "paint_p50_ms": pct(pa, 50) * 1e3, "paint_p99_ms": pct(pa, 99) * 1e3,
                    "paint_cpu_p50_ms": pct(pa_cpu, 50) * 1e3, "load": float(np.mean(loads)) if loads else math.nan,
                    "tick_p99_ms": pct(tk, 99) * 1e3, "alert_add_p50_ms": pct(al, 50) * 1e3, "paints": len(pa)})
    gc_train = [(t, g, d) for t, g, d, own in gcp.pauses if t_first <= t <= t_end_train and not own]
    gc_by_gen = {g: (len([1 for _t, gg, _d in gc_train if gg == g]),
                     sum(d for _t, gg, d in gc_train if gg == g),
                     max((d for _t, gg, d in gc_train if gg == g), default=0.0)) for g in (0, 1, 2)}
    rss_t = np.array(probe.rss.cols[0]) if len(probe.rss) else np.zeros(1)
    rss_s = np.array(probe.rss.cols[1]) if len(probe.rss) else np.zeros(1)
    gen2 = [(d * 1e3, int(rss_s[max(0, int(np.searchsorted(rss_t, t)) - 1)])) for t, g, d in gc_train if g == 2]
    in_train = [d for t, d, _c, _w in paints if t_first <= t <= t_end_train]
    ref_train = [d for t, d, _c, _w in refreshes if t_first <= t <= t_end_train]
    # Where a paint's wall time goes while training: this thread's CPU, waiting on a run
    # queue (the CPU was busy with other threads), the rest blocked (the GIL).
    tr_p = [(d, c, w) for t, d, c, w in paints if t_first <= t <= t_end_train]
    idle_p = [(d, c, w) for t, d, c, w in paints if t < probe.phase_sched["starting"][0]
              or t > probe.phase_sched["idle_after"][0]]
    wall_sum = sum(d for d, _c, _w in tr_p) or math.nan
    paint_split = {"cpu": sum(c for _d, c, _w in tr_p) / wall_sum, "runqueue": sum(w for _d, _c, w in tr_p) / wall_sum}
    paint_split["blocked"] = 1 - paint_split["cpu"] - paint_split["runqueue"]
    gui_share = {ph: probe.phase_share(ph, nxt) for ph, nxt in
                 (("idle_before", "starting"), ("training", "finished"), ("idle_after", "frames"))}
    if probe.engine_first and probe.engine_last and probe.engine_last[0] > probe.engine_first[0]:
        e_wall = probe.engine_last[0] - probe.engine_first[0]
        engine_share = ((probe.engine_last[1] - probe.engine_first[1]) / e_wall,
                        (probe.engine_last[2] - probe.engine_first[2]) / e_wall)
    else:
        engine_share = (math.nan, math.nan)

    res = {
        "steps_requested": args.steps, "steps_trained": steps_trained, "micro_batch": args.micro_batch,
        "accum": args.accum, "epochs_flag": epochs, "outcome": {k: v for k, v in outcome.items() if k != "run_dir"},
        "time_to_first_step_s": t_first - t_start, "train_s": t_end_train - t_first,
        "steps_per_s": steps_trained / (t_end_train - t_first), "wall_s": wall,
        "rss_step_1000_mb": s1000["rss"] / MB, "rss_last_training_mb": rss_last_training[2] / MB,
        "rss_last_training_step": int(rss_last_training[1]), "rss_end_mb": snap_end["rss"] / MB,
        "rss_growth_mb": growth, "rss_peak_after_1000_mb": peak_after_1000, "rss_slope_mb_per_1000_steps": slope,
        "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB,
        "snap_step_1000": s1000, "snap_end_run": snap_end_run, "snap_end": snap_end,
        "lat_idle_before_p50_ms": pct(idle_b, 50) * 1e3, "lat_idle_before_p99_ms": pct(idle_b, 99) * 1e3,
        "lat_idle_after_p50_ms": pct(idle_a, 50) * 1e3, "lat_idle_after_p99_ms": pct(idle_a, 99) * 1e3,
        "lat_train_p50_ms": pct(train, 50) * 1e3, "lat_train_p99_ms": pct(train, 99) * 1e3,
        "lat_train_max_ms": max(train) * 1e3 if train else math.nan,
        "lat_train_after_1000_p99_ms": pct(train_after_1000, 99) * 1e3,
        "lat_starting_p99_ms": pct(starting, 99) * 1e3,
        "lat_samples": {"idle_before": len(idle_b), "training": len(train), "idle_after": len(idle_a)},
        "per_stretch": per,
        "live_paint_p50_ms": pct(in_train, 50) * 1e3, "live_paint_p99_ms": pct(in_train, 99) * 1e3,
        "live_refresh_p50_ms": pct(ref_train, 50) * 1e3, "live_refresh_p99_ms": pct(ref_train, 99) * 1e3,
        "live_paints": len(in_train), "live_paint_cpu_p50_ms": pct([c for _d, c, _w in tr_p], 50) * 1e3,
        "idle_paint_p50_ms": pct([d for d, _c, _w in idle_p], 50) * 1e3, "live_paint_split": paint_split,
        "gui_thread_cpu_and_runqueue_share": gui_share, "engine_thread_cpu_and_runqueue_share": engine_share,
        "engine_thread_nice_above_gui": engine_nice,
        "gc_gen2_ms_at_step": gen2,
        "gc_while_training": {f"gen{g}": {"count": c, "total_s": tot, "max_ms": mx * 1e3}
                              for g, (c, tot, mx) in gc_by_gen.items()},
        "end_points_per_curve": points_per_curve, "end_points_drawn": drawn, "peak_downsampling_on": downsampling,
        "end_repaint_p50_ms": pct(repaint, 50) * 1e3, "end_repaint_p99_ms": pct(repaint, 99) * 1e3,
        "end_full_frame_p50_ms": pct(full, 50) * 1e3, "end_full_frame_p99_ms": pct(full, 99) * 1e3,
        "end_full_frame_cpu_p50_ms": pct(full_cpu, 50) * 1e3, "end_full_frame_cpu_p99_ms": pct(full_cpu, 99) * 1e3,
        "load_average_frames": os.getloadavg()[0],
        "db_rows": len(rows), "db_first_step": int(db_steps[0]) if len(db_steps) else None,
        "db_last_step": int(db_steps[-1]) if len(db_steps) else None, "db_contiguous": db_contiguous,
        "db_status": info.get("status"), "db_info_step": info.get("step"),
        "load_average_start": load0[0], "load_average_end": os.getloadavg()[0],
    }

    if probe.ab and len(probe.ab_rows) > 2:
        rows_ab = np.array(list(probe.ab_rows))
        t_ab, nice_ab = rows_ab[:, 0], rows_ab[:, 2]  # (time, step, nice) rows
        d = np.diff(rows_ab, axis=0)
        lat_tr = np.array([(v, t) for p, _s, v, t in probe.samples if p == PHASES.index("training")])
        idx = np.searchsorted(t_ab, lat_tr[:, 1], side="right") - 1
        ab = {}
        for v in probe.ab:
            m = nice_ab[:-1] == v
            lv = lat_tr[(idx >= 0) & (nice_ab[np.clip(idx, 0, None)] == v), 0]
            span = d[m, 0].sum()
            ab[v] = {"lat_p50_ms": pct(lv, 50) * 1e3, "lat_p99_ms": pct(lv, 99) * 1e3, "samples": len(lv),
                     "gui_cpu": d[m, 3].sum() / span, "gui_runqueue": d[m, 4].sum() / span,
                     "engine_cpu": d[m, 5].sum() / span, "steps_per_s": d[m, 1].sum() / span, "seconds": span}
        res["ab_nice"] = ab
        res["ab_block"] = probe.ab_block

    r = res
    print()
    print(f"Soak: app + charlm, {steps_trained:,} steps (micro-batch {args.micro_batch}, accum {args.accum}, "
          f"--epochs {epochs} --max-steps {args.steps}, CPU, engine in the worker thread)")
    print(f"  first step {r['time_to_first_step_s']:.1f} s after Start; training {r['train_s']:.0f} s "
          f"({r['steps_per_s']:.1f} steps/s); whole soak {wall:.0f} s")
    print("1. GUI process memory (RSS)")
    print(f"  at step {s1000['step']:,}: {r['rss_step_1000_mb']:.1f} MB;  last sample while training "
          f"(step {r['rss_last_training_step']:,}): {r['rss_last_training_mb']:.1f} MB;  end: {r['rss_end_mb']:.1f} MB")
    print(f"  growth {growth:+.1f} MB (max of last-while-training and end, minus step 1,000); peak after step 1,000 "
          f"{peak_after_1000:.1f} MB; slope {slope:+.2f} MB per 1,000 steps")
    for label, sn in (("step 1,000", s1000), ("run ended", snap_end_run), ("end", snap_end)):
        print(f"  {label:10s}: gc objects {sn['gc_objects']:,}, QObjects under the window {sn['qobjects']:,}, "
              f"notes {sn['notes']}, alert rows {sn['alert_rows']}, metrics capacity {sn['metrics_capacity']:,}")
    print("2. UI latency, lateness of a 10 ms QTimer (target p99 <= 30 ms)")
    print(f"  idle before Start   p50 {r['lat_idle_before_p50_ms']:6.2f} ms   p99 {r['lat_idle_before_p99_ms']:6.2f} ms")
    print(f"  training            p50 {r['lat_train_p50_ms']:6.2f} ms   p99 {r['lat_train_p99_ms']:6.2f} ms   "
          f"max {r['lat_train_max_ms']:.1f} ms   ({len(train):,} samples)")
    print(f"  idle after the run  p50 {r['lat_idle_after_p50_ms']:6.2f} ms   p99 {r['lat_idle_after_p99_ms']:6.2f} ms")
    print(f"  ratio training/idle p99: {r['lat_train_p99_ms'] / max(r['lat_idle_before_p99_ms'], 1e-3):.2f}x "
          f"(vs idle before), {r['lat_train_p99_ms'] / max(r['lat_idle_after_p99_ms'], 1e-3):.2f}x (vs idle after); "
          f"while torch loads: p99 {r['lat_starting_p99_ms']:.1f} ms")
    print("  per stretch of the run (ms; load = the VM's 1-min load average, this process included):")
    print("          steps  load  lat p50  lat p99  steps/s  refresh p50  paint p50  paint p99  paint CPU p50  tick p99"
          "  alert add p50")
    for p in per:
        print(f"  {p['steps']:>13s}  {p['load']:4.1f}  {p['lat_p50_ms']:7.2f}  {p['lat_p99_ms']:7.2f}  "
              f"{p['steps_per_s']:7.1f}  {p['refresh_p50_ms']:11.2f}  {p['paint_p50_ms']:9.2f}  {p['paint_p99_ms']:9.2f}"
              f"  {p['paint_cpu_p50_ms']:13.2f}  {p['tick_p99_ms']:8.2f}  {p['alert_add_p50_ms']:13.2f}")
    print(f"  GUI thread, share of wall time on a CPU / waiting on a run queue: idle before "
          f"{gui_share['idle_before'][0]:.0%} / {gui_share['idle_before'][1]:.0%}, training "
          f"{gui_share['training'][0]:.0%} / {gui_share['training'][1]:.0%}, idle after "
          f"{gui_share['idle_after'][0]:.0%} / {gui_share['idle_after'][1]:.0%}; engine thread while training "
          f"{engine_share[0]:.0%} / {engine_share[1]:.0%}"
          + (f" (nice at its first step: the GUI's {engine_nice:+d})" if engine_nice is not None else ""))
    print(f"  a paint while training: p50 {r['live_paint_p50_ms']:.1f} ms wall, {r['live_paint_cpu_p50_ms']:.1f} ms CPU "
          f"(idle: {r['idle_paint_p50_ms']:.1f} ms wall); of the wall time: CPU {paint_split['cpu']:.0%}, run queue "
          f"{paint_split['runqueue']:.0%}, blocked (GIL) {paint_split['blocked']:.0%}")
    print("  Python GC while training (it pauses every thread): " + ", ".join(
        f"gen {g}: {c:,} collections, {tot:.2f} s, longest {mx * 1e3:.1f} ms" for g, (c, tot, mx) in gc_by_gen.items())
        + ("; gen 2 at step " + ", ".join(f"~{st:,} ({ms:.0f} ms)" for ms, st in gen2) if gen2 else ""))
    print(f"3. Plots at the end: {points_per_curve:,} points per curve, peak downsampling + clip-to-view on every "
          f"curve: {'yes' if downsampling else 'NO'}; points handed to pyqtgraph: "
          f"{', '.join(f'{k} {v}' for k, v in drawn.items())}")
    print(f"  repaint       p50 {r['end_repaint_p50_ms']:.1f} ms   p99 {r['end_repaint_p99_ms']:.1f} ms")
    print(f"  full frame    p50 {r['end_full_frame_p50_ms']:.1f} ms   p99 {r['end_full_frame_p99_ms']:.1f} ms "
          f"(every curve decimated again + setData + repaint); its CPU time p50 {r['end_full_frame_cpu_p50_ms']:.1f} ms,"
          f" p99 {r['end_full_frame_cpu_p99_ms']:.1f} ms (load average {r['load_average_frames']:.2f})")
    print(f"  live, during the run: paint p50 {r['live_paint_p50_ms']:.1f} / p99 {r['live_paint_p99_ms']:.1f} ms, "
          f"refresh p50 {r['live_refresh_p50_ms']:.1f} / p99 {r['live_refresh_p99_ms']:.1f} ms over {len(in_train):,} paints")
    if "ab_nice" in res:
        print(f"A/B: the engine thread's nice above the GUI's, alternating every {probe.ab_block} steps "
              "(the same load for each):")
        print("  nice  lat p50  lat p99   GUI CPU  GUI run queue  engine CPU  steps/s  seconds")
        for v, a in res["ab_nice"].items():
            print(f"  {v:+4d}  {a['lat_p50_ms']:7.2f}  {a['lat_p99_ms']:7.2f}  {a['gui_cpu']:8.0%}  {a['gui_runqueue']:13.0%}"
                  f"  {a['engine_cpu']:10.0%}  {a['steps_per_s']:7.1f}  {a['seconds']:7.0f}")
    print(f"4. run.db: {len(rows):,} metric rows, steps {r['db_first_step']}..{r['db_last_step']} "
          f"{'contiguous' if db_contiguous else 'NOT contiguous'}; status {r['db_status']}, step {r['db_info_step']}")
    print(f"load average at start {load0[0]:.2f}, at end {r['load_average_end']:.2f}")

    checks = [
        ("steps trained", f"{steps_trained:,}", f"== {args.steps:,}", steps_trained == args.steps),
        ("RSS growth after step 1,000", f"{growth:+.1f} MB", f"< {RSS_GROWTH_MB:.0f} MB", growth < RSS_GROWTH_MB),
        ("UI lateness p99, training", f"{r['lat_train_p99_ms']:.2f} ms", f"<= {LATENCY_P99_MS:.0f} ms (idle target)",
         r["lat_train_p99_ms"] <= LATENCY_P99_MS),
        ("plots: peak downsampling on", "yes" if downsampling else "no", "on every curve", downsampling),
        ("frame at the end (full), p50", f"{r['end_full_frame_p50_ms']:.1f} ms",
         f"<= {FRAME_MS:.0f} ms (p99 {r['end_full_frame_p99_ms']:.1f} ms, as bench/ui_latency.py judges p50)",
         r["end_full_frame_p50_ms"] <= FRAME_MS),
        ("run.db rows == steps", f"{len(rows):,} vs {steps_trained:,}", "equal, 1..N contiguous",
         len(rows) == steps_trained and db_contiguous),
        ("wall time of the soak", f"{wall:.0f} s", f"< {WALL_S} s", wall < WALL_S),
    ]
    print()
    print(f"{'':4s} {'check':32s} {'value':22s} target")
    for name, value, target, ok in checks:
        print(f"{'PASS' if ok else 'FAIL':4s} {name:32s} {value:22s} {target}")
    n_fail = sum(not c[3] for c in checks)
    print(f"PASS {len(checks) - n_fail} FAIL {n_fail}")
    res["checks"] = [{"check": c[0], "value": c[1], "target": c[2], "pass": c[3]} for c in checks]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
