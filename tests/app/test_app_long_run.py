"""Long runs in the window: a run folder of many steps opens quickly into a compact model
(bench/long_run.py measures a million); the derived x-axis columns; columns a large read
leaves out are read from run.db when first asked for."""
from __future__ import annotations

import importlib.util
import math
import os
import sqlite3

import numpy as np
import pytest
from app_helpers import ROOT

from engine.declarations.events import StepMetrics
from engine.store import RunReader, RunStore


def _bench():
    spec = importlib.util.spec_from_file_location("long_run_bench", ROOT / "bench" / "long_run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.slow
def test_a_long_run_opens_quickly_into_a_compact_model(qtbot, make_window, tmp_path):
    n = 300_000
    run_dir = str(tmp_path / "long")
    _bench().generate(run_dir, n, gpu=True)
    w = make_window()
    w.plots.refresh(force=True)
    qtbot.wait(50)
    before = rss_bytes()
    assert w.open_run(run_dir)
    w.plots.refresh(force=True)
    grown = rss_bytes() - before
    m = w.model.metrics
    assert len(m) == n and w.model.step == n
    # Every step is kept, in the plots' columns: under 260 bytes a step in all (the model, its
    # pyramids, the plots' own arrays; 400 MB for a million steps over a ~140 MB window), where
    # one dict per row and float64 for every column took ~1100; the columns under 150 (were 184).
    assert grown < 260 * n, f"{grown / n:.0f} bytes per step"
    assert m.nbytes() < 150 * n, f"{m.nbytes() / n:.0f} bytes per step in the columns"
    # How long it takes is bench/long_run.py's to measure (a ratio, side by side), not a test's.
    # The view draws a few thousand points of the million, and every extreme among them.
    x, y = w.plots.curve_data("loss")
    assert len(x) < 10_000 and np.nanmax(y) == np.nanmax(m.view("loss")) and np.nanmin(y) == np.nanmin(m.view("loss"))
    assert w.plots.gpu_mode() == "gpu"


def test_columns_keep_the_precision_they_need():
    from app.model.metrics import MetricsBuffer
    b = MetricsBuffer()
    rows = [dict(step=s, epoch=1, loss=0.1 * s, grad_norm=0.3, lr=3e-4, accum=2, clip=0.3, micro_batch=8, samples=16,
                 tokens=16, clipped=0, nonfinite=0, throughput=1234.5678901, step_time=0.01, time=1.7e9 + s * 0.001)
            for s in range(1, 6)]
    b.extend_records(rows, dict.get)
    assert b.view("step").dtype == np.int64 and b.view("time").dtype == np.float64
    assert b.view("grad_norm").dtype == np.float32 and b.view("mem_total").dtype == np.float32
    assert list(b.view("loss")) == [0.1 * s for s in range(1, 6)]  # exactly what run.db holds
    assert b.view("lr")[0] == 3e-4 and b.view("clip")[0] == 0.3 and b.view("throughput")[0] == 1234.5678901
    assert b.view("time")[-1] - b.view("time")[0] == pytest.approx(0.004, abs=1e-6)
    row = next(iter(b.rows()))
    assert row[3] == 0.3  # a float32 value as the decimal it is, not 0.30000001192092896


def _rows(steps, samples, tokens, times):
    return [dict(step=s, epoch=1, loss=1.0, grad_norm=1.0, lr=1e-3, accum=1, clip=0.0, micro_batch=1, samples=a,
                 tokens=t, clipped=0, nonfinite=0, throughput=1.0, step_time=0.1, time=tt)
            for s, a, t, tt in zip(steps, samples, tokens, times)]


def test_samples_seen_tokens_seen_and_wall_follow_the_steps():
    from app.model.metrics import MetricsBuffer
    rng = np.random.default_rng(3)
    n = 500
    samples = rng.integers(1, 64, n).astype(float)
    tokens = rng.integers(100, 5000, n).astype(float)
    times = 1000.0 + np.cumsum(rng.random(n))
    samples[10] = tokens[20] = times[30] = math.nan  # rows without the value
    times[40] = times[39] - 5  # a clock that went back
    rows = _rows(range(1, n + 1), samples, tokens, times)
    whole = MetricsBuffer()
    whole.extend_records(rows, dict.get)
    pieces = MetricsBuffer()
    pieces.extend_records(rows[:7], dict.get)
    assert pieces.view("wall")[0] == 0.0  # built on first use, then kept up to date
    for i in range(7, n, 61):
        pieces.extend_records(rows[i:i + 61], dict.get)
    for b in (whole, pieces):
        assert np.array_equal(b.view("samples_seen"), np.cumsum(np.nan_to_num(samples)))
        assert np.array_equal(b.view("tokens_seen"), np.cumsum(np.nan_to_num(tokens)))
        wall = b.view("wall")
        assert wall[0] == 0.0 and np.all(np.diff(wall) >= 0) and np.all(np.isfinite(wall))
        assert wall[-1] == pytest.approx(times[-1] - times[0])
        assert wall[30] == wall[29] and wall[40] == wall[39]
    # A resumed run rewinds: the derived columns are cut with the steps and continue from there.
    pieces.extend_records(_rows(range(201, 211), [1.0] * 10, [2.0] * 10, times[200:210]), dict.get)
    assert len(pieces) == 210 and pieces.view("samples_seen")[-1] == np.nansum(samples[:200]) + 10
    assert pieces.view("tokens_seen")[-1] == np.nansum(tokens[:200]) + 20
    # Plots draw them like any column.
    _idx, y = pieces.pyramid("samples_seen").decimate(0, len(pieces), 100)
    assert y[-1] == pieces.view("samples_seen")[-1]


def _run_folder(path, n):
    os.makedirs(path / "checkpoints")
    store = RunStore(str(path))
    store.set_info(status="finished", task="mlp", device="cpu")
    for s in range(1, n + 1):
        store.record(StepMetrics(s, 1 + s // 50, loss=1.0 / s, grad_norm=0.5 + s % 3, clipped=s % 5 == 0,
                                 lr=1e-3, accum=1 + s % 4, clip=1.0, micro_batch=8 * (1 + s % 2), samples=8,
                                 tokens=100 + s, step_time=0.01 * s, throughput=float(s), nonfinite=s == 77,
                                 scaler_skipped=False))
    store.close()
    return path


def test_a_large_read_holds_what_the_plots_draw_and_reads_the_rest_when_asked(tmp_path, monkeypatch):
    from app.model.runmodel import RunModel
    from app.session import sources
    monkeypatch.setattr(sources, "LAZY_ABOVE", 50)
    run_dir = _run_folder(tmp_path / "run", 200)
    reader = RunReader(str(run_dir))
    want = reader.metrics()
    reader.close()
    src = sources.FolderSource(str(run_dir))
    model = RunModel()
    model.ingest(src.poll(force=True), src.step_get)
    src.close()
    m = model.metrics
    assert len(m) == 200
    assert not m.holds("accum") and not m.holds("step_time") and m.holds("loss") and m.holds("time")
    assert m.counts_tokens()  # told by the reader, tokens not read
    # No GPU: the memory columns are NULL in every row; one scan said so, none is read or held.
    assert not m.has_gpu_memory() and not m.holds("mem_total") and not m.holds("mem_activations")
    assert src._loader.null_through["mem_total"] == 200
    assert np.all(np.isnan(m.view("mem_activations"))) and len(m.view("mem_activations")) == 200
    assert m.nonfinite_steps == [77] and list(m.clipped_x.view()) == [s for s in range(1, 201) if s % 5 == 0]
    assert model.step_values(0) == {"lr": 1e-3, "clip": 1.0, "micro_batch": 16, "accum": 2}
    assert not m.holds("accum")  # one row asked for, the column still not read
    for col in ("accum", "micro_batch", "tokens", "step_time", "clipped", "nonfinite", "epoch"):
        assert np.allclose(m.view(col), [float(r[col]) for r in want]), col
    assert m.holds("accum")
    assert np.array_equal(m.view("tokens_seen"), np.cumsum([r["tokens"] for r in want]))
    rows = list(m.rows())
    assert len(rows) == 200 and rows[-1][0] == 200


def test_a_followed_run_keeps_growing_after_a_large_read(tmp_path, monkeypatch):
    from app.model.runmodel import RunModel
    from app.session import sources
    monkeypatch.setattr(sources, "LAZY_ABOVE", 50)
    run_dir = _run_folder(tmp_path / "run", 100)
    src = sources.FolderSource(str(run_dir))
    model = RunModel()
    model.ingest(src.poll(force=True), src.step_get)
    assert not model.metrics.holds("accum")
    db = sqlite3.connect(str(run_dir / "run.db"))  # more rows, as the engine would write them
    cols = [r[1] for r in db.execute("PRAGMA table_info(metrics)")]
    last = dict(zip(cols, db.execute("SELECT * FROM metrics WHERE step = 100").fetchone()))
    for s in (101, 102, 103):
        db.execute(f"INSERT INTO metrics ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                   [s if c == "step" else 9 if c == "accum" else last[c] for c in cols])
    db.commit()
    db.close()
    model.ingest(src.poll(force=True), src.step_get)
    src.close()
    m = model.metrics
    assert len(m) == 103 and model.step == 103
    assert list(m.view("accum")[-4:]) == [1 + 100 % 4, 9, 9, 9]
