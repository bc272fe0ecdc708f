"""Memory you can see, in the app (issue 15):

- memory by kind under the GPU memory plot: the stacked area's top is params + grads +
  optimizer (+ activations on CUDA) at every step, on a real CPU run and on a CUDA run.db
  built with the engine's own store; on a GPU the device total and the headroom too;
- the "What fits" table shows the rows of a memory_levers event, extrapolated cells marked;
  choosing a cell and pressing Apply sends SetMicroBatch / SetAccum with the cell's values
  through the session's command path (the engine applies them), and a precision change comes
  back refused, as any refused setting does;
- a memory_snapshot event is an alert with the snapshot's path and a button to its folder.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from app_helpers import run_to_end, start, wait_until

from engine.declarations.commands import SetAccum, SetMicroBatch, SetPrecision
from engine.declarations.events import MemoryLevers, MemorySnapshot, RunFinished, RunStarted, StepMetrics
from engine.store import RunReader, RunStore

pytestmark = pytest.mark.slow  # real runs in the window

GIB = 2 ** 30
KINDS = ("mem_params", "mem_grads", "mem_optimizer", "mem_activations")


def _levers_rows() -> tuple:
    """micro-batch x (fp32, bf16) x checkpointing off/on: measured, fit and extrapolated cells."""
    rows = []
    for micro in (16, 32, 64, 128):
        for prec in ("fp32", "bf16"):
            for ckpt in (False, True):
                source = "measured" if (prec, ckpt, micro) == ("fp32", False, 64) else \
                    "fit" if (prec, ckpt) == ("fp32", False) else "extrapolated"
                peak = int((2 + micro * (0.05 if prec == "fp32" else 0.03) * (0.5 if ckpt else 1)) * GIB)
                rows.append((micro, prec, ckpt, peak, peak <= 7 * GIB, max(1, 128 // micro), source,
                             (micro, prec, ckpt) == (64, "fp32", False), True))
    return tuple(rows)


def _cuda_run(run_dir, steps: int = 30) -> list[dict]:
    """A finished CUDA run as the engine writes it: memory by kind every step, a what-fits
    table and an out-of-memory snapshot."""
    os.makedirs(run_dir / "checkpoints")
    store = RunStore(str(run_dir))
    cfg = {"task": "mlp", "micro_batch": 64, "accum": 2, "lr": 1e-3, "clip": 1.0, "epochs": 1, "device": "cuda"}
    store.set_info(config=cfg, task="mlp", device="cuda:0", device_name="NVIDIA H200", world_size=1,
                   status="finished", pid=1, started=time.time() - 60)
    store.record(RunStarted(0, 1, run_dir=str(run_dir), task="mlp", device="cuda:0", device_name="NVIDIA H200",
                            torch_version="-", world_size=1, resumed=False, config=cfg))
    for s in range(1, steps + 1):
        act = int((1.5 + 0.5 * np.sin(s)) * GIB)
        store.record(StepMetrics(s, 1, loss=2.0 / s, grad_norm=0.5, clipped=False, lr=1e-3, accum=2, clip=1.0,
                                 micro_batch=64, samples=128, tokens=128, step_time=0.01, throughput=1e4,
                                 nonfinite=False, scaler_skipped=False, mem_allocated=4 * GIB, mem_reserved=5 * GIB,
                                 mem_peak=5 * GIB + act, mem_used=6 * GIB + act, mem_total=8 * GIB,
                                 mem_params=GIB, mem_grads=GIB, mem_optimizer=2 * GIB, mem_activations=act))
        if s == 10:
            store.record(MemoryLevers(s, 1, capacity=8 * GIB, usable=7 * GIB, rows=_levers_rows(),
                                      notes=("checkpointed layers unknown: assumed 4",)))
    snap = str(run_dir / "memory" / "oom-step-30.pickle")
    store.record(MemorySnapshot(steps, 1, path=snap))
    store.record(RunFinished(steps, 1, reason="completed"))
    store.close()
    reader = RunReader(str(run_dir))
    try:
        return reader.metrics()
    finally:
        reader.close()


def test_memory_by_kind_on_a_cpu_run_is_params_grads_and_optimizer(qtbot, make_window, tmp_path):
    w = make_window()
    start(w, epochs=1, max_steps=10, run_dir=str(tmp_path / "run"))
    run_to_end(qtbot, w)
    reader = RunReader(str(tmp_path / "run"))
    rows = reader.metrics()
    reader.close()
    p = w.plots
    assert p.gpu_mode() == "cpu" and all(r["mem_activations"] is None for r in rows)
    want = np.array([r["mem_params"] + r["mem_grads"] + r["mem_optimizer"] for r in rows], dtype=np.float64)
    assert want[0] > 0
    scale = p.parts.stack.scale
    assert p.parts.stack.unit in ("KiB", "MiB")  # an mlp holds about a megabyte
    x, top = p.curve_data("stack_mem_optimizer")  # the top layer on the CPU
    assert list(x) == [r["step"] for r in rows]
    np.testing.assert_allclose(top * scale, want, rtol=1e-6)
    _x, first = p.curve_data("stack_mem_params")
    np.testing.assert_allclose(first * scale, [r["mem_params"] for r in rows], rtol=1e-6)
    assert len(p.curve_data("stack_mem_activations")[0]) == 0  # no activation figure on the CPU
    title = p.parts.plot_set.stack.titleLabel.text
    assert "params" in title and "optimizer" in title and "activations" not in title and "CPU" in title


def test_cuda_run_db_memory_stack_levers_and_snapshot(qtbot, make_window, tmp_path):
    run_dir = tmp_path / "cuda"
    rows = _cuda_run(run_dir)
    w = make_window()
    assert w.open_run(str(run_dir))
    p = w.plots
    assert p.gpu_mode() == "gpu" and p.parts.stack.unit == "GiB"
    x, top = p.curve_data("stack_mem_activations")
    assert list(x) == list(range(1, 31))
    want = np.array([sum(r[k] for k in KINDS) for r in rows], dtype=np.float64) / GIB
    np.testing.assert_allclose(top, want, rtol=1e-6)  # params + grads + optimizer + activations
    np.testing.assert_allclose(p.curve_data("stack_mem_optimizer")[1], 4.0, rtol=1e-6)
    sx, total = p.parts.stack.device[0].item.getData()
    assert np.all(total == 8.0) and p.parts.stack.headroom.isVisible()
    title = p.parts.plot_set.stack.titleLabel.text
    assert "device total" in title and "activations" in title

    # What fits (a tab beside the alerts; "What fits..." by the memory readout raises it): the
    # event's 16 cells in a grid, the extrapolated ones marked, the run's own bold.
    lv = w.levers
    w.controls.live.what_fits.click()
    assert lv.isVisible()
    assert len(lv.cells) == 16 and lv.table.rowCount() == 4 and lv.table.columnCount() == 4
    now = [c for c in lv.cells if c.current]
    assert len(now) == 1 and (now[0].micro_batch, now[0].precision, now[0].checkpointing) == (64, "fp32", False)
    for r in range(4):
        for col in range(4):
            item, cell = lv.table.item(r, col), lv.cell_at(r, col)
            assert item.font().italic() == (cell.source == "extrapolated")
            assert item.text().startswith("\u2248") == (cell.source == "extrapolated")
            assert item.font().bold() == cell.current
    assert "7.00 GiB usable of 8.00 GiB" in lv.summary.text() and "at step 10" in lv.summary.text()
    assert not lv.step_button.isEnabled()  # a finished run takes no commands

    # The out-of-memory snapshot: an alert with its path and a way to its folder.
    snap = str(run_dir / "memory" / "oom-step-30.pickle")
    assert any(kind == "memory_snapshot" and snap in text for kind, _s, text in w.alerts.rows())
    assert w.alerts.snapshot_paths == [snap]
    button = w.alerts.findChild(type(w.levers.step_button), "open_snapshot_folder")
    assert button is not None and button.toolTip() == os.path.dirname(snap)


def test_choosing_a_cell_sends_micro_batch_and_accum_and_a_precision_change_is_refused(qtbot, make_window,
                                                                                      tmp_path):
    w = make_window()
    start(w, epochs=3, micro_batch=64, accum=2, run_dir=str(tmp_path / "run"))  # 32 steps an epoch
    wait_until(qtbot, lambda: w.model.step >= 2, 90, "the first steps")
    # The engine writes this table on CUDA only: hand the window one as the engine would.
    w.runner.buffer.put(MemoryLevers(w.model.step, 1, capacity=8 * GIB, usable=7 * GIB, rows=_levers_rows()))
    lv = w.levers
    wait_until(qtbot, lambda: len(lv.cells) == 16, 10, "the table")
    assert lv.step_button.isEnabled() is False  # nothing chosen yet
    assert lv.select(32, "fp32", False)
    assert [type(c) for c in lv.commands("step")] == [SetMicroBatch, SetAccum]
    assert lv.step_button.isEnabled()
    sent_before = len(w.session.sent)
    lv.step_button.click()
    sent = [s.command for s in w.session.sent[sent_before:]]
    assert sent == [SetMicroBatch(32, at="step"), SetAccum(4, at="step")]
    wait_until(qtbot, lambda: w.model.metrics.view("micro_batch")[-1] == 32, 60, "the change to apply")
    assert w.model.metrics.view("accum")[-1] == 4
    wait_until(qtbot, lambda: "applied" in w.controls.status_text("micro_batch"), 10, "the form to say so")

    # A precision cell: the engine refuses it (precision changes at a restart), in the alerts.
    assert lv.select(64, "bf16", False)
    assert SetPrecision("bf16", at="epoch") in lv.commands("epoch")
    lv.epoch_button.click()
    wait_until(qtbot, lambda: "command_refused" in w.alerts.kinds(), 60, "the refusal")
    refusal = next(text for kind, _s, text in w.alerts.rows() if kind == "command_refused")
    assert "set_precision" in refusal and "restart" in refusal
    w.stop_run()
    run_to_end(qtbot, w)
