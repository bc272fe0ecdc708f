"""The "What fits" panel shows the sharding levers of a memory_levers event (issue 20): FSDP over
N of the machine's GPUs, reduction every micro-batch, CPU offload, each row marked as an estimate
in its text and tooltip. The event is the engine's own (engine.memory.what_fits.levers.build_table for a
machine said to have 4 GPUs, the count passed in), written to a run folder by the engine's store
and opened in the window; a one-GPU machine's table has no such rows."""
from __future__ import annotations

import os
import time

import pytest

from engine.declarations.events import MemoryLevers, RunStarted
from engine.memory.what_fits.forecast import MemoryModel
from engine.memory.what_fits.levers import Current, Persistent, build_table
from engine.store import RunStore

GIB = 2 ** 30


def _run(path, gpus: int) -> None:
    """A finished one-GPU run whose what-fits table was built for a machine with `gpus` GPUs."""
    os.makedirs(path / "checkpoints")
    m = MemoryModel()
    m.add(2, 12 * GIB)
    m.add(4, 14 * GIB)  # fixed 10 GiB + 1 GiB per sample
    current = Current(micro_batch=4, accum=4, precision="fp32", checkpointing=False, world=1)
    t = build_table({("fp32", False): m}, current, capacity=16 * GIB,
                    persistent=Persistent(params=2 * GIB, grads=2 * GIB, optimizer=4 * GIB), gpus=gpus)
    store = RunStore(str(path))
    cfg = {"task": "mlp", "micro_batch": 4, "accum": 4, "epochs": 1, "device": "cuda"}
    store.set_info(config=cfg, task="mlp", device="cuda:0", device_name="NVIDIA H200", world_size=1,
                   status="finished", pid=1, started=time.time() - 60)
    store.record(RunStarted(0, 1, run_dir=str(path), task="mlp", device="cuda:0", device_name="NVIDIA H200",
                            torch_version="-", world_size=1, resumed=False, config=cfg))
    rows = tuple((c.micro_batch, c.precision, c.checkpointing, c.predicted_peak, c.fits, c.accum, c.source,
                  c.current, c.available) for c in t.cells)
    store.record(MemoryLevers(2, 1, capacity=t.capacity, usable=t.usable, rows=rows,
                              sharding=tuple(r.to_row() for r in t.sharding)))
    store.close()


@pytest.mark.slow
def test_the_what_fits_panel_shows_the_sharding_estimates_of_a_four_gpu_machine(qtbot, make_window, tmp_path):
    w = make_window()
    _run(tmp_path / "four", gpus=4)
    assert w.open_run(str(tmp_path / "four"))
    lv = w.levers
    t = lv.sharding_table
    assert not t.isHidden() and not lv.sharding_label.isHidden() and t.rowCount() == 9  # N = 2, 3, 4 x 3 levers
    labels = [t.item(i, 0).text() for i in range(t.rowCount())]
    assert labels[:3] == ["FSDP over 2 GPUs, reduce last", "FSDP over 2 GPUs, reduce every",
                          "FSDP over 2 GPUs, reduce every, CPU offload"]
    assert labels[-1] == "FSDP over 4 GPUs, reduce every, CPU offload"
    header = [t.horizontalHeaderItem(j).text() for j in range(t.columnCount())]
    assert header[0] == "Layout (estimate)"
    # whole 8 GiB of params+grads+optimizer; at 4 GPUs reduce every: 14 - 8 + 2 = 8 GiB, fits in 16
    row = labels.index("FSDP over 4 GPUs, reduce every")
    assert t.item(row, 1).text() == "\u2248 8.00 GiB \u2713 (estimate)"
    assert t.item(row, 3).text() == "4 \u00d7 1"  # ceil(16 / (4 x 4))
    offload = labels.index("FSDP over 2 GPUs, reduce every, CPU offload")
    assert t.item(offload, 4).text() == "4.00 GiB"  # the shards in host memory
    for i in range(t.rowCount()):
        for j in range(t.columnCount()):
            assert t.item(i, j).toolTip().startswith("estimate:")  # every cell says what it is
        assert "(estimate)" in t.item(i, 1).text() and t.item(i, 1).font().italic()

    _run(tmp_path / "one", gpus=1)  # one GPU and a one-process run: nothing to shard over
    assert w.open_run(str(tmp_path / "one"))
    assert lv.cells and t.rowCount() == 0 and t.isHidden() and lv.sharding_label.isHidden()
