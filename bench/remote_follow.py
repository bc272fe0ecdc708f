"""A run followed over SSH against the same run read on its own machine, side by side in one run.

  1. Opening a 100,000-step run: from starting `headroom-ctl follow RUN --json` to its `end`
     record with every row decoded (what a client does before it can draw), through ssh on the
     loopback link (a real sshd on 127.0.0.1, tests/ctl/sshkit.py) against the same command on
     the local folder, and against RunReader.metrics() in process (the floor). Target: < 5 s.
  2. The app opening it: File > Open remote run on host:path against Open run folder on the
     folder, in an offscreen window, to the first paint. Target: < 5 s.
  3. Live-row latency: a writer commits a row every 100 ms (RunStore + commit(), holding the
     writer lock like an engine); two follows read it at once, one through ssh, one local. The
     latency of a row is its arrival at the client minus the moment its commit returned (one
     clock: writer and readers are threads of this process). Target: p99 < 1 s.

The rows are written through the store's API (no training), so the figures are headroom-ctl's
and ssh's alone. Run:  PYTHONPATH=. .venv/bin/python bench/remote_follow.py [--steps 100000]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests", ROOT / "tests" / "ctl"):
    sys.path.insert(0, str(p))

import sshkit  # noqa: E402 - after the sys.path set-up above

from engine.declarations.events import StepMetrics  # noqa: E402 - after the sys.path set-up above
from engine.store import RunReader, RunStore, runlock  # noqa: E402 - after the sys.path set-up above


def row(step: int) -> StepMetrics:
    return StepMetrics(step, 1 + step // 1000, loss=1.0 / step, grad_norm=0.5, clipped=False, lr=1e-3, accum=2,
                       clip=1.0, micro_batch=8, samples=16, tokens=16, step_time=0.01, throughput=1600.0,
                       nonfinite=False, scaler_skipped=False)


def write_run(run_dir: str, steps: int) -> float:
    os.makedirs(run_dir)
    t0 = time.perf_counter()
    store = RunStore(run_dir)
    store.set_info(status="finished", task="bench")
    for s in range(1, steps + 1):
        store.record(row(s))
    store.close()
    return time.perf_counter() - t0


class Follow:
    """`python -m engine.ctl follow --json ... RUN`, its records decoded and timed as they come."""

    def __init__(self, run: str, env: dict[str, str], extra: list[str]) -> None:
        self.arrived: dict[int, float] = {}
        self.rows = 0
        self.ended_at = None
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "engine.ctl", "follow", "--json", *extra, "--", run],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            rec = json.loads(line)
            now = time.perf_counter()
            if rec["kind"] == "rows":  # decoded; the app transposes them into its column arrays
                at = rec["columns"].index("step")
                for values in rec["rows"]:
                    self.arrived[values[at]] = now
                self.rows += len(rec["rows"])
            elif rec["kind"] == "end":
                self.ended_at = now

    def wait(self) -> float:
        code = self.proc.wait(timeout=600)
        self.thread.join(timeout=30)
        if code != 0:
            raise RuntimeError(f"follow failed ({code}): {self.proc.stderr.read()[-1000:]}")
        return self.ended_at - self.started


def open_times(run_dir: str, remote: str, env: dict, ssh_args: list[str], repeats: int) -> dict:
    local, ssh, floor, rows = [], [], [], 0
    for _ in range(repeats):  # alternated, so both see the same load
        f = Follow(remote, env, ssh_args)
        ssh.append(f.wait())
        rows = f.rows
        f = Follow(run_dir, env, [])
        local.append(f.wait())
        t0 = time.perf_counter()
        reader = RunReader(run_dir)
        n = len(reader.metrics())
        reader.close()
        floor.append(time.perf_counter() - t0)
        assert n == rows
    return {"rows": rows, "ssh_s": statistics.median(ssh), "local_s": statistics.median(local),
            "reader_s": statistics.median(floor), "ssh_all": ssh, "local_all": local}


def live_latency(folder: str, remote_of, env: dict, ssh_args: list[str], rows: int, every: float) -> dict:
    run_dir = os.path.join(folder, "live")
    os.makedirs(run_dir)
    lock = runlock.acquire(run_dir)
    store = RunStore(run_dir)
    store.set_info(status="running", task="bench", pid=os.getpid())
    store.record(row(1))
    store.commit()
    committed: dict[int, float] = {}
    via_ssh = Follow(remote_of(run_dir), env, ssh_args)
    local = Follow(run_dir, env, [])
    while 1 not in via_ssh.arrived or 1 not in local.arrived:  # both connected and caught up
        time.sleep(0.05)
    for s in range(2, rows + 2):
        store.record(row(s))
        store.commit()
        committed[s] = time.perf_counter()
        time.sleep(every)
    store.set_info(status="finished")
    store.close()
    lock.release()
    via_ssh.wait(), local.wait()

    def stats(f: Follow) -> dict:
        lat = sorted(f.arrived[s] - committed[s] for s in committed)
        return {"p50_ms": 1e3 * lat[len(lat) // 2], "p99_ms": 1e3 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
                "max_ms": 1e3 * lat[-1]}
    return {"rows": rows, "ssh": stats(via_ssh), "local": stats(local)}


def app_open(run_dir: str, remote: str, env: dict, repeats: int) -> dict:
    """The window (offscreen) opening the run: File > Open run folder on the folder, against
    Open remote run on host:path (app/session/remote_source.py), alternated."""
    os.environ.update({k: env[k] for k in ("HEADROOM_SSH_COMMAND", "HEADROOM_REMOTE_PYTHON")})
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ["HEADROOM_SETTINGS"] = os.path.join(os.path.dirname(run_dir), "settings.ini")
    from PySide6.QtWidgets import QApplication
    app = QApplication.instance() or QApplication([])
    from app.main_window import MainWindow
    w = MainWindow(base_config={}, restore_settings=False)
    w.show()
    times: dict[str, list[float]] = {"local": [], "ssh": []}
    for _ in range(repeats):
        for name, target in (("ssh", remote), ("local", run_dir)):
            t0 = time.perf_counter()
            assert w.open_run(target)
            app.processEvents()  # the first paint of the plots
            times[name].append(time.perf_counter() - t0)
            assert len(w.model.metrics) > 0
    w.close()
    return {"ssh_s": statistics.median(times["ssh"]), "local_s": statistics.median(times["local"]),
            "ssh_all": times["ssh"], "local_all": times["local"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--live-rows", type=int, default=100)
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--app", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the window opening it (PySide6, offscreen)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="headroom-bench-ssh-"))
    (tmp / "sshd").mkdir()
    server, why = sshkit.start(tmp / "sshd")
    if server is None:
        print(f"no loopback sshd: {why}", file=sys.stderr)
        return 1
    env = dict(os.environ, PYTHONPATH=str(ROOT), HEADROOM_REMOTE_PYTHON=server.remote_python, **server.env)
    try:
        run_dir = str(tmp / "long")
        wrote = write_run(run_dir, args.steps)
        opened = open_times(run_dir, f"{sshkit.HOST}:{run_dir}", env, server.ctl_args(), args.repeats)
        live = live_latency(str(tmp), lambda d: f"{sshkit.HOST}:{d}", env, server.ctl_args(), args.live_rows, 0.1)
        window = app_open(run_dir, f"{sshkit.HOST}:{run_dir}", env, args.repeats) if args.app else None
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
           "load": os.getloadavg(), "write_s": wrote, "open": opened, "live": live, "app": window}
    print(f"wrote {args.steps} rows through RunStore in {wrote:.2f} s")
    print(f"open {opened['rows']} rows: ssh loopback {opened['ssh_s']:.2f} s, local follow {opened['local_s']:.2f} s, "
          f"RunReader.metrics() {opened['reader_s']:.2f} s; ssh/local {opened['ssh_s'] / opened['local_s']:.2f}x "
          f"(target ssh < 5 s: {'PASS' if opened['ssh_s'] < 5 else 'FAIL'})")
    for name in ("ssh", "local"):
        s = live[name]
        print(f"live rows, {name}: p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms, max {s['max_ms']:.0f} ms "
              f"(target p99 < 1000 ms: {'PASS' if s['p99_ms'] < 1000 else 'FAIL'})")
    if window is not None:
        print(f"the app opens it: Open remote run {window['ssh_s']:.2f} s, Open run folder {window['local_s']:.2f} s "
              f"(target remote < 5 s: {'PASS' if window['ssh_s'] < 5 else 'FAIL'})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
